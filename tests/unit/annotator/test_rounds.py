"""A metric round with stand-in Prometheus and API server: request counts and what each node receives."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from crane_annotator.batchround import BatchCapacity
from crane_annotator.matching import NodeAddresses, Series
from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.pods import PodCache
from crane_annotator.rounds import MetricRounds, MetricSpec
from crane_annotator.writer import PatchReport
from crane_shared.batch import batch_metric_key
from crane_shared.prometheus import PrometheusError, QueryResult
from crane_shared.reclaimpolicy import ReclaimPolicy
from tests.support.annotator import RecordingPatcher

NODES = {f"n{i}": NodeAddresses(f"n{i}", (f"10.0.0.{i}",)) for i in range(1, 201)}
SPECS = [
    MetricSpec("cpu_usage_avg_5m", "cpu_usage_avg_5m", 180),
    MetricSpec("mem_usage_avg_5m", "mem_usage_avg_5m", 180),
    MetricSpec("instance:cpu:max_1h", "instance_cpu_max_1h", 900),
]


class FakePrometheus:
    def __init__(self, answers: Mapping[str, list[Series] | PrometheusError | QueryResult]) -> None:
        self.answers = answers
        self.queries: list[str] = []

    async def query(self, promql: str) -> QueryResult:
        self.queries.append(promql)
        answer = self.answers[promql]
        if isinstance(answer, PrometheusError):
            raise answer
        return answer if isinstance(answer, QueryResult) else QueryResult(answer, 1)


def series(metric: str, value: float, nodes: Mapping[str, NodeAddresses] = NODES) -> list[Series]:
    return [Series({"__name__": metric, "instance": f"{a.internal_ips[0]}:9100"}, str(value)) for a in nodes.values()]


def make_rounds(answers: Mapping[str, list[Series] | PrometheusError | QueryResult], **options: Any):
    registry = CollectorRegistry()
    prom, patcher = FakePrometheus(answers), RecordingPatcher()
    rounds = MetricRounds(
        SPECS,
        prom,
        lambda: NODES,
        patcher,
        AnnotatorMetrics(registry),
        hot=lambda node: {"node_hot_value": f"1,{node}"},
        **options,
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


THANOS_STORE_DOWN = ("receive 127.0.0.1:10901: rpc error: code = Unavailable",)


def partial_answers(value: float) -> dict[str, list[Series] | PrometheusError | QueryResult]:
    """cpu: a partial answer missing half the nodes (a store down); the others complete."""
    half = dict(list(NODES.items())[:100])
    answers: dict[str, list[Series] | PrometheusError | QueryResult] = {s.name: series(s.name, 10.0) for s in SPECS}
    answers["cpu_usage_avg_5m"] = QueryResult(series("cpu_usage_avg_5m", value, half), 1, THANOS_STORE_DOWN, (), True)
    return answers


async def test_a_rejected_partial_answer_updates_no_node_and_the_metric_is_retried_soon() -> None:
    rounds, _, patcher, registry = make_rounds(partial_answers(70.0))
    with capture_logs() as logs:
        report = await rounds.run_round([s.name for s in SPECS])
    assert all("cpu_usage_avg_5m" not in patches[0] for patches in patcher.sent.values())
    assert "mem_usage_avg_5m" in patcher.sent["n1"][0]
    assert report.outcome()[1] == ["cpu_usage_avg_5m"]
    labels = {"metric": "cpu_usage_avg_5m", "handling": "rejected"}
    assert registry.get_sample_value("crane_annotator_prometheus_partial_responses_total", labels) == 1
    assert (
        registry.get_sample_value(
            "crane_annotator_prometheus_warnings_total", {"metric": "cpu_usage_avg_5m", "kind": "warning"}
        )
        == 1
    )
    assert [e["warnings"] for e in logs if e.get("kind") == "partial-cpu_usage_avg_5m"] == [THANOS_STORE_DOWN]


async def test_an_accepted_partial_answer_updates_the_nodes_in_it_and_leaves_the_others_alone() -> None:
    rounds, _, patcher, registry = make_rounds(partial_answers(70.0), partial_response="accept")
    report = await rounds.run_round([s.name for s in SPECS])
    assert patcher.sent["n1"][0]["cpu_usage_avg_5m"].startswith("0.70000,")
    assert "cpu_usage_avg_5m" not in patcher.sent["n150"][0]  # not erased: its last good value stays
    assert report.succeeded == [s.name for s in SPECS]
    labels = {"metric": "cpu_usage_avg_5m", "handling": "accepted"}
    assert registry.get_sample_value("crane_annotator_prometheus_partial_responses_total", labels) == 1


async def test_query_annotations_are_counted_but_do_not_make_an_answer_partial() -> None:
    answers: dict[str, list[Series] | PrometheusError | QueryResult] = {s.name: series(s.name, 10.0) for s in SPECS}
    answers["mem_usage_avg_5m"] = QueryResult(
        series("mem_usage_avg_5m", 20.0), 1, (), ("PromQL info: metric might not be a counter",), False
    )
    rounds, _, patcher, registry = make_rounds(answers)
    await rounds.run_round([s.name for s in SPECS])
    assert patcher.sent["n1"][0]["mem_usage_avg_5m"].startswith("0.20000,")
    assert (
        registry.get_sample_value(
            "crane_annotator_prometheus_warnings_total", {"metric": "mem_usage_avg_5m", "kind": "info"}
        )
        == 1
    )


async def test_several_series_for_one_node_are_resolved_the_same_way_whatever_their_order_and_counted() -> None:
    replicas = [
        *series("cpu_usage_avg_5m", 30.0),
        *(Series({**s.labels, "replica": "b"}, "31") for s in series("cpu_usage_avg_5m", 0)[:5]),
    ]
    written = []
    for answer in (replicas, replicas[::-1]):
        answers: dict[str, list[Series] | PrometheusError | QueryResult] = {s.name: series(s.name, 1.0) for s in SPECS}
        answers["cpu_usage_avg_5m"] = answer
        rounds, _, patcher, registry = make_rounds(answers)
        with capture_logs() as logs:
            await rounds.run_round(["cpu_usage_avg_5m"])
        written.append({n: p[0]["cpu_usage_avg_5m"].split(",")[0] for n, p in patcher.sent.items()})
        assert (
            registry.get_sample_value("crane_annotator_nodes_with_several_series", {"metric": "cpu_usage_avg_5m"}) == 5
        )
        assert [e["nodes"] for e in logs if e.get("kind") == "several-series-cpu_usage_avg_5m"] == [5]
    assert written[0] == written[1] and written[0]["n1"] == "0.31000" and written[0]["n6"] == "0.30000"


async def test_values_are_stamped_as_old_as_the_backend_latency_offset_makes_them() -> None:
    answers = {s.name: series(s.name, 10.0) for s in SPECS}
    rounds, _, patcher, _ = make_rounds(answers, latency_offset=30.0, wall_clock=lambda: 1_800_000_000.0)
    await rounds.run_round(["cpu_usage_avg_5m"])
    assert patcher.sent["n1"][0]["cpu_usage_avg_5m"] == "0.10000,2027-01-15T07:59:30+00:00"


class EmptyForOthers(FakePrometheus):
    """Answers the named queries; any other (the pods' usage) with no series."""

    async def query(self, promql: str) -> QueryResult:
        if promql in self.answers:
            return await super().query(promql)
        self.queries.append(promql)
        return QueryResult([], 1)


async def test_a_metrics_batch_share_rides_on_its_patch_with_its_timestamp_and_only_where_the_metric_has_one() -> None:
    policy = ReclaimPolicy(batch_metrics=(("cpu_usage_avg_5m", "batch_cpu"), ("mem_usage_avg_5m", "batch_mem")))
    half = dict(list(NODES.items())[:100])
    answers: dict[str, list[Series] | PrometheusError | QueryResult] = {s.name: series(s.name, 60.0) for s in SPECS}
    answers["batch_mem"] = series("batch_mem", 25.0, half)
    answers["batch_cpu"] = PrometheusError("timeout", "slow", attempts=1)
    prom, patcher = EmptyForOthers(answers), RecordingPatcher()
    metrics = AnnotatorMetrics(CollectorRegistry())
    writes: list[str] = []

    async def patch_status(node: str, body: Mapping[str, object]) -> Any:
        writes.append(node)
        return "ok"

    batch = BatchCapacity(policy, prom, dict, PodCache(client.ApiClient()), patch_status, metrics)
    rounds = MetricRounds(SPECS, prom, lambda: NODES, patcher, metrics, batch=batch)
    report = await rounds.run_round(["cpu_usage_avg_5m", "mem_usage_avg_5m"])
    assert report.failed == [] and {"batch_mem", "batch_cpu"} <= set(prom.queries)
    patch = patcher.sent["n7"][0]
    mem_stamp = patch["mem_usage_avg_5m"].split(",")[1]
    assert patch[batch_metric_key("mem_usage_avg_5m")] == f"0.25000,{mem_stamp}"
    assert batch_metric_key("cpu_usage_avg_5m") not in patch, "its query failed: nothing to pair with the metric"
    assert batch_metric_key("mem_usage_avg_5m") not in patcher.sent["n150"][0], "no share in the answer"
    # the metric failing, its share is not written either (it would pair with the older metric)
    answers["mem_usage_avg_5m"] = PrometheusError("timeout", "slow", attempts=1)
    await rounds.run_round(["cpu_usage_avg_5m", "mem_usage_avg_5m"])
    assert len(patcher.sent["n7"]) == 2 and "cpu_usage_avg_5m" in patcher.sent["n7"][1]
    assert batch_metric_key("mem_usage_avg_5m") not in patcher.sent["n7"][1]
