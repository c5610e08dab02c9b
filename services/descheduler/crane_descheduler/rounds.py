"""A whole round from raw API objects to a plan: pure (the service feeds it its informers' caches).

Node and pod JSON that cannot be read is skipped and counted (``malformed``), never fatal. The debounce state is
carried from round to round by the caller (``detectors``); a node that disappears drops its state.

``RoundState`` is what a leader carries from one round to the next (debounce, drain, the scheduler's snapshot,
its own recent evictions) and the one way to drive rounds: the service feeds it its informers' caches and
Prometheus' answers on the wall clock, ``cranectl replay`` a simulated cluster on a virtual clock.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from crane_descheduler.classify import Detector, RawClass, Reading, node_class, read_node, step
from crane_descheduler.drain import DrainInput, DrainState, plan_drain
from crane_descheduler.plan import (
    RATE_WINDOW,
    Candidate,
    Evicted,
    Eviction,
    NodeView,
    Plan,
    RoundInput,
    Workload,
    plan_round,
)
from crane_descheduler.pods import (
    Disruptions,
    PodView,
    created_at,
    eviction_blocker,
    pod_view,
    workload_of,
    workload_owners,
)
from crane_descheduler.policy import DeschedulerPolicy, NodePool
from crane_descheduler.targets import SchedulerSnapshot, SchedulerTargets, replacement
from crane_shared.batch import PodUsage
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.podresources import resource_list

TERMINAL = ("Succeeded", "Failed")


@dataclass
class RoundResult:
    plan: Plan
    classes: dict[str, RawClass]
    detectors: dict[str, Detector]
    readings: dict[str, Reading]
    pools: dict[str, NodePool]
    unknown: dict[str, str] = field(default_factory=dict)
    """node -> why its data cannot be used this round"""
    malformed: Counter[str] = field(default_factory=Counter)
    """objects skipped, by kind"""
    batch_problems: dict[str, str] = field(default_factory=dict)
    """node -> why its batch usage annotation was ignored (counted as no batch usage)"""
    drain: DrainState = field(default_factory=DrainState)
    """the drain's state for the next round (``drain``)"""


def node_view(node: Mapping[str, Any]) -> NodeView:
    meta, status = node["metadata"], node.get("status") or {}
    return NodeView(
        name=meta["name"],
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        allocatable=resource_list(status.get("allocatable")),
    )


def run_round(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    usage: Mapping[str, PodUsage],
    policy: DeschedulerPolicy,
    args: DynamicArgs,
    detectors: Mapping[str, Detector],
    now: datetime,
    evicted: Sequence[Evicted] = (),
    pdbs: Sequence[Mapping[str, Any]] = (),
    views_cache: dict[str, tuple[str, PodView]] | None = None,
    replicasets: Sequence[Mapping[str, Any]] = (),
    snapshot: SchedulerSnapshot | None = None,
    drain: DrainState | None = None,
    *,
    usage_known: bool = True,
) -> RoundResult:
    """``views_cache`` (uid -> (resourceVersion, view)), kept by the caller from round to round, spares reading
    the pods that did not change again; it is updated here and loses the pods that are gone. ``replicasets``: a
    ReplicaSet's pods count under its controller (the Deployment) for the workload budget. ``snapshot``, kept by the
    caller too, is the scheduler's node table the target check runs on (a fresh one when None). ``drain``: the
    drain's state of the previous round (``spec.drain``). ``usage_known`` False: the pods' usage could not be
    read (Prometheus failed), and the round evicts nothing: the hot nodes' pods have no usage to choose by, and
    the drain waits too (its state kept as it was)."""
    malformed: Counter[str] = Counter()
    views: list[tuple[PodView, Mapping[str, Any]]] = []
    cache = views_cache if views_cache is not None else {}
    seen: set[str] = set()
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in TERMINAL:
            continue
        meta = pod.get("metadata") or {}
        uid, version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
        cached = cache.get(uid) if uid and version else None
        if cached is not None and cached[0] == version:
            views.append((cached[1], pod))
            seen.add(uid)
            continue
        try:
            view = pod_view(pod)
        except (KeyError, TypeError, ValueError):
            malformed["pod"] += 1
            continue
        views.append((view, pod))
        if uid and version:
            cache[uid] = (version, view)
            seen.add(uid)
    for uid in cache.keys() - seen:
        del cache[uid]
    owners = workload_owners(replicasets)
    workloads: dict[str, list[int]] = {}
    for view, _ in views:
        if view.owner is not None:
            counts = workloads.setdefault(workload_of(view.owner, owners), [0, 0])
            counts[0] += 1
            counts[1] += 0 if view.ready else 1

    node_views: dict[str, NodeView] = {}
    for node in nodes:
        try:
            built = node_view(node)
            node_views[built.name] = built
        except (KeyError, TypeError, ValueError):
            malformed["node"] += 1

    readings: dict[str, Reading] = {}
    pools: dict[str, NodePool] = {}
    classes: dict[str, RawClass] = {}
    new_detectors: dict[str, Detector] = {}
    unknown: dict[str, str] = {}
    batch_problems: dict[str, str] = {}
    hot: list[str] = []
    for name, nview in node_views.items():
        pool = policy.pool_of(nview.labels)
        if pool is None:
            continue
        reading = read_node(name, nview.annotations, pool, args, now)
        detector = step(detectors.get(name, Detector()), reading.raw, policy.anomaly)
        readings[name], pools[name], new_detectors[name] = reading, pool, detector
        classes[name] = node_class(detector, reading.raw)
        if reading.problem is not None:
            unknown[name] = reading.problem
        if reading.batch_problem is not None:
            batch_problems[name] = reading.batch_problem
            malformed["batch-usage-annotation"] += 1
        if detector.hot and reading.raw == "hot":
            hot.append(name)

    candidates: dict[str, list[Candidate]] = {}
    disruptions = Disruptions(pdbs)
    for view, raw in views:
        if view.node in hot:
            budgets = disruptions.of(raw)
            blocker = eviction_blocker(raw, now, policy.evictable) or disruptions.refusal(budgets, view.ready)
            candidates.setdefault(view.node, []).append(Candidate(view, blocker, budgets))
    previous = drain or DrainState()
    excluded = set(hot) | set(previous.draining)  # no pod is sent to a hot node or one being emptied
    targets = SchedulerTargets(
        snapshot or SchedulerSnapshot(),
        nodes,
        [raw for view, raw in views if view.node],
        args,
        now.timestamp(),
        excluded,
        in_flight(evicted, views),
    )
    drained = DrainState()
    workload_counts = {uid: Workload(c[0], c[1]) for uid, c in workloads.items()}
    try:
        plan = plan_round(
            RoundInput(
                now=now,
                args=args,
                limits=policy.limits,
                nodes=node_views,
                readings=readings,
                pools=pools,
                hot=hot,
                candidates=candidates,
                usage=usage,
                workloads=workload_counts,
                owners=owners,
                targets=targets,
                evicted=evicted,
                disruptions=disruptions,
            )
        )
        if policy.drain is not None and not usage_known:
            drained = previous
        elif policy.drain is not None:
            by_node: dict[str, list[tuple[PodView, Mapping[str, Any]]]] = {}
            for view, raw in views:
                if view.node:
                    by_node.setdefault(view.node, []).append((view, raw))
            drained = plan_drain(
                DrainInput(
                    now=now,
                    policy=policy,
                    nodes=node_views,
                    readings=readings,
                    pools=pools,
                    hot=frozenset(hot),
                    pods=by_node,
                    workloads=workload_counts,
                    owners=owners,
                    disruptions=disruptions,
                    evicted_at=[e.at for e in evicted],
                    targets=targets,
                    excluded=excluded,
                    state=previous,
                ),
                plan,
            )
    finally:
        targets.close()
    return RoundResult(plan, classes, new_detectors, readings, pools, unknown, malformed, batch_problems, drained)


CREATION_SLACK = 5.0
"""seconds a replacement's creation time may read before its eviction's (the API server's clock and ours)"""


def in_flight(
    evicted: Sequence[Evicted], views: Sequence[tuple[PodView, Mapping[str, Any]]]
) -> list[tuple[Mapping[str, Any], str]]:
    """The replacements of this leader's evictions not seen bound yet (no bound pod of the evicted pod's owner
    created since), with their planned targets: the target check holds their room there."""
    newest: dict[str, float] = {}
    for view, raw in views:
        if view.node and view.owner is not None:
            created = _created(raw)
            newest[view.owner.uid] = max(newest.get(view.owner.uid, 0.0), created)
    return [
        (e.replacement, e.target)
        for e in evicted
        if e.target and e.replacement is not None and newest.get(e.owner, 0.0) < e.at - CREATION_SLACK
    ]


def _created(raw: Mapping[str, Any]) -> float:
    try:
        born = created_at(raw.get("metadata") or {})
    except ValueError:
        return 0.0
    return born.timestamp() if born is not None else 0.0


@dataclass
class RoundState:
    """A leader's rounds: what one round leaves to the next. ``plan`` runs a round at ``now`` on the cluster as
    given (``run_round``) and keeps its debounce and drain state; ``evicted`` records an eviction that was made,
    so the budgets and the next rounds' projections count it and its node must be found hot K rounds in a row
    again (as koordinator); ``new_term`` starts the debounce and the drain over (a new leader)."""

    detectors: dict[str, Detector] = field(default_factory=dict)
    drain: DrainState = field(default_factory=DrainState)
    snapshot: SchedulerSnapshot = field(default_factory=SchedulerSnapshot)
    """the scheduler's node table for the target check, kept up to date from round to round"""
    views: dict[str, tuple[str, PodView]] = field(default_factory=dict)
    recent: deque[Evicted] = field(default_factory=deque)
    """this leader's evictions, kept while an averaged metric may still carry them"""
    pods: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """the last round's pods by uid (an eviction's replacement is read from them)"""

    def new_term(self) -> None:
        self.detectors = {}
        self.drain = DrainState()

    def plan(
        self,
        nodes: Sequence[Mapping[str, Any]],
        pods: Sequence[Mapping[str, Any]],
        usage: Mapping[str, PodUsage],
        policy: DeschedulerPolicy,
        args: DynamicArgs,
        now: datetime,
        pdbs: Sequence[Mapping[str, Any]] = (),
        replicasets: Sequence[Mapping[str, Any]] = (),
        *,
        usage_known: bool = True,
    ) -> RoundResult:
        keep = max([RATE_WINDOW, *(args.estimate.window_of(m).total_seconds() for m in args.policy.metrics())])
        while self.recent and self.recent[0].at < now.timestamp() - keep:
            self.recent.popleft()
        result = run_round(
            nodes,
            pods,
            usage,
            policy,
            args,
            self.detectors,
            now,
            tuple(self.recent),
            pdbs,
            self.views,
            replicasets,
            self.snapshot,
            self.drain,
            usage_known=usage_known,
        )
        self.detectors = result.detectors
        self.drain = result.drain
        self.pods = {str((p.get("metadata") or {}).get("uid")): p for p in pods}
        return result

    def evicted(self, eviction: Eviction, at: float, use: PodUsage) -> None:
        """``eviction`` was made at ``at`` (unix seconds); ``use``: the pod's measured usage then."""
        raw = self.pods.get(eviction.pod.uid)
        held = replacement(raw) if raw is not None and eviction.target is not None else None
        owner = eviction.pod.owner.uid if eviction.pod.owner is not None else ""
        self.recent.append(Evicted(eviction.node, at, use, eviction.target, held, owner))
        self.detectors[eviction.node] = Detector()
