"""Our full rounds against the bare node-patch ceiling, like for like, interleaved in one run.

The ceiling is what the API server allows for a round's writes: one merge patch per node and nothing else in
the patch path. To be a fair ceiling it is sent

- through the same client: ``NodePatcher`` (its aiohttp session, TLS, headers, status check, timeout), with the
  same concurrency and the same client rate limit (``PriorityLimiter(qps, burst)``) as our rounds;
- with the same body: the same seven annotation keys (six metrics and the hot value) in the same value format,
  built before the clock starts, with a new timestamp every run (an unchanged patch would be a no-op for the
  API server and not reach etcd);
- against the same node objects: every run rewrites the same keys, so objects keep one size throughout.

Two ceilings, because the annotator always watches the nodes it patches (each patch comes back as a watch
event that the API server encodes and the annotator decodes):

- *strict*: bare patches with no watch open, before the annotator starts and after it has stopped;
- *watched*: bare patches while the annotator is up (node watch open, hot-value pass running), taken before
  each of our rounds and after the last: our round i is compared with the mean of the runs either side of it.
"""

from __future__ import annotations

import asyncio
import cProfile
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from crane_annotator.annotator import Annotator, metric_specs
from crane_annotator.limiter import PriorityLimiter
from crane_annotator.rounds import RoundReport
from crane_annotator.writer import NodePatcher
from crane_sandbox.cluster import LocalCluster
from crane_shared.annotations import HOT_VALUE_KEY, encode_hot_value, encode_usage
from crane_shared.kube import api_client_from_dict
from crane_shared.policy import default_policy
from crane_shared.prometheus import PrometheusClient, PrometheusSettings
from crane_shared.redisconn import make_redis

DRAIN_SECONDS = 2.0
"""after each run, for the watch events of its patches to arrive (and be counted in its CPU)"""


@dataclass(frozen=True)
class Settings:
    concurrency: int
    qps: float
    """client QPS limit of patches, ours and the ceiling alike (<= 0: unlimited)"""
    burst: int


@dataclass
class Run:
    seconds: float
    cpu: float
    """this process' CPU seconds, drain included: the client, and the node watch when it is open"""


@dataclass
class Measured:
    nodes: int
    settings: Settings
    rounds: list[RoundReport] = field(default_factory=list)
    ours: list[Run] = field(default_factory=list)
    strict: list[Run] = field(default_factory=list)
    """bare patches, no watch: before the annotator started, after it stopped"""
    watched: list[Run] = field(default_factory=list)
    """bare patches with the annotator up: before round 1, then after each round"""
    synced: float = 0.0

    def paired(self) -> list[float]:
        """Round i / the mean of the watched ceilings either side of it."""
        return [
            ours.seconds / ((self.watched[i].seconds + self.watched[i + 1].seconds) / 2)
            for i, ours in enumerate(self.ours)
        ]

    def strict_ratio(self) -> float:
        """Best round / best strict ceiling: the conservative figure (the faster ceiling, no watch)."""
        return min(r.seconds for r in self.ours) / min(r.seconds for r in self.strict)

    def paired_median(self) -> float:
        return statistics.median(self.paired())


def bare_body(at: datetime) -> dict[str, str]:
    """What a round writes to a node: every metric's key and the hot value, in their formats."""
    value = encode_usage(0.12345, at)
    body = {spec.key: value for spec in metric_specs(default_policy())}
    body[HOT_VALUE_KEY] = encode_hot_value(0, at)
    return body


async def bare_patches(cluster: LocalCluster, nodes: Sequence[str], settings: Settings) -> Run:
    api = await api_client_from_dict(cluster.kubeconfig_dict())
    patcher = NodePatcher(api, PriorityLimiter(settings.qps, settings.burst), concurrency=settings.concurrency)
    body = bare_body(datetime.now(UTC))
    patches = dict.fromkeys(nodes, body)
    try:
        cpu = time.process_time()
        started = time.monotonic()
        report = await patcher.patch_many(patches)
        seconds = time.monotonic() - started
        assert len(report.ok) == len(nodes), f"{len(report.failed)} bare patches failed"
        await asyncio.sleep(DRAIN_SECONDS)
        return Run(seconds, time.process_time() - cpu)
    finally:
        await patcher.close()
        await api.close()


async def measure(
    cluster: LocalCluster,
    prometheus_url: str,
    nodes: Sequence[str],
    metrics: Sequence[str],
    rounds: int,
    settings: Settings,
    profile: str | None = None,
) -> Measured:
    """strict, [annotator up: watched, (round, watched) x rounds], strict."""
    result = Measured(len(nodes), settings)
    say = _progress(len(nodes))
    result.strict.append(say("bare, no watch", await bare_patches(cluster, nodes, settings)))
    api = await api_client_from_dict(cluster.kubeconfig_dict(), qps=0, burst=settings.concurrency)
    redis = make_redis(cluster.redis_url)
    prometheus = PrometheusClient(PrometheusSettings(prometheus_url))
    annotator = Annotator(
        policy=default_policy(),
        api=api,
        redis=redis,
        prometheus=prometheus,
        registry=CollectorRegistry(),
        patch_qps=settings.qps,
        patch_burst=settings.burst,
        patch_concurrency=settings.concurrency,
    )
    # The annotator as it runs when leading, minus its own round schedule (rounds are started here): the node
    # watch, and the hot-value pass that keeps every node's count current (it starts after the first round).
    stopping = asyncio.Event()
    tasks = [asyncio.create_task(annotator.cache.run(stopping))]
    profiler = cProfile.Profile() if profile else None
    try:
        started = time.monotonic()
        await annotator.cache.synced.wait()
        result.synced = time.monotonic() - started
        tasks.append(asyncio.create_task(annotator.hot_loops.periodic(stopping)))
        result.watched.append(say("bare, watch open", await bare_patches(cluster, nodes, settings)))
        for _ in range(rounds):
            cpu = time.process_time()
            if profiler:
                profiler.enable()
            report = await annotator.rounds.run_round(metrics)
            await asyncio.sleep(DRAIN_SECONDS)
            if profiler:
                profiler.disable()
            result.rounds.append(report)
            result.ours.append(say("ours", Run(report.duration, time.process_time() - cpu)))
            result.watched.append(say("bare, watch open", await bare_patches(cluster, nodes, settings)))
        if profiler and profile:
            profiler.dump_stats(profile)
    finally:
        stopping.set()  # the worker contract: both return soon after
        await asyncio.gather(*tasks, return_exceptions=True)
        await annotator.close()
        await prometheus.close()
        await redis.aclose()
        await api.close()
    result.strict.append(say("bare, no watch", await bare_patches(cluster, nodes, settings)))
    return result


def _progress(n: int) -> Callable[[str, Run], Run]:
    def say(what: str, run: Run) -> Run:
        print(f"  {what}: {run.seconds:.2f} s, CPU {run.cpu:.2f} s ({1000 * run.cpu / n:.2f} ms per node)", flush=True)
        return run

    return say
