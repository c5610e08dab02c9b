"""The annotator against a real API server, a real Prometheus (fleet exporter + backfilled history) and Redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from crane_sandbox.fleet import GI, make_fleet
from crane_shared.annotations import decode
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingRecord
from crane_shared.hotvalue import hot_value
from crane_shared.policy import HotValuePolicy
from crane_shared.redisconn import make_redis
from tests.support.annotator import SELECTOR_KEY, Stack, annotators, peaks
from tests.support.policy import UPSTREAM_METRICS as METRICS
from tests.support.sentinel import SentinelGroup
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

RULES = (HotValuePolicy(timedelta(minutes=5), 5), HotValuePolicy(timedelta(minutes=1), 2))
EXPECTED_MATCH = {"ip": "ip", "ip:port": "ip:port", "name": "name"}


async def held_values(stack: Stack, metric: str, instance: str, seconds: int = 30) -> list[float]:
    """Every raw sample Prometheus holds for the series in the last ``seconds``."""
    query = f'{metric}{{instance="{instance}"}}[{seconds}s]'
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{stack.prometheus.url}/api/v1/query", params={"query": query}) as resp,
    ):
        body = await resp.json()
    return [float(v) for series in body["data"]["result"] for _, v in series["values"]]


def has_all(annotations: dict[str, str]) -> bool:
    return all(m in annotations for m in METRICS) and "node_hot_value" in annotations


async def all_annotated(stack: Stack) -> bool:
    for node in stack.nodes:
        if not has_all(await stack.annotations(node.name)):
            return False
    return True


async def test_every_default_metric_is_annotated_with_the_value_prometheus_holds(
    stack: Stack, start_annotator: Callable[..., Any]
) -> None:
    annotator = await start_annotator()
    await eventually(lambda: all_annotated(stack), what="all nodes annotated")
    now = datetime.now(UTC)
    for i, node in enumerate(stack.nodes):
        annotations = await stack.annotations(node.name)
        for metric in METRICS:
            text = annotations[metric]
            value, stamp = text.split(",")
            held = {f"{v / 100:.5f}" for v in await held_values(stack, metric, node.instance_label)}
            assert value in held, f"{node.name} {metric}={value}, Prometheus held {sorted(held)}"
            assert stamp.endswith("+00:00")
            assert abs((decode(text).timestamp - now).total_seconds()) < 30
        # The history peaks are exact and stable: the 1h and 1d metrics must carry them to the 5th decimal.
        p = peaks(i)
        assert annotations["cpu_usage_max_avg_1h"].startswith(f"{p['cpu_1h'] / 100:.5f},")
        assert annotations["cpu_usage_max_avg_1d"].startswith(f"{p['cpu_1d'] / 100:.5f},")
        assert annotations["mem_usage_max_avg_1h"].startswith(f"{p['mem_1h'] / 100:.5f},")
        assert annotations["mem_usage_max_avg_1d"].startswith(f"{p['mem_1d'] / 100:.5f},")
    # One query per due metric, one patch per node, whatever the number of metrics in the round.
    for period in ("2s", "3s", "4s"):
        queries = await annotator.metric("crane_annotator_round_queries", period=period)
        patches = await annotator.metric("crane_annotator_round_patches", period=period)
        assert queries is not None and 1 <= queries <= len(METRICS)
        assert patches == len(stack.nodes)


async def test_nodes_labelled_by_ip_ipport_and_name_are_all_matched(
    stack: Stack, start_annotator: Callable[..., Any]
) -> None:
    annotator = await start_annotator()
    for node in stack.nodes:

        async def written_by_this_annotator(name: str = node.name) -> Any:
            status, report = await annotator.get(f"/debug/nodes/{name}")
            return report if status == 200 and len(report["written"]) == len(METRICS) + 1 else None

        report = await eventually(written_by_this_annotator, what=f"{node.name} written")
        for metric in METRICS:
            series = report["metrics"][metric]["series"]
            assert series["instance"] == node.instance_label
            assert series["matched_by"] == EXPECTED_MATCH[node.instance_style]
        assert set(report["written"]) == {*METRICS, "node_hot_value"}
        assert {k: v["value"] for k, v in report["on_node"].items()}.keys() == {*METRICS, "node_hot_value"}
    assert {n.instance_style for n in stack.nodes} == {"ip", "ip:port", "name"}
    for metric in METRICS:
        assert await annotator.metric("crane_annotator_nodes_unmatched", metric=metric) == 0
        assert await annotator.metric("crane_annotator_nodes_matched", metric=metric) == len(stack.nodes)
    status, summary = await annotator.get("/debug/nodes")
    assert status == 200 and all(not m["nodes_without_series"] for m in summary["metrics"].values())


async def test_a_node_without_annotations_gets_them(stack: Stack, start_annotator: Callable[..., Any]) -> None:
    newcomer = make_fleet(
        len(stack.nodes) + 1,
        cpu_cores=8,
        memory_bytes=32 * GI,
        instance_styles=("ip", "ip:port", "name"),
        labels={SELECTOR_KEY: stack.label},
        prefix=f"ann-{stack.label}-",
    )[-1]
    await stack.add_node(newcomer)
    assert await stack.annotations(newcomer.name) == {}  # no annotations map at all: an `add` patch would fail
    await start_annotator()  # only now: a running annotator may annotate the node before the check above
    annotations = await eventually(
        lambda: _if(has_all, stack.annotations(newcomer.name)), timeout=30, what="newcomer annotated"
    )
    assert decode(annotations["cpu_usage_avg_5m"]).value == pytest.approx(0.1, abs=0.01)  # its base load


async def _if(check: Callable[[dict[str, str]], bool], annotations: Any) -> dict[str, str] | None:
    value: dict[str, str] = await annotations
    return value if check(value) else None


def records(node: str, times: list[float], tag: str) -> list[BindingRecord]:
    return [
        BindingRecord(f"{tag}-{i}", "default", f"{tag}-{i}", node, t, "crane-scheduler") for i, t in enumerate(times)
    ]


async def test_hot_value_equals_the_formula_and_follows_a_burst_within_a_second(
    stack: Stack, start_annotator: Callable[..., Any], redis: aioredis.Redis
) -> None:
    store = BindingStore(redis)
    warm, bursty, quiet = (n.name for n in stack.nodes[:3])
    now = time.time()
    await store.record(records(warm, [now - 200] * 6 + [now - 10] * 5, "warm"), stream_maxlen=10_000)
    # The periodic refresh runs once at start, then not for a minute: the burst below must come via the stream.
    annotator = await start_annotator("--hot-value-interval", "60s")

    async def hot_of(node: str) -> int | None:
        text = (await stack.annotations(node)).get("node_hot_value")
        return None if text is None else int(decode(text).value)

    counts = await store.count_in_windows([warm, quiet], [r.time_range for r in RULES], time.time())
    expected = {n: hot_value(c, RULES) for n, c in counts.items()}
    assert expected == {warm: 4, quiet: 0}  # floor(11/5) + floor(5/2)
    await eventually(lambda: _equals(hot_of(warm), expected[warm]), what="warm node hot value")
    assert await hot_of(quiet) == 0

    started = time.monotonic()
    await store.record(records(bursty, [time.time()] * 7, "burst"), stream_maxlen=10_000)
    await eventually(lambda: _equals(hot_of(bursty), 1 + 3), timeout=30, interval=0.02, what="burst hot value")
    # through the stream, not the periodic refresh 60 s away: half of it left for a loaded machine
    assert time.monotonic() - started < 30
    assert (await annotator.metric("crane_annotator_binding_notifications_total")) == 7


async def _equals(value: Any, expected: int) -> bool:
    return bool(await value == expected)


async def test_against_redis_sentinel_hot_values_follow_the_promoted_replica(
    stack: Stack, run_dir: Path, namespace: str
) -> None:
    """The annotator with its Sentinel flags: hot values from the primary's records, then, once the primary is
    killed, from bindings written to the promoted replica and announced on its stream."""
    first, second = (n.name for n in stack.nodes[:2])
    async with SentinelGroup(run_dir / f"sentinel-{namespace}", replicas=1) as group:
        redis = make_redis(group.settings())
        store = BindingStore(redis)

        async def hot_of(node: str) -> int | None:
            text = (await stack.annotations(node)).get("node_hot_value")
            return None if text is None else int(decode(text).value)

        async def bound(node: str, count: int) -> bool:
            try:
                await store.record(records(node, [time.time()] * count, node), stream_maxlen=10_000)
            except (aioredis.ConnectionError, aioredis.TimeoutError, aioredis.ReadOnlyError):
                return False  # the failover under way
            return True

        try:
            async with annotators(stack, group.url, namespace, prefix="sentinel") as start:
                # the periodic refresh once at start, then not for a minute: later bindings come via the stream
                await start(*group.flags()[2:], "--hot-value-interval", "60s")
                await bound(first, 4)
                await eventually(lambda: _equals(hot_of(first), 2), timeout=30, what="the first node's hot value")
                assert await redis.wait(1, 5000) == 1  # replicated before the kill
                await group.kill_primary()
                await eventually(lambda: bound(second, 6), timeout=60, interval=0.2, what="a write after the failover")
                await eventually(
                    lambda: _equals(hot_of(second), 1 + 3), timeout=30, what="hot value from the promoted replica"
                )
        finally:
            await redis.aclose()


async def test_two_annotators_one_writes_and_the_standby_takes_over_when_killed(
    stack: Stack, start_annotator: Callable[..., Any]
) -> None:
    lease = ("--lease-duration", "4s", "--renew-deadline", "3s", "--lease-retry-period", "0.5s")
    first = await start_annotator(*lease, name="annotator-a")
    second = await start_annotator(*lease, name="annotator-b")
    await eventually(lambda: _leaders([first, second], 1), what="one leader")
    leader, standby = (first, second) if await first.leadership() == "leader" else (second, first)
    await eventually(lambda: all_annotated(stack), what="all nodes annotated")
    assert await _patches(standby) == 0
    assert await _patches(leader) > 0

    await leader.process.kill()
    killed_at = time.monotonic()
    killed_wall = datetime.now(UTC)
    await eventually(lambda: _is_leader(standby), timeout=60, interval=0.1, what="standby takes over")
    # once the 4 s lease expired (killed: not released), at a 0.5 s retry; 30 s of slack for a loaded machine
    assert time.monotonic() - killed_at < 4 + 30

    async def fresh_after_kill() -> bool:
        for node in stack.nodes:
            text = (await stack.annotations(node.name))["cpu_usage_avg_5m"]
            if decode(text).timestamp <= killed_wall + timedelta(seconds=1):
                return False
        return True

    await eventually(fresh_after_kill, timeout=60, what="annotations written by the new leader")
    assert await _patches(standby) > 0


async def _leaders(procs: list[Any], count: int) -> bool:
    return [await p.leadership() for p in procs].count("leader") == count


async def _is_leader(proc: Any) -> bool:
    return bool(await proc.leadership() == "leader")


async def _patches(proc: Any) -> float:
    metrics = await proc.metrics()
    return float(sum(v for (name, _), v in metrics.items() if name == "crane_annotator_patches_total"))
