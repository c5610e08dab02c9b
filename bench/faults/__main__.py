"""``python -m bench.faults``: the whole fault suite (``tests/faults``, slow faults included) on the real
servers, then the table of faults survived: fault, pods (or bindings, nodes) created, bound (or recorded,
annotated) once, double binds, lost, recovery time.

Each fault test files its row (``tests.faults.conftest.FaultRow``) after auditing the outcome from the API server
or Redis; a failed test shows as FAILED. Extra arguments go to pytest (``-k blackhole``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

COLUMNS = ("fault", "created", "bound", "doubled", "lost", "recovery s", "result")


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        (
            str(r["fault"]),
            str(r["created"]),
            str(r["bound"]),
            str(r["doubled"]),
            str(r["lost"]),
            "-" if r["recovery"] is None else f"{r['recovery']:.2f}",
            "ok" if r["outcome"] == "passed" else "FAILED",
        )
        for r in rows
    ]
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(COLUMNS)]

    def fmt(cells: tuple[str, ...]) -> str:
        return " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [fmt(COLUMNS), "-+-".join("-" * w for w in widths), *(fmt(line) for line in lines)]
    notes = [f"  {r['fault']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(out + (["", "notes:", *notes] if notes else []))


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.jsonl"
        env = {**os.environ, "CRANE_FAULTS": "all", "CRANE_FAULT_REPORT": str(report)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults", *argv]
        code = subprocess.run(cmd, cwd=root, env=env, check=False).returncode
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    print("\nfaults survived (audited from the API server and Redis):\n")
    print(table(rows) if rows else "(no fault ran)")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
