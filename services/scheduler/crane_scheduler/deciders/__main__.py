"""``python -m crane_scheduler.deciders``: a decider worker (started by ``DeciderPool``, not by hand)."""

import sys

from crane_scheduler.deciders.process import main

if __name__ == "__main__":
    sys.exit(main())
