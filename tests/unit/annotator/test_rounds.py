"""A metric round with stand-in Prometheus and API server: request counts and what each node receives."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from crane_annotator.matching import NodeAddresses
from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.rounds import MetricRounds, MetricSpec
from crane_annotator.writer import PatchReport
from crane_shared.prometheus import PrometheusError, QueryResult, Series
from tests.support.annotator import RecordingPatcher

NODES = {f"n{i}": NodeAddresses(f"n{i}", (f"10.0.0.{i}",)) for i in range(1, 201)}
SPECS = [
    MetricSpec("cpu_usage_avg_5m", "cpu_usage_avg_5m", 180),
    MetricSpec("mem_usage_avg_5m", "mem_usage_avg_5m", 180),
    MetricSpec("instance:cpu:max_1h", "instance_cpu_max_1h", 900),
]


class FakePrometheus:
    def __init__(self, answers: Mapping[str, list[Series] | PrometheusError]) -> None:
        self.answers = answers
        self.queries: list[str] = []

    async def query(self, promql: str) -> QueryResult:
        self.queries.append(promql)
        answer = self.answers[promql]
        if isinstance(answer, PrometheusError):
            raise answer
        return QueryResult(answer, 1)


def series(metric: str, value: float, nodes: Mapping[str, NodeAddresses] = NODES) -> list[Series]:
    return [Series({"__name__": metric, "instance": f"{a.internal_ips[0]}:9100"}, str(value)) for a in nodes.values()]


def make_rounds(answers: Mapping[str, list[Series] | PrometheusError]):
    registry = CollectorRegistry()
    prom, patcher = FakePrometheus(answers), RecordingPatcher()
    rounds = MetricRounds(
        SPECS,
        prom,
        lambda: NODES,
        patcher,
        AnnotatorMetrics(registry),
        hot=lambda node: {"node_hot_value": f"1,{node}"},
    )
    return rounds, prom, patcher, registry


async def test_one_query_per_metric_and_one_patch_per_node_carrying_all_due_metrics_and_hot() -> None:
    answers = {s.name: series(s.name, 40.0 + i) for i, s in enumerate(SPECS)}
    rounds, prom, patcher, registry = make_rounds(answers)
    report = await rounds.run_round([s.name for s in SPECS])
    assert sorted(prom.queries) == sorted(s.name for s in SPECS)
    assert report.queries == 3 and report.patches.sent == len(NODES)
    assert all(len(patches) == 1 for patches in patcher.sent.values())
    patch = patcher.sent["n7"][0]
    assert set(patch) == {"cpu_usage_avg_5m", "mem_usage_avg_5m", "instance_cpu_max_1h", "node_hot_value"}
    assert patch["mem_usage_avg_5m"].startswith("0.41000,")
    assert registry.get_sample_value("crane_annotator_round_queries", {"period": "3m"}) == 3
    assert registry.get_sample_value("crane_annotator_round_patches", {"period": "15m"}) == 200
    assert registry.get_sample_value("crane_annotator_nodes_matched", {"metric": "cpu_usage_avg_5m"}) == 200


async def test_a_failed_metric_is_not_written_and_the_others_are() -> None:
    answers: dict[str, list[Series] | PrometheusError] = {s.name: series(s.name, 10.0) for s in SPECS}
    answers["mem_usage_avg_5m"] = PrometheusError("timeout", "slow", attempts=3)
    rounds, _, patcher, registry = make_rounds(answers)
    report = await rounds.run_round([s.name for s in SPECS])
    assert report.failed == ["mem_usage_avg_5m"] and report.queries == 5
    assert "mem_usage_avg_5m" not in patcher.sent["n1"][0]
    assert (
        registry.get_sample_value(
            "crane_annotator_prometheus_errors_total", {"metric": "mem_usage_avg_5m", "kind": "timeout"}
        )
        == 3
    )
    assert registry.get_sample_value("crane_annotator_prometheus_up") == 0


async def test_prometheus_down_means_no_metric_patches_at_all() -> None:
    down = PrometheusError("connection", "refused", attempts=1)
    rounds, _, patcher, _ = make_rounds({s.name: down for s in SPECS})
    report = await rounds.run_round([s.name for s in SPECS])
    assert report.failed == [s.name for s in SPECS] and patcher.sent == {}


async def test_refused_values_and_unmatched_nodes_are_counted_and_logged_once() -> None:
    half = dict(list(NODES.items())[:100])
    cpu = [*series("cpu_usage_avg_5m", 50.0, half), Series({"instance": "ghost:9100"}, "1")]
    cpu[0] = Series(cpu[0].labels, "NaN")
    answers = {"cpu_usage_avg_5m": cpu, "mem_usage_avg_5m": [], "instance:cpu:max_1h": series("x", 1.0)}
    rounds, _, patcher, registry = make_rounds(answers)
    with capture_logs() as logs:
        await rounds.run_round([s.name for s in SPECS])
        await rounds.run_round([s.name for s in SPECS])
    assert "cpu_usage_avg_5m" not in patcher.sent["n1"][0]  # NaN: refused
    assert patcher.sent["n2"][0]["cpu_usage_avg_5m"].startswith("0.50000,")
    assert "cpu_usage_avg_5m" not in patcher.sent["n150"][0]
    assert (
        registry.get_sample_value(
            "crane_annotator_values_dropped_total", {"metric": "cpu_usage_avg_5m", "reason": "non-finite"}
        )
        == 2
    )
    assert registry.get_sample_value("crane_annotator_nodes_unmatched", {"metric": "cpu_usage_avg_5m"}) == 100
    assert registry.get_sample_value("crane_annotator_series_unmatched", {"metric": "cpu_usage_avg_5m"}) == 1
    unmatched = [e for e in logs if e.get("kind") == "unmatched-nodes"]
    assert len(unmatched) == 1
    assert unmatched[0]["unmatched_count"] == 100 and unmatched[0]["instance_labels_seen"] == ["ghost:9100"]
    assert [e["metric"] for e in logs if str(e.get("kind", "")).startswith("no-series")] == ["mem_usage_avg_5m"]


async def test_hot_values_are_counted_while_the_queries_are_out_and_before_the_first_patch() -> None:
    answers = {s.name: series(s.name, 10.0) for s in SPECS}
    counted = asyncio.Event()
    order: list[str] = []

    class SlowPrometheus(FakePrometheus):
        async def query(self, promql: str) -> QueryResult:
            await counted.wait()  # answers only once the hot values were counted: they must not wait for us
            return await super().query(promql)

    class Patcher(RecordingPatcher):
        async def patch_many(self, patches: Mapping[str, Mapping[str, str]], **kw: Any) -> PatchReport:
            order.append("patch")
            return await super().patch_many(patches, **kw)

    async def refresh_hot(nodes: Sequence[str]) -> None:
        order.append(f"hot {len(nodes)}")
        await asyncio.sleep(0)
        counted.set()

    rounds = MetricRounds(
        SPECS,
        SlowPrometheus(answers),
        lambda: NODES,
        Patcher(),
        AnnotatorMetrics(CollectorRegistry()),
        refresh_hot=refresh_hot,
    )
    report = await asyncio.wait_for(rounds.run_round([s.name for s in SPECS]), 5)
    assert report.patches.sent == len(NODES)
    assert order == [f"hot {len(NODES)}", "patch"]


async def test_a_metric_that_matched_no_node_is_retried_soon_like_a_failed_one() -> None:
    down = PrometheusError("connection", "refused", attempts=1)
    rounds, _, _, _ = make_rounds(
        {
            "cpu_usage_avg_5m": series("cpu_usage_avg_5m", 0.5),
            "mem_usage_avg_5m": [],  # recording rule not evaluated yet
            "instance:cpu:max_1h": down,
        }
    )
    report = await rounds.run_round([s.name for s in SPECS])
    synced, retried = report.outcome()
    assert synced == ["cpu_usage_avg_5m"]
    assert sorted(retried) == ["instance:cpu:max_1h", "mem_usage_avg_5m"]


async def test_run_writes_a_first_round_then_returns_when_stopping_is_set() -> None:
    """The worker contract: ``run(stopping)`` starts with every metric due, then waits for the next due time
    (minutes away here) and returns as soon as ``stopping`` is set."""
    rounds, prom, patcher, _ = make_rounds({s.name: series(s.name, 20.0) for s in SPECS})
    stopping = asyncio.Event()
    worker = asyncio.create_task(rounds.run(stopping))
    await asyncio.wait_for(rounds.first_round_done.wait(), 5)
    stopping.set()
    await asyncio.wait_for(worker, 5)
    assert sorted(prom.queries) == sorted(s.name for s in SPECS)  # one round: the next is 3 minutes away
    assert len(patcher.sent) == len(NODES)
