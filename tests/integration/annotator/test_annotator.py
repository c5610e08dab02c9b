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
import yaml
from kubernetes_asyncio import client

from crane_sandbox.fleet import GI, make_fleet
from crane_shared.annotations import decode, encode_usage
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingRecord
from crane_shared.hotvalue import hot_value
from crane_shared.kube import raw_json
from crane_shared.loadtaintpolicy import TAINT_KEY
from crane_shared.policy import HotValuePolicy
from crane_shared.redisconn import make_redis
from tests.support.annotator import SELECTOR_KEY, TEST_POLICY, Stack, annotators, peaks
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
            # "on_node" is the node as the annotator's watch shows it: it may lag the write by an event
            status, report = await annotator.get(f"/debug/nodes/{name}")
            done = status == 200 and len(report["written"]) == len(METRICS) + 1
            return report if done and len(report["on_node"]) == len(METRICS) + 1 else None

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


# --- the load taint (spec.loadTaint) --------------------------------------------------------------------------


class Samples:
    """Load samples written on nodes no series matches (so no round overwrites them), as the annotator writes them:
    each one stamped at least a second after the last (a new sample for the debounce)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.last: dict[str, datetime] = {}

    async def write(self, node: str, cpu: float, age: float = 0.0) -> datetime:
        stamp = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=age)
        if node in self.last:
            stamp = max(stamp, self.last[node] + timedelta(seconds=1))
        self.last[node] = stamp
        body = {"metadata": {"annotations": {"cpu_usage_avg_5m": encode_usage(cpu, stamp)}}}
        await client.CoreV1Api(self.stack.kube).patch_node(node, body, _content_type="application/merge-patch+json")
        return stamp


async def load_taint(stack: Stack, node: str) -> dict[str, Any] | None:
    raw = await raw_json(client.CoreV1Api(stack.kube).read_node(node, _preload_content=False))
    return next((t for t in raw["spec"].get("taints") or [] if t["key"] == TAINT_KEY), None)


async def node_events(stack: Stack, node: str) -> list[str]:
    raw = await raw_json(
        client.EventsV1Api(stack.kube).list_namespaced_event(
            "default", field_selector=f"regarding.name={node}", _preload_content=False
        )
    )
    return [e["reason"] for e in raw["items"] if e.get("reportingController") == "crane-annotator"]


async def test_the_load_taint_follows_the_debounce_and_is_never_set_on_stale_data_and_lifted_when_data_goes_stale(
    stack: Stack, start_annotator: Callable[..., Any], tmp_path: Path
) -> None:
    policy = yaml.safe_load(TEST_POLICY)
    policy["spec"]["loadTaint"] = {"hotRounds": 2, "coolRounds": 2, "maxDataAge": "8s"}
    path = tmp_path / "taint-policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    a, b = f"lt-{stack.label}-a", f"lt-{stack.label}-b"
    v1 = client.CoreV1Api(stack.kube)
    for name in (a, b):  # selected by the annotator, matched by no series
        await v1.create_node({"metadata": {"name": name, "labels": {SELECTOR_KEY: stack.label}}})
    try:
        annotator = await start_annotator("--policy", str(path), "--load-taint-interval", "0.5s")
        await eventually(lambda: annotator.leadership_or_unreachable(), what="up")
        samples = Samples(stack)

        async def counted(node: str, stamp: datetime) -> dict[str, Any]:
            """The leader's debug view of the first evaluation after its informer held the sample ``stamp``
            (an evaluation reads the informer and records its readings without yielding: no earlier one can
            finish after it)."""
            iso = stamp.isoformat(timespec="seconds")

            async def holding() -> int | None:
                _, body = await annotator.get(f"/debug/nodes/{node}")
                on_node = (body or {}).get("on_node", {}).get("cpu_usage_avg_5m", {})
                report = (body or {}).get("load_taint") or {}
                return report.get("evaluation", 0) if on_node.get("timestamp") == iso else None

            seen = await eventually(holding, timeout=15, what=f"{node}'s sample of {iso} in the leader's informer")

            async def judged() -> dict[str, Any] | None:
                _, body = await annotator.get(f"/debug/nodes/{node}")
                report = (body or {}).get("load_taint") or {}
                return report if report.get("evaluation", 0) > seen else None

            return await eventually(judged, timeout=15, what=f"{node}'s sample of {iso} judged")

        # K = 2 hot samples: one is not enough, the second taints
        report = await counted(a, await samples.write(a, 0.9))
        assert (report["hot"], report["streak"], report["confirmed_hot"]) == (True, 1, False)
        assert await load_taint(stack, a) is None
        await samples.write(a, 0.9)  # the annotator writes one sample per sync period; judged in turn
        taint = await eventually(lambda: load_taint(stack, a), timeout=15, what="a tainted after 2 hot samples")
        assert taint == {"key": TAINT_KEY, "value": "cpu_usage_avg_5m", "effect": "NoSchedule"}
        # M = 2 cool samples: one keeps it, the second lifts it
        report = await counted(a, await samples.write(a, 0.2))
        assert (report["hot"], report["streak"], report["confirmed_hot"]) == (False, 1, True)
        assert await load_taint(stack, a) is not None
        await samples.write(a, 0.2)
        await eventually(lambda: _untainted(stack, a), timeout=15, what="a lifted after 2 cool samples")
        events = await eventually(lambda: _both(stack, a), what="an Event per change on a")
        assert events == ["LoadTaintAdded", "LoadTaintRemoved"]

        # never set on stale data: hot samples older than maxDataAge are not judged
        for age in (30, 29):
            report = await counted(b, await samples.write(b, 0.95, age=age))
            assert report["hot"] is None and "older than maxDataAge" in report["problem"]
        assert await load_taint(stack, b) is None
        # lifted when the data goes stale: tainted, then no new sample
        await counted(b, await samples.write(b, 0.95))  # each sample judged before the next replaces it
        last = await samples.write(b, 0.95)
        await eventually(lambda: load_taint(stack, b), timeout=15, what="b tainted")
        await eventually(lambda: _untainted(stack, b), timeout=20, what="b lifted once its data is stale")
        lifted_at = datetime.now(UTC)
        assert lifted_at - last >= timedelta(seconds=8), "lifted before its data was older than maxDataAge"
        assert (
            await annotator.metric(
                "crane_annotator_load_taint_changes_total", change="lifted", reason="stale", outcome="ok"
            )
            == 1
        )
        for node in stack.nodes:  # the fleet's nodes, fresh and cool, were never touched
            assert await load_taint(stack, node.name) is None

        # a tainted node relabelled out of the annotator's --node-selector: nothing judges it any more, lifted
        await counted(a, await samples.write(a, 0.9))
        await samples.write(a, 0.9)
        await eventually(lambda: load_taint(stack, a), timeout=15, what="a tainted again")
        unselect = {"metadata": {"labels": {SELECTOR_KEY: None}}}
        await v1.patch_node(a, unselect, _content_type="application/merge-patch+json")
        await eventually(lambda: _untainted(stack, a), timeout=15, what="a lifted once out of the annotator's view")
        lifted = {"change": "lifted", "reason": "unwatched", "outcome": "ok"}
        assert await annotator.metric("crane_annotator_load_taint_changes_total", **lifted) == 1
    finally:
        for name in (a, b):
            await v1.delete_node(name)


async def _untainted(stack: Stack, node: str) -> bool:
    return await load_taint(stack, node) is None


async def _both(stack: Stack, node: str) -> list[str] | None:
    reasons = sorted(await node_events(stack, node))
    return reasons if len(reasons) >= 2 else None
