"""The annotator on Thanos Query over an HA pair of Prometheus replicas with sidecars (thanos from its pinned Go
module: ``scripts/tools thanos``), against the stack's plain Prometheus on the same exporter.

Deduplicated, Thanos gives the annotations Prometheus gives; without ``dedup`` each node has two series and the
choice between them is counted and deterministic. With one replica's Prometheus killed, Thanos answers with the
other's data plus a warning: rejected, nothing is updated and nothing erased; asked for no partial answers
(``--prometheus-deny-partial-response``), Thanos fails the query; accepted, the values are updated from the
surviving replica and still equal Prometheus's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio

from crane_sandbox.prometheus import PrometheusServer, backfill
from crane_sandbox.thanos import REPLICA_LABEL, Query, Sidecar
from tests.support.annotator import Stack, history
from tests.support.policy import UPSTREAM_METRICS as METRICS
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


class Pair:
    def __init__(self, query: Query, replicas: list[PrometheusServer]) -> None:
        self.query, self.replicas = query, replicas


@pytest_asyncio.fixture(scope="module")
async def pair(stack: Stack) -> AsyncIterator[Pair]:
    end = time.time() - 60
    replicas = []
    for name in ("a", "b"):
        data = stack.run_dir / f"prometheus-{name}-data"
        await backfill(data, history(stack.nodes, end), work_dir=stack.run_dir / f"backfill-{name}")
        replicas.append(
            PrometheusServer(
                stack.run_dir,
                stack.exporter.targets(),
                rules="fast",
                data_dir=data,
                external_labels={REPLICA_LABEL: name},
                name=f"prometheus-{name}",
            )
        )
    async with contextlib.AsyncExitStack() as exits:
        for replica in replicas:
            await exits.enter_async_context(replica)
        # Each replica is ready before its sidecar starts, so the sidecars' first check passes at once. Their
        # heartbeat is then slower than the module: a stopped replica's sidecar stays in Query's fan-out and its
        # errors make every answer partial for as long as the last test needs (with the default 30 s, Query drops
        # it within a minute and answers from the other replica alone, no longer partially).
        sidecars = [
            Sidecar(stack.run_dir, n, r.url, r.data_dir, heartbeat="1h") for n, r in zip("ab", replicas, strict=True)
        ]
        for sidecar in sidecars:
            await exits.enter_async_context(sidecar)
        query = await exits.enter_async_context(Query(stack.run_dir, [s.grpc for s in sidecars]))
        for replica in replicas:  # live rule output, not only the backfilled history, for every node
            for metric in ("cpu_usage_avg_5m", "mem_usage_avg_5m"):
                await replica.wait_for(
                    f"count(count_over_time({metric}[3s]) >= 2)",
                    lambda r: bool(r) and r[0].value == len(stack.nodes),
                    timeout=60,
                )
        yield Pair(query, replicas)


def assert_equal(ours: dict[str, dict[str, float]], reference: dict[str, dict[str, float]]) -> None:
    worst = max((abs(ours[n][m] - reference[n][m]), n, m) for n in reference for m in METRICS)
    assert worst[0] <= 0.001, f"Thanos and Prometheus differ most on {worst[1:]}: {worst[0]:.5f}"


async def annotate(stack: Stack, start: Callable[..., Any], *flags: str) -> tuple[Any, dict[str, dict[str, float]]]:
    since = datetime.now(UTC)
    annotator = await start(*flags)
    values = await eventually(lambda: stack.fresh_values(since), timeout=90, what=f"annotated with {flags}")
    return annotator, values


async def test_thanos_over_two_replicas_gives_prometheus_annotations_with_and_without_dedup(
    stack: Stack, pair: Pair, start_annotator: Callable[..., Any]
) -> None:
    reference_annotator, reference = await annotate(stack, start_annotator)
    await reference_annotator.stop()
    deduplicated, values = await annotate(stack, start_annotator, "--prometheus-url", pair.query.url)
    assert_equal(values, reference)
    assert await deduplicated.metric("crane_annotator_nodes_with_several_series", metric=METRICS[0]) == 0
    await deduplicated.stop()
    both, values = await annotate(
        stack, start_annotator, "--prometheus-url", pair.query.url, "--prometheus-query-param", "dedup=false"
    )
    assert_equal(values, reference)  # one series per replica: the same value, either choice is right
    several = await both.metric("crane_annotator_nodes_with_several_series", metric=METRICS[0])
    assert several == len(stack.nodes)


async def _errors(annotator: Any) -> dict[str, float]:
    """The annotator's failed queries of the first metric, by kind (the retried ones aside)."""
    metrics = await annotator.metrics()
    return {
        dict(labels)["kind"]: value
        for (name, labels), value in metrics.items()
        if name == "crane_annotator_prometheus_errors_total"
        and dict(labels).get("metric") == METRICS[0]
        and dict(labels)["kind"] != "retried"
        and value > 0
    }


async def test_a_replica_down_is_a_partial_answer_rejected_or_accepted_as_configured(
    stack: Stack, pair: Pair, start_annotator: Callable[..., Any]
) -> None:
    """Last test of the module: replica b's Prometheus stays down."""
    reference_annotator, reference = await annotate(stack, start_annotator)
    await reference_annotator.stop()
    await pair.replicas[1].stop()  # its sidecar keeps running and fails every query it gets
    since = datetime.now(UTC)
    rejecting = await start_annotator("--prometheus-url", pair.query.url, "--prometheus-retries", "0")
    await eventually(
        lambda: rejecting.metric(
            "crane_annotator_prometheus_partial_responses_total", metric=METRICS[0], handling="rejected"
        ),
        timeout=60,
        what="a rejected partial answer",
    )
    assert await stack.fresh_values(since) is None  # nothing updated...
    for node in stack.nodes:  # ...and nothing erased
        annotations = await stack.annotations(node.name)
        assert all(m in annotations for m in METRICS)
    await rejecting.stop()
    denying = await start_annotator(
        "--prometheus-url", pair.query.url, "--prometheus-retries", "0", "--prometheus-deny-partial-response"
    )  # partial_response=false: Thanos fails the query itself
    errors = await eventually(lambda: _errors(denying), timeout=60, what="a query Thanos refused")
    assert (
        await denying.metric(
            "crane_annotator_prometheus_partial_responses_total", metric=METRICS[0], handling="rejected"
        )
        is None
    ), f"Thanos answered partially although asked not to; errors {errors}"
    assert await stack.fresh_values(since) is None
    await denying.stop()
    accepting, values = await annotate(
        stack, start_annotator, "--prometheus-url", pair.query.url, "--prometheus-partial-response", "accept"
    )
    assert_equal(values, reference)
    accepted = await accepting.metric(
        "crane_annotator_prometheus_partial_responses_total", metric=METRICS[0], handling="accepted"
    )
    assert accepted is not None and accepted >= 1
