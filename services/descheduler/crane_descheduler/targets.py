"""Where an evicted pod's replacement could go: crane-scheduler's own Filter, run on the round's snapshot.

The replacement (the pod without its node, a new uid) goes through crane-scheduler's public offline scheduler
(``crane_scheduler.simulate.Simulator``: the pod's profile of ``--scheduler-config``, else the default one, with
``Dynamic`` on the descheduler's policy and
estimate, stale data fail-closed) over the cluster's nodes and bound pods (``SchedulerSnapshot``, kept from round
to round as the scheduler keeps its own), the evicted pod taken out: the unsupported-field gate, PreFilter and
every Filter plugin (NodeUnschedulable, NodeName, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, the
volume plugins, PodTopologySpread, InterPodAffinity, DynamicResources, Dynamic) exactly as the scheduler runs them
(``Simulator.filter``). Then:

- the node it leaves passes: its replacement could land back there, the pod is not evicted (``would-return``);
- no other node that is not hot passes: not evicted (``no-target``);
- else the target is the passing node the scheduler's Score ranks first (``Simulator.score``; ties: the first
  name), and the pod is reserved there (``Simulator.reserve``: assume and Reserve, as the scheduler's cycle does),
  so the next pod of the round sees it: NodeResourcesFit its requests, Dynamic its estimate as a recent binding.

What the snapshot does not hold is not guessed: the descheduler lists no PVCs, PVs, ResourceClaims or namespaces,
so a pod with claims fails the volume or DRA PreFilter (never evicted: fail-closed), and namespace selectors of
pod-affinity terms see no namespace labels.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from crane_descheduler.pods import PodView
from crane_scheduler.simulate import Placement, PluginError, Removed, Reservation, Simulator
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


class SchedulerSnapshot:
    """crane-scheduler over the cluster, kept from round to round as the scheduler keeps its own: a round re-reads
    only the node and pod objects that changed (``Simulator.sync``), and the simulator is built again only when
    the Dynamic arguments change (a policy reload). What a round plans on it is undone when the round closes."""

    def __init__(self, config: Path | Mapping[str, Any] | None = None) -> None:
        """``config``: crane-scheduler's ``KubeSchedulerConfiguration`` (a file's path, or parsed): its profiles
        judge the targets (None: the default profile)."""
        self.now = 0.0
        self.config = config
        self._args: DynamicArgs | None = None
        self._sim: Simulator | None = None

    def sync(
        self, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], args: DynamicArgs, now: float
    ) -> Simulator:
        self.now = now
        if self._sim is None or self._args is not args:
            # every feasible node scored (no sampling); a target without fresh data does not count
            self._sim = Simulator(
                self.config,
                dynamic=replace(args, stale="fail-closed"),
                clock=lambda: self.now,
                percentage_of_nodes_to_score=100,
            )
            self._args = args
        self._sim.sync("Node", nodes)
        self._sim.sync("Pod", pods)
        return self._sim


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
    in_flight: Sequence[tuple[Mapping[str, Any], str]] = ()
    """earlier rounds' replacements not seen bound yet, with their targets: held there (as bound pods) for the
    round, so their room is not planned twice"""
    _sim: Simulator | None = field(default=None, init=False)
    _held: list[dict[str, Any]] = field(default_factory=list, init=False)
    _found: dict[str, Placement] = field(default_factory=dict, init=False)
    """pod uid -> its replacement's last ``find`` (Reserve reads what PreFilter wrote)"""
    _planned: list[Reservation] = field(default_factory=list, init=False)
    _taken_out: list[Removed] = field(default_factory=list, init=False)
    """the planned pods, out of the accounting until the round closes"""

    def _build(self) -> Simulator:
        if self._sim is None:
            self._sim = self.snapshot.sync(self.nodes, self.pods, self.args, self.now)
            for raw, target in self.in_flight:
                if target not in self._sim.table.rows:
                    continue
                meta = raw.get("metadata") or {}
                held = {
                    **raw,
                    "kind": "Pod",
                    "metadata": {**meta, "uid": f"{meta.get('uid', '')}/in-flight"},
                    "spec": {**(raw.get("spec") or {}), "nodeName": target},
                }
                self._sim.add(held)
                self._held.append(held)
        return self._sim

    def find(self, pod: PodView, source: str, *, drain: bool = False) -> Verdict:
        """The node the scheduler would place ``pod``'s replacement on, other than ``source``; or why none.

        ``drain``: ``source`` is being emptied (it passes the Filter: it is idle); the replacement would return
        when the scheduler's score, every scoring plugin weighted as it ranks nodes (Dynamic's strategy, and kube's
        own: least allocated requests, spreading), ranks ``source`` at least as high as every other node that
        passes. Dynamic's alone is not enough: with ``pack`` it ranks fuller nodes first, while the rest of the
        profile may still prefer the emptied node and send each replacement back (a drain that never ends)."""
        sim = self._build()
        raw = sim.get("Pod", pod.uid)
        if raw is None:
            return None, "no-target"
        with sim.without([pod.uid]):
            found = sim.filter(replacement(raw))
            self._found[pod.uid] = found
            if found.error or not found.feasible:
                return None, "no-target"
            back = source in found.feasible
            if back and not drain:
                return None, "would-return"
            others = [name for name in found.feasible if name != source and name not in self.hot]
            if not others:
                return None, "no-target"
            if len(found.feasible) == 1:
                return others[0], None
            # every node that passes is scored: the scheduler's score sends the replacement to the best of them,
            # which must be neither the source (a drain's passes) nor a node no pod is sent to (hot, being emptied)
            ranked = list(found.feasible)
            try:
                scores = sim.score(found, ranked)
            except PluginError:
                return None, "no-target"
            best = scores.best(ranked)
            if drain and source in best:
                return None, "would-return"
            if any(name in self.hot for name in best):
                return None, "would-go-excluded"
            return min(best), None

    def take(self, pod: PodView, target: str) -> str | None:
        """The eviction is planned: the pod leaves the accounting, its replacement is assumed on ``target`` and
        reserved there (Dynamic counts it as a recent binding), until ``close``. ``reserve-refused`` (and nothing
        taken) when a Reserve plugin refuses the replacement there."""
        sim = self._build()
        found = self._found.pop(pod.uid, None)
        removed = sim.take_out([pod.uid])
        if found is not None:
            reservation = sim.reserve(found, target)
            if not reservation.ok:
                sim.put_back(removed)
                return "reserve-refused"
            self._planned.append(reservation)
        self._taken_out.append(removed)
        return None

    def checkpoint(self) -> tuple[int, int]:
        """A mark to ``rollback`` to: a drain plans a node's pods together and keeps all or none."""
        return len(self._planned), len(self._taken_out)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Undo what was taken since ``mark``, as ``close`` undoes a round."""
        if self._sim is None:
            return
        planned, taken = mark
        for reservation in reversed(self._planned[planned:]):
            self._sim.undo(reservation)
        for removed in self._taken_out[taken:]:
            self._sim.put_back(removed)
        del self._planned[planned:], self._taken_out[taken:]

    def close(self) -> None:
        """Undo the round's plan on the snapshot: the next round starts from the cluster as the informers see it."""
        if self._sim is None:
            return
        for held in self._held:
            self._sim.delete(held)
        self._held.clear()
        for reservation in reversed(self._planned):
            self._sim.undo(reservation)
        for removed in self._taken_out:
            self._sim.put_back(removed)
        self._planned.clear()
        self._taken_out.clear()
