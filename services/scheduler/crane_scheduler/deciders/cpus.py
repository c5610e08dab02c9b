"""How many decider workers to start by default: from the CPUs this container may use, not the host's count.

A container's share of the host is its cgroup CPU quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us`` in v1), within the CPUs it may run on (``sched_getaffinity``); ``os.cpu_count()`` is the
host's and would start 64 workers in a pod limited to 2 CPUs. Without a quota (no CPU limit) the default is no
worker: set a CPU limit, or the count.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
MAX_WORKERS = 8
"""beyond this the scheduling process's own per-pod work (informers, checking, assume, bind) is the limit"""
RESERVED = 2
"""CPUs kept for the scheduling process and the API writer process"""


def quota_cpus(root: Path = CGROUP) -> float | None:
    """The cgroup CPU quota in CPUs (v2, else v1); None when unlimited or unknown."""
    try:
        text = (root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus(root: Path = CGROUP) -> int | None:
    """CPUs this container may use: its cgroup quota (rounded up: a 2.5-CPU quota runs three processes part of the
    time), at most its affinity; None without a quota (a pod with no CPU limit may use anything: that is no count
    to size workers by, each of which holds another copy of the node table)."""
    quota = quota_cpus(root)
    if quota is None:
        return None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(affinity, math.ceil(quota)))


def default_workers(cpus: int | None) -> int:
    """0 (decide in the scheduling process) without a CPU limit and up to 3 CPUs: there a worker only takes turns on
    a core the scheduling process and the writer already share (measured: bench/scheduler/RESULTS.md, "Issue 40,
    phase 2"); beyond, one worker per CPU left after those two, at most ``MAX_WORKERS``."""
    if cpus is None:
        return 0
    return 0 if cpus <= RESERVED + 1 else min(MAX_WORKERS, cpus - RESERVED)
