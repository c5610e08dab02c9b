"""``python -m bench.faults``: the whole fault suite (``tests/faults``, as ``make test`` runs it) on the real
servers, then the table of faults survived: fault, pods (or bindings, nodes) created, bound (or recorded,
annotated) once, double binds, lost, recovery time.

Each fault test files its row (``tests.support.faults.FaultRow``) after auditing the outcome from the API server
or Redis; a failed test shows as FAILED. Extra arguments go to pytest (``-k blackhole``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.faults import fault_table


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.jsonl"
        env = {**os.environ, "CRANE_FAULT_REPORT": str(report)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults", *argv]
        code = subprocess.run(cmd, cwd=root, env=env, check=False).returncode
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    print("\nfaults survived (audited from the API server and Redis):\n")
    print(fault_table(rows) if rows else "(no fault ran)")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
