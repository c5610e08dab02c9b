"""The live sandbox benchmarks (``bench.seedlive``, ``bench.rebalance``) at a tiny size: a fresh KWOK sandbox each,
one replica, short phases, crane's descheduler only (kubernetes-sigs/descheduler is built on demand, minutes: not
in CI). As the other smoke runs (tests/integration/test_bench_smoke.py), what is checked is that the command still
runs to its report, not its figures."""

from __future__ import annotations

from pathlib import Path

from tests.support.benchsmoke import run_bench


def test_seedlive_runs_to_its_table(tmp_path: Path) -> None:
    plot = tmp_path / "seedlive.png"
    output = run_bench("bench.seedlive", "--replicas", "1", "--interval", "1", "--plot", str(plot))
    assert "| service | strategy |" in output, output[-3000:]
    assert plot.exists() and plot.with_suffix(".md").exists()


def test_rebalance_runs_to_its_report(tmp_path: Path) -> None:
    out = tmp_path / "rebalance.md"
    run_bench(
        "bench.rebalance",
        *("--backends", "crane", "--replicas", "1", "--drift-timeout", "20", "--phase", "5", "--out", str(out)),
    )
    assert out.exists() and "crane" in out.read_text()
