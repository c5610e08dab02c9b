"""Batch pods leave a node hot by its regular usage first, lowest priority first; a node hot only with its batch
pods' share keeps its regular pods (issue 30's contract, ``crane_shared.batch``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from crane_descheduler.policy import AnomalyCondition, Limits, default_policy
from crane_descheduler.rounds import RoundResult, run_round
from crane_shared.annotations import encode_usage
from crane_shared.batch import BATCH_CPU, BATCH_CPU_USAGE_KEY, PodUsage, batch_metric_key
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.policy import default_policy as scheduler_default
from tests.support.descheduler import NOW, node, pod

ARGS = DynamicArgs(scheduler_default())
WIDE = Limits(per_node_per_round=5, per_namespace_per_round=5, max_unavailable_per_workload=1, per_minute=10)
POLICY = replace(
    default_policy(scheduler_default()), anomaly=AnomalyCondition(hot_rounds=1, normal_rounds=1), limits=WIDE
)
GIB = 1 << 30


def hot_node(batch: str | None) -> dict[str, Any]:
    """8 cores at 0.9 CPU, ``batch`` its batch pods' share (annotation text)."""
    raw = node("hot", cpu=0.9)
    if batch is not None:
        raw["metadata"]["annotations"][BATCH_CPU_USAGE_KEY] = batch
    return raw


def cool_node() -> dict[str, Any]:
    raw = node("cool", cpu=0.1)
    raw["status"]["allocatable"][BATCH_CPU] = "8000"  # the annotator's reclaimable capacity
    return raw


PODS = [
    pod("covers", "hot", owner="web"),  # regular, the best cover of the 2-core excess
    pod("batch-high", "hot", owner="job-high", priority=5, batch_cpu="500"),
    pod("batch-low", "hot", owner="job-low", priority=1, batch_cpu="500"),
]
USAGE = {
    "default/covers": PodUsage(3, GIB),
    "default/batch-high": PodUsage(0.8, GIB),
    "default/batch-low": PodUsage(0.8, GIB),
}


def planned(batch: str | None) -> RoundResult:
    return run_round([hot_node(batch), cool_node()], PODS, USAGE, POLICY, ARGS, {}, NOW)


def names(result: RoundResult) -> list[str]:
    return [e.pod.name for e in result.plan.evictions]


def test_a_node_hot_by_regular_usage_sheds_its_batch_pods_first_lowest_priority_first():
    # 0.9 - 0.2 batch = 0.7 regular > 0.65: both batch pods go before the regular pod that would cover it alone
    result = planned(encode_usage(0.2, NOW))
    assert names(result) == ["batch-low", "batch-high", "covers"]
    assert [e.target for e in result.plan.evictions] == ["cool"] * 3
    # without batch pods on it, the best cover alone (as before batch work existed)
    alone = run_round([hot_node(None), cool_node()], PODS[:1], USAGE, POLICY, ARGS, {}, NOW)
    assert names(alone) == ["covers"]


def test_a_node_hot_only_with_its_batch_share_keeps_its_regular_pods():
    # 0.9 - 0.3 = 0.6 regular: not hot by regular usage; the batch pods go, the regular one stays
    result = planned(encode_usage(0.3, NOW))
    assert names(result) == ["batch-low", "batch-high"] and result.plan.skipped["batch-heat"] == 1


def test_a_stale_or_malformed_batch_annotation_counts_as_no_batch_usage():
    stale = planned(encode_usage(0.3, NOW - timedelta(hours=1)))
    assert names(stale)[:2] == ["batch-low", "batch-high"] and "covers" in names(stale)
    malformed = planned("lots")
    assert "covers" in names(malformed) and malformed.malformed["batch-usage-annotation"] == 1
    assert BATCH_CPU_USAGE_KEY in malformed.batch_problems["hot"]


def test_batch_pods_yield_to_regular_load_even_with_no_place_elsewhere():
    # no other node: the batch pods still leave the node hot by regular usage (their replacements wait), the
    # regular pod stays (no place for it); a node hot only with its batch share keeps them
    result = run_round([hot_node(encode_usage(0.2, NOW))], PODS, USAGE, POLICY, ARGS, {}, NOW)
    assert names(result) == ["batch-low", "batch-high"]
    assert [e.target for e in result.plan.evictions] == [None, None]
    assert result.plan.skipped["no-target"] == 1
    batch_heat = run_round([hot_node(encode_usage(0.3, NOW))], PODS, USAGE, POLICY, ARGS, {}, NOW)
    assert names(batch_heat) == [] and batch_heat.plan.skipped["no-target"] == 2


def test_the_metrics_own_batch_share_counts_only_from_the_same_round():
    # the per-metric share (batch.crane.io/<metric>) is what the scheduler takes out; with the metric's timestamp
    # it is taken (0.9 - 0.3 = 0.6: batch heat only), from another round it takes nothing (hot by regular usage),
    # and it wins over the per-resource usage now (which alone would say 0.9 - 0.2 = 0.7: hot)
    def with_shares(at: datetime) -> dict[str, Any]:
        raw = hot_node(encode_usage(0.2, NOW))
        for metric in ("cpu_usage_avg_5m", "cpu_usage_max_avg_1h"):
            raw["metadata"]["annotations"][batch_metric_key(metric)] = encode_usage(0.3, at)
        return raw

    same = run_round([with_shares(NOW), cool_node()], PODS, USAGE, POLICY, ARGS, {}, NOW)
    assert names(same) == ["batch-low", "batch-high"] and same.plan.skipped["batch-heat"] == 1
    other = run_round([with_shares(NOW - timedelta(seconds=5)), cool_node()], PODS, USAGE, POLICY, ARGS, {}, NOW)
    assert names(other) == ["batch-low", "batch-high", "covers"]
