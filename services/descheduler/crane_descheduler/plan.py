"""One round's eviction plan: pure, from the nodes' readings, the pods, their measured usage and the budgets.

For each confirmed-hot node (most over its thresholds first), pods are taken in order: batch pods
(``crane_shared.batch``) before any regular pod, then lower priority first, then QoS (BestEffort, Burstable,
Guaranteed), then the pod whose measured usage of the over-threshold resources best covers the excess (the
smallest pod that covers it all; else the biggest), re-ranked after every choice, until the node's projected usage
is under every high threshold. A node hot only with its batch pods' usage (not by regular usage,
``Reading.regular_hot``) keeps its regular pods (``batch-heat``): batch work yields. A pod is planned only when:

- the budgets allow it: per node per round, per namespace per round, per workload (``maxUnavailable`` counting
  the workload's pods that are not Ready), and the global rate (evictions in the last minute);
- the scheduler's own Filter (``targets.SchedulerTargets``: crane-scheduler's profile, Dynamic with the pod's
  estimate included) refuses the node it leaves, so its replacement cannot land back there while the node is hot;
- another node, not hot, passes that Filter, counting the pods already planned this round (assumed and reserved
  there, as the scheduler's cycle does).

Nothing is planned when no node could take a pod (every node hot, or no headroom): the pod is skipped, counted;
except a batch pod on a node hot by its regular usage: batch work yields to the regular pods even when no other
node has room for it (as koordlet evicts best-effort pods), its replacement waiting for reclaimed capacity
(``Eviction.target`` None). A node hot only with its batch share keeps requiring a place.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from crane_descheduler.classify import Reading
from crane_descheduler.pods import QOS_RANK, Disruptions, PodView, workload_of
from crane_descheduler.policy import Limits, NodePool
from crane_shared.batch import PodUsage
from crane_shared.loadaware.dynamic import DynamicArgs, NodeCapacity, resource_of
from crane_shared.podresources import CPU, MEMORY

RATE_WINDOW = 60.0


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    allocatable: Mapping[str, int]
    """CPU in millicores, memory in bytes"""

    @property
    def capacity(self) -> NodeCapacity:
        return NodeCapacity(self.allocatable.get(CPU, 0) / 1000, float(self.allocatable.get(MEMORY, 0)))


@dataclass(frozen=True)
class Candidate:
    pod: PodView
    blocker: str | None
    """why it may not be evicted (``pods.eviction_blocker``), None when it may"""
    budgets: tuple[str, ...] = ()
    """the PodDisruptionBudgets that select it (``pods.Disruptions.of``)"""


@dataclass(frozen=True)
class Workload:
    pods: int
    unavailable: int
    """pods not Ready (terminating included)"""


@dataclass(frozen=True)
class Eviction:
    pod: PodView
    node: str
    target: str | None
    """where the replacement fits; None: a batch pod yielding to a node's regular pods with no place elsewhere"""
    metric: str
    value: float
    threshold: float
    kind: Literal["hot", "drain"] = "hot"
    """hot: the metric above its threshold; drain: the node is emptied (``drain``), the metric nearest its idle
    threshold, below it"""


@dataclass
class Plan:
    evictions: list[Eviction] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    """pods passed over, by reason"""


@dataclass(frozen=True)
class Evicted:
    """An eviction this descheduler made (unix seconds) and the pod's measured usage then."""

    node: str
    at: float
    use: PodUsage
    target: str | None = None
    """where its replacement was planned"""
    replacement: Mapping[str, Any] | None = None
    """that replacement as the target check read it: held on ``target`` until a pod of its owner created since
    the eviction is seen bound (a StatefulSet's is created only once the evicted pod is gone)"""
    owner: str = ""
    """the evicted pod's controller's uid"""


class TargetFinder(Protocol):
    """Where the scheduler would place a pod's replacement (``targets.SchedulerTargets``)."""

    def find(self, pod: PodView, source: str, *, drain: bool = False) -> tuple[str | None, str | None]:
        """(target, None), or (None, why not: ``would-return``, ``would-go-excluded`` or ``no-target``);
        ``drain``: ``source`` is being emptied (it passes the Filter), the replacement returns only if the load score
        prefers it."""
        ...

    def take(self, pod: PodView, target: str) -> str | None:
        """The eviction is planned: the next pods of the round see it; why not (nothing taken) when the
        replacement's Reserve is refused there."""
        ...

    def checkpoint(self) -> Any:
        """A mark of what was taken so far."""
        ...

    def rollback(self, mark: Any) -> None:
        """Undo what was taken since ``mark`` (a drain keeps a node's places all or none)."""
        ...


@dataclass(frozen=True)
class RoundInput:
    now: datetime
    args: DynamicArgs
    """the scheduler's Dynamic arguments (its policy, estimate and freshness rules)"""
    limits: Limits
    nodes: Mapping[str, NodeView]
    readings: Mapping[str, Reading]
    pools: Mapping[str, NodePool]
    hot: Sequence[str]
    """confirmed-hot nodes that read hot this round"""
    candidates: Mapping[str, Sequence[Candidate]]
    """node -> its pods"""
    usage: Mapping[str, PodUsage]
    """pod key (namespace/name) -> measured usage"""
    workloads: Mapping[str, Workload]
    """workload uid (``pods.workload_of``) -> its pods"""
    targets: TargetFinder
    """the scheduler's Filter over the round's snapshot"""
    owners: Mapping[str, str] = field(default_factory=dict)
    """ReplicaSet uid -> its controller's uid (``pods.workload_owners``)"""
    evicted: Sequence[Evicted] = ()
    """recent evictions (all rounds): the global rate, and the usage the averaged metrics still carry"""
    disruptions: Disruptions = field(default_factory=lambda: Disruptions(()))
    """what each PodDisruptionBudget still allows this round (spent here, then by the drain)"""


def lag_compensated(
    reading: Reading, evicted: Sequence[Evicted], capacity: NodeCapacity, args: DynamicArgs
) -> dict[str, float]:
    """The node's usage per metric without the pods already evicted from it: an average over a window ``W``
    stamped ``T`` still carries the share ``1 - (T - evicted_at) / W`` of a pod evicted at ``evicted_at`` (the
    scheduler's estimate of a new pod, in reverse), so a relieved node is not relieved again while its average
    catches up."""
    out = dict(reading.usage)
    for metric in out:
        resource = resource_of(metric)
        sample = reading.load.readings.get(metric)
        total = capacity.cpu if resource == "cpu" else capacity.memory
        if resource is None or sample is None or sample.timestamp is None or total <= 0:
            continue
        stamped = sample.timestamp.timestamp()
        window = args.estimate.window_of(metric).total_seconds()
        for e in evicted:
            carried = 1.0 - min(1.0, max(0.0, (stamped - e.at) / window)) if window > 0 else 0.0
            out[metric] -= e.use.of(resource) * carried / total
    return out


def rate_room(recent: Sequence[float], now: float, per_minute: int) -> int:
    return max(0, per_minute - sum(1 for at in recent if now - at < RATE_WINDOW))


def workload_allowance(limit: int | str, pods: int) -> int:
    """``maxUnavailable`` as a count: a percent of the workload's pods, rounded down."""
    if isinstance(limit, str):
        return math.floor(pods * int(limit.rstrip("%")) / 100)
    return limit


def _cover_key(use: PodUsage, excess: Mapping[str, float], capacity: NodeCapacity) -> tuple[int, float]:
    """Pods that cover every excess first, smallest of them first; then the rest, biggest first."""
    total = {"cpu": capacity.cpu, "memory": capacity.memory}
    share = sum(use.of(r) / total[r] for r in excess if total[r] > 0)
    if all(use.of(r) >= amount for r, amount in excess.items()):
        return (0, share)
    return (1, -share)


def _excess(projected: Mapping[str, float], pool: NodePool, capacity: NodeCapacity) -> dict[str, float]:
    """resource -> amount (cores, bytes) over the high threshold, the worst metric of each resource."""
    total = {"cpu": capacity.cpu, "memory": capacity.memory}
    out: dict[str, float] = {}
    for metric, usage in projected.items():
        resource = resource_of(metric)
        if resource and usage > pool.high[metric]:
            out[resource] = max(out.get(resource, 0.0), (usage - pool.high[metric]) * total[resource])
    return out


def _worst(projected: Mapping[str, float], pool: NodePool) -> str:
    return max(projected, key=lambda m: projected[m] / pool.high[m] if pool.high[m] > 0 else math.inf)


def plan_round(data: RoundInput) -> Plan:
    plan = Plan()
    room = rate_room([e.at for e in data.evicted], data.now.timestamp(), data.limits.per_minute)
    namespaces: Counter[str] = Counter()
    workloads: Counter[str] = Counter()
    targets = data.targets

    def over_ratio(node: str) -> float:
        reading, pool = data.readings[node], data.pools[node]
        return max((u / pool.high[m] for m, u in reading.usage.items() if pool.high[m] > 0), default=0.0)

    for node in sorted(data.hot, key=lambda n: (-over_ratio(n), n)):
        reading, pool, view = data.readings[node], data.pools[node], data.nodes[node]
        capacity = view.capacity
        projected = lag_compensated(reading, [e for e in data.evicted if e.node == node], capacity, data.args)
        remaining: list[tuple[PodView, PodUsage, tuple[str, ...]]] = []
        regular_hot = reading.regular_hot(pool)
        for candidate in data.candidates.get(node, ()):
            if candidate.blocker is not None:
                plan.skipped[candidate.blocker] += 1
                continue
            if not candidate.pod.batch and not regular_hot:
                plan.skipped["batch-heat"] += 1  # the heat is the batch pods' share: they go, regular work stays
                continue
            use = data.usage.get(candidate.pod.key)
            if use is None:
                plan.skipped["no-usage"] += 1
                continue
            remaining.append((candidate.pod, use, candidate.budgets))
        evicted_here = 0
        covering_waits = False  # a pod that would cover the excess alone waits for a budget of this round
        while remaining:
            excess = _excess(projected, pool, capacity)
            if not excess:
                break
            if evicted_here >= data.limits.per_node_per_round:
                plan.skipped["node-budget"] += len(remaining)
                break
            if room <= 0:
                plan.skipped["rate-limit"] += len(remaining)
                break
            remaining.sort(
                key=lambda item: (
                    not item[0].batch,
                    item[0].priority,
                    QOS_RANK[item[0].qos],
                    _cover_key(item[1], excess, capacity),
                )
            )
            pod, use, budgets = remaining.pop(0)
            covers = _cover_key(use, excess, capacity)[0] == 0
            if covering_waits and not covers:
                # it would not cool the node: an eviction spent for nothing (the pod that would is back next round)
                plan.skipped["waits-for-budget"] += 1
                continue
            reason = _refusal(pod, use, excess, data, namespaces, workloads)
            if reason is None:  # its budget may have gone to a pod planned before it
                reason = data.disruptions.refusal(budgets, pod.ready)
            if reason in ("workload-budget", "namespace-budget") and covers:
                covering_waits = True
            target = None
            if reason is None:
                target, reason = targets.find(pod, node)
                if reason == "no-target" and pod.batch and regular_hot:
                    reason = None  # batch work yields to the regular pods, with or without a place elsewhere
                if target is not None:
                    reason = targets.take(pod, target)
            if reason is not None:
                plan.skipped[reason] += 1
                continue
            metric = _worst(projected, pool)
            plan.evictions.append(Eviction(pod, node, target, metric, projected[metric], pool.high[metric]))
            namespaces[pod.namespace] += 1
            if pod.owner is not None:
                workloads[workload_of(pod.owner, data.owners)] += 1
            data.disruptions.spend(budgets, pod.ready)
            evicted_here += 1
            room -= 1
            for m in projected:
                resource = resource_of(m)
                total = capacity.cpu if resource == "cpu" else capacity.memory
                if resource and total > 0:
                    projected[m] -= use.of(resource) / total
    return plan


def _refusal(
    pod: PodView,
    use: PodUsage,
    excess: Mapping[str, float],
    data: RoundInput,
    namespaces: Counter[str],
    workloads: Counter[str],
) -> str | None:
    if all(use.of(r) <= 0 for r in excess):
        return "no-relief"
    if namespaces[pod.namespace] >= data.limits.per_namespace_per_round:
        return "namespace-budget"
    return workload_refusal(pod, data.limits, data.workloads, data.owners, workloads)


def workload_refusal(
    pod: PodView,
    limits: Limits,
    workloads: Mapping[str, Workload],
    owners: Mapping[str, str],
    planned: Counter[str],
) -> str | None:
    """``workload-budget`` when one more of the pod's workload down (not Ready, or planned this round) would exceed
    ``maxUnavailablePerWorkload``."""
    if pod.owner is None:
        return None
    key = workload_of(pod.owner, owners)
    workload = workloads.get(key, Workload(1, 0))
    allowed = workload_allowance(limits.max_unavailable_per_workload, workload.pods)
    return "workload-budget" if workload.unavailable + planned[key] + 1 > allowed else None
