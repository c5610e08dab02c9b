"""``bench.check`` fails on a ratio more than the tolerance below the recorded figures, and only then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.check import (
    annotator_ratios,
    annotator_run,
    compare,
    extender_ratios,
    main,
    recorded,
    scheduler_ratios,
    scheduler_runs,
)

FIGURES = {
    "profile": "default",
    "pods": 10000,
    "sizes": {"1000": {"ratio_to_kube": 1.6}, "5000": {"ratio_to_kube": 1.5}},
}


def results_md(tmp_path: Path, figures: dict[str, object]) -> Path:
    (tmp_path / "scheduler").mkdir()
    path = tmp_path / "scheduler" / "RESULTS.md"
    path.write_text(
        f"# results\n\nold:\n```json bench-figures\n{{}}\n```\n\n```json bench-figures\n{json.dumps(figures)}\n```\n"
    )
    return path


def test_the_last_figures_block_is_the_record(tmp_path: Path) -> None:
    results_md(tmp_path, FIGURES)
    assert recorded("scheduler", tmp_path) == FIGURES


def test_a_drop_within_the_tolerance_passes_and_beyond_it_fails() -> None:
    before = scheduler_ratios(FIGURES)
    within = scheduler_ratios({"sizes": {"1000": {"ratio_to_kube": 1.3}, "5000": {"ratio_to_kube": 1.9}}})
    assert compare(before, within, 0.25) == []
    beyond = scheduler_ratios({"sizes": {"1000": {"ratio_to_kube": 1.1}, "5000": {"ratio_to_kube": 1.5}}})
    [failure] = compare(before, beyond, 0.25)
    assert "1000 nodes" in failure and "31% below" in failure


def test_a_size_no_longer_measured_fails() -> None:
    after = scheduler_ratios({"sizes": {"1000": {"ratio_to_kube": 1.6}}})
    [failure] = compare(scheduler_ratios(FIGURES), after, 0.25)
    assert "5000 nodes" in failure and "not measured" in failure


def test_extender_ratio_is_reference_over_ours_with_the_node_cache() -> None:
    row = {"nodes": 5000, "filter+prioritize": {"p50_ms": 8.0}, "reference_json_only": {"p50_ms": 2.0}}
    figures = {"results": [{**row, "mode": "nodeCacheCapable"}, {**row, "mode": "Nodes"}]}
    assert extender_ratios(figures) == {"extender 5000 nodes (node cache): JSON-only p50 / ours p50": 0.25}


def test_the_command_exits_1_on_a_regression(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results_md(tmp_path, FIGURES)
    monkeypatch.setattr("bench.check.BENCH", tmp_path)
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"sizes": {"1000": {"ratio_to_kube": 1.0}, "5000": {"ratio_to_kube": 1.5}}}))
    assert main(["--only", "scheduler", "--scheduler", str(run)]) == 1
    run.write_text(json.dumps(FIGURES))
    assert main(["--only", "scheduler", "--scheduler", str(run)]) == 0


def test_each_recorded_size_is_measured_again_with_its_own_pods_and_bound_pods() -> None:
    figures = {
        "profile": "default",
        "pods": 10000,
        "sizes": {
            "1000": {"ratio_to_kube": 1.0},
            "2000": {"ratio_to_kube": 1.0},
            "5000": {"ratio_to_kube": 1.0, "pods": 3000, "bound_pods": 50000},
        },
    }
    assert scheduler_runs(figures) == [
        ["--nodes", "1000,2000", "--plugins", "default", "--pods", "10000", "--bound-pods", "0"],
        ["--nodes", "5000", "--plugins", "default", "--pods", "3000", "--bound-pods", "50000"],
    ]


def test_figures_recorded_with_each_scheduler_on_a_core_of_its_own_are_measured_again_the_same_way() -> None:
    figures = {"profile": "default", "pods": 5000, "scheduler_cpu": 1, "sizes": {"1000": {}, "5000": {}}}
    assert scheduler_runs(figures) == [
        ["--nodes", "1000,5000", "--plugins", "default", "--pods", "5000", "--bound-pods", "0", "--scheduler-cpu", "1"]
    ]


ANNOTATOR = {
    "nodes": 5000,
    "settings": {"concurrency": 64, "qps": 0.0, "burst": 100},
    "ours": [{"seconds": 60.0}, {"seconds": 59.0}, {"seconds": 61.0}],
    "round_over_watched_bare_median": 1.25,
}


def test_annotator_ratio_is_the_ceiling_over_our_round() -> None:
    assert annotator_ratios(ANNOTATOR) == {"annotator 5000 nodes: bare-patch ceiling / round": 0.8}
    slower = annotator_ratios({**ANNOTATOR, "round_over_watched_bare_median": 1.8})
    [failure] = compare(annotator_ratios(ANNOTATOR), slower, 0.25)
    assert "annotator 5000 nodes" in failure


def test_the_annotator_round_is_timed_again_at_the_recorded_fleet_and_settings() -> None:
    run = annotator_run(ANNOTATOR)
    assert run[:4] == ["--nodes", "5000", "--rounds", "3"]
    assert run[run.index("--patch-concurrency") + 1] == "64" and run[run.index("--kube-api-qps") + 1] == "0.0"
    assert run[run.index("--budget-periods") + 1] == "0"
