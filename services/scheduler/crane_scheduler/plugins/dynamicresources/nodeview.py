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
- per view and shape, the devices that a simple request can take there (``ShapeDevices``) and how many of them
  the held devices leave free, so Filter answers most nodes by a count (``Allocator.fits``).

Evaluating a selector earlier than kube would is not observable: a verdict is only acted upon (an error raised)
when the search reaches the device, as kube's does.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crane_scheduler.plugins.dynamicresources.celenv import CelError, DeviceView, compile_selector, device_view
from crane_scheduler.plugins.dynamicresources.pools import Pool, PoolError, gather_pools
from crane_scheduler.podinfo import NodeInfo

Raw = Mapping[str, Any]
DeviceID = tuple[str, str, str]
"""(driver, pool, device)."""
PoolKey = tuple[str, str]
Shape = tuple[str, tuple[str, ...], tuple[str, ...]]
"""(class name, the class's selector expressions, the request's selector expressions)."""
SelectorError = tuple[bool, int, str]
"""(raised by a class selector rather than the request's, the selector's index, kube's text after the index)."""
Verdict = bool | SelectorError


@dataclass(slots=True, eq=False)
class Candidate:
    """A device of a pool a node reaches, with what has been learnt about it (kept while its slice is)."""

    id: DeviceID
    device: Raw
    slice: Raw
    verdicts: dict[Shape, Verdict] = field(default_factory=dict)
    view: DeviceView | None = None

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
                return on_class, i, f"CEL compile error: {err}"
            try:
                if not compiled.matches(candidate.cel_view()):
                    return False
            except CelError as err:
                return on_class, i, f"CEL runtime error: {err}"
    return True


@dataclass(slots=True)
class ShapeDevices:
    """The devices of a view's complete, valid pools that a request of one shape may take (selected, no binding
    conditions, no counters consumed), in search order, and the free count last computed for them."""

    ids: tuple[DeviceID, ...]
    pools: tuple[PoolKey, ...]
    stamp: tuple[int, ...] | None = None
    free: int = 0
    counted_by: object = None  # the per-pool versions ``stamp`` was read from


class NodeView:
    """A node's pools (``gather_pools``, or the error it raised) with their candidates in search order."""

    __slots__ = ("candidates", "error", "invalid", "node", "pools", "shapes")

    def __init__(self, node: NodeInfo | None, pools: list[Pool], error: str | None = None) -> None:
        self.node = node  # the object the view was built for, when node labels matter
        self.pools = pools
        self.error = error
        self.invalid = any(p.invalid for p in pools)
        self.candidates = [
            [
                Candidate((pool.driver, pool.name, str(device.get("name", ""))), device, slice_)
                for slice_ in pool.slices
                for device in (slice_.get("spec") or {}).get("devices") or ()
            ]
            for pool in pools
        ]
        self.shapes: dict[int, ShapeDevices | None] = {}

    def shape_devices(self, shape: Shape, key: int) -> ShapeDevices | None:
        """The shape's devices here (``key``: the shape's number, ``DeviceCache.shape_key``, cheaper to hash than
        the shape); None when a selector fails on one of them (the full search must meet it)."""
        shapes = self.shapes
        if key in shapes:
            return shapes[key]
        ids: list[DeviceID] = []
        pools: list[PoolKey] = []
        entry: ShapeDevices | None = None
        for pool, candidates in zip(self.pools, self.candidates, strict=True):
            if pool.incomplete or pool.invalid:
                continue
            pools.append((pool.driver, pool.name))
            for candidate in candidates:
                if candidate.device.get("bindingConditions"):
                    continue
                v = verdict(candidate, shape)
                if v is not True and v is not False:
                    break
                if v and not candidate.device.get("consumesCounters"):
                    ids.append(candidate.id)
            else:
                continue
            break
        else:
            entry = ShapeDevices(tuple(ids), tuple(pools))
        shapes[key] = entry
        return entry


class DeviceCache:
    """Node views across cycles (see the module's docstring); ``refresh`` once per cycle with the current
    objects."""

    def __init__(self) -> None:
        self.slices: Sequence[Raw] = ()
        self._classes: list[Raw] = []
        self._by_node: dict[str, list[Raw]] = {}
        self._shared: list[Raw] = []
        self._selective = False  # some slice selects nodes by labels: a view also depends on the node object
        self._views: dict[str, NodeView] = {}
        self._shape_keys: dict[Shape, int] = {}

    def shape_key(self, shape: Shape) -> int:
        return self._shape_keys.setdefault(shape, len(self._shape_keys))

    def refresh(self, classes: Mapping[str, Raw], slices: Sequence[Raw]) -> None:
        class_objects = list(classes.values())
        if _same(slices, self.slices) and _same(class_objects, self._classes):
            return
        self.slices, self._classes = list(slices), class_objects
        self._views.clear()
        self._by_node, self._shared = {}, []
        for s in self.slices:
            name = (s.get("spec") or {}).get("nodeName")
            if name:
                self._by_node.setdefault(name, []).append(s)
            else:
                self._shared.append(s)
        self._selective = any((s.get("spec") or {}).get("nodeSelector") is not None for s in self._shared)

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


def _same(a: Sequence[Raw], b: Sequence[Raw]) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))
