"""The patch budget: the real annotator leading (rounds, hot-value pass, stream and fall followers) at the default
client QPS, node PATCHes counted by the API server itself (``apiserver_request_total``), no bindings.

Measured: the first round (start-up) and how many patches reached the API server before it completed, then the
patches per following period. Target: exactly one patch per node per period, none extra at start-up.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from crane_annotator.annotator import Annotator
from crane_annotator.debug import WriteLog
from crane_annotator.rounds import RoundReport
from crane_sandbox.cluster import LocalCluster
from crane_shared.kube import api_client_from_dict
from crane_shared.policy import DynamicSchedulerPolicy, default_policy
from crane_shared.prometheus import PrometheusClient, PrometheusSettings
from crane_shared.redisconn import make_redis


async def node_patches(cluster: LocalCluster, subresource: str = "") -> int:
    """Node PATCH requests the API server has served (the node object, or ``subresource`` such as ``status``),
    every response code."""
    assert cluster.pki is not None, "cluster not started"
    context = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
    headers = {"Authorization": f"Bearer {cluster.pki.admin_token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{cluster.api_url}/metrics", ssl=context, headers=headers) as resp,
    ):
        if resp.status != 200:
            raise RuntimeError(f"kube-apiserver /metrics answered {resp.status}")
        text = await resp.text()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "apiserver_request_total"
                and labels.get("verb") == "PATCH"
                and labels.get("resource") == "nodes"
                and labels.get("subresource", "") == subresource
            ):
                total += sample.value
    return int(total)


class CountingLog(WriteLog):
    """The annotator's write log, also counting successful patches per node."""

    def __init__(self) -> None:
        super().__init__()
        self.per_node: Counter[str] = Counter()

    def record(self, node: str, annotations: Mapping[str, str], at: float) -> None:
        self.per_node[node] += 1
        super().record(node, annotations, at)


@dataclass
class Budget:
    nodes: int
    period: float
    qps: float
    first_round_seconds: float = 0.0
    startup_patches: int = 0
    """node PATCHes the API server served from the start until the first round completed"""
    startup_max_per_node: int = 0
    per_period: list[int] = field(default_factory=list)
    """node PATCHes the API server served in each following period"""
    rounds: list[RoundReport] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return sum(self.per_period) / (len(self.per_period) * self.nodes) if self.per_period else float("nan")


def policy_with_period(period: float | None) -> DynamicSchedulerPolicy:
    """The default policy, or every metric on one ``period`` (seconds), so that each period is one round."""
    policy = default_policy()
    if period is None:
        return policy
    sync = tuple(replace(s, period=timedelta(seconds=period)) for s in policy.sync_policy)
    return replace(policy, sync_policy=sync)


async def patch_budget(
    cluster: LocalCluster, prometheus_url: str, *, period: float | None, periods: int, qps: float, nodes: int
) -> Budget:
    policy = policy_with_period(period)
    shortest = min(s.period.total_seconds() for s in policy.sync_policy)
    api = await api_client_from_dict(cluster.kubeconfig_dict(), qps=0)
    redis = make_redis(cluster.redis_url)
    await redis.flushdb()  # no bindings
    prometheus = PrometheusClient(PrometheusSettings(prometheus_url))
    annotator = Annotator(
        policy=policy, api=api, redis=redis, prometheus=prometheus, registry=CollectorRegistry(), patch_qps=qps
    )
    log = CountingLog()
    annotator.written = log
    result = Budget(nodes, shortest, qps)
    run_round = annotator.rounds.run_round
    round_done = asyncio.Event()

    async def recorded(due: Sequence[str]) -> RoundReport:
        report = await run_round(due)
        result.rounds.append(report)
        round_done.set()
        return report

    setattr(annotator.rounds, "run_round", recorded)  # noqa: B010 (instance attribute over the method)
    stopping = asyncio.Event()
    watch = asyncio.create_task(annotator.cache.run(stopping))
    lead: asyncio.Task[None] | None = None
    try:
        await annotator.cache.synced.wait()
        before = await node_patches(cluster)
        started = time.monotonic()
        lead = asyncio.create_task(annotator.lead(stopping))
        await annotator.rounds.first_round_done.wait()
        result.first_round_seconds = time.monotonic() - started
        result.startup_patches = await node_patches(cluster) - before
        result.startup_max_per_node = max(log.per_node.values(), default=0)
        print(
            f"  first round {result.first_round_seconds:.1f} s, {result.startup_patches} node patches "
            f"(most on one node: {result.startup_max_per_node})",
            flush=True,
        )
        # Count between the ends of consecutive rounds: each window holds exactly one round's patches plus
        # whatever the hot-value loops sent meanwhile.
        mark = await node_patches(cluster)
        for _ in range(periods):
            round_done.clear()
            await round_done.wait()
            now = await node_patches(cluster)
            result.per_period.append(now - mark)
            mark = now
            print(f"  period {len(result.per_period)}: {result.per_period[-1]} node patches", flush=True)
        return result
    finally:
        stopping.set()  # the worker contract: both return soon after
        await asyncio.gather(*(task for task in (lead, watch) if task is not None), return_exceptions=True)
        await annotator.close()
        await prometheus.close()
        await redis.aclose()
        await api.close()
