"""The drain (``spec.drain``): empty the nodes whose real usage and requests are both low, so an autoscaler can
remove them (the descheduler's LowNodeUtilization, by measured usage). Pure.

A node is *idle* in a round when its load data is fresh and every metric of ``usageBelow`` (default: its pool's
low thresholds) is strictly below its threshold, and its pods' requests are strictly below ``requestsBelow`` of
its allocatable (CPU and memory); it becomes a drain candidate after ``consecutiveRounds`` idle rounds in a row.
At most ``maxNodes`` nodes are drained at once, the ones already under way first, then the emptiest (by requests);
a node under way that evicted nothing ``consecutiveRounds`` rounds in a row (a pod that never starts, a budget that
never allows) goes after them, so it keeps no other node from being emptied. A node the drain's placed pods go to
this round (evicted now or held back by a budget) is not drained in it (``drain-is-target``).

A node is drained only when **every** pod on it that must move has a place elsewhere by the scheduler's own
Filter (``targets.SchedulerTargets.find(drain=True)``: crane-scheduler's profile, the other pods of the round
assumed and reserved, nodes being drained and hot nodes excluded as targets) and the scheduler's score (every
scoring plugin of its profile, weighted: Dynamic's strategy and kube's own) would not send it back (with
``scoring.strategy: pack`` Dynamic ranks fuller nodes first; with ``spread`` the emptiest node, so the drain
reports ``would-return``; kube's least-allocated and spreading scores can still favour the emptied node): if one
has none, the node's plan is undone and nothing is evicted from it (``drain-no-target``, ``drain-would-return``).
DaemonSet, static and terminating pods do not move (an autoscaler
ignores them too); a pod that may never be evicted (``pods.eviction_blocker``: not recreated, system-critical,
local storage, excluded namespace, ``prefer-no-eviction``) keeps its node out of the drain (``drain-blocked``).
Then the pods are evicted under the same budgets as a hot node's (per node and namespace per round, per workload,
the global rate) and PodDisruptionBudgets, the rest in later rounds, as long as the node stays idle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, MutableSet, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from crane_descheduler.classify import Reading
from crane_descheduler.plan import Eviction, NodeView, Plan, TargetFinder, Workload, rate_room, workload_refusal
from crane_descheduler.pods import QOS_RANK, Disruptions, PodView, eviction_blocker, workload_of
from crane_descheduler.policy import DeschedulerPolicy, Drain, NodePool
from crane_shared.podresources import CPU, MEMORY

MOVE_LATER = frozenset({"young", "not-running"})
"""blockers that pass with time: the node stays in the drain, the pod waits"""
STAYS = frozenset({"daemonset", "static"})
"""pods that stay on a node being removed (its DaemonSet's, the kubelet's own)"""


@dataclass(frozen=True)
class DrainState:
    """Carried from round to round."""

    idle: Mapping[str, int] = field(default_factory=dict)
    """node -> consecutive idle rounds"""
    draining: frozenset[str] = frozenset()
    stalled: Mapping[str, int] = field(default_factory=dict)
    """node being drained -> rounds in a row it evicted nothing (its pods waiting: starting, young, a budget)"""


@dataclass(frozen=True)
class Idle:
    idle: bool
    metric: str = ""
    """the metric nearest its threshold"""
    value: float = 0.0
    threshold: float = 0.0


def idle_reading(reading: Reading, pool: NodePool, drain: Drain, view: NodeView, requested: Mapping[str, int]) -> Idle:
    """Whether the node reads idle this round (usage and requests below the drain's thresholds)."""
    if reading.raw == "unknown":
        return Idle(False)
    thresholds = drain.usage_below or pool.low
    found: list[tuple[float, str, float, float]] = []
    for metric, limit in thresholds.items():
        sample = reading.load.readings.get(metric)
        usage = sample.usage if sample is not None else None
        if usage is None or usage >= limit:
            return Idle(False)
        found.append((usage / limit, metric, usage, limit))
    for resource, name in (("cpu", CPU), ("memory", MEMORY)):
        allocatable = view.allocatable.get(name, 0)
        if allocatable <= 0 or requested.get(name, 0) / allocatable >= drain.requests_below[resource]:
            return Idle(False)
    if not found:
        return Idle(False)
    _, metric, usage, limit = max(found)
    return Idle(True, metric, usage, limit)


@dataclass
class DrainInput:
    now: datetime
    policy: DeschedulerPolicy
    nodes: Mapping[str, NodeView]
    readings: Mapping[str, Reading]
    pools: Mapping[str, NodePool]
    hot: frozenset[str]
    pods: Mapping[str, Sequence[tuple[PodView, Mapping[str, Any]]]]
    """node -> its pods (not terminal) with their JSON"""
    workloads: Mapping[str, Workload]
    owners: Mapping[str, str]
    disruptions: Disruptions
    """what each PodDisruptionBudget still allows this round, after the hot nodes' evictions"""
    evicted_at: Sequence[float]
    """recent evictions (all rounds): the global rate"""
    targets: TargetFinder
    excluded: MutableSet[str]
    """the targets' excluded nodes (hot ones, nodes being drained): the nodes chosen here are added"""
    state: DrainState


def plan_drain(data: DrainInput, plan: Plan) -> DrainState:
    """Add the drain's evictions to ``plan`` (after the hot nodes', sharing their budgets); the new state."""
    drain = data.policy.drain
    if drain is None:
        return DrainState()
    idle: dict[str, int] = {}
    readings: dict[str, Idle] = {}
    for name, reading in data.readings.items():
        pool, view = data.pools.get(name), data.nodes.get(name)
        if pool is None or view is None or name in data.hot:
            continue
        requested: Counter[str] = Counter()
        for pod, _ in data.pods.get(name, ()):
            requested.update(pod.requests)
        found = idle_reading(reading, pool, drain, view, requested)
        readings[name] = found
        if found.idle:
            idle[name] = data.state.idle.get(name, 0) + 1
    ready = {n for n, rounds in idle.items() if rounds >= drain.rounds}

    def share(name: str) -> tuple[float, str]:
        view = data.nodes[name]
        pods = [p for p, _ in data.pods.get(name, ())]
        used = max(sum(p.requests.get(r, 0) for p in pods) / view.allocatable[r] for r in (CPU, MEMORY))
        return used, name

    # A node under way that evicted nothing for ``rounds`` rounds in a row (a pod that never starts, a budget that
    # never allows) goes after the fresh candidates: it keeps no other node from being emptied.
    stalled_before = data.state.stalled
    waiting = {n for n in data.state.draining if stalled_before.get(n, 0) >= drain.rounds}
    under_way = sorted(n for n in data.state.draining if n in ready and n not in waiting)
    fresh = sorted((n for n in ready if n not in data.state.draining), key=share)
    budget = Budget.of(data, plan)
    draining: set[str] = set()
    stalled: dict[str, int] = {}
    places: set[str] = set()  # nodes the drain's placed pods go to this round, evicted now or not
    for name in [*under_way, *fresh, *sorted(n for n in waiting if n in ready)]:
        if len(draining) >= drain.max_nodes:
            if name in waiting:
                stalled[name] = stalled_before[name]  # kept back, not given up: its count stands
            continue
        if name in places or any(e.target == name for e in plan.evictions):  # a replacement goes there
            plan.skipped["drain-is-target"] += 1
            continue
        outcome, evicted = _drain_node(name, readings[name], data, budget, plan, places)
        if outcome == "draining":
            draining.add(name)
            stalled[name] = 0 if evicted else stalled_before.get(name, 0) + 1
    return DrainState(idle, frozenset(draining), stalled)


@dataclass
class Budget:
    """What a hot node's evictions left of this round's budgets."""

    room: int
    namespaces: Counter[str]
    workloads: Counter[str]

    @classmethod
    def of(cls, data: DrainInput, plan: Plan) -> Budget:
        limits = data.policy.limits
        room = rate_room(list(data.evicted_at), data.now.timestamp(), limits.per_minute) - len(plan.evictions)
        namespaces = Counter(e.pod.namespace for e in plan.evictions)
        workloads = Counter(workload_of(e.pod.owner, data.owners) for e in plan.evictions if e.pod.owner)
        return cls(room, namespaces, workloads)

    def refusal(self, pod: PodView, data: DrainInput, on_node: int) -> str | None:
        limits = data.policy.limits
        if self.room <= 0:
            return "rate-limit"
        if on_node >= limits.per_node_per_round:
            return "node-budget"
        if self.namespaces[pod.namespace] >= limits.per_namespace_per_round:
            return "namespace-budget"
        return workload_refusal(pod, limits, data.workloads, data.owners, self.workloads)

    def spend(self, pod: PodView, data: DrainInput) -> None:
        self.room -= 1
        self.namespaces[pod.namespace] += 1
        if pod.owner is not None:
            self.workloads[workload_of(pod.owner, data.owners)] += 1


def _drain_node(
    name: str, idle: Idle, data: DrainInput, budget: Budget, plan: Plan, places: set[str]
) -> tuple[str, int]:
    """``draining`` (every pod placed; some evicted now, perhaps), ``empty``, or why not; with the evictions
    planned. The placed pods' targets go into ``places``."""
    movable: list[tuple[PodView, Mapping[str, Any], str | None]] = []
    for pod, raw in data.pods.get(name, ()):
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            continue  # leaving already
        blocker = eviction_blocker(raw, data.now, data.policy.evictable)
        if blocker in STAYS:
            continue
        if blocker is not None and blocker not in MOVE_LATER:
            plan.skipped["drain-blocked"] += 1
            return "blocked", 0
        movable.append((pod, raw, blocker))
    if not movable:
        return "empty", 0
    movable.sort(key=lambda m: (m[0].priority, QOS_RANK[m[0].qos], m[0].key))
    mark = data.targets.checkpoint()
    data.excluded.add(name)
    placed: list[tuple[PodView, Mapping[str, Any], str | None, str]] = []
    for pod, raw, blocker in movable:
        target, why = data.targets.find(pod, name, drain=True)
        if target is not None:
            why = data.targets.take(pod, target)
        if target is None or why is not None:
            data.targets.rollback(mark)
            data.excluded.discard(name)
            plan.skipped[f"drain-{why or 'no-target'}"] += len(movable)
            return "no-place", 0
        placed.append((pod, raw, blocker, target))
    places.update(target for *_, target in placed)
    evicted_here = 0
    for pod, raw, blocker, target in placed:  # every pod has a place: evict what the budgets allow now
        budgets = data.disruptions.of(raw)
        reason = blocker or data.disruptions.refusal(budgets, pod.ready) or budget.refusal(pod, data, evicted_here)
        if reason is not None:
            plan.skipped[f"drain-{reason}"] += 1
            continue
        plan.evictions.append(Eviction(pod, name, target, idle.metric, idle.value, idle.threshold, kind="drain"))
        budget.spend(pod, data)
        data.disruptions.spend(budgets, pod.ready)
        evicted_here += 1
    return "draining", evicted_here
