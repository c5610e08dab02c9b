"""crane-scheduler as a library: the same plugins, profiles and algorithm as the service, offline.

This is crane-scheduler's one public module: the descheduler's target check, the benchmarks and the tests' shared
fixtures use it, never the scheduler's internals (``tests/unit/test_layering.py``). A ``Simulator`` owns a node
table, the plugin registry (the built-in plugins, the installed ``crane_scheduler.plugins`` entry points, the
load-aware ``Dynamic``), the profiles of a ``KubeSchedulerConfiguration`` built exactly as the scheduler builds
them, the listers of the other objects plugins read, and the algorithm with a seeded tie-break::

    sim = Simulator(config_yaml, clock=lambda: now)      # or Simulator() for the default profile
    sim.sync("Node", nodes)                              # the whole list of a kind ...
    sim.sync("Pod", pods)
    sim.apply("MODIFIED", node)                          # ... or one change at a time (the object's ``kind``)
    placement = sim.place(pod)                           # the node the scheduler would choose, or why none
    placement.node, placement.message, placement.rejected["n3"], placement.scores["n1"].plugins
    reservation = sim.reserve(placement)                 # assume + Reserve: the next decision sees it
    sim.undo(reservation)                                # Unreserve + forget: the table as before

What it takes (``KINDS``): nodes (with the load annotations Dynamic reads), pods (bound ones are accounted, a
pending one with ``status.nominatedNodeName`` is a nomination, terminal ones are gone), the objects the listers
keep (PVCs, PVs, StorageClasses, CSINodes, VolumeAttachments, PDBs, CSIDrivers, CSIStorageCapacities,
ResourceClaims, ResourceSlices, DeviceClasses) and those the ``ObjectPlugin``s of the profiles read (PodGroups,
Workloads, NodeResourceTopologies, Namespaces, the owners of default spread constraints). An object of another
kind is refused naming it, never ignored.

What it answers: ``place`` (the scheduler's decision: PreFilter, Filter, sampling, Score, the seeded tie-break;
the FitError message when nothing fits, and per node the first plugin that rejected it and why, as ``cranectl
explain`` words them; ``explain()`` is that command's JSON), ``filter`` (every feasible node, no sampling),
``score`` (per node, per plugin), ``reserve`` / ``undo``, ``schedule`` (place and reserve: pods placed one after
another, each seeing the earlier), ``schedule_gang`` (a PodGroup's members as the gang cycle places them: kept whole
or given back at once), and ``take_out`` / ``put_back`` (a what-if without some pods: an eviction).

PostFilter is a dry run: when nothing fits, the profile's PostFilter plugins run as the scheduler runs them, but
DefaultPreemption only decides (its evaluator: eligibility, the candidates' what-if, which it undoes, kube's
choice of a node) and nominates and evicts nothing; DynamicResources deallocates nothing (the simulator gives it no
writer). So a pending pod's ``message`` is the one the scheduler reports, "preemption: ..." part included, and
``Placement.preemption`` says what preemption would do: the node it would nominate and the victims it would evict
there (the scheduler then places the pod on that node once they are gone), or kube's words for why it cannot help.
The table is left as it was (``preemption=False``: no PostFilter, the bare FitError).

Time: ``clock`` (default: the wall clock) is every plugin handle's clock and Dynamic's wall clock (the freshness
of load annotations, the window of recent bindings), so a caller that sets it replays virtual time. (The service
runs its handles on the monotonic clock and Dynamic on the wall clock: ``wall_clock`` apart from ``clock``.)

Its users beyond the service (``cranectl snapshot`` / ``simulate``, ``cranectl replay`` on a virtual ``clock``;
next, issue 40's decider workers):

- A snapshot file (nodes, pods, claims, slices, classes, PodGroups, the policy, the profile) loads straight in:
  ``Simulator(profile_yaml, dynamic=policy, clock=...)`` then ``load(objects)`` (each object's ``kind`` says where
  it goes; every kind present is synced whole). Manifests' pods are placed one after another with ``schedule``;
  a pod without a uid gets ``<namespace>/<name>``. ``requested(node)`` / ``allocatable(node)`` give each node's
  accounting before and after, ``node_load(node)`` the load Dynamic estimates there (``cranectl simulate`` does
  exactly this, ``shared/cranectl/whatif.py``).
- The incremental path (``apply``) is what a worker process holding a replica of the node table needs: one object
  per call, the same table updates the scheduler's cache makes, no asyncio and no API client; ``place``, ``reserve``
  and ``undo`` touch only the table and the plugins' own state, and ``undo`` restores them exactly (a property test
  holds incremental and whole syncs to the same answers). Nothing here starts a task or reads the API: plugins'
  watches (``WorkerPlugin.run``) are never run, their objects come through ``apply``.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from crane_scheduler import gangless
from crane_scheduler.algorithm import Algorithm, ScheduleResult, filter_error
from crane_scheduler.config import ConfigError, SchedulerConfig, load_config, parse_config
from crane_scheduler.explain import Decision, render
from crane_scheduler.framework import (
    EXPLAIN_FILTERS,
    EXPLAIN_SCORES,
    Code,
    CycleState,
    Diagnosis,
    GangPlugin,
    Handle,
    ObjectPlugin,
    Plugin,
    PluginFactory,
    PluginMetrics,
    Registry,
    Status,
)
from crane_scheduler.framework.interface import GANG, GANG_MEMBERS
from crane_scheduler.framework.runtime import Profile, build_profiles
from crane_scheduler.gangrules import gang_of, no_preemption, quorum_met, quorum_out_of_reach
from crane_scheduler.listers import Kind, Listers
from crane_scheduler.loadaware import register as register_dynamic
from crane_scheduler.loadaware.args import parse_args as parse_dynamic_args
from crane_scheduler.loadaware.plugin import NAME as DYNAMIC_NAME
from crane_scheduler.loadaware.plugin import Dynamic
from crane_scheduler.nodetable import NodeTable, PodRecord
from crane_scheduler.plugins import builtin_registry, plugin_registry
from crane_scheduler.plugins.coscheduling import gang
from crane_scheduler.plugins.defaultpreemption.plugin import DefaultPreemption
from crane_scheduler.plugins.dynamicresources.plugin import NAME as DRA_NAME
from crane_scheduler.plugins.dynamicresources.plugin import DynamicResources
from crane_scheduler.podinfo import PODS, NodeInfo, PodInfo, parse_node
from crane_scheduler.podinfo import parse_pod as _parse_pod
from crane_scheduler.unsupported import GATE, refusal, unsupported_field
from crane_shared.informer import object_key
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.policy import DynamicSchedulerPolicy

__all__ = [
    "DYNAMIC",
    "KINDS",
    "POD_GROUP_LABEL",
    "POD_GROUP_RESOURCE",
    "ConfigError",
    "Event",
    "GangPlacement",
    "NodeScore",
    "Placement",
    "PluginError",
    "PluginFactory",
    "Preemption",
    "Rejected",
    "Removed",
    "Reservation",
    "Scores",
    "Simulator",
    "parse_pod",
]

Event = Literal["ADDED", "MODIFIED", "DELETED"]
Obj = dict[str, Any]

LISTER_KINDS: dict[str, Kind] = {
    "PersistentVolumeClaim": "pvcs",
    "PersistentVolume": "pvs",
    "StorageClass": "storageclasses",
    "CSINode": "csinodes",
    "VolumeAttachment": "volumeattachments",
    "PodDisruptionBudget": "pdbs",
    "CSIDriver": "csidrivers",
    "CSIStorageCapacity": "csistoragecapacities",
    "ResourceClaim": "resourceclaims",
    "ResourceSlice": "resourceslices",
    "DeviceClass": "deviceclasses",
}
PLUGIN_KINDS = frozenset(
    {"PodGroup", "Workload", "NodeResourceTopology", "Namespace", "Service", "ReplicationController", "ReplicaSet"}
    | {"StatefulSet"}
)
"""the kinds the built-in ``ObjectPlugin``s read (taken, and kept for a profile that enables one, also when none
of the profiles does)"""
KINDS = frozenset({"Node", "Pod", *LISTER_KINDS, *PLUGIN_KINDS})
"""every kind a ``Simulator`` takes (plus those an out-of-tree ``ObjectPlugin`` of its profiles names)"""
TERMINAL = ("Succeeded", "Failed")
DYNAMIC = DYNAMIC_NAME
"""the load-aware plugin's name (its scores: ``Scores.of(DYNAMIC)``)"""
POD_GROUP_LABEL = gang.POD_GROUP_LABEL
"""the label naming a pod's PodGroup (scheduler-plugins' contract, which Coscheduling implements)"""
POD_GROUP_RESOURCE = (gang.GROUP, gang.VERSION, gang.PLURAL)
"""the PodGroup custom resource's group, version and plural (what a snapshot lists)"""


class PluginError(RuntimeError):
    """A plugin failed (not rejected) while scoring: kube's Error status, its message as the scheduler reports it."""


@dataclass(frozen=True)
class Rejected:
    """The first plugin (in profile order) that rejected a node, and its reason."""

    plugin: str
    reason: str


@dataclass(frozen=True)
class NodeScore:
    """A node's total (the weighted sum the scheduler maximises) and each Score plugin's normalised score."""

    total: int
    plugins: Mapping[str, int]


class Scores(Mapping[str, NodeScore]):
    """Node -> ``NodeScore`` for the nodes scored, each computed when read (a decision scores hundreds of nodes and
    a caller reads a few); ``best()`` the top-scored ones."""

    def __init__(self, names: Sequence[str], state: CycleState) -> None:
        rows, explained = state.get(EXPLAIN_SCORES, (None, []))
        self._names: list[str] = [] if rows is None else [names[row] for row in rows.tolist()]
        self._explained: list[tuple[str, int, Any]] = list(explained)
        self._index: dict[str, int] | None = None
        self._totals: Any = None

    def totals(self) -> Any:
        """The weighted sums, one per scored node in the search's order (what the scheduler maximises)."""
        if self._totals is None:
            self._totals = np.zeros(len(self._names), dtype=np.int64)
            for _, weight, scores in self._explained:
                self._totals = self._totals + weight * scores.astype(np.int64)
        return self._totals

    def best(self, among: Iterable[str] | None = None) -> list[str]:
        """The nodes with the highest total (the scheduler's tie-break picks one of them), of ``among`` if given."""
        totals = self.totals()
        if among is None:
            picks = np.arange(len(totals))
        else:
            index = self._by_name()
            picks = np.array([index[name] for name in among], dtype=np.intp)
        if not len(picks):
            return []
        chosen = totals[picks]
        return [self._names[i] for i in picks[chosen == chosen.max()].tolist()]

    def of(self, plugin: str) -> dict[str, int] | None:
        """``plugin``'s normalised score per node; None where it did not score (not enabled, or PreScore SKIP)."""
        found = next((scores for name, _, scores in self._explained if name == plugin), None)
        return None if found is None else dict(zip(self._names, found.tolist(), strict=True))

    def _by_name(self) -> dict[str, int]:
        if self._index is None:
            self._index = {n: i for i, n in enumerate(self._names)}
        return self._index

    def __getitem__(self, name: str) -> NodeScore:
        i = self._by_name()[name]
        return NodeScore(int(self.totals()[i]), {plugin: int(s[i]) for plugin, _, s in self._explained})

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@dataclass(eq=False)
class Reservation:
    """A pod assumed on a node with its Reserve plugins run (``ok``), or why Reserve refused (``message``: then
    nothing is held). ``Simulator.undo`` takes it back."""

    pod: PodInfo = field(repr=False)
    profile: Profile = field(repr=False)
    node: str
    state: CycleState = field(repr=False)
    ok: bool = True
    message: str = ""
    plugin: str = ""
    """the Reserve plugin that refused"""
    undone: bool = False
    claims_written: list[tuple[str, Any]] = field(default_factory=list, repr=False)
    """the DRA claims taken as written by PreBind (``DynamicResources.write_offline``), for ``undo``"""


@dataclass(frozen=True)
class Preemption:
    """What DefaultPreemption would do for a pod that fits nowhere (a dry run: nothing nominated, nothing evicted).

    ``message``: its part of the pod's message as the scheduler reports it (kube's ``preemption: ...``); empty when
    preemption would succeed (the scheduler then reports the FitError alone and nominates the pod). ``node``: the
    node it would nominate, None when it cannot help; ``victims``: the pods it would evict there
    (``namespace/name``), in its order."""

    message: str
    node: str | None = None
    victims: tuple[str, ...] = ()

    @property
    def possible(self) -> bool:
        """Preemption would make room: ``node`` once ``victims`` are gone."""
        return self.node is not None


@dataclass(eq=False)
class Placement:
    """One decision (``place``, ``schedule``) or feasibility check (``filter``) of one pod.

    ``node``: the chosen node (None: none fits, a plugin failed, or ``filter``); ``message``: why not, kube's
    FitError (``0/N nodes are available: ...``) or the failure (``error``). The per-node views are computed when
    read, from references the decision kept (nothing per node is built for a caller that does not ask)."""

    pod: PodInfo = field(repr=False)
    profile: Profile = field(repr=False)
    node: str | None
    message: str
    error: bool
    evaluated: int
    """nodes the search examined (kube's sampling: all of them below 100 nodes)"""
    decision: Decision = field(repr=False)
    feasible_rows: Sequence[int] = field(repr=False)
    state: CycleState = field(repr=False)
    reservation: Reservation | None = None
    """set by ``schedule`` (and by ``reserve``'s caller's choice, not here)"""
    preemption: Preemption | None = None
    """DefaultPreemption's dry run for a pod no node fits (None: placed, failed, ``preemption=False``, or no
    DefaultPreemption in the profile)"""
    rejectors: frozenset[str] = frozenset()
    """the plugins that rejected the pod (or failed, or refused it in Reserve) when it was not placed"""

    @property
    def placed(self) -> bool:
        return self.node is not None

    @functools.cached_property
    def feasible(self) -> list[str]:
        """The nodes that passed every Filter: all of them (``filter``), or those the sampling found (``place``;
        the chosen node alone when the pod's nominated node fits)."""
        names = self.decision.names
        return [names[row] for row in self.feasible_rows]

    @functools.cached_property
    def rejected(self) -> dict[str, Rejected]:
        """Node -> the first plugin that rejected it and why (a node PreFilter excluded is not listed)."""
        out: dict[str, Rejected] = {}
        for name, verdict in self.decision.verdicts().items():
            found = verdict["filter"]
            if isinstance(found, dict):
                out[name] = Rejected(found["plugin"], found["reason"])
        return out

    @functools.cached_property
    def scores(self) -> Scores:
        """Node -> its scores, for the nodes scored (none when one node was feasible: it is chosen unscored)."""
        return Scores(self.decision.names, self.state)

    def explain(self, limit: int = 50) -> dict[str, Any]:
        """``cranectl explain``'s JSON for this decision (the profile's ``ExplainPlugin``s add their sections)."""
        return render(self.decision, list(self.profile.plugins.values()), limit)


@dataclass(eq=False)
class GangPlacement:
    """One gang cycle (``schedule_gang``): the group, its quorum (``minMember``) and the members placed before,
    the members decided in name order (``placements``) and those left undecided once the quorum was out of reach
    (``untried``); ``kept``: the quorum was met and the members found places are reserved, else none is."""

    gang: str
    quorum: int
    placed_before: int
    placements: list[Placement]
    untried: list[PodInfo]
    kept: bool

    @property
    def found(self) -> int:
        """Members this cycle found a place for (kept or not)."""
        return sum(1 for p in self.placements if p.node is not None)


@dataclass(frozen=True, eq=False)
class Removed:
    """Pods taken out of the accounting for a what-if (``take_out``), until ``put_back``."""

    records: list[PodRecord]


class Simulator:
    """crane-scheduler's node table, plugins, profiles and algorithm, fed plain objects (see the module's
    docstring)."""

    def __init__(
        self,
        config: SchedulerConfig | Mapping[str, Any] | str | Path | None = None,
        *,
        seed: int | None = 0,
        clock: Callable[[], float] = time.time,
        wall_clock: Callable[[], float] | None = None,
        dynamic: DynamicSchedulerPolicy | DynamicArgs | None = None,
        plugins: Mapping[str, PluginFactory] | None = None,
        out_of_tree: bool = True,
        percentage_of_nodes_to_score: int | None = None,
        table: NodeTable | None = None,
        listers: Listers | None = None,
        pod_group_without_gang_plugin: gangless.Mode = "refuse",
        watched: bool = False,
    ) -> None:
        """``config``: a ``KubeSchedulerConfiguration`` as the scheduler reads it (YAML text, a path to it, the
        parsed mapping, or a ``SchedulerConfig``; None: the default profile); raises ``ConfigError`` naming every
        problem. ``seed``: the tie-break between equally scored nodes (None: unseeded). ``clock``: the plugins'
        handles' time (the scheduler's queue runs on it); ``wall_clock``: Dynamic's (the load annotations'
        timestamps, the window of recent bindings; default: ``clock``). ``dynamic``: the load policy Dynamic runs
        with instead of its ``policyConfigPath`` (a ``DynamicSchedulerPolicy``), or all of its settings
        (``DynamicArgs``: the descheduler's). ``plugins``: factories by name replacing or adding plugins (an added
        one is enabled through ``config``). ``out_of_tree``: the plugins installed through the
        ``crane_scheduler.plugins`` entry points, Dynamic among them, as the scheduler loads them (False: the
        built-in ones only, kube-scheduler's with crane's NUMA and gang plugins). ``percentage_of_nodes_to_score``:
        overrides the config's (100: score every feasible node). ``table``, ``listers``: a node table and listers
        to share instead of new ones (the scheduler's own tests run several profiles over one table).
        ``pod_group_without_gang_plugin``: the scheduler's flag of that name (``place`` refuses a pod naming a
        PodGroup in a profile without a gang plugin, or places it alone). ``watched``: the plugins' own watches
        will list their objects (a live scheduler assembled from the simulator's parts: the tests' in-process
        one); by default the objects given are the whole list, so no plugin waits for a list."""
        self.config = _config(config)
        self.clock = clock
        self.wall_clock = wall_clock or clock
        self.table = table if table is not None else NodeTable()
        self.listers = listers if listers is not None else Listers()
        self.metrics = PluginMetrics()
        registry = _registry(wall_clock or clock, dynamic, plugins or {}, out_of_tree)
        self.profiles: dict[str, Profile] = build_profiles(
            self.config,
            registry,
            lambda name: Handle(self.table, None, clock, name, self.metrics, listers=self.listers),
        )
        percentage = (
            percentage_of_nodes_to_score
            if percentage_of_nodes_to_score is not None
            else self.config.percentage_of_nodes_to_score
        )
        self.algorithm = Algorithm(self.table, percentage, random.Random(seed))
        self._preemption = [
            p for prof in self.profiles.values() for p in prof.post_filter if isinstance(p, DefaultPreemption)
        ]
        for preemption in self._preemption:  # where the candidates' search starts: seeded as the tie-break
            preemption.rng = random.Random(seed)
        self.gangless = pod_group_without_gang_plugin
        self._gang_profiles = {
            name
            for name, profile in self.profiles.items()
            if any(isinstance(p, GangPlugin) for p in profile.plugins.values())
        }
        self.pending: dict[str, PodInfo] = {}
        """pending pods of the profiles in the synced state (not deleting, not gated), by uid"""
        self._known: dict[str, dict[str, Obj]] = {}
        """kind -> key -> the object last applied (``sync`` re-applies only what is not that very object)"""
        self._readers: dict[str, list[ObjectPlugin]] = {}
        for profile in self.profiles.values():
            for plugin in profile.plugins.values():
                if isinstance(plugin, ObjectPlugin):
                    if not watched:
                        plugin.objects_listed()  # offline, the objects given are the whole list
                    for kind in plugin.object_kinds:
                        self._readers.setdefault(kind, []).append(plugin)
        self.kinds = KINDS | frozenset(self._readers)
        """the kinds this simulator takes"""
        self._snapshot: tuple[int, list[str], list[NodeInfo | None]] = (-1, [], [])

    # ------------------------------------------------------------------------------------------ the cluster

    def apply(self, event: Event, obj: Mapping[str, Any], kind: str | None = None) -> None:
        """One watch event: ``obj`` added, modified or deleted (``kind``: else the object's own ``kind``)."""
        kind = self._kind_of(obj, kind)
        raw = _dict(obj)
        if not (raw.get("metadata") or {}).get("name"):
            raise ValueError(f"a {kind} without metadata.name")
        key = self._key(kind, raw)
        known = self._known.setdefault(kind, {})
        if event == "DELETED":
            known.pop(key, None)
        else:
            known[key] = raw
        self._apply(kind, event, raw)

    def add(self, obj: Mapping[str, Any], kind: str | None = None) -> None:
        self.apply("ADDED", obj, kind)

    def update(self, obj: Mapping[str, Any], kind: str | None = None) -> None:
        self.apply("MODIFIED", obj, kind)

    def delete(self, obj: Mapping[str, Any], kind: str | None = None) -> None:
        self.apply("DELETED", obj, kind)

    def sync(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """Bring ``kind`` to exactly ``objects``: an object that is not the one last applied (an informer replaces
        an object when it changes) is applied again, one no longer there is deleted."""
        self._kind_of({}, kind)
        known = self._known.setdefault(kind, {})
        field = "uid" if kind == "Pod" else "name"
        namespaced = kind != "Pod"
        seen: set[str] = set()
        for obj in objects:  # a steady re-list of tens of thousands of pods: nothing here but lookups, inline
            meta = obj.get("metadata") or {}
            key = meta.get(field) or ""
            if not key or (namespaced and meta.get("namespace")):
                if not meta.get("name"):
                    raise ValueError(f"a {kind} without metadata.name")
                key = _pod_key(obj) if kind == "Pod" else object_key(obj)
            seen.add(key)
            old = known.get(key)
            if old is not obj:
                raw = _dict(obj)
                known[key] = raw
                self._apply(kind, "ADDED" if old is None else "MODIFIED", raw)
        if len(known) > len(seen):
            for key in [k for k in known if k not in seen]:
                self._apply(kind, "DELETED", known.pop(key))

    def load(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Objects of mixed kinds, each naming its ``kind`` (a snapshot's, ``kubectl get -o json``'s items): every
        kind present is synced to exactly its objects here, nodes first, then the other objects, pods last. A
        snapshot's PriorityClasses and ResourceClaimTemplates are passed over (``ADMISSION_KINDS``: admission and
        the claim controller read them, to make a new pod's priority and claims, not the scheduler)."""
        by_kind: dict[str, list[Mapping[str, Any]]] = {}
        for obj in objects:
            if obj.get("kind") in ADMISSION_KINDS:
                continue
            by_kind.setdefault(self._kind_of(obj, None), []).append(obj)
        order = sorted(by_kind, key=lambda k: (k != "Node", k == "Pod"))
        for kind in order:
            self.sync(kind, by_kind[kind])

    def _kind_of(self, obj: Mapping[str, Any], kind: str | None) -> str:
        kind = kind or str(obj.get("kind") or "")
        if kind not in self.kinds:
            raise ValueError(
                f"kind {kind!r}: not an object the scheduler reads (known: {', '.join(sorted(self.kinds))})"
            )
        return kind

    @staticmethod
    def _key(kind: str, raw: Mapping[str, Any]) -> str:
        return _pod_key(raw) if kind == "Pod" else object_key(raw)

    def _apply(self, kind: str, event: Event, raw: Obj) -> None:
        if kind == "Node":
            if event == "DELETED":
                self.table.remove_node(str((raw.get("metadata") or {}).get("name", "")))
            else:
                self.table.upsert_node(parse_node(raw))
        elif kind == "Pod":
            self._pod(event, raw)
        elif kind in LISTER_KINDS:
            self.listers.apply(LISTER_KINDS[kind], event, raw)
        for plugin in self._readers.get(kind, ()):
            plugin.apply_object(kind, event, raw)

    def _pod(self, event: Event, raw: Obj) -> None:
        """The scheduler cache's accounting: a bound pod counts on its node, a pending one nominated to a node
        counts there for Filter (kube's nominator), a terminal or deleted one is gone."""
        uid = _pod_key(raw)
        phase = (raw.get("status") or {}).get("phase")
        if event == "DELETED" or phase in TERMINAL:
            self.table.nominated.pop(uid, None)
            self.pending.pop(uid, None)
            self.table.remove_pod(uid, deleted=True)
            return
        pod = parse_pod(raw)
        if pod.node_name:
            self.pending.pop(uid, None)
            self.table.nominated.pop(uid, None)
            self.table.add_pod(pod)
            return
        record = self.table.pods.get(uid)
        if record is not None and not record.assumed:  # said bound before (a snapshot edited by hand): as given now
            self.table.remove_pod(uid)
        nominated = (raw.get("status") or {}).get("nominatedNodeName")
        if nominated and not pod.deleting:
            self.table.nominated[uid] = (pod, str(nominated))
        else:
            self.table.nominated.pop(uid, None)
        if pod.scheduler_name in self.profiles and not (pod.deleting or pod.gated):
            self.pending[uid] = pod
        else:
            self.pending.pop(uid, None)

    def get(self, kind: str, key: str) -> Obj | None:
        """The object of ``kind`` last applied under ``key`` (a pod's uid, else ``namespace/name`` or ``name``)."""
        return self._known.get(kind, {}).get(key)

    def requested(self, node: str) -> dict[str, int]:
        """What the pods accounted on ``node`` request (bound and reserved), per resource (milli-CPU, bytes, ...;
        ``pods``: how many), the resources none of them asks left out."""
        values = self._row_values(node, self.table.requested)
        count = int(self.table.pod_count[self.table.rows[node]])
        return values | {PODS: count} if count else values

    def allocatable(self, node: str) -> dict[str, int]:
        return self._row_values(node, self.table.alloc)

    def _row_values(self, node: str, columns: np.ndarray[Any, Any]) -> dict[str, int]:
        row = self.table.rows.get(node)
        if row is None:
            raise KeyError(node)
        return {name: int(columns[row, col]) for name, col in self.table.resources.items() if columns[row, col]}

    def node_load(self, node: str, profile: str | None = None) -> dict[str, Any] | None:
        """The load Dynamic sees on ``node`` now (``wall_clock``), as ``cranectl explain`` shows it: per metric the
        annotated usage, ``estimate`` (what the pods reserved since the annotation add, by Dynamic's estimate),
        ``usage`` (their sum, None unless fresh) and the policy's ``threshold``; the hot value. None when the
        profile (default: the first) runs no Dynamic."""
        plugin = self._profile(profile).plugins.get(DYNAMIC)
        row = self.table.rows.get(node)
        if row is None:
            raise KeyError(node)
        info = self.table.nodes[row]
        if not isinstance(plugin, Dynamic) or info is None:
            return None
        return plugin.explain_node(info, self.wall_clock())

    def plugin(self, name: str, profile: str | None = None) -> Plugin:
        """A plugin instance of ``profile`` (default: the first profile)."""
        return self._profile(profile).plugins[name]

    # ------------------------------------------------------------------------------------------ decisions

    def place(
        self, pod: Mapping[str, Any] | PodInfo, *, profile: str | None = None, preemption: bool = True
    ) -> Placement:
        """The scheduler's decision for ``pod`` (the profile of its ``schedulerName``, else the first), with the
        table as it is (a pod naming a PodGroup in a profile without a gang plugin refused first, as the
        scheduler's cycle does: ``pod_group_without_gang_plugin``); when nothing fits, PostFilter as a dry run
        (``Placement.preemption``; ``preemption=False``: not run). Changes nothing but the searches' rotating
        starts (kube's ``nextStartNodeIndex``, preemption's random offset, both seeded). ``pod``: the object, or
        ``parse_pod``'s reading of it (a caller that places it more than once parses it once)."""
        info = _pod_info(pod)
        return self._place(info, self._profile(profile, info), {}, preemption)

    def _place(self, info: PodInfo, prof: Profile, state: CycleState, preemption: bool) -> Placement:
        group = gangless.pod_group(info.raw) if prof.name not in self._gang_profiles else None
        result: ScheduleResult | Diagnosis | Status
        if info.gated:  # never queued (kube's SchedulingGates PreEnqueue): what the API server's condition says
            gates = [g.get("name") for g in info.raw["spec"]["schedulingGates"] if isinstance(g, Mapping)]
            placement = self._placement(
                info, prof, state, None, f"{GATED_MESSAGE} ({', '.join(map(str, gates))})", False, 0, []
            )
            placement.rejectors = frozenset({SCHEDULING_GATES})
            return placement
        if group is not None and self.gangless == "refuse":  # the scheduler's cycle refuses it before deciding
            text = gangless.message(prof.name, info.namespace, group, self.gangless)
            result = Diagnosis(self.table.num_nodes, rejectors={gangless.GATE}, pre_filter_msg=text)
        else:
            try:
                result = self.algorithm.schedule(prof, info, state)
            except Exception as err:  # as the scheduler's cycle: an attempt that failed, not a crash
                result = Status(Code.ERROR, (f"running the scheduling framework: {err!r}",))
        if isinstance(result, ScheduleResult):
            rows = state[EXPLAIN_SCORES][0] if EXPLAIN_SCORES in state else [self.table.rows[result.node]]
            return self._placement(info, prof, state, result.node, "", False, result.evaluated, rows)
        found = self._post_filter(prof, info, state, result) if preemption and isinstance(result, Diagnosis) else None
        error = isinstance(result, Status)
        placement = self._placement(info, prof, state, None, result.message, error, self.table.num_nodes, [])
        placement.preemption = found
        placement.rejectors = (
            frozenset(result.rejectors) if isinstance(result, Diagnosis) else frozenset({result.plugin} - {""})
        )
        return placement

    def _post_filter(
        self, profile: Profile, pod: PodInfo, state: CycleState, diagnosis: Diagnosis
    ) -> Preemption | None:
        """The profile's PostFilter (``Profile.run_post_filter``, which writes its part of ``diagnosis``'s message)
        with DefaultPreemption's dry run in place of its ``post_filter``. A gang's member runs none: the gang cycle
        never preempts for one, and says so when room was what it lacked (``gangrules.no_preemption``)."""
        member = gang_of((p for p in profile.plugins.values() if isinstance(p, GangPlugin)), pod)
        if member is not None:
            plugin, group = member
            if not diagnosis.rejectors - {plugin.name}:  # the gang plugin's own refusal: not a matter of room
                return None
            diagnosis.post_filter_msg = no_preemption(group)
            return Preemption(diagnosis.post_filter_msg)
        found: list[Preemption] = []

        def call(plugin: Any) -> Status:
            if not isinstance(plugin, DefaultPreemption):
                return plugin.post_filter(state, pod, diagnosis)  # type: ignore[no-any-return]
            status, choice = plugin.dry_run(pod, diagnosis)
            best = choice.best
            if best is None:
                found.append(Preemption(choice.message))
            else:
                found.append(Preemption("", best.node, tuple(f"{v.namespace}/{v.name}" for v in best.victims)))
            return status

        profile.run_post_filter(state, pod, diagnosis, call)
        return found[0] if found else None

    def filter(self, pod: Mapping[str, Any] | PodInfo, *, profile: str | None = None) -> Placement:
        """Every node that passes PreFilter and Filter for ``pod`` (no sampling, no scoring; the unsupported-field
        gate first), with the rejected ones' reasons; ``node`` is None. ``score`` and ``reserve`` take it on."""
        info = _pod_info(pod)
        prof = self._profile(profile, info)
        state: CycleState = {}
        table = self.table
        field_ = unsupported_field(info.raw, prof.supported_fields)
        if field_ is not None:
            message = Diagnosis(table.num_nodes, rejectors={GATE}, pre_filter_msg=refusal(field_)).message
            return self._placement(info, prof, state, None, message, False, table.num_nodes, [])
        alive = table.live.copy()
        rejected = prof.run_prefilter_and_filter(state, info, table, alive)
        state[EXPLAIN_FILTERS] = rejected
        failed = filter_error(rejected)
        if failed is not None:
            return self._placement(info, prof, state, None, failed.message, True, table.num_nodes, [])
        rows = np.flatnonzero(alive).tolist()
        return self._placement(info, prof, state, None, "", False, table.num_nodes, rows)

    def score(self, placement: Placement, nodes: Iterable[str] | None = None) -> Scores:
        """PreScore and Score over ``nodes`` (default: the feasible ones) for the pod ``placement`` decided or
        filtered (its PreFilter state); raises ``PluginError`` when a plugin fails."""
        table = self.table
        names = placement.feasible if nodes is None else nodes
        rows = np.array(sorted(table.rows[n] for n in names if n in table.rows), dtype=np.intp)
        result = self.algorithm.score(placement.profile, placement.pod, placement.state, rows)
        if isinstance(result, Status):
            raise PluginError(result.message)
        placement.__dict__.pop("scores", None)  # the cached view follows the latest scoring
        return Scores(table.names, placement.state)

    def reserve(self, placement: Placement, node: str | None = None) -> Reservation:
        """Assume the pod on ``node`` (default: the chosen one) and run Reserve, as the scheduler's cycle does: the
        next decision sees it (its requests, ports, spread, Dynamic's estimate); its DRA claims as PreBind would
        write them (allocated, reserved for it: ``DynamicResources.write_offline``). A refusal (``ok`` False) is
        undone at once. The pod must not be in the table already (a new pod, or one ``take_out`` took out)."""
        target = node if node is not None else placement.node
        if target is None:
            raise ValueError(f"pod {placement.pod.key}: no node to reserve ({placement.message})")
        pod, profile, state = placement.pod, placement.profile, placement.state
        if pod.uid in self.table.pods:
            raise ValueError(f"pod {pod.key}: already in the table (reserved, or bound in the loaded objects)")
        if target not in self.table.rows:
            raise KeyError(f"node {target!r}: not in the table")
        self.table.assume(pod, target)
        status = profile.run_reserve(state, pod, target)
        if not status.success:
            self.table.forget(pod.uid)
            return Reservation(pod, profile, target, state, ok=False, message=status.message, plugin=status.plugin)
        dra = profile.plugins.get(DRA_NAME)
        written = dra.write_offline(state, pod) if isinstance(dra, DynamicResources) else []
        return Reservation(pod, profile, target, state, claims_written=written)

    def undo(self, reservation: Reservation) -> None:
        """Unreserve and forget the assumption: the table and the plugins as before ``reserve``."""
        if not reservation.ok or reservation.undone:
            return
        dra = reservation.profile.plugins.get(DRA_NAME)
        if reservation.claims_written and isinstance(dra, DynamicResources):
            dra.unwrite_offline(reservation.claims_written)
        reservation.profile.run_unreserve(reservation.state, reservation.pod, reservation.node)
        self.table.forget(reservation.pod.uid)
        reservation.undone = True

    def gang_of(self, pod: Mapping[str, Any] | PodInfo, *, profile: str | None = None) -> str | None:
        """The group (``namespace/name``) a gang plugin of the pod's profile puts it in; None: no gang."""
        info = _pod_info(pod)
        found = gang_of(self._gang_plugins(self._profile(profile, info)), info)
        return found[1] if found is not None else None

    def schedule_gang(
        self, pods: Sequence[Mapping[str, Any] | PodInfo], *, profile: str | None = None
    ) -> GangPlacement:
        """The scheduler's gang cycle for the pending members ``pods`` of one group (``gang_of``): decided one
        after another in name order, each seeing those before it assumed (with the cycle state the gang cycle
        gives its plugins), none decided once the group's quorum is out of reach; then the members found places
        are kept (reserved, as ``schedule`` does) if the members placed already plus them meet the quorum
        (``minMember``), else every one is undone at once, before the next pod is placed, as the gang cycle
        does: a group that waits holds nothing. No preemption for a member (the gang cycle's words)."""
        infos = sorted((_pod_info(p) for p in pods), key=lambda p: p.name)
        if not infos:
            raise ValueError("schedule_gang: no pods")
        prof = self._profile(profile, infos[0])
        plugins = self._gang_plugins(prof)
        found = gang_of(plugins, infos[0])
        if found is None:
            raise ValueError(f"pod {infos[0].key}: in no gang of profile {prof.name}")
        plugin, gang = found
        for info in infos:
            if not self._in_gang(plugins, info, gang):
                raise ValueError(f"pod {info.key}: not a member of {gang}")
        mine = {info.uid for info in infos}
        placed = sum(
            1
            for record in self.table.pods.values()
            if record.pod is not None and record.uid not in mine and self._in_gang(plugins, record.pod, gang)
        )
        quorum = plugin.quorum(gang)
        total = placed + len(infos)
        placements: list[Placement] = []
        failed: list[Placement] = []
        untried: list[PodInfo] = []
        for i, info in enumerate(infos):  # the gang cycle's loop (``gangcycle.schedule_gang``)
            # the gang plugin's own refusals (a group-level verdict, in PreFilter) go on: each member hears its own
            if (
                failed
                and failed[-1].rejectors != {plugin.name}
                and quorum_out_of_reach(placed, len(infos), len(failed), quorum)
            ):
                untried = infos[i:]
                break
            placement = self._place(info, prof, {GANG_MEMBERS: total, GANG: gang}, True)
            placements.append(placement)
            if placement.node is not None:
                placement.reservation = self.reserve(placement)
                if not placement.reservation.ok:
                    placement.node, placement.message = None, placement.reservation.message
                    placement.rejectors = frozenset({placement.reservation.plugin} - {""})
            if placement.node is None:
                failed.append(placement)
        assumed = [p for p in placements if p.node is not None]
        kept = quorum_met(placed, len(assumed), quorum)
        if not kept:
            for placement in reversed(assumed):
                assert placement.reservation is not None
                self.undo(placement.reservation)
        return GangPlacement(gang, quorum, placed, placements, untried, kept)

    @staticmethod
    def _in_gang(plugins: list[GangPlugin], pod: PodInfo, gang: str) -> bool:
        found = gang_of(plugins, pod)
        return found is not None and found[1] == gang

    def _gang_plugins(self, profile: Profile) -> list[GangPlugin]:
        return [p for p in profile.plugins.values() if isinstance(p, GangPlugin)]

    def schedule(
        self, pod: Mapping[str, Any] | PodInfo, *, profile: str | None = None, preemption: bool = True
    ) -> Placement:
        """``place`` then ``reserve`` on the chosen node: the pod counts there for the next pod. A pod Reserve
        refused is not placed (``node`` None, Reserve's message), as the scheduler reports it. A pod that would
        preempt stays pending (``Placement.preemption``): nothing is evicted."""
        placement = self.place(pod, profile=profile, preemption=preemption)
        if placement.node is not None:
            reservation = self.reserve(placement)
            placement.reservation = reservation
            if not reservation.ok:
                placement.node, placement.message = None, reservation.message
        return placement

    def reseed(self, seed: int | None = 0) -> None:
        """Start the node search afresh: kube's rotating start index back to the first node, the tie-break seeded
        again (two runs over the same input from the same search state, e.g. two policies compared)."""
        self.algorithm.rng = random.Random(seed)
        self.algorithm.next_start = 0
        for preemption in self._preemption:
            preemption.rng = random.Random(seed)

    def take_out(self, uids: Iterable[str]) -> Removed:
        """Pods out of the accounting (and out of the pod index) for a what-if, until ``put_back``."""
        return Removed(self.table.simulate_remove(list(uids), notify=True))

    def put_back(self, removed: Removed) -> None:
        self.table.simulate_add(removed.records, notify=True)

    @contextlib.contextmanager
    def without(self, uids: Iterable[str]) -> Iterator[Removed]:
        """``take_out`` for the duration of a ``with`` block."""
        removed = self.take_out(uids)
        try:
            yield removed
        finally:
            self.put_back(removed)

    # ------------------------------------------------------------------------------------------ internals

    def _profile(self, name: str | None, pod: PodInfo | None = None) -> Profile:
        if name is not None:
            found = self.profiles.get(name)
            if found is None:
                raise KeyError(f"no profile {name!r} (profiles: {', '.join(self.profiles)})")
            return found
        if pod is not None and pod.scheduler_name in self.profiles:
            return self.profiles[pod.scheduler_name]
        return next(iter(self.profiles.values()))

    def _placement(
        self,
        pod: PodInfo,
        profile: Profile,
        state: CycleState,
        node: str | None,
        message: str,
        error: bool,
        evaluated: int,
        rows: Sequence[int],
    ) -> Placement:
        table = self.table
        if self._snapshot[0] != table.nodes_version:  # the node objects, shared until a node changes
            self._snapshot = (table.nodes_version, list(table.names), list(table.nodes))
        _, names, nodes = self._snapshot
        decision = Decision.from_state(pod, self.clock(), table, state, node, message, (names, nodes))
        return Placement(pod, profile, node, message, error, evaluated, decision, rows, state)


ADMISSION_KINDS = frozenset({"PriorityClass", "ResourceClaimTemplate"})
"""kinds a snapshot holds for what happens to a pod before the scheduler sees it (``cranectl simulate``'s
``with_priority`` and ``claims_from_templates``)"""
SCHEDULING_GATES = "SchedulingGates"
GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
"""the PodScheduled=False condition's message the API server writes for a pod with ``spec.schedulingGates``
(reason ``SchedulingGated``); the scheduler never takes such a pod from its queue"""


def _config(config: SchedulerConfig | Mapping[str, Any] | str | Path | None) -> SchedulerConfig:
    if config is None or isinstance(config, SchedulerConfig):
        return config or SchedulerConfig()
    if isinstance(config, Path):
        return load_config(config)
    if isinstance(config, str):
        try:
            return parse_config(yaml.safe_load(config))
        except yaml.YAMLError as err:
            raise ConfigError([f"not valid YAML: {err}"]) from err
    return parse_config(config)


def _registry(
    clock: Callable[[], float],
    dynamic: DynamicSchedulerPolicy | DynamicArgs | None,
    plugins: Mapping[str, PluginFactory],
    out_of_tree: bool,
) -> Registry:
    """The scheduler's registry (built-ins and entry points), with Dynamic on ``clock`` (and ``dynamic``'s
    policy or settings) and ``plugins`` in place of, or beside, the registered factories."""
    base = plugin_registry() if out_of_tree else builtin_registry()
    if out_of_tree and DYNAMIC not in base:  # not installed through its entry point (no package metadata)
        register_dynamic(base)

    def dynamic_factory(raw: Mapping[str, Any], handle: Handle) -> Dynamic:
        args = parse_dynamic_args(raw)
        if isinstance(dynamic, DynamicArgs):
            args = replace(
                args,
                policy_path=None,
                stale=dynamic.stale,
                legacy_zone=dynamic.legacy_zone,
                own_bindings_in_hot_value=dynamic.own_bindings_in_hot_value,
                estimate=dynamic.estimate,
            )
            return Dynamic(args, handle, clock, policy=dynamic.policy)
        if dynamic is not None:
            return Dynamic(replace(args, policy_path=None), handle, clock, policy=dynamic)
        return Dynamic(args, handle, clock)

    factories: dict[str, PluginFactory] = {name: functools.partial(base.create, name) for name in base}
    if DYNAMIC in base:
        factories[DYNAMIC] = dynamic_factory
    factories.update(plugins)
    return Registry(factories, base.defaults)


def _pod_key(raw: Mapping[str, Any]) -> str:
    """A pod's uid (the table's key), else ``namespace/name`` (a manifest's pod)."""
    return str((raw.get("metadata") or {}).get("uid") or object_key(raw))


def _dict(obj: Mapping[str, Any]) -> Obj:
    return obj if isinstance(obj, dict) else dict(obj)


def parse_pod(pod: Mapping[str, Any]) -> PodInfo:
    """The scheduler's reading of a pod object (what ``place`` takes as well as the object); a pod without a uid
    (a manifest's) gets ``<namespace>/<name>``: the table keys pods by uid."""
    return _parse_pod(_with_uid(_dict(pod)))


def _pod_info(pod: Mapping[str, Any] | PodInfo) -> PodInfo:
    return pod if isinstance(pod, PodInfo) else parse_pod(pod)


def _with_uid(raw: Obj) -> Obj:
    """A pod without a uid (a manifest's) gets ``<namespace>/<name>``: the table keys pods by uid."""
    meta = raw.get("metadata") or {}
    if meta.get("uid"):
        return raw
    return {**raw, "metadata": {**meta, "uid": object_key(raw)}}
