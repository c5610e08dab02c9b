"""Where an evicted pod's replacement could go: crane-scheduler's own Filter, run on the round's snapshot.

The replacement (the pod without its node, a new uid) goes through the scheduler's default profile, built from
``crane_scheduler``'s registry with its ``Dynamic`` plugin (the descheduler's policy and estimate, stale data
fail-closed), over a ``NodeTable`` of the cluster's nodes and bound pods (``SchedulerSnapshot``, kept from round
to round as the scheduler keeps its own), the evicted pod taken out: PreFilter
and every Filter plugin (NodeUnschedulable, NodeName, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit,
the volume plugins, PodTopologySpread, InterPodAffinity, DynamicResources, Dynamic) exactly as the scheduler runs
them (``Profile.run_prefilter_and_filter``, the what-if entry point preemption uses), and the scheduler's
unsupported-field gate. Then:

- the node it leaves passes: its replacement could land back there, the pod is not evicted (``would-return``);
- no other node that is not hot passes: not evicted (``no-target``);
- else the target is the passing node the scheduler's Score ranks first, and the pod is reserved there
  (``Profile.run_reserve`` after the table's ``assume``, as the scheduler's cycle does), so the next pod of the
  round sees it: NodeResourcesFit its requests, Dynamic its estimate as a recent binding.

What the snapshot does not hold is not guessed: the descheduler lists no PVCs, PVs, ResourceClaims or namespaces,
so a pod with claims fails the volume or DRA PreFilter (never evicted: fail-closed), and namespace selectors of
pod-affinity terms see no namespace labels.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crane_descheduler.pods import PodView
from crane_scheduler.algorithm import Algorithm, filter_error
from crane_scheduler.config import SchedulerConfig
from crane_scheduler.framework import Handle, PluginMetrics, Registry
from crane_scheduler.framework.runtime import Profile, build_profiles
from crane_scheduler.framework.types import EXPLAIN_SCORES
from crane_scheduler.loadaware import DYNAMIC_WEIGHT
from crane_scheduler.loadaware.args import PluginArgs
from crane_scheduler.loadaware.plugin import NAME as DYNAMIC
from crane_scheduler.loadaware.plugin import Dynamic
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import builtin_registry
from crane_scheduler.podinfo import PodInfo, parse_node, parse_pod
from crane_scheduler.unsupported import unsupported_field
from crane_shared.loadaware.dynamic import DynamicArgs

Verdict = tuple[str | None, str | None]
"""(target, None) or (None, why not)"""


def replacement(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The pod its controller creates in its place, as far as the Filter reads it: the same spec without a node,
    labels, namespace and owners; a uid of its own (the evicted pod's stays in the accounting until taken out)."""
    meta = raw.get("metadata") or {}
    spec = {k: v for k, v in (raw.get("spec") or {}).items() if k != "nodeName"}
    kept = ("namespace", "labels", "annotations", "ownerReferences", "generateName")
    new_meta = {k: meta[k] for k in kept if k in meta}
    new_meta |= {"name": f"{meta.get('name', '')}-replacement", "uid": f"{meta.get('uid', '')}/replacement"}
    return {"metadata": new_meta, "spec": spec, "status": {}}


def registry_for(args: DynamicArgs, clock: Callable[[], float]) -> Registry:
    """The scheduler's built-in plugins and its Dynamic, fed the descheduler's policy object (reloaded by the
    descheduler from the same file) and the round's clock; a target without fresh data does not count."""
    registry = builtin_registry()
    plugin_args = PluginArgs(
        policy_path=None,
        stale="fail-closed",
        legacy_zone=args.legacy_zone,
        own_bindings_in_hot_value=args.own_bindings_in_hot_value,
        estimate=args.estimate,
    )

    def dynamic(raw: Mapping[str, Any], handle: Handle) -> Dynamic:
        return Dynamic(plugin_args, handle, clock, policy=args.policy)

    registry.register(DYNAMIC, dynamic, enabled_by_default=True, weight=DYNAMIC_WEIGHT)
    return registry


def _follow(
    objects: Sequence[Mapping[str, Any]],
    key: str,
    known: dict[str, Mapping[str, Any]],
    put: Callable[[Mapping[str, Any]], object],
    drop: Callable[[str], object],
) -> None:
    """Bring ``known`` (``metadata[key]`` -> object) and the table to ``objects``: an object that is not the one
    last put (the informers replace an object when it changes) is put again, one that is gone is dropped."""
    seen: set[str] = set()
    for obj in objects:
        name = str((obj.get("metadata") or {}).get(key) or "")
        seen.add(name)
        if known.get(name) is not obj:
            put(obj)
            known[name] = obj
    for name in known.keys() - seen:
        drop(name)
        del known[name]


class SchedulerSnapshot:
    """crane-scheduler's node table and default profile over the cluster, kept from round to round as the
    scheduler keeps its own: a round re-reads only the node and pod objects that changed (the informers replace
    an object when it changes, so identity says so), and the profile is built again only when the Dynamic
    arguments change (a policy reload). What a round plans on it is undone when the round closes."""

    def __init__(self) -> None:
        self.now = 0.0
        self._args: DynamicArgs | None = None
        self._built: tuple[NodeTable, Profile, Algorithm] | None = None
        self._nodes: dict[str, Mapping[str, Any]] = {}
        self._pods: dict[str, Mapping[str, Any]] = {}
        """uid -> the object last put in the table"""

    def sync(
        self, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], args: DynamicArgs, now: float
    ) -> tuple[NodeTable, Profile, Algorithm]:
        self.now = now
        if self._built is None or self._args is not args:
            table = NodeTable()
            metrics = PluginMetrics()
            registry = registry_for(args, lambda: self.now)
            profiles = build_profiles(
                SchedulerConfig(), registry, lambda name: Handle(table, None, lambda: self.now, name, metrics)
            )
            # every feasible node scored (no sampling), ties broken the same way every round
            self._built = (table, next(iter(profiles.values())), Algorithm(table, 100, random.Random(0)))
            self._args, self._nodes, self._pods = args, {}, {}
        table = self._built[0]
        _follow(nodes, "name", self._nodes, lambda node: table.upsert_node(parse_node(dict(node))), table.remove_node)
        _follow(pods, "uid", self._pods, lambda pod: table.add_pod(parse_pod(dict(pod))), table.remove_pod)
        return self._built

    def raw(self, uid: str) -> Mapping[str, Any] | None:
        return self._pods.get(uid)


@dataclass
class SchedulerTargets:
    """One round's questions to the snapshot; it is synced on first use (most rounds have no hot node, and then
    nothing is read), and ``close`` takes back what the round planned."""

    snapshot: SchedulerSnapshot
    nodes: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    """bound, not terminal"""
    args: DynamicArgs
    now: float
    hot: Collection[str] = ()
    """nodes no pod is sent to (the round's hot ones)"""
    _built: tuple[NodeTable, Profile, Algorithm] | None = field(default=None, init=False)
    _states: dict[str, tuple[PodInfo, dict[str, Any]]] = field(default_factory=dict, init=False)
    """pod uid -> its replacement and the cycle state of its last ``find`` (Reserve reads what PreFilter wrote)"""
    _planned: list[tuple[PodInfo, dict[str, Any], str]] = field(default_factory=list, init=False)
    _taken_out: list[Any] = field(default_factory=list, init=False)
    """the planned pods' records, out of the table until the round closes"""

    def _build(self) -> tuple[NodeTable, Profile, Algorithm]:
        if self._built is None:
            self._built = self.snapshot.sync(self.nodes, self.pods, self.args, self.now)
        return self._built

    def find(self, pod: PodView, source: str, *, drain: bool = False) -> Verdict:
        """The node the scheduler would place ``pod``'s replacement on, other than ``source``; or why none.

        ``drain``: ``source`` is being emptied (it passes the Filter: it is idle); the replacement would return
        only if Dynamic's score (the policy's strategy: with ``pack``, fuller nodes first) ranks ``source`` at
        least as high as every other node that passes."""
        table, profile, algorithm = self._build()
        raw = self.snapshot.raw(pod.uid)
        if raw is None:
            return None, "no-target"
        info = parse_pod(replacement(raw))
        if unsupported_field(info.raw, profile.supported_fields) is not None:
            return None, "no-target"
        removed = table.simulate_remove([pod.uid], notify=True)
        try:
            state: dict[str, Any] = {}
            self._states[pod.uid] = (info, state)
            alive = table.live.copy()
            rejected = profile.run_prefilter_and_filter(state, info, table, alive)
            if filter_error(rejected) is not None:
                return None, "no-target"
            src = table.rows.get(source, -1)
            if src >= 0 and alive[src] and not drain:
                return None, "would-return"
            for name in self.hot:
                row = table.rows.get(name)
                if row is not None and row != src:
                    alive[row] = False
            others = alive.copy()
            if src >= 0:
                others[src] = False
            rows = np.flatnonzero(others)
            if len(rows) == 0:
                return None, "no-target"
            if src >= 0 and alive[src]:  # a drain: where the scheduler's load score sends the replacement
                rows = np.append(rows, src)
            elif len(rows) == 1:
                return table.names[int(rows[0])], None
            scores = algorithm._score(profile, info, state, rows)
            if not isinstance(scores, np.ndarray):
                return None, "no-target"
            if rows[-1] == src:
                load = dict((name, sc) for name, _, sc in state.get(EXPLAIN_SCORES, ((), []))[1]).get(DYNAMIC)
                if load is not None and load[-1] >= load[:-1].max():
                    return None, "would-return"
                rows, scores = rows[:-1], scores[:-1]
            best = [str(table.names[int(r)]) for r in rows[scores == scores.max()]]
            return min(best), None
        finally:
            table.simulate_add(removed, notify=True)

    def take(self, pod: PodView, target: str) -> None:
        """The eviction is planned: the pod leaves the accounting, its replacement is assumed on ``target`` and
        reserved there (Dynamic counts it as a recent binding), until ``close``."""
        table, profile, _ = self._build()
        self._taken_out += table.simulate_remove([pod.uid], notify=True)
        found = self._states.pop(pod.uid, None)
        if found is None:
            return
        info, state = found
        table.assume(info, target)
        profile.run_reserve(state, info, target)
        self._planned.append((info, state, target))

    def checkpoint(self) -> tuple[int, int]:
        """A mark to ``rollback`` to: a drain plans a node's pods together and keeps all or none."""
        return len(self._planned), len(self._taken_out)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Undo what was taken since ``mark``, as ``close`` undoes a round."""
        if self._built is None:
            return
        table, profile, _ = self._built
        planned, taken = mark
        for info, state, target in reversed(self._planned[planned:]):
            profile.run_unreserve(state, info, target)
            table.forget(info.uid)
        table.simulate_add(self._taken_out[taken:], notify=True)
        del self._planned[planned:], self._taken_out[taken:]

    def close(self) -> None:
        """Undo the round's plan on the snapshot: the next round starts from the cluster as the informers see it."""
        if self._built is None:
            return
        table, profile, _ = self._built
        for info, state, target in reversed(self._planned):
            profile.run_unreserve(state, info, target)
            table.forget(info.uid)
        table.simulate_add(self._taken_out, notify=True)
        self._planned.clear()
        self._taken_out.clear()
