"""The batch part of a metric round (policy ``spec.reclaim``): measure every pod, annotate each node with its
batch pods' usage and its pods' usage, and publish its reclaimable capacity as extended resources.

In a round where the reclaim section's node metrics are due, the pods' usage is queried (two queries for all
pods, ``crane_shared.podusage``) next to the node metrics. Its annotations (``crane.io/batch-cpu-usage``,
``crane.io/batch-memory-usage``, ``crane.io/pod-usage``) ride on the round's patch of each node, which the round
sends anyway (every due metric is rewritten each period: its timestamp is its freshness), so they add no write;
a node the round does not patch (no series for it) gets none, and when the pod query fails nothing is stamped
(an old measurement is never re-stamped as new).

Then, every round (also when Prometheus is down, so stale inputs degrade to zero in time), each node's
reclaimable capacity is computed (``reclaim``) and written to ``status.capacity`` and ``status.allocatable`` with
one merge patch of ``nodes/status``, but only when ``reclaim.should_write`` says so: a move beyond
``changeThreshold`` of capacity, to or from zero, or a difference once the last write is ``maxAge`` old. An
unchanged cluster costs no status write at all. The value compared with is the one the API server holds (the
node informer), so a value changed by anyone else is put back.

A loan never outlives what it was measured from (``Withdrawal``): a node whose inputs went stale, and every node
once ``spec.reclaim`` is removed from the policy file (or was absent when the annotator started: a loan an earlier
configuration left), gets its ``crane.io/batch-*`` resources set to 0, then removed from node status, and its batch
annotations removed (``crane_shared.batch``). Put ``spec.reclaim`` back and the next round lends again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.nodes import NodeInfo
from crane_annotator.patches import DEFAULT_STAMP, Stamp, metric_annotations
from crane_annotator.pods import PodCache
from crane_annotator.reclaim import (
    NodeInputs,
    Published,
    Reclaimable,
    Resources,
    batch_usage,
    node_pod_usage,
    should_write,
)
from crane_annotator.reclaim import reclaimable as compute
from crane_annotator.writer import Outcome
from crane_shared.annotations import annotation_key
from crane_shared.batch import (
    BATCH_CPU_USAGE_KEY,
    BATCH_MEMORY_USAGE_KEY,
    POD_USAGE_KEY,
    WITHDRAW_REMOVE,
    WITHDRAW_TO_ZERO,
    PodUsage,
    batch_metric_key,
    encode_pod_usage,
    loan_status,
    removed_annotations,
)
from crane_shared.logs import LogOnce, get_logger
from crane_shared.podusage import fetch_pod_usage
from crane_shared.policy import DynamicSchedulerPolicy
from crane_shared.policyfile import PolicyFile
from crane_shared.prometheus import PrometheusError, QueryClient
from crane_shared.reclaimpolicy import OverrideError, ReclaimPolicy, parse_override

log = get_logger("crane.annotator.batch")

BATCH_KEYS = (BATCH_CPU_USAGE_KEY, BATCH_MEMORY_USAGE_KEY)
"""the usage-codec keys the node cache decodes (ages, dashboards)"""


def status_patch(cpu_milli: int, memory_bytes: int) -> dict[str, object]:
    """The ``nodes/status`` merge patch: the same values as capacity and allocatable (integers: extended
    resources take no fractions)."""
    return loan_status(cpu_milli, memory_bytes)


Patch = Callable[[str, Mapping[str, object]], Awaitable[Outcome]]


class Withdrawal:
    """Takes a loan back from a node: ``crane.io/batch-*`` to 0 in node status (no batch pod fits from then on,
    also if what follows fails), then removed from it, then the node's batch annotations removed; each a merge
    patch under the writer's QPS limit and leadership check, counted in ``crane_annotator_patches_total
    {cause="batch_withdraw"}``. A step that fails stops the node's withdrawal: the next round tries again."""

    def __init__(self, patch_status: Patch, patch_metadata: Patch, metrics: AnnotatorMetrics) -> None:
        self._patch_status = patch_status
        self._patch_metadata = patch_metadata
        self._metrics = metrics

    @staticmethod
    def holds(info: NodeInfo) -> bool:
        """Whether the node carries anything of a loan (a resource in status or a batch annotation)."""
        return info.lending or bool(info.batch_keys)

    async def node(self, name: str, info: NodeInfo, why: str) -> bool:
        """Withdraw the node's loan; True once nothing of it is left (or the node is gone)."""
        steps: list[tuple[Patch, Mapping[str, object]]] = []
        if info.lending:
            steps += [(self._patch_status, WITHDRAW_TO_ZERO), (self._patch_status, WITHDRAW_REMOVE)]
        if info.batch_keys:
            steps.append((self._patch_metadata, removed_annotations(list(info.batch_keys))))
        for send, body in steps:
            outcome = await send(name, body)
            self._metrics.patches.labels("batch_withdraw", outcome).inc()
            if outcome == "missing":
                return True
            if outcome != "ok":
                return False
        if steps:
            log.info(
                "batch loan withdrawn", node=name, why=why, resources=info.lending, annotations=list(info.batch_keys)
            )
        return True

    async def nodes(self, nodes: Mapping[str, NodeInfo], why: str, skip: Iterable[str] = ()) -> list[str]:
        """Withdraw every loan among ``nodes`` (but ``skip``); the nodes that hold nothing any more."""
        skipped = set(skip)
        holding = [n for n, info in nodes.items() if n not in skipped and self.holds(info)]
        done = await asyncio.gather(*(self.node(n, nodes[n], why) for n in holding))
        return [n for n, ok in zip(holding, done, strict=True) if ok]


@dataclass
class PublishReport:
    written: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    why: dict[str, int] = field(default_factory=dict)


def reload_problems(policy: DynamicSchedulerPolicy, synced: Iterable[str]) -> list[str]:
    """Why a changed policy cannot be applied by a running annotator: ``syncPolicy`` is read at start only, so a
    node metric not synced needs a restart. A removed ``spec.reclaim`` is applied (the loan is withdrawn)."""
    if policy.reclaim is None:
        return []
    running = set(synced)
    return [
        f'spec.reclaim.{resource}.nodeMetric: "{rule.node_metric}" is not synced by this process (restart to '
        "change syncPolicy)"
        for resource, rule in (("cpu", policy.reclaim.cpu), ("memory", policy.reclaim.memory))
        if rule.node_metric not in running
    ]


class BatchCapacity:
    def __init__(
        self,
        policy: ReclaimPolicy,
        prometheus: QueryClient,
        nodes: Callable[[], Mapping[str, NodeInfo]],
        pods: PodCache,
        patch_status: Callable[[str, Mapping[str, object]], Awaitable[Outcome]],
        metrics: AnnotatorMetrics,
        *,
        stamp: Stamp = DEFAULT_STAMP,
        concurrency: int = 32,
        policy_file: PolicyFile[DynamicSchedulerPolicy] | None = None,
        clock: Callable[[], float] = time.time,
        patch_metadata: Patch | None = None,
    ) -> None:
        self._policy_file = policy_file
        self._prometheus = prometheus
        self._nodes = nodes
        self._pods = pods
        self._patch_status = patch_status
        self._metrics = metrics
        self._stamp = stamp
        self._gate = asyncio.Semaphore(max(1, concurrency))
        self._clock = clock
        self._log_once = LogOnce(log)
        self.withdrawal = Withdrawal(patch_status, patch_metadata or _no_metadata_patch, metrics)
        self.lending = True
        """``spec.reclaim`` is in the policy file (False once it is removed: every loan is withdrawn)"""
        self._apply(policy)
        self.begin_term(clock())

    def _apply(self, policy: ReclaimPolicy) -> None:
        self.policy = policy
        self.metrics_read = {policy.cpu.node_metric, policy.memory.node_metric}
        self._keys = {
            "cpu": annotation_key(policy.cpu.node_metric),
            "memory": annotation_key(policy.memory.node_metric),
        }
        self._share_keys = {
            "cpu": batch_metric_key(policy.cpu.node_metric),
            "memory": batch_metric_key(policy.memory.node_metric),
        }

    def reload(self) -> bool:
        """Apply a changed policy file's ``spec.reclaim`` (thresholds, policies, window, budget) at the start of a
        round; ``PolicyFile`` refuses an invalid one (logged, counted, the old policy kept), ``reload_problems``
        included."""
        new = self._policy_file.reload() if self._policy_file is not None else None
        if new is None:
            return False
        if new.reclaim is None:
            if self.lending:
                self.lending = False
                log.warning("spec.reclaim removed: withdrawing every node's batch loan")
            return True
        if self.lending and new.reclaim == self.policy:
            return False
        self.lending = True
        self._apply(new.reclaim)
        log.info("spec.reclaim reloaded", reclaim=str(new.reclaim))
        return True

    def begin_term(self, now: float) -> None:
        """A new leadership term measures afresh; what it did not write itself it takes from node status, as if
        written when the term began (so a new leader does not rewrite every node at once)."""
        self.term_started = now
        self.node_usage: dict[str, dict[str, tuple[float, float]]] = {}
        """node -> resource -> (fraction of capacity, measured at)"""
        self.node_share: dict[str, dict[str, tuple[float, float]]] = {}
        """node -> resource -> (the batch pods' share of the node metric, measured at), where ``batchMetrics`` has
        one for the reclaim section's node metric"""
        self.pod_usage: dict[str, PodUsage] = {}
        self.pod_usage_at: float | None = None
        self.written_at: dict[str, float] = {}
        self.last: dict[str, Reclaimable] = {}
        self.withdrawn: set[str] = set()
        """nodes whose loan this term took back (not tried again while the informer still shows it)"""

    def shares_of(self, due: Iterable[str]) -> dict[str, str]:
        """metric -> the PromQL of the batch pods' share of it (``spec.reclaim.batchMetrics``), for the due ones."""
        if not self.lending:
            return {}
        queries = dict(self.policy.batch_metrics)
        return {metric: queries[metric] for metric in due if metric in queries}

    def wants(self, due: Iterable[str]) -> bool:
        """Whether a round of these metrics measures the pods too (one of the reclaim node metrics is due)."""
        return self.lending and not self.metrics_read.isdisjoint(due)

    async def measure(self) -> bool:
        """Query every pod's usage; False (and nothing changed) when Prometheus fails or answers in part."""
        try:
            usage, dropped = await fetch_pod_usage(self._prometheus, self.policy.pod_usage_window.total_seconds())
        except PrometheusError as err:
            self._metrics.queries.labels("pod_usage").inc(max(1, err.attempts))
            self._metrics.prometheus_errors.labels("pod_usage", err.kind).inc()
            self._log_once.warning(
                f"pod-usage-{err.kind}", "pod usage query failed: batch annotations not written", error=str(err)
            )
            return False
        self._metrics.queries.labels("pod_usage").inc(2)
        if dropped:
            self._metrics.values_dropped.labels("pod_usage", "invalid").inc(dropped)
        self.pod_usage = usage
        return True

    def record(self, values: Mapping[str, Mapping[str, float]], measured: bool, at: float) -> None:
        """Keep the node usage of this round (``values``: annotation key -> node -> fraction) and, when the pods
        were measured this round, when that was."""
        for resource, key in self._keys.items():
            for node, fraction in (values.get(key) or {}).items():
                self.node_usage.setdefault(node, {})[resource] = (fraction, at)
            for node, fraction in (values.get(self._share_keys[resource]) or {}).items():
                self.node_share.setdefault(node, {})[resource] = (fraction, at)
        if measured:
            self.pod_usage_at = at

    def annotations(self, nodes: Iterable[str], at: datetime) -> dict[str, dict[str, str]]:
        """The batch keys for the nodes this round patches (only when the pods were measured in it)."""
        usage: dict[str, dict[str, float]] = {BATCH_CPU_USAGE_KEY: {}, BATCH_MEMORY_USAGE_KEY: {}}
        pods_text: dict[str, str] = {}
        known = self._nodes()
        for node in nodes:
            info = known.get(node)
            if info is None or info.capacity is None:
                continue
            inputs = self.inputs(node, info)
            fractions = batch_usage(inputs, at.timestamp(), self.policy.pod_usage_window.total_seconds())
            usage[BATCH_CPU_USAGE_KEY][node] = fractions.cpu
            usage[BATCH_MEMORY_USAGE_KEY][node] = fractions.memory
            pods_text[node] = encode_pod_usage(node_pod_usage(inputs), at)
        out = metric_annotations(usage, at, self._stamp)
        for node, text in pods_text.items():
            out.setdefault(node, {})[POD_USAGE_KEY] = text
        return out

    def inputs(self, node: str, info: NodeInfo) -> NodeInputs:
        assert info.capacity is not None
        capacity = info.capacity
        measured = self.node_usage.get(node, {})
        usage = at = None
        if "cpu" in measured and "memory" in measured:
            usage = Resources(measured["cpu"][0] * capacity.cpu, measured["memory"][0] * capacity.memory)
            at = min(measured["cpu"][1], measured["memory"][1])
        shares = self.node_share.get(node, {})
        share = {  # only a share measured in the same round as the node metric it is taken from
            resource: fraction * capacity.of(resource)
            for resource, (fraction, when) in shares.items()
            if resource in measured and measured[resource][1] == when
        }
        try:
            override = parse_override(info.reclaim_override)
        except OverrideError as err:
            override = None
            self._metrics.values_dropped.labels("batch_reclaim_override", "unparseable").inc()
            self._log_once.warning(
                f"override-{node}", "node override refused: nothing reclaimed on the node", node=node, error=str(err)
            )
        return NodeInputs(
            capacity=capacity,
            allocatable=info.allocatable or capacity,
            pods=tuple((self._pods.by_node.get(node) or {}).values()),
            usage=usage,
            usage_at=at,
            pod_usage=self.pod_usage,
            pod_usage_at=self.pod_usage_at,
            override=override,
            batch_share=share,
        )

    async def publish(self) -> PublishReport:
        """Compute every node's reclaimable capacity and write the ones the budget allows."""
        now = self._clock()
        report = PublishReport()
        if not self.lending:  # spec.reclaim removed: every loan goes
            nodes = self._nodes()
            done = await self.withdrawal.nodes(nodes, "spec.reclaim removed", skip=self.withdrawn)
            self.withdrawn.update(done)
            report.written = done
            report.failed = [n for n, i in nodes.items() if n not in self.withdrawn and Withdrawal.holds(i)]
            return report
        writes: dict[str, Reclaimable] = {}
        stale: list[str] = []
        for node, info in self._nodes().items():
            if info.capacity is None:
                report.why["no-capacity"] = report.why.get("no-capacity", 0) + 1
                continue
            result = compute(self.inputs(node, info), self.policy, now, self.term_started)
            why = "unmeasured" if result is None else result.why
            report.why[why] = report.why.get(why, 0) + 1
            if result is None:
                continue
            self.last[node] = result
            if result.why == "stale":  # nothing measured it lately: the loan goes, not only its value
                if info.lending and node not in self.withdrawn:
                    stale.append(node)
                continue
            old = None
            if info.batch is not None:
                old = Published(info.batch[0], info.batch[1], self.written_at.get(node, self.term_started))
            if should_write(result, old, info.capacity, self.policy, now):
                writes[node] = result
        if stale:
            nodes = self._nodes()
            done = await self.withdrawal.nodes({n: nodes[n] for n in stale}, "inputs stale")
            self.withdrawn.update(done)
            report.written += done
        outcomes = await asyncio.gather(*(self._write(node, r) for node, r in writes.items()))
        for node, outcome in zip(writes, outcomes, strict=True):
            (report.written if outcome == "ok" else report.failed).append(node)
            self._metrics.patches.labels("batch_capacity", outcome).inc()
            if outcome == "ok":
                self.written_at[node] = now
                self.withdrawn.discard(node)
        for outcome_name in ("ok", "stale", "off", "bad-override", "unmeasured", "no-capacity"):
            self._metrics.reclaim_nodes.labels(outcome_name).set(report.why.get(outcome_name, 0))
        return report

    async def _write(self, node: str, value: Reclaimable) -> Outcome:
        async with self._gate:
            return await self._patch_status(node, status_patch(value.cpu_milli, value.memory_bytes))


async def _no_metadata_patch(node: str, body: Mapping[str, object]) -> Outcome:
    """A ``BatchCapacity`` given no metadata patcher (pure tests of its status writes): annotations stay."""
    return "ok"
