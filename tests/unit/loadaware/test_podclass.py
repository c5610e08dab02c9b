"""Two classes of pods: a regular pod is judged by the node's usage without the batch pods', a batch pod by all of it.

The same verdicts from the shared reference, the scheduler's Dynamic plugin and the extender."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from crane_extender.protocol import Decide, filter_nodes, parse_args, prioritize_nodes
from crane_extender.server import Extender, ExtenderMetrics
from crane_scheduler.framework import Diagnosis
from crane_scheduler.loadaware.plugin import is_regular
from crane_scheduler.podinfo import parse_pod
from crane_shared.annotations import encode_usage
from crane_shared.batch import (
    BATCH_CPU,
    BATCH_CPU_USAGE_KEY,
    BATCH_MEMORY,
    BATCH_MEMORY_USAGE_KEY,
    batch_metric_key,
    is_batch,
)
from crane_shared.informer import Informer
from crane_shared.loadaware.dynamic import DynamicArgs, filter_reason, node_load
from crane_shared.policy import default_policy
from tests.support.loadaware import NOW, Setup, batch_pod, loaded, with_batch_usage
from tests.support.scheduler import pod

WHEN = datetime.fromtimestamp(NOW, UTC)
ARGS = DynamicArgs(default_policy())
BATCH_CAPACITY = {BATCH_CPU: "8000", BATCH_MEMORY: "32Gi"}


def hot_by_batch(name: str = "hot") -> dict[str, Any]:
    """0.8 real usage on every metric, 0.4 of it the batch pods': 0.4 without them (thresholds 0.65-0.75)."""
    n = with_batch_usage(loaded(name, 0.8), cpu=0.4, memory=0.4)
    n["status"]["allocatable"].update(BATCH_CAPACITY)
    return n


def test_a_regular_pods_load_is_the_usage_less_the_batch_pods_clamped_at_zero() -> None:
    ann = hot_by_batch()["metadata"]["annotations"]
    whole = node_load("n", ann, ARGS, WHEN)
    regular = node_load("n", ann, ARGS, WHEN, regular=True)
    assert whole.readings["cpu_usage_avg_5m"].usage == pytest.approx(0.8)
    assert regular.readings["cpu_usage_avg_5m"].usage == pytest.approx(0.4)
    assert regular.readings["mem_usage_max_avg_1d"].usage == pytest.approx(0.4)
    ann[BATCH_CPU_USAGE_KEY] = ann[BATCH_CPU_USAGE_KEY].replace("0.4", "0.95", 1)
    assert node_load("n", ann, ARGS, WHEN, regular=True).readings["cpu_usage_avg_5m"].usage == 0.0
    assert filter_reason(whole, ARGS) == "node(s) had cpu_usage_avg_5m above 0.65"
    assert filter_reason(regular, ARGS) is None


@pytest.mark.parametrize(
    "text",
    ["0.4,2000-01-01T00:00:00Z", "lots,2026-11-22T11:59:00+00:00", "0.4"],
    ids=["stale", "malformed", "no-timestamp"],
)
def test_a_stale_or_malformed_batch_annotation_takes_nothing_out(text: str) -> None:
    ann = hot_by_batch()["metadata"]["annotations"]
    ann[BATCH_CPU_USAGE_KEY] = ann[BATCH_MEMORY_USAGE_KEY] = text
    regular = node_load("n", ann, ARGS, WHEN, regular=True)
    assert regular.readings["cpu_usage_avg_5m"].usage == pytest.approx(0.8)
    assert filter_reason(regular, ARGS) == "node(s) had cpu_usage_avg_5m above 0.65"


@pytest.mark.parametrize(
    "containers",
    [
        {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}]},
        {"containers": [{"name": "c", "resources": {"requests": {BATCH_CPU: "500"}, "limits": {BATCH_CPU: "500"}}}]},
        {
            "containers": [
                {"name": "c", "resources": {"requests": {BATCH_MEMORY: "1Gi"}, "limits": {BATCH_MEMORY: "1Gi"}}}
            ]
        },
        {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [{"name": "i", "resources": {"requests": {BATCH_CPU: "1"}, "limits": {BATCH_CPU: "1"}}}],
        },
    ],
    ids=["regular", "batch-cpu", "batch-memory", "batch-init-container"],
)
def test_the_schedulers_class_rule_is_is_batch_for_pods_as_the_api_server_admits_them(
    containers: dict[str, Any],
) -> None:
    raw = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": containers}
    assert is_regular(parse_pod(raw)) is not is_batch(raw["spec"])


def test_scheduler_places_a_regular_pod_on_a_node_hot_only_by_batch_work_and_refuses_a_batch_pod() -> None:
    s = Setup(hot_by_batch())
    assert s.place(pod("regular", cpu="500m")) == "hot"
    refused = s.place(batch_pod("batch"))
    assert isinstance(refused, Diagnosis)
    assert "node(s) had cpu_usage_avg_5m above 0.65" in refused.message


def test_scheduler_counts_a_stale_batch_annotation_once_and_judges_the_whole_usage() -> None:
    n = with_batch_usage(loaded("hot", 0.8), cpu=0.4, memory=0.4, age=3600)  # metrics fresh, batch usage not
    s = Setup(n)
    refused = s.place(pod("regular"))
    assert isinstance(refused, Diagnosis) and "cpu_usage_avg_5m above 0.65" in refused.message
    s.place(pod("again"))
    ignored = s.plugin.metrics.batch_ignored
    assert ignored._value.get() == 2  # the cpu and the memory annotation, once each


def test_each_class_prefers_the_node_idlest_by_its_own_measure() -> None:
    """A: 0.6 used, 0.5 of it batch work (0.1 regular); B: 0.3 used, no batch work."""

    def nodes() -> tuple[dict[str, Any], dict[str, Any]]:
        a = with_batch_usage(loaded("a", 0.6), cpu=0.5, memory=0.5)
        b = loaded("b", 0.3)
        for n in (a, b):
            n["status"]["allocatable"].update(BATCH_CAPACITY)
        return a, b

    assert Setup(*nodes()).place(pod("regular")) == "a"
    assert Setup(*nodes()).place(batch_pod("batch")) == "b"


def extender_request(raw_pod: dict[str, Any], *nodes: dict[str, Any]) -> bytes:
    return json.dumps({"Pod": raw_pod, "Nodes": {"items": list(nodes)}}).encode()


def test_the_extender_gives_the_same_verdicts_for_both_classes() -> None:
    decide = Decide(ARGS, WHEN)
    hot = hot_by_batch()
    regular = filter_nodes(parse_args(extender_request(pod("regular", cpu="500m"), hot)), decide)
    batch = filter_nodes(parse_args(extender_request(batch_pod("batch"), hot)), decide)
    assert [n["metadata"]["name"] for n in regular["Nodes"]["items"]] == ["hot"]
    assert batch["FailedNodes"] == {"hot": "node(s) had cpu_usage_avg_5m above 0.65"}
    regular_score = prioritize_nodes(parse_args(extender_request(pod("regular"), hot)), decide)
    batch_score = prioritize_nodes(parse_args(extender_request(batch_pod("batch"), hot)), decide)
    assert regular_score[0]["Score"] > batch_score[0]["Score"]


def test_the_extender_counts_a_stale_batch_annotation_once_and_judges_the_whole_usage() -> None:
    metrics = ExtenderMetrics.create(CollectorRegistry())
    ext = Extender(ARGS, metrics=metrics, clock=lambda: NOW)
    stale = with_batch_usage(loaded("hot", 0.8), cpu=0.4, memory=0.4, age=3600)  # metrics fresh, batch usage not
    for name in ("p1", "p2"):
        answer, _ = ext.answer("filter", extender_request(pod(name), stale))
        assert answer["FailedNodes"] == {"hot": "node(s) had cpu_usage_avg_5m above 0.65"}
    assert metrics.batch_usage_ignored._value.get() == 1


async def _no_list(**kw: Any) -> Any:
    raise AssertionError("not listed in unit tests")


def test_the_extenders_node_cache_mode_judges_each_class_from_its_cached_verdicts() -> None:
    informer = Informer("nodes", _no_list, cache={"hot": hot_by_batch()})
    informer.synced.set()
    ext = Extender(ARGS, informer=informer, clock=lambda: NOW)
    for _ in range(2):  # the second time from the memo
        regular, _ = ext.answer("filter", json.dumps({"Pod": pod("r"), "NodeNames": ["hot"]}).encode())
        batch, _ = ext.answer("filter", json.dumps({"Pod": batch_pod("b"), "NodeNames": ["hot"]}).encode())
        assert regular["NodeNames"] == ["hot"] and regular["FailedNodes"] == {}
        assert batch["FailedNodes"] == {"hot": "node(s) had cpu_usage_avg_5m above 0.65"}
        ranked_regular, _ = ext.answer("prioritize", json.dumps({"Pod": pod("r"), "NodeNames": ["hot"]}).encode())
        ranked_batch, _ = ext.answer("prioritize", json.dumps({"Pod": batch_pod("b"), "NodeNames": ["hot"]}).encode())
        assert ranked_regular[0]["Score"] > ranked_batch[0]["Score"]


def with_shares(n: dict[str, Any], share: float, age: float = 10) -> dict[str, Any]:
    """``n`` with every metric's batch share (``batch.crane.io/<metric>``) stamped ``age`` seconds before NOW."""
    stamp = datetime.fromtimestamp(NOW - age, UTC)
    annotations = n["metadata"]["annotations"]
    for metric in [k for k in annotations if k.startswith(("cpu_", "mem_"))]:
        annotations[batch_metric_key(metric)] = encode_usage(share, stamp)
    return n


def test_each_metrics_own_batch_share_is_taken_out_only_when_written_with_the_metric() -> None:
    """0.8 used; the batch pods' usage now 0.1 (just started: barely inside the averages yet), their share of each
    metric 0.4. The share stamped as the metrics are is what a regular pod's reading takes out (0.4, placed),
    in the reference, the scheduler and the extender alike; a share from another round takes nothing (0.8,
    refused), and the usage now is not used in its place."""
    same = with_shares(with_batch_usage(loaded("hot", 0.8), cpu=0.1, memory=0.1), 0.4)
    regular = node_load("n", same["metadata"]["annotations"], ARGS, WHEN, regular=True)
    assert regular.readings["cpu_usage_avg_5m"].usage == pytest.approx(0.4)
    assert regular.readings["mem_usage_max_avg_1h"].usage == pytest.approx(0.4)
    assert Setup(same).place(pod("regular", cpu="500m")) == "hot"
    decide = Decide(ARGS, WHEN)
    verdict = filter_nodes(parse_args(extender_request(pod("regular", cpu="500m"), same)), decide)
    assert [n["metadata"]["name"] for n in verdict["Nodes"]["items"]] == ["hot"]

    other = with_shares(with_batch_usage(loaded("hot", 0.8), cpu=0.1, memory=0.1), 0.4, age=11)
    reading = node_load("n", other["metadata"]["annotations"], ARGS, WHEN, regular=True)
    assert reading.readings["cpu_usage_avg_5m"].usage == pytest.approx(0.8)
    assert reading.batch_state[batch_metric_key("cpu_usage_avg_5m")] == "stale"
    refused = Setup(other).place(pod("regular", cpu="500m"))
    assert isinstance(refused, Diagnosis) and "cpu_usage_avg_5m above 0.65" in refused.message
    verdict = filter_nodes(parse_args(extender_request(pod("regular", cpu="500m"), other)), decide)
    assert verdict["FailedNodes"] == {"hot": "node(s) had cpu_usage_avg_5m above 0.65"}
