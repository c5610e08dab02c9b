"""What the allocator reads per node, kept across scheduling cycles until the slices or classes change.

kube's allocator gathers a node's pools and evaluates the CEL selectors per ``Allocate`` call, in Go. Here the
same work per node and per pod was most of the decision (bench/dra/RESULTS.md), so ``DeviceCache`` keeps:

- per node, its ``NodeView``: the pools ``gather_pools`` answers for it, each with its candidate devices in search
  order. The view depends on the slices (all of them: a pool's completeness reads every slice) and, when a slice
  selects nodes by ``nodeSelector``, on the node's labels, so it is rebuilt when the list of slice objects or the
  device classes change (the informer replaces an object on every change: identity is its version), and per node
  when that node's object changes while such a slice exists;
- per candidate, the verdict of each selector set asked of it (a "shape": the class, its selectors and the
  request's), an error included, so CEL runs once per device and shape, not once per node and pod;
- per view and shape, the devices that a simple request can take there (``ShapeDevices``): Filter answers most
  nodes by how many of them are free (``Allocator.fits_nodes``);
- per shape, a ``ShapeColumn``: that free count for every row of the node table as one numpy column, moved by
  the held devices that changed since the last cycle (``HeldLog``), so Filter compares one column with the
  number of devices the pod needs instead of counting node by node.

Evaluating a selector earlier than kube would is not observable: a verdict is only acted upon (an error raised)
when the search reaches the device, as kube's does.
"""

from __future__ import annotations

import operator
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from crane_scheduler.plugins.dynamicresources.capacity import CapacityError, fits_capacity
from crane_scheduler.plugins.dynamicresources.celenv import CelError, DeviceView, compile_selector, device_view
from crane_scheduler.plugins.dynamicresources.pools import Pool, PoolError, device_selects, gather_pools
from crane_scheduler.plugins.dynamicresources.taints import blocked_without_tolerations
from crane_scheduler.podinfo import NodeInfo

Raw = Mapping[str, Any]
DeviceID = tuple[str, str, str]
"""(driver, pool, device)."""
Shape = tuple[str, tuple[str, ...], tuple[str, ...]]
"""(class name, the class's selector expressions, the request's selector expressions)."""
SelectorError = tuple[bool, int, str, str]
"""(raised by a class selector rather than the request's, the selector's index, "compile" or "runtime", the CEL
error's text)."""
Verdict = bool | SelectorError
Consumption = tuple[tuple[str, tuple[tuple[str, Decimal], ...]], ...]
"""A device's ``consumesCounters``: (counter set, ((counter, value), ...)) per entry, in order."""


@dataclass(slots=True, eq=False)
class Candidate:
    """A device of a pool a node reaches, with what has been learnt about it (kept while its slice is).
    ``node_ok``: whether the device itself selects the node (True unless its slice selects nodes per device,
    ``perDeviceNodeSelection``), or the error kube raises evaluating that."""

    id: DeviceID
    device: Raw
    slice: Raw
    verdicts: dict[Shape, Verdict] = field(default_factory=dict)
    view: DeviceView | None = None
    node_ok: bool | str = True
    pool: Pool | None = None
    consumption: Consumption | None = None  # its ``consumesCounters`` parsed (the allocator's, on first use)

    def cel_view(self) -> DeviceView:
        if self.view is None:
            self.view = device_view(self.id[0], self.device)
        return self.view


def shape_of(class_: Raw, selectors: Sequence[Raw]) -> Shape:
    return (
        str((class_.get("metadata") or {}).get("name", "")),
        _expressions((class_.get("spec") or {}).get("selectors")),
        _expressions(selectors),
    )


def _expressions(selectors: Sequence[Raw] | None) -> tuple[str, ...]:
    return tuple(str((s.get("cel") or {}).get("expression", "")) for s in selectors or ())


def verdict(candidate: Candidate, shape: Shape) -> Verdict:
    """Whether the shape's selectors (the class's, then the request's) accept the device, memoized; a failing
    selector's error instead (kube stops at the first selector that fails or does not match)."""
    known = candidate.verdicts.get(shape)
    if known is None:
        known = candidate.verdicts[shape] = _evaluate(candidate, shape)
    return known


def _evaluate(candidate: Candidate, shape: Shape) -> Verdict:
    for on_class, expressions in ((True, shape[1]), (False, shape[2])):
        for i, expression in enumerate(expressions):
            try:
                compiled = compile_selector(expression)
            except CelError as err:
                return on_class, i, "compile", str(err)
            try:
                if not compiled.matches(candidate.cel_view()):
                    return False
            except CelError as err:
                return on_class, i, "runtime", str(err)
    return True


@dataclass(slots=True)
class ShapeDevices:
    """The devices of a view's complete, valid pools that a plain request of one shape (no tolerations, no
    capacity) may take: selected, selecting the node, no untolerated taint, its capacities' policies met by the
    whole device; in search order."""

    ids: tuple[DeviceID, ...]


class NodeView:
    """A node's pools (``gather_pools``, or the error it raised) with their candidates in search order."""

    __slots__ = ("candidates", "error", "invalid", "local", "node", "pools", "shapes")

    def __init__(self, node: NodeInfo | None, pools: list[Pool], error: str | None = None) -> None:
        self.node = node  # the object the view was built for, when node labels matter
        self.pools = pools
        self.error = error
        self.invalid = any(p.invalid for p in pools)
        self.candidates = [
            [
                Candidate(
                    (pool.driver, pool.name, str(device.get("name", ""))),
                    device,
                    slice_,
                    node_ok=_node_ok(node, slice_, device),
                    pool=pool,
                )
                for slice_ in pool.slices
                for device in (slice_.get("spec") or {}).get("devices") or ()
            ]
            for pool in pools
        ]
        self.shapes: dict[int, ShapeDevices | None] = {}
        # the search's answers here depend on this node's devices only (``SearchMemo``): every pool node-local,
        # no device allocated several times (each share gets a new ID)
        name = node.name if node is not None else None
        self.local = error is None and all(
            not pool.not_targeting
            and all((s.get("spec") or {}).get("nodeName") == name for s in pool.slices)
            and not any(c.device.get("allowMultipleAllocations") for c in candidates)
            for pool, candidates in zip(pools, self.candidates, strict=True)
        )

    def shape_devices(self, shape: Shape, key: int) -> ShapeDevices | None:
        """The shape's devices here (``key``: the shape's number, ``DeviceCache.shape_key``, cheaper to hash than
        the shape); None when the count cannot answer: a selector or a node selection fails on one of them, or a
        selected device consumes shared counters or can be allocated several times (the full search must meet
        it)."""
        shapes = self.shapes
        if key in shapes:
            return shapes[key]
        ids: list[DeviceID] = []
        entry: ShapeDevices | None = None
        for pool, candidates in zip(self.pools, self.candidates, strict=True):
            if pool.incomplete or pool.invalid:
                continue
            for candidate in candidates:
                v = verdict(candidate, shape)
                if v is not True and v is not False:
                    break
                if not v:
                    continue
                ok = candidate.node_ok
                if ok is not True and ok is not False:
                    break
                if not ok:
                    continue
                device = candidate.device
                if device.get("consumesCounters") or device.get("allowMultipleAllocations"):
                    break
                if blocked_without_tolerations(device):
                    continue
                fits = _static_capacity(device)
                if fits is None:
                    break
                if fits:
                    ids.append(candidate.id)
            else:
                continue
            break
        else:
            entry = ShapeDevices(tuple(ids))
        shapes[key] = entry
        return entry


def _node_ok(node: NodeInfo | None, slice_: Raw, device: Raw) -> bool | str:
    if node is None or not (slice_.get("spec") or {}).get("perDeviceNodeSelection"):
        return True
    try:
        return device_selects(node, device)
    except PoolError as err:
        return str(err)


def _static_capacity(device: Raw) -> bool | None:
    """Whether a device taken whole meets its capacities' request policies (kube checks it for every request
    when DRAConsumableCapacity is on); None when kube would abort on it (a negative capacity)."""
    capacities = device.get("capacity")
    if not capacities:
        return True
    try:
        return fits_capacity(None, capacities)
    except (CapacityError, ValueError):
        return None


class HeldLog(Protocol):
    """The held devices (``device in held``) and the log of their changes (``claims.Held``): ``log[i -
    log_base]`` is the i-th change since it was made, (device, +1 now held / -1 now free); entries before
    ``log_base`` are gone."""

    log: list[tuple[DeviceID, int]]
    log_base: int

    def __contains__(self, device: object) -> bool: ...


BoolArray = npt.NDArray[np.bool_]


class ShapeColumn:
    """One shape's devices per node-table row (``nodes``: the rows' node objects, None for a free row): whether
    the count answers the row (``countable``: a node whose pools were gathered and whose devices of the shape all
    have a verdict), whether it has invalid pools, and ``free``, how many of its devices ``held`` does not hold.
    Kept across cycles: ``sync`` re-reads the rows whose node object changed and applies the held devices'
    changes logged since the last cycle (usually a few devices, each mapped to its rows by ``rows_of``)."""

    __slots__ = (
        "countable",
        "devices",
        "free",
        "held",
        "invalid",
        "nodes",
        "nodes_version",
        "offset",
        "present",
        "rows_of",
    )

    def __init__(self, held: HeldLog | Container[DeviceID]) -> None:
        self.held = held
        self.nodes: list[NodeInfo | None] = []
        self.devices: list[ShapeDevices | None] = []
        self.rows_of: dict[DeviceID, list[int]] = {}
        self.free = np.zeros(0, dtype=np.int64)
        self.present = np.zeros(0, dtype=bool)
        self.countable = np.zeros(0, dtype=bool)
        self.invalid = np.zeros(0, dtype=bool)
        self.offset = _log_end(held)
        self.nodes_version: int | None = None

    def sync(
        self,
        cache: DeviceCache,
        nodes: Sequence[NodeInfo | None],
        shape: Shape,
        key: int,
        nodes_version: int | None = None,
    ) -> None:
        """Catch up with the held devices' log and with ``nodes``; ``nodes_version``: the node table's (bumped
        whenever a node is added, removed or changes what the scheduler reads), when the same as last time the rows
        are not compared."""
        log = getattr(self.held, "log", None)
        if log is not None:
            held: HeldLog = self.held  # type: ignore[assignment]
            if self.offset < held.log_base:  # the log was trimmed past this column: count every row again
                self.nodes = []
            else:
                free, rows_of = self.free, self.rows_of
                for device, step in log[self.offset - held.log_base :]:
                    for row in rows_of.get(device, ()):
                        free[row] -= step
            self.offset = held.log_base + len(log)
        if nodes_version is not None and nodes_version == self.nodes_version and len(nodes) == len(self.nodes):
            return
        self.nodes_version = nodes_version
        if len(nodes) != len(self.nodes):
            n = len(nodes)
            self.nodes, self.devices, self.rows_of = [None] * n, [None] * n, {}
            self.free, self.present = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
            self.countable, self.invalid = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
            changed: Sequence[int] = range(n)
        elif _same(nodes, self.nodes):
            return
        else:
            changed = [row for row, (a, b) in enumerate(zip(nodes, self.nodes, strict=True)) if a is not b]
        for row in changed:
            self._set_row(row, nodes[row], cache, shape, key, self.held)

    def _set_row(
        self, row: int, node: NodeInfo | None, cache: DeviceCache, shape: Shape, key: int, held: Container[DeviceID]
    ) -> None:
        old = self.devices[row]
        if old is not None:
            for device in old.ids:
                self.rows_of[device].remove(row)
        entry: ShapeDevices | None = None
        invalid = False
        if node is not None:
            view = cache.view(node)
            if view.error is None:
                entry = view.shapes[key] if key in view.shapes else view.shape_devices(shape, key)
                invalid = view.invalid
        self.nodes[row], self.devices[row] = node, entry
        self.present[row], self.countable[row], self.invalid[row] = node is not None, entry is not None, invalid
        self.free[row] = 0
        if entry is not None:
            for device in entry.ids:
                self.rows_of.setdefault(device, []).append(row)
            self.free[row] = sum(1 for d in entry.ids if d not in held)


def _log_end(held: object) -> int:
    log = getattr(held, "log", None)
    return 0 if log is None else int(getattr(held, "log_base", 0)) + len(log)


class SearchMemo:
    """The search's answer per node and claims (by their specs), kept across cycles while the node's view is the
    same and none of its devices changed whether it is held (the held devices' log, mapped to nodes by the
    node-local pools' devices): a node a burst did not touch is not searched again. Only for views whose answer
    depends on their own devices alone (``NodeView.local``) and while no device is shared."""

    MAX_CLAIM_SETS = 64

    def __init__(self) -> None:
        self.node_of: dict[DeviceID, str] = {}
        self.versions: dict[str, int] = {}
        self.answers: dict[str, dict[str, tuple[NodeView, int, Any]]] = {}
        self.held: HeldLog | None = None
        self.offset = 0

    def reset(self, slices: Sequence[Raw]) -> None:
        self.answers.clear()
        self.node_of = {}
        for s in slices:
            spec = s.get("spec") or {}
            node = spec.get("nodeName")
            if not node:
                continue
            pool = (spec.get("pool") or {}).get("name", "")
            for device in spec.get("devices") or ():
                self.node_of[(spec.get("driver", ""), pool, str(device.get("name", "")))] = node

    def sync(self, held: HeldLog) -> None:
        """Follow the held devices' changes since the last call."""
        if held is not self.held or self.offset < held.log_base:
            self.held, self.answers = held, {}
        else:
            versions, node_of = self.versions, self.node_of
            for device, _ in held.log[self.offset - held.log_base :]:
                node = node_of.get(device)
                if node is not None:
                    versions[node] = versions.get(node, 0) + 1
        self.offset = held.log_base + len(held.log)

    def get(self, key: str, node: str, view: NodeView) -> tuple[bool, Any]:
        entry = self.answers.get(key, {}).get(node)
        if entry is None or entry[0] is not view or entry[1] != self.versions.get(node, 0):
            return False, None
        return True, entry[2]

    def put(self, key: str, node: str, view: NodeView, answer: Any) -> None:
        per_node = self.answers.get(key)
        if per_node is None:
            if len(self.answers) >= self.MAX_CLAIM_SETS:
                self.answers.clear()
            per_node = self.answers[key] = {}
        per_node[node] = (view, self.versions.get(node, 0), answer)


class DeviceCache:
    """Node views across cycles (see the module's docstring); ``refresh`` once per cycle with the current
    objects."""

    def __init__(self) -> None:
        self.memo = SearchMemo()
        self.slices: Sequence[Raw] = ()
        self._classes: list[Raw] = []
        self._by_node: dict[str, list[Raw]] = {}
        self._shared: list[Raw] = []
        self._selective = False  # some slice selects nodes by labels: a view also depends on the node object
        self._views: dict[str, NodeView] = {}
        self._shape_keys: dict[Shape, int] = {}
        self._columns: dict[int, ShapeColumn] = {}

    def shape_key(self, shape: Shape) -> int:
        return self._shape_keys.setdefault(shape, len(self._shape_keys))

    def refresh(self, classes: Mapping[str, Raw], slices: Sequence[Raw]) -> None:
        class_objects = list(classes.values())
        if _same(slices, self.slices) and _same(class_objects, self._classes):
            return
        self.slices, self._classes = list(slices), class_objects
        self._views.clear()
        self._columns.clear()
        self.memo.reset(self.slices)
        self._by_node, self._shared = {}, []
        for s in self.slices:
            name = (s.get("spec") or {}).get("nodeName")
            if name:
                self._by_node.setdefault(name, []).append(s)
            else:
                self._shared.append(s)
        self._selective = any(
            (s.get("spec") or {}).get("nodeSelector") is not None or (s.get("spec") or {}).get("perDeviceNodeSelection")
            for s in self._shared
        )

    def view(self, node: NodeInfo) -> NodeView:
        view = self._views.get(node.name)
        if view is not None and (not self._selective or view.node is node):
            return view
        try:
            pools = gather_pools(self.slices, node, [*self._by_node.get(node.name, ()), *self._shared])
        except PoolError as err:
            view = NodeView(node, [], f"gather pool information: {err}")
        else:
            view = NodeView(node, pools)
        self._views[node.name] = view
        return view

    def column(
        self,
        shape: Shape,
        key: int,
        nodes: Sequence[NodeInfo | None],
        held: HeldLog | Container[DeviceID],
        nodes_version: int | None = None,
    ) -> ShapeColumn:
        """The shape's column for ``nodes`` (the node table's rows) under ``held``: kept across cycles when
        ``held`` is a ``HeldLog`` (the same one each cycle); otherwise counted for this call."""
        column = self._columns.get(key)
        if column is None or column.held is not held:
            column = ShapeColumn(held)
            if hasattr(held, "log"):
                self._columns[key] = column
        column.sync(self, nodes, shape, key, nodes_version)
        return column


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))
