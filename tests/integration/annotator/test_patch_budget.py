"""The annotator's patch budget, counted by the API server itself (``apiserver_request_total`` at /metrics).

A fleet of its own (more nodes than the shared stack, all metrics on one short period so a period is one round),
scraped by a real Prometheus; annotators run as child processes with their real command line.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from bench.annotator.budget import node_patches
from crane_sandbox.cluster import LocalCluster
from crane_sandbox.fleet import make_fleet
from crane_shared.annotations import HOT_VALUE_KEY, decode
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingRecord
from tests.support.annotator import SELECTOR_KEY, AnnotatorProc, Stack, annotators, running_stack
from tests.support.policy import UPSTREAM_METRICS as METRICS
from tests.support.policy import fast_policy
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

N = 30
PERIOD = 4  # seconds; every metric, so each period is exactly one round
POLICY = fast_policy(dict.fromkeys(METRICS, f"{PERIOD}s"))


@pytest_asyncio.fixture(scope="module")
async def fleet_stack(cluster: LocalCluster, kube: client.ApiClient, run_dir: Path) -> AsyncIterator[Stack]:
    label = f"budget{int(time.time()) % 100000}"
    run_dir = run_dir / f"annotator-{label}"
    fleet = make_fleet(N, labels={SELECTOR_KEY: label}, prefix=f"bud-{label}-", instance_styles=("ip", "ip:port"))
    async with running_stack(kube, cluster, run_dir, label, fleet, POLICY, shard_size=16) as stack:
        for metric in METRICS:  # every metric has a series for every node before any annotator starts
            await stack.prometheus.wait_for(f"count({metric})", lambda r: bool(r) and r[0].value == N, timeout=90)
        yield stack


@pytest_asyncio.fixture
async def start(fleet_stack: Stack, redis_url: str, namespace: str) -> AsyncIterator[Callable[..., Any]]:
    async with annotators(fleet_stack, redis_url, namespace, prefix="budget") as start:
        yield start


async def rounds_done(annotator: AnnotatorProc) -> int:
    return int(await annotator.metric("crane_annotator_round_duration_seconds_count", period=f"{PERIOD}s") or 0)


async def strip_annotations(stack: Stack) -> None:
    """Nodes as new: no load or hot-value annotations (so nothing seeds what the annotator thinks is written)."""
    body = {"metadata": {"annotations": dict.fromkeys([*METRICS, HOT_VALUE_KEY])}}
    core = client.CoreV1Api(stack.kube)
    for node in stack.nodes:
        await core.patch_node(node.name, body, _content_type="application/merge-patch+json")


async def hot_annotation(stack: Stack, node: str) -> tuple[int, float] | None:
    text = (await stack.annotations(node)).get(HOT_VALUE_KEY)
    if text is None:
        return None
    sample = decode(text)
    return int(sample.value), sample.timestamp.timestamp()


async def test_with_no_bindings_each_node_gets_exactly_one_patch_per_period(
    fleet_stack: Stack, start: Callable[..., Any]
) -> None:
    # The hot-value pass runs 8 times per period, and --hot-value-max-age is shorter than the period (as 2m is
    # than the default 3m): neither may add a patch when nothing changes.
    annotator = await start("--hot-value-interval", "0.5s", "--hot-value-max-age", "2s")
    await eventually(lambda: rounds_done(annotator), timeout=30, interval=0.05, what="first round")
    done = await rounds_done(annotator)
    before = await node_patches(fleet_stack.cluster)
    started = time.time()
    await eventually(
        lambda: _at_least(rounds_done(annotator), done + 2), timeout=4 * PERIOD, interval=0.05, what="two rounds"
    )
    patched = await node_patches(fleet_stack.cluster) - before
    assert patched == 2 * N, f"{patched} node patches in two {PERIOD}s periods at {N} nodes"
    for node in fleet_stack.nodes:  # and each node got its own: every annotation was rewritten
        stamp = decode((await fleet_stack.annotations(node.name))["cpu_usage_avg_5m"]).timestamp.timestamp()
        assert stamp >= int(started)
    hot = await annotator.metric("crane_annotator_patches_total", cause="hot_value", outcome="ok")
    assert not hot


async def test_startup_round_slower_than_the_hot_value_interval_patches_each_node_once(
    fleet_stack: Stack, start: Callable[..., Any], redis: aioredis.Redis
) -> None:
    await strip_annotations(fleet_stack)
    # Some nodes have recent bindings, so their hot value is not 0 and differs from what they carry (nothing).
    now = time.time()
    bound = [n.name for n in fleet_stack.nodes[::5]]
    store = BindingStore(redis)
    records = [
        BindingRecord(f"{node}-{i}", "default", f"{node}-{i}", node, now - 20, "crane-scheduler")
        for node in bound
        for i in range(4)
    ]
    await store.record(records, stream_maxlen=10_000)
    before = await node_patches(fleet_stack.cluster)
    # 4 patches/s, no burst: the first round takes about N / 4 = 7.5 s, 15 hot-value intervals.
    annotator = await start("--hot-value-interval", "0.5s", "--kube-api-qps", "4", "--kube-api-burst", "1")
    started = time.monotonic()
    await eventually(lambda: rounds_done(annotator), timeout=60, interval=0.05, what="first round")
    took = time.monotonic() - started
    assert took > 5, f"the first round took only {took:.1f}s: not slower than the hot-value interval"
    patched = await node_patches(fleet_stack.cluster) - before
    assert patched == N, f"{patched} node patches before the first round completed, {N} nodes"
    for node in fleet_stack.nodes:  # the round carried every node's hot value, the bound ones' included
        hot = await hot_annotation(fleet_stack, node.name)
        assert hot is not None and hot[0] == (2 if node.name in bound else 0), (node.name, hot)


async def test_hot_value_falls_within_a_second_of_the_truth(
    fleet_stack: Stack, start: Callable[..., Any], redis: aioredis.Redis
) -> None:
    node = fleet_stack.nodes[1].name
    store = BindingStore(redis)
    # Two bindings 45 s ago: the 1m rule gives floor(2 / 2) = 1 until they leave the window, 15 s from now.
    bound_at = time.time() - 45
    records = [BindingRecord(f"fall-{i}", "default", f"fall-{i}", node, bound_at, "crane-scheduler") for i in (1, 2)]
    await store.record(records, stream_maxlen=10_000)
    truth_falls = bound_at + timedelta(minutes=1).total_seconds()
    # The periodic pass runs once a minute: only the expiry can bring the value down in time.
    annotator = await start("--hot-value-interval", "60s")
    await eventually(lambda: _hot_is(fleet_stack, node, 1), timeout=12, interval=0.05, what="hot value 1")
    assert time.time() < truth_falls - 0.5, "setup too slow: the value must be seen at 1 before it falls"
    await eventually(lambda: _hot_is(fleet_stack, node, 0), timeout=15, interval=0.02, what="hot value 0")
    seen = time.time()
    assert truth_falls <= seen < truth_falls + 1.0, f"fell {seen - truth_falls:+.2f}s after the truth"
    # Brought down by the fall follower (a round, every 4 s, might have been first by luck): it recounted.
    recounts = await annotator.metric("crane_annotator_hot_value_refreshes_total", trigger="expiry", outcome="ok")
    assert recounts is not None and recounts >= 1


async def _at_least(value: Any, expected: int) -> bool:
    return bool(await value >= expected)


async def _hot_is(stack: Stack, node: str, expected: int) -> bool:
    hot = await hot_annotation(stack, node)
    return hot is not None and hot[0] == expected
