"""Every ``python -m bench...`` command the README and the RESULTS files name, run at a tiny size: a benchmark that
no longer runs (an argument its runner reads and its parser lost, a renamed helper, a changed wire format) fails
the build here instead of the next time someone measures.

Each run is the real command line in a child process, as a user types it, so argument parsing and the module's
``main`` are part of what is checked; sizes are the smallest that still take every path (both contenders, the
bind ceiling, the paced run). Figures are not asserted: on a shared two-core machine they are noise; the closing
table or line each benchmark prints is. ``bench.faults`` is the fault suite CI runs whole anyway (tests/faults),
and ``bench.seedlive``/``bench.rebalance`` have smoke runs with the KWOK sandbox tests
(tests/integration/sandbox/test_bench_smoke.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.benchsmoke import ROOT, TIMEOUT, run_bench

DRA_STEADY = ("--nodes", "4", "--claims-per-node", "2", "--init-pods", "0", "--batch", "2", "--duration", "2")
"""the steady state's tiny size (1.37's per-pod replacement, and 1.35's batches)"""

# (argv, a line or fragment the closing report prints): benchmarks that start their own servers (a local API
# server, Redis, Prometheus) or none at all.
SMOKES: list[tuple[tuple[str, ...], str]] = [
    (("bench.loadaware", "--replicas", "2"), "ours vs requests-only"),
    (("bench.descheduler", "--sizes", "20x100"), "steady round"),
    (("bench.extender", "--sizes", "10", "--iterations", "3"), "filter+prioritize"),
    (("bench.gangs", "--nodes", "30", "--gangs", "5"), "per gang cycle"),
    (("bench.nrt", "--nodes", "10", "--pods", "5"), "whole-cpu"),
    (("bench.simulate", "--nodes", "10", "--pods", "20", "--no-plot"), "20/20 pods placed"),
    (("bench.scheduler.loop", "--nodes", "20", "--pods", "30", "--workers", "0,1"), "1 workers"),
    (("bench.scheduler.dynamic_cost", "--nodes", "20", "--bindings", "0,40", "--decisions", "5"), "recent bindings"),
    (("bench.scheduler.affinity_cost", "--nodes", "12", "--scale", "smoke"), "PreferredTopologySpreading"),
    (("bench.scheduler.preemption_cost", "--nodes", "8", "--pods", "8"), "second decision"),
    (("bench.scheduler.volumes_cost", "--nodes", "8", "--pods", "8"), "SchedulingCSIPVs"),
    (("bench.scheduler.pod_memory", "--nodes", "10", "--pods", "20"), "KiB per pod"),
    (("bench.differential", "--cases", "5", "--max-nodes", "3", "--max-pods", "3"), "5"),
    (
        (
            "bench.event_recorder",
            "--synthetic-events",
            "200",
            "--watch-events",
            "50",
            "--nodes",
            "5",
            "--zadd-requests",
            "200",
            "--sustain-seconds",
            "2",
            "--sustain-rate",
            "50",
            "--check-every",
            "1",
        ),
        "recorded",
    ),
    (("bench.annotator", "--nodes", "10", "--rounds", "1", "--upstream-seconds", "2", "--budget-periods", "0"), "10"),
    (("bench.backends", "--nodes", "10", "--rounds", "1", "--vm-latency-offset", "2"), "10"),
    (("bench.estimates", "--replicas", "3"), "learned"),
    (("bench.scheduler.writer_cost", "--pods", "40"), "40"),
    (("bench.scheduler.preemption", "--nodes", "4", "--pods", "4"), "4"),
    (("bench.scheduler.volumes", "--nodes", "4", "--pods", "4"), "4"),
    # crane-scheduler on every workload; kube-scheduler's side is the same runner as bench.scheduler's (smoked there)
    (("bench.scheduler.workloads", "--nodes", "12", "--scale", "smoke", "--skip-kube"), "PreferredTopologySpreading"),
    (("bench.dra", "--nodes", "4", "--claims-per-node", "2", "--init-pods", "2", "--pods", "4"), "4"),
    (("bench.dra", "--steady-state", *DRA_STEADY), "per pod (median): claim made"),
    (("bench.dra", "--steady-batches", "--steady-state", *DRA_STEADY, "--skip-kube"), "per batch (median): claims"),
    (
        (
            "bench.gangs.live",
            "--nodes",
            "8",
            "--gangs",
            "3",
            "--min-size",
            "2",
            "--max-size",
            "3",
            "--rate",
            "0",
            "--hold",
            "1",
            "--skip-reference",
        ),
        "gang",
    ),
]


@pytest.mark.parametrize(("argv", "expect"), SMOKES, ids=[" ".join(a[:2]) for a, _ in SMOKES])
def test_bench_runs_at_a_tiny_size(argv: tuple[str, ...], expect: str) -> None:
    output = run_bench(*argv)
    assert expect.lower() in output.lower(), f"{' '.join(argv)} did not print {expect!r}:\n{output[-3000:]}"


def test_scheduler_bench_and_its_check(tmp_path: Path) -> None:
    """SchedulingBasic with both contenders, the bind ceiling and the paced run, then ``bench.check`` reading the
    figures it wrote (the check's comparison against RESULTS.md, not its verdict: tiny runs are not comparable)."""
    figures = tmp_path / "scheduler.json"
    output = run_bench("bench.scheduler", "--nodes", "10", "--pods", "30", "--json", str(figures))
    assert "crane pods/s" in output and "kube-scheduler" in output, output[-3000:]
    sizes = json.loads(figures.read_text())["sizes"]
    assert sizes["10"]["crane_pods_per_s"] > 0 and sizes["10"]["kube_pods_per_s"] > 0, sizes
    proc = subprocess.run(
        [sys.executable, "-m", "bench.check", "--only", "scheduler", "--scheduler", str(figures)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 1: a ratio below the record (expected here)
    assert "scheduler" in (proc.stdout + proc.stderr).lower()


def test_bench_runner_names_existing_benchmarks() -> None:
    """``python -m bench`` runs its list one after the other with their default sizes (minutes each): every name
    it lists is a module that runs (each has its own smoke run above)."""
    from bench.__main__ import BENCHMARKS

    smoked = {argv[0] for argv, _ in SMOKES} | {"bench.scheduler"}
    assert {f"bench.{name}" for name in BENCHMARKS} <= smoked
