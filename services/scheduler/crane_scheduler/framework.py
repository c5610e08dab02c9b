"""The plugin API: kube-scheduler's extension points, one small Protocol each, and the plugin registry.

A plugin is any object with a ``name`` and the methods of the extension points it implements; the framework
finds them by shape (``isinstance`` against these runtime-checkable protocols), as Go finds interfaces. The one
difference from kube-scheduler is deliberate: **Filter, PreScore and Score see all candidate nodes at once** as
rows of the ``NodeTable`` and answer with numpy arrays, because a Python call per node per plugin would cost more
than the decision. Everything after the node is chosen (Reserve ... PostBind) is per pod, and the binding-cycle
points are coroutines, so a plugin may wait (Permit) or call the API (PreBind) without blocking the loop.

To add a plugin: write a factory ``(args, handle) -> plugin`` and register it under a name::

    registry = builtin_registry()
    registry.register("Dynamic", lambda args, handle: Dynamic(parse_args(args), handle))

then enable it in a profile (``plugins.multiPoint.enabled: [{name: Dynamic, weight: 3}]``) and give it
``pluginConfig`` args. A factory rejects bad args by raising ``ArgsError`` with (field path, message) pairs; the
configuration loader reports them as ``profiles[i].pluginConfig[j].args.<path>: <message>``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from crane_scheduler.nodetable import IntArray, Mask, NodeTable
from crane_scheduler.podinfo import PodInfo

if TYPE_CHECKING:
    from crane_scheduler.queue import QueuedPod

MAX_NODE_SCORE = 100
Rows = npt.NDArray[np.intp]
CycleState = dict[str, Any]
"""Per-pod scratch space shared by the plugins of one scheduling attempt (PreFilter results, PreScore data)."""


class Code(enum.Enum):
    SUCCESS = "Success"
    ERROR = "Error"
    UNSCHEDULABLE = "Unschedulable"
    UNSCHEDULABLE_AND_UNRESOLVABLE = "UnschedulableAndUnresolvable"
    WAIT = "Wait"
    SKIP = "Skip"


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
    POD_UPDATE = enum.auto()  # an assigned pod changed (e.g. resized down)
    ALL = NODE_ADD | NODE_UPDATE | POD_DELETE | POD_UPDATE


@dataclass
class Handle:
    """What the framework gives a plugin factory: the shared node table, the API client, a clock."""

    table: NodeTable
    api: Any = None  # kubernetes_asyncio ApiClient; None in pure tests
    clock: Callable[[], float] = field(default=lambda: 0.0)
    profile: str = ""


# ---------------------------------------------------------------------------------------------- extension points


@runtime_checkable
class QueueSortPlugin(Protocol):
    name: str

    def sort_key(self, qp: QueuedPod) -> tuple[Any, ...]:
        """Smaller keys are scheduled first (kube's ``Less`` as a sort key, so the queue can be a heap)."""
        ...


@runtime_checkable
class PreFilterPlugin(Protocol):
    name: str

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> PreFilterResult: ...


@runtime_checkable
class FilterPlugin(Protocol):
    name: str

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Rejection]:
        """Rejections over all table rows; an empty list passes every node."""
        ...


@runtime_checkable
class PostFilterPlugin(Protocol):
    name: str

    def post_filter(self, state: CycleState, pod: PodInfo, diagnosis: Any) -> Status:
        """Runs when no node fits (kube: preemption); the status message is appended to the FitError."""
        ...


@runtime_checkable
class PreScorePlugin(Protocol):
    name: str

    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> Status:
        """SKIP leaves this plugin's Score out for this pod."""
        ...


@runtime_checkable
class ScorePlugin(Protocol):
    name: str

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> IntArray:
        """One score per row in ``rows``; after NormalizeScore each must be within 0..100."""
        ...


@runtime_checkable
class NormalizeScorePlugin(Protocol):
    name: str

    def normalize_score(self, state: CycleState, pod: PodInfo, scores: IntArray) -> IntArray: ...


@runtime_checkable
class ReservePlugin(Protocol):
    name: str

    def reserve(self, state: CycleState, pod: PodInfo, node: str) -> Status: ...

    def unreserve(self, state: CycleState, pod: PodInfo, node: str) -> None: ...


@runtime_checkable
class PermitPlugin(Protocol):
    name: str

    async def permit(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """May await (kube's Wait); UNSCHEDULABLE rejects and the pod is retried after backoff."""
        ...


@runtime_checkable
class PreBindPlugin(Protocol):
    name: str

    async def pre_bind(self, state: CycleState, pod: PodInfo, node: str) -> Status: ...


@runtime_checkable
class BindPlugin(Protocol):
    name: str

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """SKIP hands the pod to the next bind plugin."""
        ...


@runtime_checkable
class PostBindPlugin(Protocol):
    name: str

    def post_bind(self, state: CycleState, pod: PodInfo, node: str) -> None: ...


@runtime_checkable
class EnqueueExtensions(Protocol):
    name: str

    def events_to_register(self) -> ClusterEvent:
        """Events that may make a pod this plugin rejected schedulable; plugins without it get ALL."""
        ...


EXTENSION_POINTS: dict[str, type] = {
    "queueSort": QueueSortPlugin,
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


# ---------------------------------------------------------------------------------------------- registry


class ArgsError(ValueError):
    """Invalid plugin args: (path inside ``args``, message) pairs, all of them at once."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in problems))
        self.problems = problems


PluginFactory = Callable[[Mapping[str, Any], Handle], Any]


class Registry:
    """Plugin name -> factory, plus the default profile's ``multiPoint`` set (name, score weight).

    The built-in set comes from ``crane_scheduler.plugins.builtin_registry()``; installed packages add theirs
    through the ``crane_scheduler.plugins`` entry-point group (see ``__main__.plugin_registry``)."""

    def __init__(
        self, factories: Mapping[str, PluginFactory] | None = None, defaults: Iterable[tuple[str, int | None]] = ()
    ) -> None:
        self._factories: dict[str, PluginFactory] = dict(factories or {})
        self.defaults: list[tuple[str, int | None]] = list(defaults)

    def register(
        self, name: str, factory: PluginFactory, *, enabled_by_default: bool = False, weight: int | None = None
    ) -> None:
        """Add a plugin; ``enabled_by_default`` puts it in the default profile (after the built-ins), with
        ``weight`` if it scores. Profiles can still disable it like any default plugin."""
        if name in self._factories:
            raise ValueError(f"plugin {name!r} is already registered")
        self._factories[name] = factory
        if enabled_by_default:
            self.defaults.append((name, weight))

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)

    def create(self, name: str, args: Mapping[str, Any], handle: Handle) -> Any:
        return self._factories[name](args, handle)


def no_args(name: str) -> Callable[[Mapping[str, Any]], None]:
    """Argument check for plugins that take none."""

    def check(args: Mapping[str, Any]) -> None:
        if args:
            raise ArgsError([(k, f"unknown field (plugin {name} takes no args)") for k in args])

    return check


def default_normalize(scores: IntArray, reverse: bool = False) -> IntArray:
    """kube's ``DefaultNormalizeScore``: scale to 0..100 by the maximum (integer math), optionally reversed."""
    top = int(scores.max()) if len(scores) else 0
    if top == 0:
        return np.full(len(scores), MAX_NODE_SCORE if reverse else 0, dtype=np.int64)
    out = MAX_NODE_SCORE * scores // top
    return MAX_NODE_SCORE - out if reverse else out
