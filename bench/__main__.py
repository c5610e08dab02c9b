"""``python -m bench``: every benchmark, one after the other, each with its own defaults.

Run one with ``python -m bench.<name> --help`` to see how to scale it (the scheduler benchmark at 5,000 nodes and
10,000 pods takes the longest).
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = (
    "loadaware",
    "event_recorder",
    "extender",
    "annotator",
    "scheduler",
    "gangs",
    "gangs.live",
    "dra",
    "descheduler",
    "estimates",
    "simulate",
    "differential",
)


def main() -> int:
    failed = []
    for name in sys.argv[1:] or BENCHMARKS:
        print(f"\n=== bench.{name} ===", flush=True)
        if subprocess.run([sys.executable, "-m", f"bench.{name}"], check=False).returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
