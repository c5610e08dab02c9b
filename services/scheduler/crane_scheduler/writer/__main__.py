"""``python -m crane_scheduler.writer``: the writer process (started by ``ApiWriter``, not by hand)."""

import sys

from crane_scheduler.writer.process import main

if __name__ == "__main__":
    sys.exit(main())
