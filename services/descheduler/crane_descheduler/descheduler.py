"""The descheduler's assembly: informers (nodes, pods, PDBs, ReplicaSets), policy files, the leader's rounds.

Every replica keeps its caches warm; only the Lease holder runs rounds. A round: reload the policies if their
files changed, query per-pod usage (two queries), run the pure round (``rounds.RoundState.plan``) on the caches, then
send the planned evictions one by one, the term checked right before each. The debounce starts over with every
term, so a new leader needs K hot rounds of its own before it evicts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from crane_descheduler import policy as dpolicy
from crane_descheduler.evictor import Evictor, Result
from crane_descheduler.metrics import CLASSES, DeschedulerMetrics
from crane_descheduler.plan import Eviction
from crane_descheduler.rounds import RoundResult, RoundState
from crane_descheduler.targets import SchedulerSnapshot
from crane_descheduler.usage import fetch_usage
from crane_shared.batch import PodUsage
from crane_shared.informer import Informer
from crane_shared.leader import Term
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.logs import LogOnce, get_logger
from crane_shared.policy import DynamicSchedulerPolicy, default_policy, load_policy
from crane_shared.policyfile import PolicyFile
from crane_shared.policyyaml import PolicyError
from crane_shared.prometheus import PrometheusError, QueryClient
from crane_shared.retry import sleep_unless

log = get_logger("crane.descheduler")

WATCH_SECONDS = 300


@dataclass(frozen=True)
class Options:
    interval: float
    usage_window: float
    dry_run: bool
    identity: str


@dataclass(frozen=True)
class PlanView:
    """The last round, for ``/debug/plan``: what would be or was evicted and why nothing else was."""

    at: str
    classes: dict[str, str]
    unknown: dict[str, str]
    evictions: list[dict[str, Any]]
    skipped: dict[str, int]
    dry_run: bool
    draining: list[str] = field(default_factory=list)
    """nodes being emptied (``spec.drain``)"""


class Descheduler:
    def __init__(
        self,
        api: client.ApiClient,
        prometheus: QueryClient,
        registry: CollectorRegistry,
        options: Options,
        scheduler_policy: str | None,
        descheduler_policy: str | None,
        args: DynamicArgs | None = None,
        scheduler_config: Path | None = None,
    ) -> None:
        self.metrics = DeschedulerMetrics(registry)
        self.options = options
        self.prometheus = prometheus
        core = client.CoreV1Api(api)
        self.nodes = Informer("nodes", core.list_node, watch_timeout=WATCH_SECONDS, page_size=500)
        self.pods = Informer(
            "pods",
            core.list_pod_for_all_namespaces,
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
            watch_timeout=WATCH_SECONDS,
        )
        self.pdbs = Informer(
            "poddisruptionbudgets",
            client.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces,
            watch_timeout=WATCH_SECONDS,
        )
        self.replicasets = Informer(  # a ReplicaSet's controller: the workload budget counts the Deployment
            "replicasets",
            client.AppsV1Api(api).list_replica_set_for_all_namespaces,
            watch_timeout=WATCH_SECONDS,
        )
        self.evictor = Evictor(api, options.identity)
        self.scheduler_file: PolicyFile[DynamicSchedulerPolicy] = PolicyFile(
            scheduler_policy, load_policy, default_policy, self.metrics.reloads
        )
        self._descheduler_path = descheduler_policy
        self.policy_file = self._policy_file(self.scheduler_file.policy)
        base = args or DynamicArgs(self.scheduler_file.policy)
        self.args = replace(base, policy=self.scheduler_file.policy)
        self.rounds = RoundState(snapshot=SchedulerSnapshot(scheduler_config))
        """debounce, drain, the scheduler's snapshot (by its configuration's profiles when given) and the recent
        evictions (a new term starts over)"""
        self.last: PlanView | None = None
        self._log = LogOnce(log)
        self.rounds_done = 0

    def _policy_file(self, scheduler: DynamicSchedulerPolicy) -> PolicyFile[dpolicy.DeschedulerPolicy]:
        return PolicyFile(
            self._descheduler_path,
            lambda path: dpolicy.load_policy(path, scheduler),
            lambda: dpolicy.default_policy(scheduler),
            self.metrics.reloads,
        )

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self._informers())

    def _informers(self) -> tuple[Informer, ...]:
        return (self.nodes, self.pods, self.pdbs, self.replicasets)

    def _reload(self) -> None:
        scheduler = self.scheduler_file.reload()
        if scheduler is not None:
            try:
                self.policy_file = self._policy_file(scheduler)
            except PolicyError as err:  # the descheduler policy does not fit the new scheduler policy
                log.error("descheduler policy invalid under the new scheduler policy; keeping both", problems=str(err))
                self.metrics.reloads.labels("invalid").inc()
            else:
                self.args = replace(self.args, policy=scheduler)
        self.policy_file.reload()

    async def run_caches(self, stopping: asyncio.Event) -> None:
        await asyncio.gather(*(informer.run(stopping) for informer in self._informers()))

    async def lead(self, term: Term) -> None:
        """The leader's loop: a round every interval until the term ends."""
        self.rounds.new_term()
        self._warn_drain_without_packing()
        stopping = term.lost
        await sleep_unless(stopping, None, until=self._synced())
        while not stopping.is_set():
            started = time.monotonic()
            try:
                await self.round(term)
            except Exception:  # a bug in a round must not end leadership: log, count, go on
                log.exception("round failed")
                self.metrics.rounds.labels("failed").inc()
            self.metrics.round_duration.observe(time.monotonic() - started)
            await sleep_unless(stopping, self.options.interval)

    async def _synced(self) -> None:
        for informer in self._informers():
            await informer.synced.wait()

    async def round(self, term: Term) -> RoundResult:
        self._reload()
        now = datetime.now(UTC)
        usage: dict[str, PodUsage] = {}
        try:
            usage, dropped = await fetch_usage(self.prometheus, self.options.usage_window)
            self.metrics.usage_dropped.inc(dropped)
            outcome = "planned"
        except PrometheusError as err:
            self.metrics.prometheus_errors.labels("pod_usage", err.kind).inc()
            self._log.warning(f"prometheus-{err.kind}", "per-pod usage unavailable: nothing evicted", error=str(err))
            outcome = "no_usage"
        result = self.rounds.plan(
            list(self.nodes.cache.values()),
            list(self.pods.cache.values()),
            usage,
            self.policy_file.policy,
            self.args,
            now,
            list(self.pdbs.cache.values()),
            list(self.replicasets.cache.values()),
            usage_known=outcome == "planned",
        )
        self._report(result)
        self.metrics.rounds.labels(outcome).inc()
        results = [await self._execute(e, term, usage) for e in result.plan.evictions]
        self.last = PlanView(
            at=now.isoformat(),
            classes=dict(result.classes),
            unknown=dict(result.unknown),
            evictions=[_describe(e, r) for e, r in zip(result.plan.evictions, results, strict=True)],
            skipped=dict(result.plan.skipped),
            dry_run=self.options.dry_run,
            draining=sorted(result.drain.draining),
        )
        self.rounds_done += 1
        return result

    def _report(self, result: RoundResult) -> None:
        for name in CLASSES:
            self.metrics.nodes.labels(name).set(sum(1 for c in result.classes.values() if c == name))
        for node, problem in result.unknown.items():
            self.metrics.unusable_nodes.inc()
            self._log.warning(
                f"unusable-{node}", "node load data unusable: node left alone", node=node, problem=problem
            )
        for node, problem in result.batch_problems.items():
            self._log.warning(
                f"batch-usage-{node}", "batch usage annotation unreadable: counted as none", node=node, problem=problem
            )
        for kind, count in result.malformed.items():
            self.metrics.malformed.labels(kind).inc(count)
        for reason, count in result.plan.skipped.items():
            self.metrics.skipped.labels(reason).inc(count)
        self.metrics.draining.set(len(result.drain.draining))

    def _warn_drain_without_packing(self) -> None:
        if self.policy_file.policy.drain is not None and self.args.policy.scoring.strategy != "pack":
            self._log.warning(
                "drain-spread",
                "spec.drain with the scheduler policy's spread scoring: the emptiest node is where the scheduler "
                "sends pods, so a drain would be undone and none is started (drain-would-return); set the scheduler "
                "policy's scoring.strategy: pack",
            )

    async def _execute(self, e: Eviction, term: Term, usage: dict[str, PodUsage]) -> Result | str:
        if self.options.dry_run:
            log.info("dry run: would evict", pod=e.pod.key, node=e.node, kind=e.kind, metric=e.metric, value=e.value)
            self.metrics.evictions.labels(_reason(e), "dry_run").inc()
            return "dry_run"
        result = await self.evictor.evict(e, term)
        self.metrics.evictions.labels(_reason(e), result).inc()
        if result == "pdb":
            self._log.warning(  # counted every time (evictions_total{result="pdb"}), logged once
                "pdb", "eviction refused by a disruption budget (429): retried in a later round", pod=e.pod.key
            )
        if result in ("evicted", "unknown"):  # its node must be found hot K rounds in a row again (as koordinator)
            self.rounds.evicted(e, time.time(), usage.get(e.pod.key, PodUsage(0.0, 0.0)))
            log.info("evicted", pod=e.pod.key, node=e.node, kind=e.kind, metric=e.metric, value=e.value)
        return result


def _reason(e: Eviction) -> str:
    """The evictions metric's reason: the metric over its threshold, or ``drain``."""
    return e.metric if e.kind == "hot" else "drain"


def _describe(e: Eviction, result: str) -> dict[str, Any]:
    return {
        "pod": e.pod.key,
        "kind": e.kind,
        "node": e.node,
        "target": e.target,
        "metric": e.metric,
        "value": e.value,
        "threshold": e.threshold,
        "result": result,
    }
