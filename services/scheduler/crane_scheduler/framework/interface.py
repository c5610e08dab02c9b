"""The plugin API: kube-scheduler's extension points, one small Protocol each, and the ``Handle``.

A plugin declares the extension points it implements by subclassing their protocols
(``class NodeName(fwk.FilterPlugin, fwk.EnqueueExtensions)``), so mypy checks its method signatures against these; an
out-of-tree plugin may also just have the methods (the protocols are runtime-checkable and the profile runtime
finds them by shape, as Go finds interfaces). The one difference from kube-scheduler is deliberate: **Filter,
PreScore and Score see all candidate nodes at once** as rows of the ``NodeTable`` and answer with numpy arrays,
because a Python call per node per plugin would cost more than the decision. Everything after the node is chosen
(Reserve ... PostBind) is per pod, and the binding-cycle points are coroutines, so a plugin may wait (Permit) or
call the API (PreBind, Bind) without blocking the loop. Plugins never raise across this boundary: failures are
a ``Status``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Gauge

from crane_scheduler.framework.types import (
    ClusterEvent,
    CycleState,
    Diagnosis,
    PreFilterResult,
    QueuedPod,
    QueueingHints,
    Rejection,
    Rows,
    Status,
)
from crane_scheduler.listers import Listers
from crane_scheduler.nodetable import IntArray, Mask, NodeTable
from crane_scheduler.podinfo import NodeInfo, PodInfo
from crane_scheduler.writer import ApiWriter, ScheduledReport
from crane_shared.informer import EventType
from crane_shared.metrics import Histogram

__all__ = [
    "EXTENSION_POINTS",
    "GANG",
    "GANG_MEMBERS",
    "BindPlugin",
    "CrossNodeFilterPlugin",
    "DeciderPreFilterPlugin",
    "EnqueueExtensions",
    "ExplainPlugin",
    "FilterPlugin",
    "GangPlugin",
    "GangWait",
    "Handle",
    "NormalizeScorePlugin",
    "ObjectPlugin",
    "PermitPlugin",
    "Plugin",
    "PluginMetrics",
    "PodBlindFilterPlugin",
    "PodExplainPlugin",
    "PostBindPlugin",
    "PostFilterPlugin",
    "PreBindPlugin",
    "PreEnqueuePlugin",
    "PreFilterPlugin",
    "PreScorePlugin",
    "QueueSortPlugin",
    "QueueingHintPlugin",
    "ReservePlugin",
    "ScorePlugin",
    "VictimLoadFilterPlugin",
    "WorkerPlugin",
]


class PluginMetrics:
    """Plugins' metrics in one registry: each family is created on first use and shared by every profile's
    instance of the plugin (a registry refuses a name twice). Nothing is registered at import time."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        self._histograms: dict[str, Histogram] = {}

    def counter(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> Counter:
        found = self._counters.get(name)
        if found is None:
            found = self._counters[name] = Counter(name, documentation, labelnames, registry=self.registry)
        return found

    def gauge(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> Gauge:
        found = self._gauges.get(name)
        if found is None:
            found = self._gauges[name] = Gauge(name, documentation, labelnames, registry=self.registry)
        return found

    def histogram(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), buckets: Sequence[float] = ()
    ) -> Histogram:
        found = self._histograms.get(name)
        if found is None:
            kw: dict[str, Any] = {"buckets": buckets} if buckets else {}
            found = self._histograms[name] = Histogram(name, documentation, labelnames, registry=self.registry, **kw)
        return found


async def _settled() -> None:
    """``Handle.status_settled`` without a reporter: nothing is on its way."""


@dataclass
class Handle:
    """What the framework gives a plugin factory: the shared node table, the API client (set before the first
    binding cycle; None while only validating, and in pure tests), a clock, the metrics registry, and the
    listers of the other API objects plugins read."""

    table: NodeTable
    api: Any = None
    clock: Callable[[], float] = field(default=lambda: 0.0)
    profile: str = ""
    metrics: PluginMetrics = field(default_factory=PluginMetrics)
    # Whether a bind may be sent now (False once the leader's term ended); bind plugins check it right before
    # their write. Set by the service; always True without leader election.
    may_bind: Callable[[], bool] = field(default=lambda: True)
    writer: ApiWriter | None = None
    """The API writer process's client: bind plugins send their write through it (set by the service)."""
    listers: Listers = field(default_factory=Listers)
    """PVCs, PVs, StorageClasses, CSINodes, PDBs (one instance shared by every profile and the cache)."""
    activate: Callable[[str], None] = field(default=lambda uid: None)
    """Move a pending pod (by uid) straight to activeQ (kube's ``Handle.Activate``); set by the scheduler."""
    record_event: Callable[[Mapping[str, Any], Mapping[str, Any] | None, str, str, str, str], None] = field(
        default=lambda regarding, related, type_, reason, action, note: None
    )
    """kube's ``EventRecorder().Eventf(regarding, related, type, reason, action, note)`` for pods: references as
    {namespace, name, uid}; set by the scheduler to its reporter (this profile's name as reportingController)."""
    scheduled_report: Callable[[PodInfo], ScheduledReport | None] = field(default=lambda pod: None)
    """The ``Scheduled`` event a bind of the pod carries through the writer (``Reporter.with_bind``, this profile's
    name as reportingController; set by the scheduler); a bind plugin that sends it sets ``SCHEDULED_WITH_BIND`` in
    the cycle state, and the scheduler then writes no event of its own for that bind."""
    claim_condition: Callable[[str, str, str], None] = field(default=lambda uid, reason, message: None)
    """(pod uid, reason, message): this attempt's PodScheduled=False condition is written by the plugin itself, in
    a write of its own (preemption: with the nomination, kube's ``updatePod``), so the reporter does not patch it
    again, and drops the pod's older patch still queued; set by the scheduler to its reporter."""
    status_settled: Callable[[str], Awaitable[None]] = field(default=lambda uid: _settled())
    """(pod uid): returns once the pod's status patches the reporter handed to the writer are answered, so a
    plugin's own status write (preemption's nomination) is not overwritten by an older one landing after it; set
    by the scheduler to its reporter's ``settled``."""
    framework: Any = None
    """The plugin's profile (``runtime.Profile``), set once built: what kube's handle offers as
    ``RunFilterPluginsWithNominatedPods`` (preemption's dry run runs the profile's own filters)."""


@runtime_checkable
class Plugin(Protocol):
    name: str


@runtime_checkable
class QueueSortPlugin(Plugin, Protocol):
    def sort_key(self, qp: QueuedPod) -> tuple[Any, ...]:
        """Smaller keys are scheduled first (kube's ``Less`` as a sort key, so the queue can be a heap)."""
        ...


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> PreFilterResult: ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Rejection]:
        """Rejections over all table rows; an empty list passes every node."""
        ...


@runtime_checkable
class PostFilterPlugin(Plugin, Protocol):
    def post_filter(self, state: CycleState, pod: PodInfo, diagnosis: Diagnosis) -> Status:
        """Runs when no node fits (kube: preemption); the status message is appended to the FitError."""
        ...


@runtime_checkable
class PreScorePlugin(Plugin, Protocol):
    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> Status:
        """SKIP leaves this plugin's Score out for this pod."""
        ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> IntArray:
        """One score per row in ``rows``; after NormalizeScore each must be within 0..100."""
        ...


@runtime_checkable
class NormalizeScorePlugin(ScorePlugin, Protocol):
    """A Score plugin that rescales its own scores (kube's ``ScoreExtensions``, which belong to a ScorePlugin)."""

    def normalize_score(self, state: CycleState, pod: PodInfo, scores: IntArray) -> IntArray: ...


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserve(self, state: CycleState, pod: PodInfo, node: str) -> Status: ...

    def unreserve(self, state: CycleState, pod: PodInfo, node: str) -> None: ...


@runtime_checkable
class PermitPlugin(Plugin, Protocol):
    async def permit(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """May await (kube's Wait); UNSCHEDULABLE rejects and the pod is retried after backoff."""
        ...


@runtime_checkable
class PreBindPlugin(Plugin, Protocol):
    """May also define ``pre_bind_pre_flight(state, pod, node) -> Status`` (kube's ``PreBindPreFlight``: SUCCESS
    when its PreBind will do work for the pod, SKIP when not, ERROR): the binding cycle writes the pod's
    nominated node before PreBind when one will (``Profile.run_pre_bind_pre_flights``); a plugin without it
    counts as one that will."""

    async def pre_bind(self, state: CycleState, pod: PodInfo, node: str) -> Status: ...


@runtime_checkable
class BindPlugin(Plugin, Protocol):
    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """SKIP hands the pod to the next bind plugin; ALREADY_BOUND says the pod is bound already (409)."""
        ...


@runtime_checkable
class PostBindPlugin(Plugin, Protocol):
    def post_bind(self, state: CycleState, pod: PodInfo, node: str) -> None: ...


@runtime_checkable
class EnqueueExtensions(Plugin, Protocol):
    def events_to_register(self) -> ClusterEvent:
        """Events that may make a pod this plugin rejected schedulable; plugins without it get ALL."""
        ...


@runtime_checkable
class QueueingHintPlugin(EnqueueExtensions, Protocol):
    """Optional, on top of ``EnqueueExtensions`` (kube registers each event with its hint): kube's per-object
    ``QueueingHintFn``s. For a pod this plugin rejected, a change of a registered event kind requeues it only when
    the hint keyed by that kind answers QUEUE (a kind without a hint always requeues, as does a hint that raises)."""

    def queueing_hints(self) -> QueueingHints: ...


@runtime_checkable
class PreEnqueuePlugin(Plugin, Protocol):
    """Optional: kube's ``PreEnqueue``. A pod it gates (True) does not leave the unschedulable pods for activeQ,
    whatever the cluster events, until the plugin activates it (``Handle.activate``) or stops gating it."""

    def pre_enqueue(self, pod: PodInfo) -> bool: ...


@runtime_checkable
class ExplainPlugin(Plugin, Protocol):
    """Optional: per-node inputs the plugin decided on, shown by ``GET /debug/explain`` under ``explain_section``."""

    explain_section: str

    def explain_node(self, node: NodeInfo, at: float, uid: str = "", priority: int | None = None) -> Mapping[str, Any]:
        """The plugin's view of ``node`` as it was at wall-clock time ``at`` (the decision's time), for the pod
        ``uid`` of ``priority`` (what counts can depend on the pod, e.g. nominated pods)."""
        ...


@runtime_checkable
class PodExplainPlugin(Plugin, Protocol):
    """Optional: what the plugin chose for a placed pod beyond its node (NUMA zones, ...), merged into the
    explained ``result``."""

    def explain_pod(self, uid: str, node: str) -> Mapping[str, Any]:
        """Entries to add to the decision's ``result`` for pod ``uid`` placed on ``node`` (empty: nothing)."""
        ...


@runtime_checkable
class CrossNodeFilterPlugin(Plugin, Protocol):
    """Optional marker: the plugin's PreFilter/Filter verdict on a node may depend on pods placed on *other* nodes
    (InterPodAffinity, PodTopologySpread: kube's plugins with ``PreFilterExtensions``). Unless its PreFilter
    answers SKIP for the pod, preemption's dry run then evaluates candidate nodes one at a time, as kube does,
    with the what-if visible through the node table's ``pod_simulated`` hooks."""

    reads_other_nodes: bool


@runtime_checkable
class DeciderPreFilterPlugin(Plugin, Protocol):
    """Optional marker, ``decider_pre_filter``: what the plugin's PreFilter answers for a pod a decider worker may
    decide (``deciders.eligible``: no claim, no volume that binds, no nomination, only the node's own resources):
    ``"skip"``, SKIP for every such pod (the volume plugins), or ``"pod"``, an answer that reads that pod alone (its
    node name, affinity, ports, features). A worker's fresh answer for the same pod object was given after its own
    PreFilter, so the scheduling process checking it runs neither kind again (``Algorithm.schedule``); a plugin
    without the marker is always run."""

    decider_pre_filter: str


@runtime_checkable
class PodBlindFilterPlugin(Plugin, Protocol):
    """Optional marker, ``reads_node_pods = False``: the plugin's Filter verdict on a node never depends on the
    pods counted on any node (node fields, taints, labels, volumes' topology, load annotations only), so a what-if
    that moves pods cannot change it. Preemption's dry run then leaves it out of its reprieve rounds, which become
    NodeResourcesFit's arithmetic when no other plugin that reads pods has something to say about the pod.
    A plugin without the marker is assumed to read pods."""

    reads_node_pods: bool


@runtime_checkable
class VictimLoadFilterPlugin(Plugin, Protocol):
    """Optional marker, ``reads_victims_load = True``: a ``PodBlindFilterPlugin`` whose verdict still depends on
    preemption's victims through something the table does not account (Dynamic: their measured usage and their
    estimates). It listens to ``NodeTable.victims_simulated``; preemption's dry run tells it of every victim it
    takes out or puts back, and its arithmetic reprieve puts a victim back only where the plugin still passes the
    pod (``refuses``: its Filter verdict alone). ``victim_rows(pod)``: the node rows where a victim of ``pod`` can
    change its verdict at all. Its verdict must be monotone (taking victims out never refuses a node it passed):
    the dry run tells it only of the victims on rows it refuses with every victim there."""

    reads_victims_load: bool

    def victim_rows(self, pod: PodInfo) -> set[int]: ...

    def refuses(self, pod: PodInfo, table: NodeTable) -> Mask: ...


@runtime_checkable
class WorkerPlugin(Plugin, Protocol):
    """Optional: a plugin with a loop of its own (NodeResourceTopologyMatch's NRT watch), run by the scheduler for
    its whole life under the one worker contract. It may return at once when it has nothing to watch (no API, no
    default spread constraints): the scheduler then waits for the stop (``crane_shared.service.until_stopped``)."""

    async def run(self, stopping: asyncio.Event) -> None: ...


@runtime_checkable
class ObjectPlugin(Plugin, Protocol):
    """Optional: a plugin that reads API objects of kinds of its own (PodGroups, Workloads, NRTs, namespaces, the
    owners of default spread constraints), kept by its ``WorkerPlugin`` watch in the scheduler. Fed directly where
    there is no watch (the offline scheduler, ``crane_scheduler.simulate``): ``object_kinds`` names the Kubernetes
    kinds it reads, ``apply_object`` applies one event, ``objects_listed`` says the objects given so far are the
    whole list (what the watch's first list says: a missing object is missing, not "not listed yet")."""

    object_kinds: tuple[str, ...]

    def apply_object(self, kind: str, event: EventType, obj: dict[str, Any]) -> None: ...

    def objects_listed(self) -> None: ...


GANG_MEMBERS = "gang/members"
"""CycleState key the scheduler's gang cycle writes for each member: how many pods its group has (pending and
placed), the sibling count a gang plugin's PreFilter checks."""
GANG = "gang/name"
"""CycleState key the gang cycle writes for each member: its group (``GangPlugin.gang_of``), for plugins that treat
a gang's members as one (Dynamic's ``gangHotValue: together``)."""


@dataclass(frozen=True, slots=True)
class GangWait:
    """A gang's members did not all find places: what its members that fit hear, and when to retry it."""

    message: str
    retry_after: float | None = None
    """seconds until the plugin retries the group regardless of cluster events (its backoff or timeout); None: on
    events only"""
    timed_out: bool = False


@runtime_checkable
class GangPlugin(Plugin, Protocol):
    """Optional: the plugin groups pods into gangs that are placed all or nothing (Coscheduling). The scheduler
    takes a popped member's pending siblings with it, finds places for them one after another (each decision
    sees the previous members assumed), and assumes and binds them only if the group's quorum is met; otherwise
    it assumes none, so a waiting gang holds no capacity."""

    def gang_of(self, pod: PodInfo) -> str | None:
        """The pod's group (``namespace/name``), None for a pod of no gang."""
        ...

    def quorum(self, gang: str) -> int:
        """How many members must be placed (counting those bound or assumed already); 0 when unknown."""
        ...

    def gang_placed(self, gang: str, uids: Sequence[str]) -> None:
        """The cycle met the quorum: ``uids`` are assumed and about to bind."""
        ...

    def gang_waiting(
        self,
        gang: str,
        uids: Sequence[str],
        blocker: str,
        feasible: int,
        refused: bool,
        placed: int = 0,
        untried: int = 0,
    ) -> GangWait:
        """The cycle did not meet the quorum (``blocker``: the first member that found no place; ``feasible``: how
        many did; ``refused``: every failure was this plugin's own refusal, not a lack of room; ``placed``: members
        bound or assumed before the cycle; ``untried``: members left undecided once the quorum was out of reach):
        nothing is assumed, ``uids`` wait."""
        ...

    def gang_incomplete(self, gang: str, pod: PodInfo, members: int, quorum: int) -> str:
        """PreEnqueue: the group has ``members`` pods (pending or placed), fewer than its ``quorum``, so its new pod
        ``pod`` waits outside the queue (no scheduling cycle) until a sibling completes the group (that one's gang
        cycle takes it along) or the plugin activates it (the group changed). Returns the refusal the pod is told
        once, as its PreFilter would have said it (the cycle is skipped, not the message)."""
        ...


EXTENSION_POINTS: dict[str, type] = {
    "queueSort": QueueSortPlugin,
    "preEnqueue": PreEnqueuePlugin,
    "preFilter": PreFilterPlugin,
    "filter": FilterPlugin,
    "postFilter": PostFilterPlugin,
    "preScore": PreScorePlugin,
    "score": ScorePlugin,
    "reserve": ReservePlugin,
    "permit": PermitPlugin,
    "preBind": PreBindPlugin,
    "bind": BindPlugin,
    "postBind": PostBindPlugin,
}
