"""The framework's value types (kube-scheduler's ``framework/types.go`` and ``framework/interface.go`` statuses).

Nothing here imports the rest of the scheduler: plugins, the queue, the cache and the runtime all import these
types, never the reverse, so the package has no import cycles.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from crane_scheduler.nodetable import IntArray, Mask
from crane_scheduler.podinfo import NodeInfo, PodInfo

__all__ = [
    "EXPLAIN_FILTERS",
    "EXPLAIN_SCORES",
    "MAX_NODE_SCORE",
    "NO_NODES_MESSAGE",
    "SCHEDULED_WITH_BIND",
    "SKIP",
    "SUCCESS",
    "ArgsError",
    "ClusterChange",
    "ClusterEvent",
    "Code",
    "CycleState",
    "Diagnosis",
    "PreFilterResult",
    "QueuedPod",
    "QueueingHint",
    "QueueingHintFn",
    "QueueingHints",
    "Rejection",
    "Rows",
    "Status",
    "default_normalize",
    "error",
    "fit_error_message",
    "sooner",
    "unschedulable",
]

MAX_NODE_SCORE = 100
NO_NODES_MESSAGE = "no nodes available to schedule pods"
Rows = npt.NDArray[np.intp]
CycleState = dict[str, Any]
"""Per-pod scratch space shared by the plugins of one scheduling attempt (PreFilter results, PreScore data)."""

EXPLAIN_FILTERS = "explain.filters"
"""CycleState key: [(filter plugin, its rejections, rows alive before it)] of the last decision."""
EXPLAIN_SCORES = "explain.scores"
"""CycleState key: (scored rows, [(score plugin, weight, normalised scores)]) of the last decision."""
EXPLAIN_DECIDER = "explain.decider"
"""CycleState key: how a decider worker's node was taken (its filters and scores ran on the worker's replica)."""
SCHEDULED_WITH_BIND = "scheduled.with-bind"
"""CycleState key: the bind carried the pod's ``Scheduled`` event (``Handle.scheduled_report``)."""


class Code(enum.Enum):
    SUCCESS = "Success"
    ERROR = "Error"
    UNSCHEDULABLE = "Unschedulable"
    UNSCHEDULABLE_AND_UNRESOLVABLE = "UnschedulableAndUnresolvable"
    WAIT = "Wait"
    SKIP = "Skip"
    ALREADY_BOUND = "AlreadyBound"
    """Bind only: the pod is bound already (HTTP 409), by us before a crash or by another replica; the binding
    is someone else's success, not an error to retry (no Go counterpart: kube-scheduler treats it as an error)."""


@dataclass(frozen=True, slots=True)
class Status:
    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @property
    def success(self) -> bool:
        return self.code is Code.SUCCESS

    @property
    def rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    @property
    def message(self) -> str:
        return ", ".join(self.reasons)


SUCCESS = Status()
SKIP = Status(Code.SKIP)


def sooner(a: float | None, b: float | None) -> float | None:
    """The earlier of two optional retry delays (None: no timed retry)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def unschedulable(*reasons: str, unresolvable: bool = False) -> Status:
    return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE, reasons)


def error(message: str) -> Status:
    return Status(Code.ERROR, (message,))


@dataclass(frozen=True, slots=True)
class Rejection:
    """Nodes a Filter plugin rejects for one reason: ``mask`` is over table rows, True = rejected.

    The reason must not name the node: kube-scheduler's "0/N nodes are available" message is a histogram of
    reasons, so a per-node reason would break the grouping (and bloat the event)."""

    reason: str
    mask: Mask
    unresolvable: bool = False
    error: bool = False
    """The plugin failed on these rows (kube's Error status from Filter): the attempt fails with ``reason``."""
    retry_after: float | None = None
    """Seconds until the earliest instant at which this refusal could lift with no cluster event at all (a load
    annotation turning stale, a recent binding's estimate leaving its window): the pod is retried then (a queueing
    hint with a time). None: only a cluster event can lift it. Read it through ``lifts_in``."""
    retry_after_of: Callable[[], float | None] | None = None
    """``retry_after`` computed on first read instead (memoised by the plugin): it matters only when the attempt
    fails, and most refusals are of nodes a placed pod did not need. Consumers read ``lifts_in`` right after the
    Filter call that returned the rejection, before any other, so it sees that call's inputs."""

    def lifts_in(self) -> float | None:
        """``retry_after``, computed now when the plugin deferred it."""
        return self.retry_after if self.retry_after_of is None else self.retry_after_of()


@dataclass(frozen=True, slots=True)
class PreFilterResult:
    """``node_names`` restricts the nodes Filter looks at (None = all); a rejected status fails the pod."""

    status: Status = SUCCESS
    node_names: frozenset[str] | None = None


class ClusterEvent(enum.Flag):
    """Cluster changes that can make an unschedulable pod schedulable (kube's EventsToRegister, coarse)."""

    NODE_ADD = enum.auto()
    NODE_UPDATE = enum.auto()
    POD_DELETE = enum.auto()  # an assigned pod went away (resources, ports freed)
    POD_UPDATE = enum.auto()  # an assigned pod changed (e.g. resized down, relabelled)
    POD_ADD = enum.auto()  # a pod was bound (a peer for pod affinity, a count for topology spread)
    NODE_DELETE = enum.auto()  # a node went away (a topology domain less: spread skew may drop)
    PVC_CHANGE = enum.auto()  # a PersistentVolumeClaim was added or updated
    PV_CHANGE = enum.auto()  # a PersistentVolume was added or updated
    STORAGE_CLASS_CHANGE = enum.auto()  # a StorageClass was added or updated
    CSINODE_CHANGE = enum.auto()  # a CSINode was added or updated
    PDB_CHANGE = enum.auto()  # a PodDisruptionBudget was added, updated or deleted
    VOLUME_ATTACHMENT_DELETE = enum.auto()  # a VolumeAttachment went away (an attach slot freed)
    CSIDRIVER_UPDATE = enum.auto()  # a CSIDriver changed (e.g. storageCapacity turned off)
    CSI_STORAGE_CAPACITY_CHANGE = enum.auto()  # a CSIStorageCapacity was added or updated (more free storage)
    RESOURCE_CLAIM_CHANGE = enum.auto()  # a ResourceClaim was added or updated (created, deallocated)
    RESOURCE_SLICE_CHANGE = enum.auto()  # a ResourceSlice was added or updated (devices published)
    DEVICE_CLASS_CHANGE = enum.auto()  # a DeviceClass was added or updated
    ALL = (
        NODE_ADD
        | NODE_UPDATE
        | POD_DELETE
        | POD_UPDATE
        | POD_ADD
        | NODE_DELETE
        | PVC_CHANGE
        | PV_CHANGE
        | STORAGE_CLASS_CHANGE
        | CSINODE_CHANGE
        | PDB_CHANGE
        | VOLUME_ATTACHMENT_DELETE
        | CSIDRIVER_UPDATE
        | CSI_STORAGE_CAPACITY_CHANGE
        | RESOURCE_CLAIM_CHANGE
        | RESOURCE_SLICE_CHANGE
        | DEVICE_CLASS_CHANGE
    )


class QueueingHint(enum.Enum):
    """kube's ``QueueingHint``: whether a cluster change may make a pod a plugin rejected schedulable."""

    QUEUE = "Queue"
    SKIP = "QueueSkip"


@dataclass(frozen=True, slots=True)
class ClusterChange:
    """One cluster event with its objects (kube's ``oldObj``/``newObj`` of a ``QueueingHintFn``): ``old`` is None
    for an add, ``new`` None for a delete. Pods are ``PodInfo``, nodes ``NodeInfo``; ResourceClaims and DeviceClasses
    come as the API's JSON in ``old_object``/``new_object``; other kinds carry none."""

    event: ClusterEvent
    old: PodInfo | NodeInfo | None = None
    new: PodInfo | NodeInfo | None = None
    old_object: Mapping[str, Any] | None = None
    new_object: Mapping[str, Any] | None = None


QueueingHintFn = Callable[[PodInfo, ClusterChange], QueueingHint]
"""kube's ``QueueingHintFn``: (the unschedulable pod, the change) -> QUEUE or SKIP. It must be cheap and pure: the
queue calls it for every unschedulable pod the plugin rejected and every change of the event kinds it is keyed by."""

QueueingHints = Mapping[ClusterEvent, QueueingHintFn]
"""Per registered event kind(s), the hint deciding it; a registered kind without a hint always queues."""


@dataclass(slots=True)
class QueuedPod:
    """kube's ``QueuedPodInfo``: a pending pod with its queue bookkeeping (what QueueSort compares)."""

    pod: PodInfo
    timestamp: float  # when it (re-)entered the queue; the tie-breaker after priority
    initial_attempt: float | None = None
    attempts: int = 0
    rejectors: frozenset[str] = field(default_factory=frozenset)  # plugins that rejected it last time
    unschedulable_since: float = 0.0
    retry_at: float | None = None
    """queue time at which an unschedulable pod is retried without an event (its refusal's ``retry_after``)"""


@dataclass
class Diagnosis:
    """Why no node fits (kube's ``Diagnosis`` inside a ``FitError``)."""

    num_all_nodes: int
    reasons: Counter[str] = field(default_factory=Counter)
    rejectors: set[str] = field(default_factory=set)
    pre_filter_msg: str = ""
    post_filter_msg: str = ""
    preemptible: Mask | None = None
    """Rows rejected only with resolvable reasons (kube: status Unschedulable): where preemption may help."""
    retry_after: float | None = None
    """The soonest ``Rejection.retry_after`` of the attempt (Filter's, and PostFilter's dry run): seconds until
    a refusal could lift with no cluster event; None: events only."""
    clear_nomination: bool = False
    """Set by a PostFilter plugin that found nothing to do for the pod (kube's ``PostFilterResult`` with an empty
    nominated node: preemption without a candidate): the failure clears the pod's nomination."""

    @property
    def message(self) -> str:
        return fit_error_message(self)


def fit_error_message(d: Diagnosis) -> str:
    """kube-scheduler's ``FitError.Error()``: ``0/N nodes are available: <count> <reason>, ... .``

    The histogram is sorted as strings ("10 x" sorts before "2 y", as in Go), joined by ", ", ended with "."."""
    if d.num_all_nodes == 0 and not d.pre_filter_msg:
        return NO_NODES_MESSAGE
    msg = f"0/{d.num_all_nodes} nodes are available:"
    if d.pre_filter_msg:
        msg += f" {d.pre_filter_msg}."
    else:
        items = sorted(f"{count} {reason}" for reason, count in d.reasons.items())
        if items:
            msg += f" {', '.join(items)}."
    if d.post_filter_msg:
        msg += f" {d.post_filter_msg}"
    return msg


class ArgsError(ValueError):
    """Invalid plugin args: (path inside ``args``, message) pairs, all of them at once."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in problems))
        self.problems = problems


def default_normalize(scores: IntArray, reverse: bool = False) -> IntArray:
    """kube's ``DefaultNormalizeScore``: scale to 0..100 by the maximum (integer math), optionally reversed."""
    top = int(scores.max()) if len(scores) else 0
    if top == 0:
        return np.full(len(scores), MAX_NODE_SCORE if reverse else 0, dtype=np.int64)
    out = MAX_NODE_SCORE * scores // top
    return MAX_NODE_SCORE - out if reverse else out
