"""The profile runtime (kube-scheduler's ``framework/runtime``): one ``schedulerName``'s plugins, instantiated
once and ordered per extension point, and the runners of the per-pod extension points.

Plugin lists are resolved exactly as kube-scheduler does it. The defaults (``registry.defaults``: kube-scheduler's
default plugins, plus any registered ``enabled_by_default``) live in ``multiPoint``; a profile's
``multiPoint`` merges over them (``disabled: [{name: "*"}]`` drops them all, a default named again in
``enabled`` is reconfigured in place, others are appended). Each multiPoint plugin then lands on every extension
point it implements unless disabled there; a plugin also listed at a specific extension point keeps that entry
(and its score weight), ordered first. Score weight: the specific one, else multiPoint's, else 1.

Each plugin is instantiated once per profile, with its ``pluginConfig`` args. The decision's points (PreFilter
to Score) run in ``crane_scheduler.algorithm`` over the node table; Reserve to PostBind run here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crane_scheduler.config import ConfigError, PluginRef, PluginSet, ProfileConfig, SchedulerConfig
from crane_scheduler.framework.interface import (
    EXTENSION_POINTS,
    BindPlugin,
    EnqueueExtensions,
    ExplainPlugin,
    FilterPlugin,
    Handle,
    PermitPlugin,
    Plugin,
    PodExplainPlugin,
    PostBindPlugin,
    PostFilterPlugin,
    PreBindPlugin,
    PreEnqueuePlugin,
    PreFilterPlugin,
    PreScorePlugin,
    QueueSortPlugin,
    ReservePlugin,
    ScorePlugin,
    WorkerPlugin,
)
from crane_scheduler.framework.registry import Registry
from crane_scheduler.framework.types import (
    SKIP,
    SUCCESS,
    ArgsError,
    ClusterEvent,
    Code,
    CycleState,
    Diagnosis,
    Rejection,
    Status,
)
from crane_scheduler.nodetable import Mask, NodeTable, PodRecord
from crane_scheduler.podinfo import PodInfo

Observe = Callable[[str, str, float], None]
"""(extension point, status code, seconds): how the runtime reports each point's duration (for the metrics)."""


def _ignore(point: str, status: str, seconds: float) -> None:
    pass


def nominated_records(table: NodeTable, pod: PodInfo, rows: Mask) -> list[PodRecord]:
    """The pods nominated to ``rows`` that Filter counts for ``pod`` (kube's ``addGENominatedPods``): of at least
    its priority, not the pod itself, not bound yet. Walks whichever is fewer, the rows or the nominations: a
    burst of preemptions nominates hundreds of pods, and a decision looks at a few rows of them (the nodes still
    alive after Filter, the dry run's candidates)."""
    nominated = table.nominated
    if not nominated:
        return []
    where = np.flatnonzero(rows)
    if len(where) < len(nominated):
        nodes = table.nodes
        uids = [uid for row in where.tolist() if (n := nodes[row]) is not None for uid in nominated.on_node(n.name)]
    else:
        index = table.rows
        uids = [uid for uid, (_, node) in nominated.items() if node in index and rows[index[node]]]
    return [
        nominated.record(uid)
        for uid in uids
        if uid != pod.uid and nominated[uid][0].priority >= pod.priority and uid not in table.pods
    ]


@dataclass
class Profile:
    name: str
    queue_sort: QueueSortPlugin
    pre_enqueue: list[PreEnqueuePlugin] = field(default_factory=list)
    pre_filter: list[PreFilterPlugin] = field(default_factory=list)
    filter: list[FilterPlugin] = field(default_factory=list)
    post_filter: list[PostFilterPlugin] = field(default_factory=list)
    pre_score: list[PreScorePlugin] = field(default_factory=list)
    score: list[tuple[ScorePlugin, int]] = field(default_factory=list)
    reserve: list[ReservePlugin] = field(default_factory=list)
    permit: list[PermitPlugin] = field(default_factory=list)
    pre_bind: list[PreBindPlugin] = field(default_factory=list)
    bind: list[BindPlugin] = field(default_factory=list)
    post_bind: list[PostBindPlugin] = field(default_factory=list)
    percentage_of_nodes_to_score: int | None = None
    plugins: dict[str, Plugin] = field(default_factory=dict)
    handle: Handle | None = None
    supported_fields: frozenset[str] = frozenset()
    """pod fields of the unsupported-field gate that a plugin of this profile reads (its ``supports_fields``)"""

    @functools.cached_property
    def _gates(
        self,
    ) -> tuple[tuple[str, list[tuple[str, Callable[[CycleState, PodInfo, str], Awaitable[Status]]]]], ...]:
        """Permit's and PreBind's plugins as (name, method), in order: ``run_binding`` walks them for every pod."""
        return (
            ("Permit", [(p.name, p.permit) for p in self.permit]),
            ("PreBind", [(p.name, p.pre_bind) for p in self.pre_bind]),
        )

    @functools.cached_property
    def decider_pre_filter(self) -> tuple[list[PreFilterPlugin], frozenset[str]]:
        """(the PreFilter plugins to run when checking a decider worker's fresh answer, the names of those that
        answer SKIP for every pod a worker decides): the plugins marked ``decider_pre_filter`` ("pod" or "skip",
        ``DeciderPreFilterPlugin``) are left out of the first."""
        run = [p for p in self.pre_filter if getattr(p, "decider_pre_filter", "") not in ("pod", "skip")]
        skips = frozenset(p.name for p in self.pre_filter if getattr(p, "decider_pre_filter", "") == "skip")
        return run, skips

    @functools.cached_property
    def other_nodes_filters(self) -> frozenset[str]:
        """The Filter plugins whose verdict on a node reads other nodes' pods (``reads_other_nodes``): a decider
        worker's node is taken unfiltered only when each of them skipped the pod."""
        return frozenset(p.name for p in self.filter if getattr(p, "reads_other_nodes", False))

    def events_of(self, plugin: str) -> ClusterEvent:
        instance = self.plugins.get(plugin)
        if isinstance(instance, EnqueueExtensions):
            return instance.events_to_register()
        return ClusterEvent.ALL

    @property
    def explainers(self) -> list[ExplainPlugin]:
        """The plugins that can explain their per-node inputs (optional ``ExplainPlugin`` interface)."""
        return [p for p in self.plugins.values() if isinstance(p, ExplainPlugin)]

    @property
    def workers(self) -> list[WorkerPlugin]:
        """The plugins with a loop of their own (optional ``WorkerPlugin`` interface)."""
        return [p for p in self.plugins.values() if isinstance(p, WorkerPlugin)]

    @property
    def pod_explainers(self) -> list[PodExplainPlugin]:
        """The plugins that add to a placed pod's explained result (optional ``PodExplainPlugin`` interface)."""
        return [p for p in self.plugins.values() if isinstance(p, PodExplainPlugin)]

    # ------------------------------------------------------------------------------------------ extension points

    def run_filter_plugins(
        self,
        state: CycleState,
        pod: PodInfo,
        table: NodeTable,
        alive: Mask,
        skipped: Set[str] = frozenset(),
        *,
        with_nominated: bool = True,
    ) -> list[tuple[str, list[Rejection], Mask]]:
        """Every Filter plugin over all rows, narrowing ``alive`` in place; returns (plugin, rejections, rows alive
        before it). kube's ``RunFilterPluginsWithNominatedPods``: pods nominated to a node (by preemption) with at
        least this pod's priority count there too, so a node passes only if it fits both with and without them.
        ``with_nominated=False``: the pass without them only (a caller that counts them itself, preemption's
        arithmetic dry run)."""
        rejected = self._filter_pass(state, pod, table, alive, skipped)
        if not with_nominated:
            return rejected
        nominated = nominated_records(table, pod, alive)  # only where they can change the answer
        if nominated:
            table.simulate_add(nominated, notify=True)
            try:
                # Plugins counting pods across nodes decide in PreFilter: count the nominated pods too (kube's
                # AddPod on a cloned state), in a state of their own.
                nominated_state = dict(state)
                for pl in self.pre_filter:
                    if getattr(pl, "reads_other_nodes", False) and pl.name not in skipped:
                        pl.pre_filter(nominated_state, pod, table)
                rejected += self._filter_pass(nominated_state, pod, table, alive, skipped)
            finally:
                table.simulate_remove([r.uid for r in nominated], notify=True)
        return rejected

    def _filter_pass(
        self, state: CycleState, pod: PodInfo, table: NodeTable, alive: Mask, skipped: Set[str]
    ) -> list[tuple[str, list[Rejection], Mask]]:
        rejected: list[tuple[str, list[Rejection], Mask]] = []
        for flt in self.filter:
            if flt.name in skipped:
                continue
            rejections = flt.filter(state, pod, table)
            if not rejections:
                continue
            before = alive.copy()
            for r in rejections:
                alive &= ~r.mask
            rejected.append((flt.name, rejections, before))
        return rejected

    def run_prefilter_and_filter(
        self, state: CycleState, pod: PodInfo, table: NodeTable, alive: Mask, *, with_nominated: bool = True
    ) -> list[tuple[str, list[Rejection], Mask]]:
        """PreFilter then Filter on ``alive`` rows (narrowed in place), for what-ifs such as preemption's dry run
        (kube's handle offers the same to plugins); a PreFilter rejection or node restriction narrows ``alive``."""
        skipped: set[str] = set()
        for pl in self.pre_filter:
            res = pl.pre_filter(state, pod, table)
            if res.status.code is Code.SKIP:
                skipped.add(pl.name)
            elif not res.status.success:
                before = alive.copy()
                alive[:] = False
                return [(pl.name, [Rejection(res.status.message, table.live.copy(), res.status.rejected)], before)]
            if res.node_names is not None:
                pinned = np.zeros(table.n_rows, dtype=bool)
                pinned[[table.rows[n] for n in res.node_names if n in table.rows]] = True
                alive &= pinned
        return self.run_filter_plugins(state, pod, table, alive, skipped, with_nominated=with_nominated)

    def run_post_filter(
        self,
        state: CycleState,
        pod: PodInfo,
        diagnosis: Diagnosis,
        call: Callable[[PostFilterPlugin], Status] | None = None,
    ) -> None:
        """kube's ``RunPostFilterPlugins``: in order while they answer Unschedulable (their reasons joined with
        ", "); the first that succeeds, answers UnschedulableAndUnresolvable or fails ends it with its own message.
        The message is appended to the FitError ("... preemption: ..."). ``call``: how each plugin is run instead of
        its ``post_filter`` (the simulator's dry run of preemption)."""
        reasons: list[str] = []
        for pf in self.post_filter:
            status = call(pf) if call is not None else pf.post_filter(state, pod, diagnosis)
            if status.code is Code.UNSCHEDULABLE:
                reasons.extend(status.reasons)
                continue
            diagnosis.post_filter_msg = status.message
            return
        diagnosis.post_filter_msg = ", ".join(reasons)

    def run_reserve(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """Reserve in order; on the first failure every plugin reserved so far (and the failing one) unreserves."""
        for i, pl in enumerate(self.reserve):
            status = pl.reserve(state, pod, node)
            if not status.success:
                for undo in reversed(self.reserve[: i + 1]):
                    undo.unreserve(state, pod, node)
                return Status(status.code, status.reasons, status.plugin or pl.name)
        return Status()

    def run_unreserve(self, state: CycleState, pod: PodInfo, node: str) -> None:
        for pl in reversed(self.reserve):
            pl.unreserve(state, pod, node)

    @functools.cached_property
    def _pre_flights(self) -> list[tuple[str, Callable[[CycleState, PodInfo, str], Status] | None]]:
        return [(p.name, getattr(p, "pre_bind_pre_flight", None)) for p in self.pre_bind]

    def run_pre_bind_pre_flights(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """kube's ``RunPreBindPreFlights``: SUCCESS when some PreBind plugin will do work for the pod (the binding
        cycle then writes its nominated node first: NominatedNodeNameForExpectation), SKIP when none will, ERROR
        naming the plugin when one fails. A PreBind plugin without ``pre_bind_pre_flight`` (kube's interface
        requires it) counts as one that will work."""
        result = SKIP
        for name, flight in self._pre_flights:
            if flight is None:
                result = SUCCESS
                continue
            try:
                status = flight(state, pod, node)
            except Exception as err:
                status = Status(Code.ERROR, (repr(err),))
            if status.code is Code.ERROR:
                return Status(Code.ERROR, (f'running PreBindPreFlight "{name}": {status.message}',), name)
            if status.code is Code.SUCCESS:
                result = SUCCESS
            elif status.code is not Code.SKIP:
                return Status(
                    Code.ERROR,
                    (
                        f'PreBindPreFlight {name} returned "{status.code.value}", which is unsupported. It is '
                        "supposed to return Success, Skip, or Error status",
                    ),
                    name,
                )
        return result

    async def run_binding(self, state: CycleState, pod: PodInfo, node: str, observe: Observe = _ignore) -> Status:
        """Permit, PreBind, then the first Bind plugin that does not SKIP; the first non-success status wins.
        A plugin that raises is reported as an error status naming it, never as an exception."""
        for point, calls in self._gates:
            started = time.perf_counter()
            for name, call in calls:
                try:  # each plugin awaited here, not through a wrapping coroutine: several a pod on the hot path
                    status = await call(state, pod, node)
                except Exception as err:
                    status = _raised(name, err)
                if not status.success:
                    observe(point, status.code.value, time.perf_counter() - started)
                    return Status(status.code, status.reasons, name)
        t2 = time.perf_counter()
        for binder in self.bind:
            try:
                status = await binder.bind(state, pod, node)
            except Exception as err:
                status = _raised(binder.name, err)
            if status.code is Code.SKIP:
                continue
            observe("Bind", status.code.value, time.perf_counter() - t2)
            return Status(status.code, status.reasons, binder.name)
        return Status(Code.ERROR, ("no bind plugin bound the pod",))

    def run_post_bind(self, state: CycleState, pod: PodInfo, node: str) -> None:
        """PostBind is informational (kube ignores its outcome): one failing plugin does not stop the others."""
        for post in self.post_bind:
            try:
                post.post_bind(state, pod, node)
            except Exception:  # informational extension point
                continue


def _raised(plugin: str, err: Exception) -> Status:
    """A binding plugin that raised, as the error status naming it."""
    return Status(Code.ERROR, (f"running {plugin}: {err!r}",), plugin)


def merge_plugin_set(default: list[PluginRef], custom: PluginSet | None) -> list[PluginRef]:
    """kube-scheduler's ``mergePluginSet`` for the multiPoint defaults."""
    if custom is None:
        return list(default)
    disabled = set(custom.disabled)
    by_name = {ref.name: ref for ref in custom.enabled}
    merged: list[PluginRef] = []
    replaced: set[str] = set()
    if "*" not in disabled:
        for ref in default:
            if ref.name in disabled:
                continue
            if ref.name in by_name:
                ref = by_name[ref.name]
                replaced.add(ref.name)
            merged.append(ref)
    merged += [ref for ref in custom.enabled if ref.name not in replaced]
    return merged


def build_profiles(
    config: SchedulerConfig, registry: Registry, handle_for: Callable[[str], Handle]
) -> dict[str, Profile]:
    """Instantiate every profile; raises ``ConfigError`` with all plugin problems (names, points, args)."""
    problems: list[str] = []
    profiles: dict[str, Profile] = {}
    for i, pc in enumerate(config.profiles):
        profile = _build(pc, f"profiles[{i}]", registry, handle_for(pc.scheduler_name), problems)
        if profile is not None:
            profiles[pc.scheduler_name] = profile
    sorts = {type(p.queue_sort).__name__ for p in profiles.values()}
    if len(sorts) > 1:
        problems.append("profiles: all profiles must use the same queueSort plugin (they share one queue)")
    if problems:
        raise ConfigError(problems)
    return profiles


def _build(pc: ProfileConfig, p: str, registry: Registry, handle: Handle, problems: list[str]) -> Profile | None:
    defaults = [PluginRef(name, weight) for name, weight in registry.defaults]
    multipoint = merge_plugin_set(defaults, pc.plugins.get("multiPoint"))

    # Every plugin named anywhere, instantiated once with its args.
    wanted: dict[str, str] = {}  # name -> config path where it is first enabled
    for k, ref in enumerate(pc.plugins.get("multiPoint", PluginSet()).enabled):
        wanted.setdefault(ref.name, f"{p}.plugins.multiPoint.enabled[{k}].name")
    for ref in multipoint:
        wanted.setdefault(ref.name, f"{p}.plugins.multiPoint")
    for point in EXTENSION_POINTS:
        for k, ref in enumerate(pc.plugins.get(point, PluginSet()).enabled):
            wanted.setdefault(ref.name, f"{p}.plugins.{point}.enabled[{k}].name")
    instances: dict[str, Plugin] = {}
    for name, where in wanted.items():
        if name not in registry:
            problems.append(f"{where}: unknown plugin {name!r} (available: {', '.join(sorted(registry))})")
            continue
        index, args = pc.plugin_config.get(name, (-1, {}))
        try:
            instances[name] = registry.create(name, args, handle)
        except ArgsError as err:
            problems += [
                f"{p}.pluginConfig[{index}].args" + (f".{path}" if path else "") + f": {msg}"
                for path, msg in err.problems
            ]
    for name, (index, _) in pc.plugin_config.items():
        if name not in wanted:
            problems.append(f"{p}.pluginConfig[{index}].name: plugin {name!r} is not enabled in this profile")

    lists: dict[str, list[tuple[Any, int | None]]] = {}
    for point, protocol in EXTENSION_POINTS.items():
        specific = pc.plugins.get(point, PluginSet())
        for k, ref in enumerate(specific.enabled):
            inst = instances.get(ref.name)
            if inst is not None and not isinstance(inst, protocol):
                problems.append(
                    f"{p}.plugins.{point}.enabled[{k}].name: plugin {ref.name!r} does not implement {point}"
                )
        lists[point] = _expand(point, protocol, specific, multipoint, instances)
    if len(lists["queueSort"]) != 1:
        problems.append(
            f"{p}.plugins.queueSort: exactly one queueSort plugin must be enabled, got {len(lists['queueSort'])}"
        )
    if not lists["bind"]:
        problems.append(f"{p}.plugins.bind: at least one bind plugin is needed")
    if any(x.startswith(p + ".") for x in problems):
        return None
    profile = Profile(
        name=pc.scheduler_name,
        queue_sort=lists["queueSort"][0][0],
        pre_enqueue=[x for x, _ in lists["preEnqueue"]],
        pre_filter=[x for x, _ in lists["preFilter"]],
        filter=[x for x, _ in lists["filter"]],
        post_filter=[x for x, _ in lists["postFilter"]],
        pre_score=[x for x, _ in lists["preScore"]],
        score=[(x, w if w else 1) for x, w in lists["score"]],
        reserve=[x for x, _ in lists["reserve"]],
        permit=[x for x, _ in lists["permit"]],
        pre_bind=[x for x, _ in lists["preBind"]],
        bind=[x for x, _ in lists["bind"]],
        post_bind=[x for x, _ in lists["postBind"]],
        percentage_of_nodes_to_score=pc.percentage_of_nodes_to_score,
        plugins=instances,
        supported_fields=frozenset(f for pl in instances.values() for f in getattr(pl, "supports_fields", ())),
    )
    profile.handle = handle
    handle.framework = profile
    return profile


def _expand(
    point: str, protocol: type, specific: PluginSet, multipoint: list[PluginRef], instances: dict[str, Plugin]
) -> list[tuple[Any, int | None]]:
    """kube-scheduler's ``expandMultiPointPlugins`` for one extension point: overrides, then multiPoint
    plugins, then the other specific ones."""
    enabled = [ref for ref in specific.enabled if ref.name in instances]
    disabled = set(specific.disabled)
    if "*" in disabled:
        return [(instances[ref.name], ref.weight) for ref in enabled]
    specific_names = {ref.name for ref in enabled}
    mp_weight = {ref.name: ref.weight for ref in multipoint}
    from_multipoint = [
        ref
        for ref in multipoint
        if ref.name in instances and isinstance(instances[ref.name], protocol) and ref.name not in disabled
    ]
    overrides = [ref for ref in enabled if ref.name in {m.name for m in from_multipoint}]
    ordered = overrides + [ref for ref in from_multipoint if ref.name not in specific_names]
    ordered += [ref for ref in enabled if ref not in overrides]
    return [
        (instances[ref.name], ref.weight if ref.weight is not None else mp_weight.get(ref.name))
        for ref in ordered
        if isinstance(instances[ref.name], protocol)
    ]
