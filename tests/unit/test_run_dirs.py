"""Run directories: pruning old runs never removes one whose process still uses it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crane_sandbox.cluster import new_run_dir


def test_a_live_sessions_first_run_survives_many_newer_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRANE_RUN_DIR", str(tmp_path))
    shared_cluster = new_run_dir("tests", keep=3)
    (shared_cluster / "etcd").mkdir()
    later = [new_run_dir(f"bench-{i}", keep=3) for i in range(6)]
    assert shared_cluster.exists(), "the live test session's cluster directory was pruned"
    assert all(p.exists() for p in later)


def test_runs_of_processes_that_ended_are_pruned_to_keep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRANE_RUN_DIR", str(tmp_path))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(ended.stdout)
    for i in range(5):
        path = tmp_path / f"2026010{i}-000000-sandbox-{dead_pid}"
        path.mkdir()
        os.utime(path, (i, i))
    new_run_dir("tests", keep=3)
    left = sorted(p.name for p in tmp_path.iterdir() if str(dead_pid) in p.name)
    assert left == [f"2026010{i}-000000-sandbox-{dead_pid}" for i in (3, 4)]
