"""Running a benchmark's command as a user types it, for the smoke runs (tests/integration/test_bench_smoke.py and
tests/integration/sandbox/test_bench_smoke.py)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 600.0


def run_bench(*argv: str, timeout: float = TIMEOUT) -> str:
    """``python -m <argv>`` from the repository root; its output (stdout + stderr) when it exits 0."""
    started, cpu = time.monotonic(), _children_cpu()
    proc = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    output = proc.stdout + proc.stderr
    took = time.monotonic() - started
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode} after {took:.0f}s:\n{output[-4000:]}"
    print(f"{' '.join(argv)}: {took:.1f}s wall, {_children_cpu() - cpu:.1f} CPU-s with the servers it started")
    return output


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children and theirs (a benchmark and its servers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
