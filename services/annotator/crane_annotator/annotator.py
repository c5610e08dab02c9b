"""The annotator assembled from its parts, given its adapters (API client, Redis, Prometheus client).

Separate from ``app`` (flags, process, signals) so tests and the benchmark can run the real thing in-process.
Everyone watches nodes (``cache.run(stopping)``: readiness, metrics and the debug endpoint); only the Lease
holder runs the workers that write (``lead(stopping)``): metric rounds, and the hot-value loops (the periodic
refresh, the binding-stream follower and the fall follower).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import redis.asyncio as aioredis
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from crane_annotator.batchround import BATCH_KEYS, BatchCapacity, Withdrawal, reload_problems
from crane_annotator.debug import WriteLog
from crane_annotator.hot import HotValues, RedisBindingTimes
from crane_annotator.hotloop import HotValueLoops
from crane_annotator.limiter import PriorityLimiter
from crane_annotator.matching import NodeAddresses
from crane_annotator.metrics import AgeCollector, AnnotatorMetrics
from crane_annotator.nodes import NodeCache
from crane_annotator.patches import DEFAULT_STAMP, Stamp
from crane_annotator.pods import PodCache
from crane_annotator.rounds import MetricRounds, MetricSpec
from crane_annotator.taints import LoadTaints
from crane_annotator.taints import reload_problems as taint_reload_problems
from crane_annotator.writer import NodePatcher, Outcome
from crane_shared.annotations import HOT_VALUE_KEY, annotation_key
from crane_shared.batch import batch_metric_key
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingSchema
from crane_shared.loadaware.dynamic import BATCH_USAGE_KEYS, DynamicArgs
from crane_shared.logs import get_logger
from crane_shared.policy import DynamicSchedulerPolicy, PolicyError, default_policy, load_policy
from crane_shared.policyfile import PolicyFile
from crane_shared.prometheus import PrometheusClient
from crane_shared.retry import sleep_unless
from crane_shared.settings import PartialResponse

log = get_logger("crane.annotator")

HOT_STALE_INTERVALS = 2
"""a round recounts a node's hot value when the loops have not for this many ``--hot-value-interval``s"""


def load_keys(policy: DynamicSchedulerPolicy) -> list[str]:
    """The annotations the load taint reads as written: every synced metric, its batch share, the batch usage."""
    keys = [annotation_key(s.name) for s in policy.sync_policy]
    return keys + [batch_metric_key(s.name) for s in policy.sync_policy] + list(BATCH_USAGE_KEYS.values())


def _args_of(stamp: Stamp) -> Callable[[DynamicSchedulerPolicy], DynamicArgs]:
    """The Dynamic arguments a policy is read with (the annotator's legacy zone), built once per policy."""
    last: list[tuple[DynamicSchedulerPolicy, DynamicArgs]] = []

    def args(policy: DynamicSchedulerPolicy) -> DynamicArgs:
        if not last or last[0][0] is not policy:
            last[:] = [(policy, DynamicArgs(policy, legacy_zone=stamp.legacy_zone))]
        return last[0][1]

    return args


def metric_specs(policy: DynamicSchedulerPolicy) -> list[MetricSpec]:
    """Every synced metric with its annotation key (names with ``:`` mapped, see ``annotation_key``)."""
    return [MetricSpec(s.name, annotation_key(s.name), s.period.total_seconds()) for s in policy.sync_policy]


class Annotator:
    def __init__(
        self,
        *,
        policy: DynamicSchedulerPolicy,
        api: client.ApiClient,
        redis: aioredis.Redis,
        prometheus: PrometheusClient,
        registry: CollectorRegistry,
        instance_label: str = "instance",
        node_selector: str | None = None,
        stamp: Stamp = DEFAULT_STAMP,
        redis_prefix: str = "crane",
        patch_qps: float = 50.0,
        patch_burst: int = 100,
        patch_concurrency: int = 32,
        hot_value_interval: float = 15.0,
        hot_value_debounce: float = 0.25,
        hot_value_max_age: float = 240.0,
        retry_base: float = 5.0,
        partial_response: PartialResponse = "reject",
        latency_offset: float = 0.0,
        policy_path: str | None = None,
        identity: str = "",
        load_taint_interval: float = 15.0,
    ) -> None:
        self.specs = metric_specs(policy)
        shortest = min((s.period for s in self.specs), default=0.0)
        if policy.hot_value and shortest >= hot_value_max_age:
            log.warning(
                "--hot-value-max-age is not longer than the shortest sync period: unchanged non-zero hot values "
                "will get a patch of their own between rounds (see the annotator README, patch budget)",
                hot_value_max_age=hot_value_max_age,
                shortest_period=shortest,
            )
        keys = [s.key for s in self.specs] + [HOT_VALUE_KEY] + (list(BATCH_KEYS) if policy.reclaim else [])
        self.metrics = AnnotatorMetrics(registry)
        self.cache = NodeCache(api, keys, stamp.legacy_zone, node_selector, texts=load_keys(policy))
        self.store = BindingStore(redis, BindingSchema(redis_prefix))
        self.hot = HotValues(RedisBindingTimes(redis, self.store.schema), policy.hot_value, stamp)
        self.written = WriteLog()
        self.patcher = NodePatcher(
            api, PriorityLimiter(patch_qps, patch_burst), concurrency=patch_concurrency, on_sent=self._on_sent
        )
        self.pods: PodCache | None = None
        self.batch: BatchCapacity | None = None
        if policy.reclaim is not None:
            self.pods = PodCache(
                api,
                on_restart=lambda reason: self.metrics.pod_watch_restarts.labels(reason).inc(),
                on_skipped=self.metrics.pods_skipped.inc,
            )
            self.batch = BatchCapacity(
                policy.reclaim,
                prometheus,
                lambda: self.cache.nodes,
                self.pods,
                self.patcher.patch_status,
                self.metrics,
                stamp=stamp,
                concurrency=patch_concurrency,
                policy_file=self._reclaim_file(policy_path),
                patch_metadata=self.patcher.patch_metadata,
            )
        self.withdrawal = Withdrawal(self.patcher.patch_status, self.patcher.patch_metadata, self.metrics)
        self.rounds = MetricRounds(
            self.specs,
            prometheus,
            self._addresses,
            self.patcher,
            self.metrics,
            hot=self.hot.annotation,
            # the hot-value loops recount every node each interval and on every binding: a round recounts only
            # what they have not (its first, and any the loops missed), while its queries are out
            refresh_hot=lambda nodes: self.hot.refresh_stale(nodes, HOT_STALE_INTERVALS * hot_value_interval),
            batch=self.batch,
            instance_label=instance_label,
            stamp=stamp,
            retry_base=retry_base,
            partial_response=partial_response,
            latency_offset=latency_offset,
        )
        self.hot_loops = HotValueLoops(
            self.hot,
            self.store,
            redis,
            lambda: self.cache.nodes.keys(),
            self.patcher,
            self.metrics,
            settled=self.rounds.first_round_done,
            interval=hot_value_interval,
            debounce=hot_value_debounce,
            max_age=hot_value_max_age,
        )
        self.taints = LoadTaints(
            self._taint_file(policy_path, policy),
            _args_of(stamp),
            lambda: self.cache.nodes,
            self.patcher.patch_taints,
            self.metrics,
            api,
            identity=identity,
            interval=load_taint_interval,
            may_write=lambda: self.patcher.may_write(),
        )
        self.rounds.after_round = self.taints.wake
        registry.register(
            AgeCollector(lambda: self.cache.nodes, keys, lambda: self.rounds.last_success, started=time.time())
        )
        self.leading = False

    def _reclaim_file(self, path: str | None) -> PolicyFile[DynamicSchedulerPolicy] | None:
        """The policy file, re-read for ``spec.reclaim`` each round (see ``BatchCapacity.reload``)."""
        if path is None:
            return None
        return PolicyFile(path, self._loader(reload_problems), default_policy, self.metrics.policy_reloads)

    def _taint_file(self, path: str | None, started: DynamicSchedulerPolicy) -> PolicyFile[DynamicSchedulerPolicy]:
        """The policy file, re-read for ``spec.loadTaint`` at each evaluation; a change the running process cannot
        apply (a threshold on a metric it does not sync) is refused, the previous policy kept."""
        return PolicyFile(path, self._loader(taint_reload_problems), lambda: started)

    def _loader(
        self, problems_of: Callable[[DynamicSchedulerPolicy, list[str]], list[str]]
    ) -> Callable[[str], DynamicSchedulerPolicy]:
        """``load_policy``, refusing a policy this process cannot apply (``problems_of`` it and the metrics it
        syncs: ``syncPolicy`` is read at start only)."""
        synced = [s.name for s in self.specs]

        def load(source: str) -> DynamicSchedulerPolicy:
            policy = load_policy(source)
            problems = problems_of(policy, synced)
            if problems:
                raise PolicyError(source, problems)
            return policy

        return load

    def _addresses(self) -> Mapping[str, NodeAddresses]:
        return {name: info.addresses for name, info in self.cache.nodes.items()}

    def _on_sent(self, node: str, annotations: Mapping[str, str], outcome: Outcome) -> None:
        if outcome != "ok":
            return
        self.written.record(node, annotations, time.time())
        if HOT_VALUE_KEY in annotations:
            self.hot.mark_written(node, annotations[HOT_VALUE_KEY])

    def on_leadership(self, leading: bool) -> None:
        self.leading = leading
        self.metrics.is_leader.set(1 if leading else 0)

    def synced(self) -> bool:
        """Readiness: the node list (and, with ``spec.reclaim``, the pod list) is synced."""
        return self.cache.synced.is_set() and (self.pods is None or self.pods.synced.is_set())

    async def watch(self, stopping: asyncio.Event) -> None:
        """The informers every instance runs (leader and standby alike), until ``stopping``; never raises."""
        watches = [self.cache.run(stopping)] + ([self.pods.run(stopping)] if self.pods is not None else [])
        await asyncio.gather(*watches)

    async def _caches_synced(self) -> None:
        await self.cache.synced.wait()
        if self.pods is not None:
            await self.pods.synced.wait()

    async def close(self) -> None:
        await self.patcher.close()

    async def lead(self, stopping: asyncio.Event) -> None:
        """The writing loops (a worker: ``run(stopping)`` for one term), run while this instance holds the Lease;
        ``stopping`` is the term's end (``Term.lost``: lease lost or shutdown). If one loop fails, the others are
        cancelled and the error raised, so the lease is given up and a new term starts them afresh."""
        try:
            if await sleep_unless(stopping, None, until=self._caches_synced()):
                return
            self._seed_written()
            if self.batch is not None:
                self.batch.begin_term(time.time())
            self.rounds.first_round_done.clear()  # a new term starts with a full round again
            self.taints.begin_term()  # ... and judges the load taint afresh (the taints found count as confirmed)
            async with asyncio.TaskGroup() as group:
                for worker in (self.rounds, self.hot_loops, self.taints):
                    group.create_task(worker.run(stopping))
                if self.batch is None:
                    group.create_task(self._withdraw_leftovers(stopping))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("writing loop failed; giving up the lease to restart it")
            raise

    async def _withdraw_leftovers(self, stopping: asyncio.Event) -> None:
        """Without ``spec.reclaim``: the loan an earlier configuration left on the nodes (an upgrade that removed
        the section, a restart with it gone) is taken back, once per term, retried each minute while a node's
        withdrawal fails."""
        while not stopping.is_set():
            left = [n for n, info in self.cache.nodes.items() if Withdrawal.holds(info)]
            done = await self.withdrawal.nodes({n: self.cache.nodes[n] for n in left}, "spec.reclaim absent")
            if len(done) == len(left) or await sleep_unless(stopping, 60.0):
                return

    def _seed_written(self) -> None:
        """Start from the hot values already on the nodes, so an unchanged value is not rewritten at once."""
        for name, info in self.cache.nodes.items():
            if HOT_VALUE_KEY in info.stamps:
                self.hot.written[name] = (int(info.values[HOT_VALUE_KEY]), info.stamps[HOT_VALUE_KEY])
