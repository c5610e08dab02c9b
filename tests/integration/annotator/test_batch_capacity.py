"""Batch capacity (``spec.reclaim``) on the real servers: a fleet scraped by a real Prometheus (node and per-pod
series), the real API server, the annotator as a child process under the chart's account (pods watch and
``nodes/status`` patch granted by the chart only with ``spec.reclaim``).

Two 8-core 32 GiB nodes whose system uses 10 % of each (the fleet's base load). On ``busy``: a regular pod using
2 cores / 4 GiB, a batch pod using 1 core / 2 GiB. koordinator's usage policy, thresholds 0.60 / 0.65:
``busy`` lends 8 x 0.6 - 0.8 - 2 = 2.0 cores and 32 x 0.65 - 3.2 - 4 = 13.6 GiB; ``idle`` 4.0 cores, 17.6 GiB.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.fleet import GI, make_fleet
from crane_shared.annotations import decode
from crane_shared.batch import (
    BATCH_CPU,
    BATCH_CPU_USAGE_KEY,
    BATCH_MEMORY,
    POD_USAGE_KEY,
    batch_annotations,
    batch_metric_key,
    decode_pod_usage,
    lent,
)
from crane_shared.kube import raw_json
from crane_shared.reclaimpolicy import OVERRIDE_KEY
from tests.support.annotator import (
    SELECTOR_KEY,
    Stack,
    annotators,
    batch_policy,
    published_batch,
    run_pod,
    running_stack,
    set_usage,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

DEGRADE = 12.0  # seconds: long enough to watch the loan stand after Prometheus stops
SHARES = {"cpu_usage_avg_5m": "batch_cpu_usage_avg_5m", "mem_usage_avg_5m": "batch_mem_usage_avg_5m"}
POLICY = batch_policy(
    "2s",
    podUsageWindow="5s",
    changeThreshold=0.02,
    degradeAfter=f"{DEGRADE:g}s",
    maxAge="1m",
    batchMetrics=SHARES,
)
CPU_TOLERANCE = 300  # millicores: rate windows straddling a change, the 2 % write threshold (160m)
MEMORY_TOLERANCE = GI


@pytest_asyncio.fixture(scope="module")
async def batch_stack(cluster: LocalCluster, kube: client.ApiClient, run_dir: Path) -> AsyncIterator[Stack]:
    label = uuid.uuid4().hex[:8]
    fleet = make_fleet(
        2,
        cpu_cores=8,
        memory_bytes=32 * GI,
        base_cpu_fraction=0.1,
        base_mem_fraction=0.1,
        labels={SELECTOR_KEY: label},
        prefix=f"bat-{label}-",
        instance_styles=("ip",),
    )
    async with running_stack(kube, cluster, run_dir / f"annotator-{label}", label, fleet, POLICY) as stack:
        for metric in ("cpu_usage_avg_5m", "mem_usage_avg_5m"):
            await stack.prometheus.wait_for(f"count({metric})", lambda r: bool(r) and r[0].value == 2, timeout=60)
        yield stack


@pytest_asyncio.fixture
async def start(batch_stack: Stack, redis_url: str, namespace: str) -> AsyncIterator[Callable[..., Any]]:
    async with annotators(batch_stack, redis_url, namespace, prefix="batch") as start:
        yield start


def near(expected: tuple[float, float]) -> Callable[[tuple[int, int] | None], bool]:
    cpu_cores, memory_gib = expected

    def check(value: tuple[int, int] | None) -> bool:
        return (
            value is not None
            and abs(value[0] - cpu_cores * 1000) <= CPU_TOLERANCE
            and abs(value[1] - memory_gib * GI) <= MEMORY_TOLERANCE
        )

    return check


async def settles(stack: Stack, node: str, expected: tuple[float, float], timeout: float = 60) -> tuple[int, int]:
    check = near(expected)

    async def seen() -> tuple[int, int] | None:
        value = await published_batch(stack, node)
        return value if check(value) else None

    return await eventually(seen, timeout=timeout, interval=0.25, what=f"{node} lends {expected}")


async def test_extended_resources_appear_shrink_with_regular_usage_and_not_with_batch_usage(
    batch_stack: Stack, start: Callable[..., Any], namespace: str
) -> None:
    busy, idle = (n.name for n in batch_stack.nodes)
    await run_pod(
        batch_stack, namespace, "regular", busy, usage="cpu=2,memory=4Gi", requests={"cpu": "1", "memory": "2Gi"}
    )
    asks = {BATCH_CPU: "1000", BATCH_MEMORY: str(2 * GI)}
    await run_pod(batch_stack, namespace, "batch", busy, usage="cpu=1,memory=2Gi", requests=asks, limits=asks)
    await start()
    await settles(batch_stack, busy, (2.0, 13.6))
    await settles(batch_stack, idle, (4.0, 17.6))

    # A round's patch carries the batch pods' usage (1 core of 8) and every measured pod of the node. The lent
    # capacity above does not move with batch usage, so it may settle on a round from before the batch pod's usage
    # was scraped: wait for the round that carries it.
    async def with_batch_usage() -> dict[str, str] | None:
        notes = await batch_stack.annotations(busy)
        raw = notes.get(BATCH_CPU_USAGE_KEY)
        return notes if raw is not None and abs(decode(raw).value - 1 / 8) <= 0.03 else None

    notes = await eventually(with_batch_usage, timeout=60, interval=0.25, what=f"{busy}'s batch usage at 1/8")
    pods = decode_pod_usage(notes[POD_USAGE_KEY]).pods
    assert set(pods) == {f"{namespace}/regular", f"{namespace}/batch"}
    assert pods[f"{namespace}/regular"].cpu_cores == pytest.approx(2, abs=0.2)
    assert pods[f"{namespace}/batch"].memory_bytes == pytest.approx(2 * GI, rel=0.01)
    assert json.loads((await batch_stack.annotations(idle))[POD_USAGE_KEY])["p"] == {}
    # ... and, per metric, the batch pods' share of it from the fast rules' batch_*, stamped as the metric is
    # (1 core of 8, 2 GiB of 32); 0 on the node without batch pods
    await eventually(
        lambda: _shares_are(batch_stack, busy, {"cpu_usage_avg_5m": 1 / 8, "mem_usage_avg_5m": 2 / 32}),
        timeout=30,
        interval=0.25,
        what="the batch shares of busy",
    )
    await eventually(
        lambda: _shares_are(batch_stack, idle, dict.fromkeys(SHARES, 0.0)), timeout=30, what="idle's shares"
    )

    # Regular work rises by 1.5 cores: the node lends 1.5 cores less.
    await set_usage(batch_stack, namespace, "regular", "cpu=3.5,memory=4Gi")
    await settles(batch_stack, busy, (0.5, 13.6))
    # Batch work rising takes nothing more from the loan (it is what the loan is for): once both windows have
    # seen it, the node still lends 0.5 cores (counted as regular work, it would lend none).
    await set_usage(batch_stack, namespace, "batch", "cpu=2,memory=2Gi")
    await eventually(
        lambda: _batch_cpu_usage_is(batch_stack, busy, 2 / 8), timeout=30, interval=0.25, what="batch usage 2/8"
    )
    await settles(batch_stack, busy, (0.5, 13.6))

    # The node's override: switched off, then a threshold of its own (8 x 0.3 - 0.8 = 1.6 cores).
    core = client.CoreV1Api(batch_stack.kube)
    await core.patch_node(idle, {"metadata": {"annotations": {OVERRIDE_KEY: "off"}}})
    await eventually(lambda: _published_is(batch_stack, idle, (0, 0)), timeout=30, interval=0.25, what="off")
    await core.patch_node(idle, {"metadata": {"annotations": {OVERRIDE_KEY: "cpu=0.3"}}})
    await settles(batch_stack, idle, (1.6, 17.6))
    await core.patch_node(idle, {"metadata": {"annotations": {OVERRIDE_KEY: None}}})


async def test_removing_spec_reclaim_withdraws_the_loan_and_the_batch_annotations(
    batch_stack: Stack, start: Callable[..., Any]
) -> None:
    """The loan does not outlive its lender: with spec.reclaim removed from the policy file, the running annotator
    takes back what it lent (crane.io/batch-* gone from node status) and its batch annotations."""
    nodes = [n.name for n in batch_stack.nodes]
    await start()
    for node in nodes:
        await eventually(partial(_published_positive, batch_stack, node), timeout=60, what=f"{node} lends")
        await eventually(partial(_has_batch_annotations, batch_stack, node), timeout=30, what=f"{node} annotated")
    text = batch_stack.policy_path.read_text()
    document = yaml.safe_load(text)
    del document["spec"]["reclaim"]
    batch_stack.policy_path.write_text(yaml.safe_dump(document))
    try:
        for node in nodes:
            await eventually(partial(_withdrawn, batch_stack, node), timeout=30, interval=0.25, what=f"{node}'s loan")
    finally:
        batch_stack.policy_path.write_text(text)


async def test_stale_metrics_degrade_the_loan_to_zero(batch_stack: Stack, start: Callable[..., Any]) -> None:
    """Last in the module: it stops Prometheus. The loan stands until ``degradeAfter`` past the last measurement,
    then is withdrawn."""
    nodes = [n.name for n in batch_stack.nodes]
    annotator = await start()
    for node in nodes:
        await eventually(partial(_published_positive, batch_stack, node), timeout=60, what=f"{node} lends")
    await batch_stack.prometheus.stop()
    # Read now: a query in flight at the stop can only make the true last success later than this, and the check
    # below shorter than it could be, never wrong.
    successes = [
        await annotator.metric("crane_annotator_metric_last_success_timestamp_seconds", metric=m)
        for m in ("cpu_usage_avg_5m", "mem_usage_avg_5m")
    ]
    assert None not in successes, f"no last success exported: {successes}"
    last = min(s for s in successes if s is not None)
    # Not before degradeAfter past the last measurement (the pods' may be a round, 2 s, older than the nodes')...
    until = last + DEGRADE - 2.5
    assert until - time.time() >= 2, f"only {until - time.time():.1f} s left to see the loan stand: not tested"
    while time.time() < until:
        for node in nodes:
            assert await _published_positive(batch_stack, node), (
                f"{node}'s loan withdrawn {time.time() - last:.1f} s after the last measurement (degradeAfter "
                f"{DEGRADE:g} s)"
            )
        await asyncio.sleep(0.25)
    # ... and then withdrawn: set to 0, then removed with the batch annotations.
    for node in nodes:
        await eventually(partial(_withdrawn, batch_stack, node), timeout=60, interval=0.25, what="withdrawn")


async def _has_batch_annotations(stack: Stack, node: str) -> bool:
    return bool(batch_annotations(await stack.annotations(node)))


async def _withdrawn(stack: Stack, node: str) -> bool:
    """Nothing of a loan left on the node: no batch resource in its status, no batch annotation."""
    found = await raw_json(client.CoreV1Api(stack.kube).read_node(node, _preload_content=False))
    return not lent(found["status"]) and not batch_annotations(found["metadata"].get("annotations"))


async def _batch_cpu_usage_is(stack: Stack, node: str, fraction: float) -> bool:
    text = (await stack.annotations(node)).get(BATCH_CPU_USAGE_KEY)
    return text is not None and abs(decode(text).value - fraction) < 0.02


async def _published_is(stack: Stack, node: str, value: tuple[int, int]) -> bool:
    return await published_batch(stack, node) == value


async def _published_positive(stack: Stack, node: str) -> bool:
    value = await published_batch(stack, node)
    return value is not None and value[0] > 0 and value[1] > 0


async def _shares_are(stack: Stack, node: str, expected: dict[str, float]) -> bool:
    notes = await stack.annotations(node)
    for metric, share in expected.items():
        text = notes.get(batch_metric_key(metric))
        if text is None or decode(text).timestamp != decode(notes[metric]).timestamp:
            return False
        if abs(decode(text).value - share) > 0.01:
            return False
    return True
