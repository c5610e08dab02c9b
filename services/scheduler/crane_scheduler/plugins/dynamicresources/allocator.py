"""The structured-parameters allocator: kube's ``structured.Allocator`` as 1.37's default gates select it (the
"incubating" implementation: DRAAdminAccess and DRAPrioritizedList (GA), DRAPartitionableDevices, DRADeviceTaints,
DRADeviceBindingConditions with DRAResourceClaimDeviceStatus, DRAConsumableCapacity on; fractional capacity
ranges, list-type and derived attributes, compatibility groups off), over the API's JSON (resource.k8s.io/v1).

``Allocator`` is built once per scheduling cycle from the device classes, the slices (DeviceTaintRules applied)
and the devices already allocated (``Allocated``: held whole, shared, capacity consumed); ``allocate(node,
claims)`` answers one node: the allocation result of each claim, in order, or None when the claims do not fit
there. The search is kube's: depth first over claims, their requests (a ``firstAvailable`` request tries its
subrequests in order), the devices each needs, and the candidate devices in pool, slice and device order, a
request's next device only after its previous one (combinations, not permutations); the first complete solution
wins; it skips only branches certain to fail as kube's would (``_Search``: a later claim that fits nowhere). A
candidate is skipped when in use, not selected (class and request selectors, then its own node selection for
``perDeviceNodeSelection`` slices), short of capacity (``capacity``), short of shared counters
(``consumesCounters`` against the pool's ``sharedCounters``, less what allocated and chosen devices consume),
tainted without a toleration (``taints``), or against a constraint (``matchAttribute``, ``distinctAttribute``).
A device with ``allowMultipleAllocations`` is never "in use": each claim gets a share (``shareID``) consuming
capacity. What kube answers with an error is raised: ``AllocationError`` (the plugin's Error status: a broken
selector, an unknown class...), ``FailedOnNode`` (kube's ``ErrFailedAllocationOnNode``: unschedulable on this node
with that message) and ``AllocationTimeout`` (the filter timeout).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import numpy.typing as npt

from crane_scheduler.plugins.dynamicresources.capacity import (
    CapacityError,
    Quantity,
    consumed_map,
    fits_capacity,
    parse,
)
from crane_scheduler.plugins.dynamicresources.nodeview import (
    Candidate,
    Consumption,
    DeviceCache,
    NodeView,
    Shape,
    shape_of,
    verdict,
)
from crane_scheduler.plugins.dynamicresources.pools import CounterSets, Pool
from crane_scheduler.plugins.dynamicresources.taints import prevents_allocation
from crane_scheduler.podinfo import NodeInfo

Raw = Mapping[str, Any]
DeviceID = tuple[str, str, str]
"""(driver, pool, device)."""

ALLOCATION_RESULTS_MAX_SIZE = 32
"""``resourceapi.AllocationResultsMaxSize``: devices in one claim's allocation."""

EXACT_COUNT = "ExactCount"
ALL = "All"


class AllocationError(Exception):
    """Allocation cannot proceed at all (kube returns it from ``Allocate``; the plugin answers Error)."""


class FailedOnNode(AllocationError):
    """kube's ``ErrFailedAllocationOnNode``: this node cannot take the claims; the message is the reason."""


class AllocationTimeout(AllocationError):
    """The deadline passed during the search (kube: the DRASchedulerFilterTimeout context)."""


class _MaxSizeExceeded(Exception):
    """kube's ``errAllocationResultMaxSizeExceeded``: this branch would put more than 32 devices in a claim."""


class _NoSolution(Exception):
    """The search is proven to end without a solution and without an error: it stops (``_Search._next_claim``)."""


class _OverBudget(Exception):
    """A probe (``_Search._probe``) used up its invocations before it could tell."""


@dataclass(frozen=True, slots=True)
class Features:
    """kube's ``structured.Features`` as 1.37's default gates set them."""

    admin_access: bool = True
    prioritized_list: bool = True
    partitionable_devices: bool = True
    device_taints: bool = True
    binding_conditions: bool = True  # DRADeviceBindingConditions and DRAResourceClaimDeviceStatus
    consumable_capacity: bool = True


@dataclass(slots=True)
class SharedState:
    """The shares of devices allocated several times (``allowMultipleAllocations``), from the claims and the
    allocations in flight: the devices with a share (kube's ``AllocatedSharedDeviceIDs``) and per device the
    capacity the shares consume (``AggregatedCapacity``)."""

    devices: set[DeviceID] = field(default_factory=set)
    capacity: dict[DeviceID, dict[str, Decimal]] = field(default_factory=dict)


NO_SHARES = SharedState()


def claim_ref(claim: Raw) -> str:
    """``klog.KObj(claim)``: namespace/name."""
    meta = claim.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    return f"{ns}/{name}" if ns else name


def device_id_text(device: DeviceID) -> str:
    return "/".join(device)


def _results(claim: Raw) -> Sequence[Raw]:
    allocation = (claim.get("status") or {}).get("allocation")
    return ((allocation or {}).get("devices") or {}).get("results") or ()


def allocated_devices(claims: Sequence[Raw]) -> set[DeviceID]:
    """The devices the claims' allocations hold whole (kube's ``foreachAllocatedDevice``): admin access holds
    none, a share (``shareID``) is not held whole."""
    out: set[DeviceID] = set()
    for claim in claims:
        for result in _results(claim):
            if not result.get("adminAccess") and result.get("shareID") is None:
                out.add((result.get("driver", ""), result.get("pool", ""), result.get("device", "")))
    return out


Share = tuple[DeviceID, str, Raw | None]
"""(device, shareID, consumedCapacity)"""


def shares_of(claim: Raw) -> tuple[Share, ...]:
    """The claim's shares of devices allocated several times."""
    return tuple(
        ((r.get("driver", ""), r.get("pool", ""), r.get("device", "")), str(r["shareID"]), r.get("consumedCapacity"))
        for r in _results(claim)
        if not r.get("adminAccess") and r.get("shareID") is not None
    )


def shared_state(shares: Sequence[Share]) -> SharedState:
    state = SharedState()
    for device, _, consumed in shares:
        state.devices.add(device)
        if consumed:
            totals = state.capacity.setdefault(device, {})
            for name, raw in consumed.items():
                totals[name] = totals.get(name, Decimal(0)) + parse(raw).value
    return state


# ------------------------------------------------------------------------------------------------ requests


@dataclass(slots=True)
class _Request:
    """A request or subrequest (kube's ``requestData`` with its accessor)."""

    name: str
    parent: str | None
    spec: Raw  # the ``exactly`` entry or the subrequest
    class_: Raw
    admin_access: bool
    num_devices: int = 0
    all_devices: list[Candidate] = field(default_factory=list)
    selected_sub: int = 0
    shape: Shape = ("", (), ())

    @property
    def full_name(self) -> str:
        return f"{self.parent}/{self.name}" if self.parent is not None else self.name

    @property
    def mode(self) -> str:
        return self.spec.get("allocationMode") or EXACT_COUNT

    @property
    def selectors(self) -> Sequence[Raw]:
        return self.spec.get("selectors") or ()

    @property
    def tolerations(self) -> Sequence[Raw]:
        return self.spec.get("tolerations") or ()

    @property
    def capacity_requests(self) -> Raw | None:
        return (self.spec.get("capacity") or {}).get("requests")


class _Constraint:
    """A claim constraint over the devices of its requests (all of them when ``requests`` is empty)."""

    __slots__ = ("attribute", "requests")

    def __init__(self, requests: frozenset[str], attribute: str) -> None:
        self.requests, self.attribute = requests, attribute

    def applies(self, request: str, sub: str | None) -> bool:
        if not self.requests:
            return True
        return request in self.requests or (sub is not None and f"{request}/{sub}" in self.requests)

    def add(self, request: str, sub: str | None, device: Raw, device_id: DeviceID) -> bool:
        raise NotImplementedError

    def remove(self, request: str, sub: str | None) -> None:
        raise NotImplementedError


_KINDS = ("string", "int", "bool", "version")


def _kind(attr: Raw) -> str | None:
    for kind in _KINDS:
        if attr.get(kind) is not None:
            return kind
    return None


class _MatchAttribute(_Constraint):
    """All in-scope devices share the attribute's value (string, int, bool or version)."""

    __slots__ = ("count", "value")

    def __init__(self, requests: frozenset[str], attribute: str) -> None:
        super().__init__(requests, attribute)
        self.value: Raw | None = None
        self.count = 0

    def add(self, request: str, sub: str | None, device: Raw, device_id: DeviceID) -> bool:
        if not self.applies(request, sub):
            return True
        attr = lookup_attribute(device, device_id, self.attribute)
        if attr is None:
            return False
        if self.count == 0:
            self.value, self.count = attr, 1
            return True
        assert self.value is not None
        kind = _kind(attr)
        if kind is None or self.value.get(kind) is None or self.value[kind] != attr[kind]:
            return False
        self.count += 1
        return True

    def remove(self, request: str, sub: str | None) -> None:
        if self.applies(request, sub):
            self.count -= 1


class _DistinctAttribute(_Constraint):
    """No two in-scope devices share the attribute's value."""

    __slots__ = ("values",)

    def __init__(self, requests: frozenset[str], attribute: str) -> None:
        super().__init__(requests, attribute)
        self.values: list[Raw] = []

    def add(self, request: str, sub: str | None, device: Raw, device_id: DeviceID) -> bool:
        if not self.applies(request, sub):
            return True
        attr = lookup_attribute(device, device_id, self.attribute)
        if attr is None:
            return False
        kind = _kind(attr)
        if kind is None:
            return False
        if any(have.get(kind) is not None and have[kind] == attr[kind] for have in self.values):
            return False
        self.values.append(attr)
        return True

    def remove(self, request: str, sub: str | None) -> None:
        if self.applies(request, sub):
            self.values.pop()


def lookup_attribute(device: Raw, device_id: DeviceID, name: str) -> Raw | None:
    """A fully qualified attribute: found as written, or by its short name when the domain is the driver's."""
    attributes = device.get("attributes") or {}
    if name in attributes:
        return attributes[name]  # type: ignore[no-any-return]
    domain, sep, short = name.partition("/")
    if not sep or domain != device_id[0]:
        return None
    return attributes.get(short)


# ------------------------------------------------------------------------------------------------ allocator


class Allocator:
    """One cycle's allocator (see the module's docstring); reusable for every node of the cycle. ``cache`` keeps
    the node views and selector verdicts across cycles (the plugin's); without it they last for this allocator.
    ``allocated``: the devices held whole; ``shared``: the shares of devices allocated several times."""

    def __init__(
        self,
        classes: Mapping[str, Raw],
        slices: Sequence[Raw],
        allocated: Container[DeviceID],
        features: Features = Features(),
        clock: Callable[[], float] = time.monotonic,
        cache: DeviceCache | None = None,
        shared: SharedState = NO_SHARES,
    ) -> None:
        self.classes = classes
        self.allocated = allocated
        self.shared = shared
        self.features = features
        self.clock = clock
        self.cache = cache if cache is not None else DeviceCache()
        self.cache.refresh(classes, slices)
        self._counters: dict[str, CounterSets] = {}  # kube's availableCounters, per pool id, first computed wins
        self._memo: tuple[Sequence[Raw], str | None] | None = None

    def allocate(
        self, node: NodeInfo, claims: Sequence[Raw], deadline: float | None = None
    ) -> list[dict[str, Any]] | None:
        view = self.cache.view(node)
        if view.error is not None:
            raise AllocationError(view.error)
        key = self._memo_key(claims) if view.local else None
        memo = self.cache.memo
        if key is not None:
            hit, answer = memo.get(key, node.name, view)
            if hit:
                return answer  # type: ignore[no-any-return]
        answer = _Search(self, node, claims, view, deadline).run()
        if key is not None:
            memo.put(key, node.name, view, answer)
        return answer

    def _memo_key(self, claims: Sequence[Raw]) -> str | None:
        """The claims' specs as the search memo's key (once per claims list and cycle); None when the answer
        must not be reused: the held devices keep no log, or a device is shared."""
        if self._memo is not None and self._memo[0] is claims:
            return self._memo[1]
        key: str | None = None
        log = getattr(self.allocated, "log", None)
        if log is not None and not self.shared.devices and not self.shared.capacity:
            self.cache.memo.sync(self.allocated)  # type: ignore[arg-type]
            key = json.dumps([(c.get("spec") or {}) for c in claims], sort_keys=True, separators=(",", ":"))
        self._memo = (claims, key)
        return key

    def is_allocated(self, device: DeviceID) -> bool:
        """kube's ``IsDeviceAllocated``: held whole, shared, or with capacity consumed."""
        return device in self.allocated or device in self.shared.devices or device in self.shared.capacity

    def available_counters(self, pool: Pool) -> CounterSets:
        """The pool's shared counters less what its allocated devices consume (kube computes it once per pool and
        allocator, from the first node that asks)."""
        have = self._counters.get(pool.id)
        if have is not None:
            return have
        available = {name: dict(counters) for name, counters in pool.counter_sets.items()}
        for slice_ in (*pool.slices, *pool.not_targeting):
            spec = slice_.get("spec") or {}
            for device in spec.get("devices") or ():
                consumption = device.get("consumesCounters")
                if not consumption:
                    continue
                if not self.is_allocated((pool.driver, pool.name, str(device.get("name", "")))):
                    continue
                for entry in consumption:
                    counters = available.get(str(entry.get("counterSet", "")))
                    if counters is None:
                        continue
                    for name, value in (entry.get("counters") or {}).items():
                        if name in counters:
                            counters[name] -= parse((value or {}).get("value", "0")).value
        self._counters[pool.id] = available
        return available

    def plan(self, claims: Sequence[Raw]) -> Plan | None:
        """The claims as one count of devices of one shape, when that is all they ask: every request an
        ``exactly`` of ExactCount without admin access, tolerations, capacity or derived attributes, all of one
        class and selectors, no constraint, nothing ``allocate`` would refuse before searching. None otherwise
        (``allocate`` answers each node)."""
        shape: Shape | None = None
        need = 0
        for claim in claims:
            devices = (claim.get("spec") or {}).get("devices") or {}
            if devices.get("constraints"):
                return None
            per_claim = 0
            for request in devices.get("requests") or ():
                exactly = request.get("exactly")
                if request.get("firstAvailable") or not exactly or exactly.get("adminAccess") is not None:
                    return None
                if exactly.get("tolerations") or exactly.get("capacity") is not None:
                    return None
                if exactly.get("derivedAttributes"):
                    return None
                if (exactly.get("allocationMode") or EXACT_COUNT) != EXACT_COUNT:
                    return None
                selectors = exactly.get("selectors") or ()
                if any(not (s.get("cel") or {}).get("expression") for s in selectors):
                    return None
                class_ = self.classes.get(exactly.get("deviceClassName") or "")
                if class_ is None:
                    return None
                mine = shape_of(class_, selectors)
                if shape is None:
                    shape = mine
                elif mine != shape:
                    return None
                per_claim += int(exactly.get("count") or 1)
            if per_claim > ALLOCATION_RESULTS_MAX_SIZE:
                return None
            need += per_claim
        return Plan(shape, self.cache.shape_key(shape), need) if shape is not None else None

    def fits_nodes(self, nodes: Sequence[NodeInfo | None], plan: Plan, nodes_version: int | None = None) -> NodeFits:
        """Per node (a row of ``nodes``, None for none), whether ``allocate(node, claims)`` finds a solution for
        claims that ``plan`` describes, by counting the free devices of the plan's shape: ``fit`` (it does),
        ``cannot`` (it returns None), and ``search``, the rows the count cannot tell (a selector fails on a device
        there, a device shares counters or capacity, invalid pools change the message, gathering the pools failed).
        Exact because with one shape, no constraint and no such device, kube's depth-first search takes the first
        free devices in order and never needs to go back: it succeeds if and only if there are enough. The counts
        are the shape's column (``DeviceCache.column``, kept across cycles when ``allocated`` logs its changes,
        ``nodeview.HeldLog``): one numpy comparison for all nodes. ``nodes_version``: the node table's, see
        ``ShapeColumn.sync``."""
        column = self.cache.column(plan.shape, plan.key, nodes, self.allocated, nodes_version)
        free = column.free
        enough = free >= plan.need
        countable = column.countable
        return NodeFits(
            fit=countable & enough,
            cannot=countable & ~enough & ~column.invalid,
            search=np.flatnonzero(column.present & ~(countable & (enough | ~column.invalid))),
        )

    def fits(self, node: NodeInfo, plan: Plan) -> bool | None:
        """``fits_nodes`` for one node: True, False, or None (the search must answer)."""
        return self.fits_nodes([node], plan).answer(0)


@dataclass(frozen=True, slots=True)
class NodeFits:
    """``Allocator.fits_nodes``' answer: boolean masks over the rows and the rows left to the search."""

    fit: npt.NDArray[np.bool_]
    cannot: npt.NDArray[np.bool_]
    search: npt.NDArray[np.intp]

    def answer(self, row: int) -> bool | None:
        return True if self.fit[row] else False if self.cannot[row] else None


@dataclass(frozen=True, slots=True)
class Plan:
    """Claims that ask for ``need`` devices of one ``shape`` and nothing else (``Allocator.plan``)."""

    shape: Shape
    key: int  # DeviceCache.shape_key
    need: int


@dataclass(slots=True)
class _Chosen:
    data: _Request
    candidate: Candidate
    share_id: str | None = None
    consumed: dict[str, Quantity] | None = None


@dataclass(frozen=True, slots=True)
class _Bound:
    """``_Search._short``'s tables: per counter, what is left of it at most and its devices (those consuming it
    first) by what they consume, smallest first; the devices the requests after each one need at least."""

    groups: list[tuple[tuple[str, str, str], Decimal, list[tuple[Decimal, DeviceID]]]]
    need_after: dict[tuple[int, int], int]
    common: list[tuple[tuple[str, str, str], Decimal, list[tuple[Decimal, DeviceID]]]]
    """the counters every device the node reaches consumes (``_Search._short_within``), with all the devices"""


@dataclass(slots=True)
class _Undo:
    """What ``_allocate_device`` did for one candidate (kube's ``deviceRollbackState``)."""

    counters: bool = False
    constraints: int = 0
    marked: bool = False
    capacity: dict[str, Quantity] | None = None
    result_at: int = -1


BOUND_AFTER = 64
"""Invocations before the search starts comparing what it still needs with the counters left (``_short``): a
search that ends sooner never pays for it."""

PROBE_MIN_BUDGET = 100
"""Invocations a probe may use at least (``_Search._probe``); as many as the search has used once that is more
(it is tried again with a doubled budget after as many more), so probing never costs much more than searching."""


class _Search:
    """One ``Allocate`` call (kube's ``allocator``).

    kube's search is exhaustive: when a later claim fits nowhere, it still tries that claim again after every
    way of allocating the earlier ones, which takes seconds in Go and minutes here. Three shortcuts prune only
    what is certain to fail the same way, so every answer (the first solution, None, the error) stays kube's.
    At a claim (``_next_claim``): the claims from ``c`` on are not searched again from a state (the devices the
    earlier claims hold) where they already failed; and once they fail, they are tried alone, as if nothing
    else were allocated (a probe): failing there, they fail from every state the search can reach, because
    taking devices only ever takes options away (in use, counters and capacity consumed) and the claims'
    constraints are their own. Then no state is tried again and, when the rest of the search cannot raise an
    error (``_quiet``), the search stops at once. At a request (``_short``): when the devices still to pick
    cannot fit in the shared counters left, and no error can be met, the request is not searched. All hold only
    without devices allocated several times (a share skips the counters a first share took, so more allocated
    can mean more allowed) and when no claim can pass the 32 devices of a result (that limit cuts the search
    short in ways that depend on the path); otherwise the search is kube's, step for step."""

    def __init__(
        self,
        owner: Allocator,
        node: NodeInfo,
        claims: Sequence[Raw],
        view: NodeView,
        deadline: float | None,
        budget: float = float("inf"),
    ) -> None:
        self.owner = owner
        self.features = owner.features
        self.node = node
        self.claims = claims
        self.view = view
        self.pools = view.pools
        self.deadline = deadline
        self.requests: dict[tuple[int, int, int], _Request] = {}
        self.constraints: list[list[_Constraint]] = []
        self.allocating: dict[DeviceID, set[int]] = {}
        self.allocating_capacity: dict[DeviceID, tuple[int, dict[str, Decimal]]] = {}
        self.consumed_counters: dict[str, dict[str, dict[str, Decimal]]] = {}
        self.pool_counters: dict[str, tuple[CounterSets, bool]] = {}
        self.results: list[list[_Chosen]] = [[] for _ in claims]
        self.invocations = 0
        self.budget = budget
        self.prunable: bool | None = None  # whether the shortcuts hold (``_can_prune``), once asked
        self.failed: set[tuple[int, tuple[DeviceID, ...]]] = set()  # (claim, held by earlier claims): no solution
        self.hopeless: set[int] = set()  # the claims from there on fail from every state
        self.probe_at: dict[int, float] = {}  # per claim, the invocations before it is probed (again)
        self.bound: _Bound | bool | None = None  # ``_short``'s tables, False where it does not hold, once asked

    # -- preparation (kube's loop over claims before allocateOne)

    def run(self) -> list[dict[str, Any]] | None:
        for ci, claim in enumerate(self.claims):
            self._prepare_claim(ci, claim)
        try:
            done = self._allocate_one((0, 0, 0, 0), False, (0, 0))
        except _MaxSizeExceeded:  # kube returns errAllocationResultMaxSizeExceeded itself from Allocate
            raise AllocationError("allocation max size exceeded") from None
        except _NoSolution:
            done = False
        if not done:
            if self.view.invalid:
                raise FailedOnNode("invalid resource pools were encountered")
            return None
        return [self._result(ci, claim) for ci, claim in enumerate(self.claims)]

    def _prepare_claim(self, ci: int, claim: Raw) -> None:
        devices = (claim.get("spec") or {}).get("devices") or {}
        min_devices = 0
        ref = claim_ref(claim)
        for ri, request in enumerate(devices.get("requests") or ()):
            subs = request.get("firstAvailable") or ()
            name = request.get("name", "")
            if subs and not self.features.prioritized_list:
                raise AllocationError(
                    f"claim {ref}, request {name}: has subrequests, but the DRAPrioritizedList feature is disabled"
                )
            if not self.features.consumable_capacity:
                if (request.get("exactly") or {}).get("capacity") is not None:
                    raise AllocationError(
                        f"claim {ref}, request {name}: has capacity requests, but the DRAConsumableCapacity "
                        "feature is disabled"
                    )
                for sub in subs:
                    if sub.get("capacity") is not None:
                        raise AllocationError(
                            f"claim {ref}, subrequest {sub.get('name', '')}: has capacity requests, but the "
                            "DRAConsumableCapacity feature is disabled"
                        )
            if subs:
                least: int | None = None
                for si, sub in enumerate(subs):
                    data = self._validate(claim, sub.get("name", ""), name, sub, False, ci)
                    self.requests[(ci, ri, si)] = data
                    least = data.num_devices if least is None else min(least, data.num_devices)
                per_request = least or 0
            else:
                exactly = request.get("exactly") or {}
                admin = exactly.get("adminAccess")
                data = self._validate(claim, name, None, exactly, admin is not None, ci)
                data.admin_access = bool(admin)
                self.requests[(ci, ri, 0)] = data
                per_request = data.num_devices
            if per_request > ALLOCATION_RESULTS_MAX_SIZE - min_devices:
                raise AllocationError(
                    f"claim {ref}, request {name}: adding {per_request} devices exceeds the claim limit of "
                    f"{ALLOCATION_RESULTS_MAX_SIZE}, with {min_devices} already accounted for"
                )
            min_devices += per_request
        constraints: list[_Constraint] = []
        for i, constraint in enumerate(devices.get("constraints") or ()):
            scope = frozenset(constraint.get("requests") or ())
            if constraint.get("matchAttribute"):
                constraints.append(_MatchAttribute(scope, constraint["matchAttribute"]))
            elif constraint.get("distinctAttribute"):
                constraints.append(_DistinctAttribute(scope, constraint["distinctAttribute"]))
            else:
                raise AllocationError(f"claim {ref}, constraint #{i}: empty constraint (unsupported constraint type?)")
        self.constraints.append(constraints)

    def _validate(self, claim: Raw, name: str, parent: str | None, spec: Raw, has_admin: bool, ci: int) -> _Request:
        where = f"claim {claim_ref(claim)}, request {name}"
        if spec.get("derivedAttributes"):
            raise AllocationError(f"{where}: cannot handle request with derived attributes, the feature is disabled")
        for i, selector in enumerate(spec.get("selectors") or ()):
            if not (selector.get("cel") or {}).get("expression"):
                raise AllocationError(f"{where}, selector #{i}: CEL expression empty (unsupported selector type?)")
        if has_admin and not self.features.admin_access:
            raise AllocationError(f"{where}: admin access is requested, but the feature is disabled")
        class_name = spec.get("deviceClassName") or ""
        if not class_name:
            raise AllocationError(f"{where}: missing device class name (unsupported request type?)")
        class_ = self.owner.classes.get(class_name)
        if class_ is None:
            raise AllocationError(
                f'{where}: could not retrieve device class {class_name}: deviceclass.resource.k8s.io "{class_name}" '
                "not found"
            )
        data = _Request(
            name, parent, spec, class_, admin_access=False, shape=shape_of(class_, spec.get("selectors") or ())
        )
        mode = data.mode
        if mode == EXACT_COUNT:
            data.num_devices = int(spec.get("count") or 1)
        elif mode == ALL:
            for pool, candidates in zip(self.pools, self.view.candidates, strict=True):
                if pool.incomplete:
                    raise AllocationError(
                        f"{where}: asks for all devices, but resource pool {pool.id} is currently being updated"
                    )
                if pool.invalid:
                    raise AllocationError(
                        f"{where}: asks for all devices, but resource pool {pool.id} is currently invalid"
                    )
                for candidate in candidates:
                    if not self._selectable(ci, data, candidate):
                        continue
                    if self.features.consumable_capacity:
                        try:
                            fits = fits_capacity(data.capacity_requests, candidate.device.get("capacity") or {})
                        except (CapacityError, ValueError) as err:
                            raise AllocationError(
                                f"{where}: checking capacity for device {candidate.id[2]}: {err}"
                            ) from None
                        if not fits:
                            continue
                    data.all_devices.append(candidate)
            data.num_devices = len(data.all_devices)
        else:
            raise AllocationError(f"{where}: unsupported count mode {mode}")
        return data

    # -- the search (kube's allocateOne)

    def _allocate_one(self, r: tuple[int, int, int, int], allocate_sub: bool, start: tuple[int, int]) -> bool:
        self.invocations += 1
        if self.invocations > self.budget:
            raise _OverBudget
        if self.deadline is not None and self.owner.clock() > self.deadline:
            raise AllocationTimeout("filter operation aborted: context deadline exceeded")
        ci, ri, si, di = r
        if ci >= len(self.claims):
            return True
        requests = ((self.claims[ci].get("spec") or {}).get("devices") or {}).get("requests") or ()
        if ri >= len(requests):
            return self._next_claim(ci + 1)
        data = self.requests[(ci, ri, si)]
        if not allocate_sub and data.parent is not None:
            all_exceeded = True
            sub = 0
            while (ci, ri, sub) in self.requests:
                try:
                    success = self._allocate_one((ci, ri, sub, di), True, (0, 0))
                except _MaxSizeExceeded:
                    sub += 1
                    continue
                all_exceeded = False
                if success:
                    self.requests[(ci, ri, si)].selected_sub = sub
                    return True
                sub += 1
            if all_exceeded:
                raise _MaxSizeExceeded
            return False

        if di == 0 and self.invocations > BOUND_AFTER and self._short(ci, ri, data):
            return False
        if data.mode == ALL and not data.all_devices:
            return False
        if di >= data.num_devices:
            return self._allocate_one((ci, ri + 1, 0, 0), False, (0, 0))
        if data.num_devices - di > ALLOCATION_RESULTS_MAX_SIZE - len(self.results[ci]):
            raise _MaxSizeExceeded
        # inside a request, with two devices or more still to pick: one more is a plain scan of the candidates,
        # and a request of one or two devices never pays for the bound's tables
        if di > 0 and data.num_devices - di >= 2 and data.mode != ALL and self._short_within(ci, ri, data, di):
            return False
        if data.mode == ALL:
            undo = self._allocate_device(r, data, data.all_devices[di], must=True)
            if undo is None:
                return False
            try:
                done = self._allocate_one((ci, ri, si, di + 1), allocate_sub, (0, 0))
            except BaseException:
                undo()
                raise
            if not done:
                undo()
            return done

        consumable = self.features.consumable_capacity
        for pi in range(start[0], len(self.pools)):
            pool = self.pools[pi]
            if pool.incomplete or pool.invalid:
                continue
            candidates = self.view.candidates[pi]
            for index in range(start[1] if pi == start[0] else 0, len(candidates)):
                candidate = candidates[index]
                if data.admin_access:
                    if ci in self.allocating.get(candidate.id, ()):
                        continue
                elif self._in_use(candidate.id):
                    continue
                if not self._selectable(ci, data, candidate):
                    continue
                if consumable and not self._fits_capacity(ci, data, candidate, "checking"):
                    continue
                undo = self._allocate_device(r, data, candidate, must=False)
                if undo is None:
                    continue
                try:
                    done = self._allocate_one((ci, ri, si, di + 1), allocate_sub, (pi, index + 1))
                except BaseException:
                    undo()
                    raise
                if done:
                    return True
                undo()
        return False

    # -- the shortcuts over later claims (see the class docstring)

    def _next_claim(self, c: int) -> bool:
        """kube's step to the next claim, ``c``, once the earlier ones have their devices."""
        if c >= len(self.claims) or self.prunable is False:
            return self._enter(c)
        if c in self.hopeless:
            return False
        key = self._held_key(c) if self.failed else None
        if key is not None and (c, key) in self.failed:
            return False
        if self._enter(c):
            return True
        if not self._can_prune():
            return False
        self.failed.add((c, key if key is not None else self._held_key(c)))
        if self.invocations >= self.probe_at.get(c, 0):
            self._learn(c)
        return False

    def _enter(self, c: int) -> bool:
        try:
            return self._allocate_one((c, 0, 0, 0), False, (0, 0))
        except _MaxSizeExceeded:
            return False

    def _learn(self, c: int) -> None:
        """Probe the claims from ``c`` on; when they fail alone, stop trying them, and stop the whole search if
        nothing left to try before them can raise an error."""
        budget = max(PROBE_MIN_BUDGET, self.invocations)
        alone = self._probe(c, budget) if any(self.results[:c]) else False
        if alone is None:  # over budget: again once the search has used as much again
            self.probe_at[c] = self.invocations + 2 * budget
            return
        if alone:
            self.probe_at[c] = float("inf")
            return
        self.hopeless.add(c)
        if self._quiet(c):
            raise _NoSolution

    def _probe(self, c: int, budget: int) -> bool | None:
        """Whether the claims from ``c`` on fit with nothing else allocated in this search (None: unknown, over
        ``budget`` or an error there)."""
        probe = _Search(self.owner, self.node, self.claims[c:], self.view, self.deadline, budget)
        try:
            for ci, claim in enumerate(probe.claims):
                probe._prepare_claim(ci, claim)
            return probe._allocate_one((0, 0, 0, 0), False, (0, 0))
        except _NoSolution:
            return False
        except AllocationTimeout:
            raise
        except (_OverBudget, _MaxSizeExceeded):
            return None
        except (AllocationError, ValueError):  # ValueError: a counter that does not parse
            self.probe_at[c] = float("inf")  # the same error each time
            return None

    def _short(self, ci: int, ri: int, data: _Request) -> bool:
        """Whether the devices still to pick, from this request on, cannot fit in the shared counters left: then
        kube's search below fails, and it can raise no error there (``_quiet``), so it is not searched. Each
        device consumes a counter ("its" counter, the first it consumes), each pick takes a device not in use,
        so a counter lets in at most as many of its devices as the smallest of them fit in what is left of it.
        Only where every device the node reaches consumes counters and no request has admin access (a device
        taken again)."""
        bound = self._tables()
        if bound is None:
            return False
        need = data.num_devices + bound.need_after[(ci, ri + 1)]
        room = 0
        for key, limit, devices in bound.groups:
            room += self._room(key, limit, devices, need - room)
            if room >= need:
                return False
        return True

    def _short_within(self, ci: int, ri: int, data: _Request, di: int) -> bool:
        """Whether the devices still to pick, from the ``di``-th of this request on, cannot fit in what is left
        of a counter that every device the node reaches consumes (a partitionable GPU's memory): whichever
        devices come next, each takes some of it, and at most as many fit as its smallest consumers fit in what
        is left. kube's search below fails then, raising nothing (``_bound_tables`` holds only where nothing can
        be raised), so it is not searched; its first solution, where there is one, is not below a pruned step.
        Asked inside a request, where kube backtracks through every way of completing it (PartitionableBacktracking:
        the first device takes 20Gi of 70Gi, six more of 10Gi cannot follow, and kube tries them all)."""
        bound = self._tables()
        if bound is None or not bound.common:
            return False
        need = data.num_devices - di + bound.need_after[(ci, ri + 1)]
        return any(self._room(key, limit, devices, need) < need for key, limit, devices in bound.common)

    def _tables(self) -> _Bound | None:
        """The bounds' tables (``_bound_tables``, made once a search); None where no bound holds."""
        if self.bound is None:
            self.bound = self._bound_tables()
        return self.bound if isinstance(self.bound, _Bound) else None

    def _room(
        self, key: tuple[str, str, str], limit: Decimal, devices: list[tuple[Decimal, DeviceID]], enough: int
    ) -> int:
        """How many of ``devices`` (by consumption, smallest first) not in use fit in what is left of the counter
        ``key`` (pool, set, name) of ``limit``; counting stops at ``enough``."""
        pool_id, set_name, name = key
        left = limit - ((self.consumed_counters.get(pool_id) or {}).get(set_name) or {}).get(name, _ZERO)
        room = 0
        for value, device in devices:
            if room >= enough or value > left:
                break
            if not self._in_use(device):
                left -= value
                room += 1
        return room

    def _bound_tables(self) -> _Bound | bool:
        if not self._can_prune() or any(data.admin_access for data in self.requests.values()):
            return False
        groups: dict[tuple[str, str, str], list[tuple[Decimal, DeviceID]]] = {}
        limits: dict[tuple[str, str, str], Decimal] = {}
        common: dict[tuple[str, str, str], list[tuple[Decimal, DeviceID]]] | None = None
        for pool, candidates in zip(self.pools, self.view.candidates, strict=True):
            if pool.incomplete or pool.invalid:
                continue
            available = self._pool_counters(pool)[0]
            for candidate in candidates:
                try:
                    consumption = _consumption(candidate)
                except ValueError:
                    return False
                totals: dict[tuple[str, str], Decimal] = {}
                for set_name, counters in consumption:
                    for name, value in counters:
                        totals[(set_name, name)] = totals.get((set_name, name), _ZERO) + value
                first = next(((key, value) for key, value in totals.items() if value > 0), None)
                if first is None:
                    return False  # a device consuming nothing: no bound
                (set_name, name), value = first
                limit = available.get(set_name, {}).get(name)
                if limit is None:
                    return False
                key = (pool.id, set_name, name)
                limits[key] = limit
                groups.setdefault(key, []).append((value, candidate.id))
                if common == {}:
                    continue  # no counter every device consumes: nothing more to gather for ``common``
                mine = {
                    (pool.id, set_name, name): value
                    for (set_name, name), value in totals.items()
                    if value > 0 and available.get(set_name, {}).get(name) is not None
                }
                if common is None:
                    common = {key: [(value, candidate.id)] for key, value in mine.items()}
                    limits.update({key: available[key[1]][key[2]] for key in mine})
                else:
                    for key in [k for k in common if k not in mine]:
                        del common[key]
                    for key, devices in common.items():
                        devices.append((mine[key], candidate.id))
        if not self._quiet(len(self.claims)):
            return False
        least: dict[tuple[int, int], int] = {}  # per request, the fewest devices one of its subrequests takes
        for (ci, ri, _), data in self.requests.items():
            least[(ci, ri)] = min(least.get((ci, ri), data.num_devices), data.num_devices)
        need_after: dict[tuple[int, int], int] = {}
        later = 0
        for ci in range(len(self.claims) - 1, -1, -1):
            ri = sum(1 for c, _ in least if c == ci)
            need_after[(ci, ri)] = later
            for r in range(ri - 1, -1, -1):
                later += least[(ci, r)]
                need_after[(ci, r)] = later
        return _Bound(
            groups=[(key, limits[key], sorted(devices)) for key, devices in groups.items()],
            need_after=need_after,
            common=[(key, limits[key], sorted(devices)) for key, devices in (common or {}).items()],
        )

    def _held_key(self, c: int) -> tuple[DeviceID, ...]:
        """What decides how the claims from ``c`` on fare: the devices the earlier claims hold (the counters
        they consume follow), sorted."""
        return tuple(sorted(chosen.candidate.id for results in self.results[:c] for chosen in results))

    def _can_prune(self) -> bool:
        """No device allocated several times, no claim that can pass the result limit (see the class docstring)."""
        if self.prunable is None:
            multi = self.features.consumable_capacity and any(
                candidate.device.get("allowMultipleAllocations") for pool in self.view.candidates for candidate in pool
            )
            self.prunable = not multi and all(
                self._most_devices(ci) <= ALLOCATION_RESULTS_MAX_SIZE for ci in range(len(self.claims))
            )
        return self.prunable

    def _most_devices(self, ci: int) -> int:
        most = 0
        ri = 0
        while (ci, ri, 0) in self.requests:
            si, per_request = 0, 0
            while (ci, ri, si) in self.requests:
                per_request = max(per_request, self.requests[(ci, ri, si)].num_devices)
                si += 1
            most += per_request
            ri += 1
        return most

    def _quiet(self, c: int) -> bool:
        """Whether searching the claims before ``c`` can raise no error, wherever it goes: no selector, node
        selection, capacity check or counter fails on any of their candidates, and no "All" request meets a
        constraint (the result limit is ruled out by ``_can_prune``)."""
        consumable = self.features.consumable_capacity
        for (ci, _, _), data in self.requests.items():
            if ci >= c:
                continue
            if data.mode == ALL and self.constraints[ci]:
                return False
            for pool, candidates in zip(self.pools, self.view.candidates, strict=True):
                if pool.incomplete or pool.invalid:
                    continue
                for candidate in candidates:
                    try:
                        if self._selectable(ci, data, candidate) and consumable:
                            self._fits_capacity(ci, data, candidate, "checking")
                        _consumption(candidate)
                    except (AllocationError, ValueError):
                        return False
        return True

    def _in_use(self, device: DeviceID) -> bool:
        return device in self.owner.allocated or bool(self.allocating.get(device))

    def _capacity_in_use(self, device: DeviceID) -> bool:
        shared = self.owner.shared
        return device in shared.capacity or device in shared.devices or device in self.allocating_capacity

    def _selectable(self, ci: int, data: _Request, candidate: Candidate) -> bool:
        if not self.features.binding_conditions and candidate.device.get("bindingConditions"):
            return False
        v = verdict(candidate, data.shape)
        if v is False:
            return False
        if v is not True:
            on_class, i, kind, text = v
            where = (
                f"class {(data.class_.get('metadata') or {}).get('name', '')}"
                if on_class
                else f"claim {claim_ref(self.claims[ci])}"
            )
            if kind == "compile":
                raise AllocationError(f"{where}: selector #{i}: CEL compile error: {text}")
            if "no such key:" in text:
                text += (
                    ". consider using CEL optional chaining (.? followed by orValue()) or guarding the check with "
                    "has() for optional fields"
                )
            raise AllocationError(
                f"{where}: selector #{i} on device {device_id_text(candidate.id)}: CEL runtime error: {text}"
            )
        ok = candidate.node_ok
        if ok is True or ok is False:
            return ok
        raise AllocationError(ok)

    def _fits_capacity(self, ci: int, data: _Request, candidate: Candidate, verb: str) -> bool:
        """kube's ``CmpRequestOverCapacity`` for the candidate, with the shares allocated and being allocated
        (nothing to compare when neither the request nor the device names a capacity: most devices)."""
        requests, capacities = data.capacity_requests, candidate.device.get("capacity")
        if not requests and not capacities:
            return True
        allocating = self.allocating_capacity.get(candidate.id)
        try:
            return fits_capacity(
                requests,
                capacities or {},
                self.owner.shared.capacity.get(candidate.id),
                allocating[1] if allocating is not None else None,
            )
        except (CapacityError, ValueError) as err:
            raise AllocationError(
                f"claim {claim_ref(self.claims[ci])}, request {data.name}: {verb} capacity for device "
                f"{device_id_text(candidate.id)}: {err}"
            ) from None

    def _allocate_device(
        self, r: tuple[int, int, int, int], data: _Request, candidate: Candidate, must: bool
    ) -> Callable[[], None] | None:
        ci = r[0]
        device, device_id = candidate.device, candidate.id
        multi = self.features.consumable_capacity and bool(device.get("allowMultipleAllocations"))
        if not multi and data.admin_access and ci in self.allocating.get(device_id, ()):
            return None
        if not data.admin_access and self._in_use(device_id):
            return None
        consumes = device.get("consumesCounters")
        if not self.features.partitionable_devices and consumes:
            return None
        undo = _Undo(result_at=len(self.results[ci]))
        if consumes and not (multi and self._capacity_in_use(device_id)):
            if not self._take_counters(candidate):
                return None
            undo.counters = True
        base, sub = (data.name, None) if data.parent is None else (data.parent, data.name)

        def rollback() -> None:
            self._rollback(ci, candidate, base, sub, undo)

        if self.features.device_taints and prevents_allocation(device, data.tolerations):
            rollback()
            return None
        constraints = self.constraints[ci]
        for constraint in constraints:
            if not constraint.add(base, sub, device, device_id):
                rollback()
                if must:
                    raise AllocationError(
                        f"claim {claim_ref(self.claims[ci])}, request {data.name}: cannot add device "
                        f"{device_id_text(device_id)} because a claim constraint would not be satisfied"
                    )
                return None
            undo.constraints += 1
        if not multi:
            self.allocating.setdefault(device_id, set()).add(ci)
            undo.marked = True
        share_id: str | None = None
        consumed: dict[str, Quantity] | None = None
        if self.features.consumable_capacity:
            try:
                fits = self._fits_capacity(ci, data, candidate, "rechecking")
            except AllocationError:
                rollback()
                raise
            if not fits:
                rollback()
                return None
            if multi:
                try:
                    consumed = consumed_map(data.capacity_requests, device.get("capacity") or {})
                except (CapacityError, ValueError) as err:
                    rollback()
                    raise AllocationError(
                        f"claim {claim_ref(self.claims[ci])}, request {data.name}: computing consumed capacity for "
                        f"device {device_id_text(device_id)}: {err}"
                    ) from None
                share_id = str(uuid.uuid4())
                count, totals = self.allocating_capacity.get(device_id, (0, {}))
                totals = dict(totals)
                for name, q in consumed.items():
                    totals[name] = totals.get(name, Decimal(0)) + q.value
                self.allocating_capacity[device_id] = (count + 1, totals)
                undo.capacity = consumed
        self.results[ci].append(_Chosen(data, candidate, share_id, consumed or None))
        return rollback

    def _rollback(self, ci: int, candidate: Candidate, base: str, sub: str | None, undo: _Undo) -> None:
        """kube's ``rollbackDevice``: undo what ``_allocate_device`` recorded, in reverse order."""
        del self.results[ci][undo.result_at :]
        if undo.capacity is not None:
            count, totals = self.allocating_capacity[candidate.id]
            if count <= 1:
                del self.allocating_capacity[candidate.id]
            else:
                totals = dict(totals)
                for name, q in undo.capacity.items():
                    totals[name] -= q.value
                self.allocating_capacity[candidate.id] = (count - 1, totals)
            undo.capacity = None
        if undo.marked:
            self.allocating[candidate.id].discard(ci)
            undo.marked = False
        constraints = self.constraints[ci]
        for i in range(undo.constraints - 1, -1, -1):
            constraints[i].remove(base, sub)
        undo.constraints = 0
        if undo.counters:
            self._give_counters(candidate)
            undo.counters = False

    def _take_counters(self, candidate: Candidate) -> bool:
        """kube's ``checkAvailableCounters``: add the device's consumption; False (and nothing added) when a
        counter of the pool would be overdrawn. kube compares every counter of the pool; only the device's can
        have changed since the last check, which left them all within bounds, unless the pool was overdrawn
        before the search took anything (what its allocated devices consume passes a counter): then every device
        consuming its counters fails, as in kube."""
        pool = candidate.pool
        assert pool is not None
        available, overdrawn = self._pool_counters(pool)
        consumption = _consumption(candidate)
        consumed = self.consumed_counters.setdefault(pool.id, {})
        for set_name, counters in consumption:
            used = consumed.setdefault(set_name, {})
            for name, value in counters:
                used[name] = used.get(name, _ZERO) + value
        fits = not overdrawn
        if fits:
            for set_name, counters in consumption:
                have = available.get(set_name)
                if have is None:
                    continue
                used = consumed[set_name]
                for name, _ in counters:
                    limit = have.get(name)
                    if limit is not None and limit < used[name]:
                        fits = False
                        break
                if not fits:
                    break
        if not fits:
            self._give_counters(candidate)
        return fits

    def _give_counters(self, candidate: Candidate) -> None:
        assert candidate.pool is not None
        consumed = self.consumed_counters[candidate.pool.id]
        for set_name, counters in _consumption(candidate):
            used = consumed[set_name]
            for name, value in counters:
                used[name] -= value

    def _pool_counters(self, pool: Pool) -> tuple[CounterSets, bool]:
        """The pool's available counters (``Allocator.available_counters``) and whether one is already below zero."""
        have = self.pool_counters.get(pool.id)
        if have is None:
            available = self.owner.available_counters(pool)
            overdrawn = any(value < 0 for counters in available.values() for value in counters.values())
            have = self.pool_counters[pool.id] = (available, overdrawn)
        return have

    # -- the result (kube's loop after allocateOne)

    def _result(self, ci: int, claim: Raw) -> dict[str, Any]:
        out_results: list[dict[str, Any]] = []
        for chosen in self.results[ci]:
            data, candidate = chosen.data, chosen.candidate
            entry: dict[str, Any] = {
                "request": data.full_name,
                "driver": candidate.id[0],
                "pool": candidate.id[1],
                "device": candidate.id[2],
            }
            if data.admin_access:
                entry["adminAccess"] = True
            if data.tolerations:
                entry["tolerations"] = list(data.tolerations)
            if self.features.binding_conditions:
                for key in ("bindingConditions", "bindingFailureConditions"):
                    if candidate.device.get(key):
                        entry[key] = list(candidate.device[key])
            if chosen.share_id is not None:
                entry["shareID"] = chosen.share_id
            if chosen.consumed:
                entry["consumedCapacity"] = {name: q.text for name, q in chosen.consumed.items()}
            out_results.append(entry)
        allocation: dict[str, Any] = {"devices": {"results": out_results}}
        config = self._config(ci, claim)
        if config:
            allocation["devices"]["config"] = config
        selector = _node_selector(self.node, [chosen.candidate for chosen in self.results[ci]], claim)
        if selector is not None:
            allocation["nodeSelector"] = selector
        return allocation

    def _chosen_name(self, ci: int, ri: int, request: Raw) -> str | None:
        """The full name of the subrequest chosen for a ``firstAvailable`` request, None for an exact one."""
        data = self.requests[(ci, ri, 0)]
        if data.parent is None:
            return None
        chosen = (request.get("firstAvailable") or ())[data.selected_sub]
        return f"{request.get('name', '')}/{chosen.get('name', '')}"

    def _config(self, ci: int, claim: Raw) -> list[dict[str, Any]]:
        config: list[dict[str, Any]] = []
        class_ranges: dict[str, tuple[int, int]] = {}
        devices = (claim.get("spec") or {}).get("devices") or {}
        requests = devices.get("requests") or ()
        for ri in range(len(requests)):
            data = self.requests[(ci, ri, 0)]
            if data.parent is not None:
                data = self.requests[(ci, ri, data.selected_sub)]
            class_name = (data.class_.get("metadata") or {}).get("name", "")
            if class_name in class_ranges:
                start, end = class_ranges[class_name]
                for entry in config[start:end]:
                    entry["requests"].append(data.full_name)
                continue
            start = len(config)
            for c in (data.class_.get("spec") or {}).get("config") or ():
                config.append({"source": "FromClass", "requests": [data.full_name], **_device_configuration(c)})
            class_ranges[class_name] = (start, len(config))
        for c in devices.get("config") or ():
            wanted = c.get("requests") or []
            if not wanted:
                config.append({"source": "FromClaim", **_device_configuration(c)})
                continue
            for ri, request in enumerate(requests):
                chosen = self._chosen_name(ci, ri, request)
                if request.get("name") in wanted or (chosen is not None and chosen in wanted):
                    config.append({"source": "FromClaim", "requests": list(wanted), **_device_configuration(c)})
                    break
        for entry in config:  # a config naming every request applies to all: kube drops the list
            named = entry.get("requests")
            if not named:
                continue
            if all(
                request.get("name") in named or self._chosen_name(ci, ri, request) in named
                for ri, request in enumerate(requests)
            ):
                del entry["requests"]
        return config


_ZERO = Decimal(0)


def _consumption(candidate: Candidate) -> Consumption:
    """The candidate's ``consumesCounters``, parsed once (kept on the candidate, which lives as long as its slice)."""
    known = candidate.consumption
    if known is None:
        known = candidate.consumption = tuple(
            (
                str(entry.get("counterSet", "")),
                tuple(
                    (name, parse((value or {}).get("value", "0")).value)
                    for name, value in (entry.get("counters") or {}).items()
                ),
            )
            for entry in candidate.device.get("consumesCounters") or ()
        )
    return known


def _device_configuration(config: Raw) -> dict[str, Any]:
    """The inlined ``DeviceConfiguration`` (``opaque``) of a class or claim config entry."""
    return {k: v for k, v in config.items() if k not in ("requests", "source")}


def _node_selector(node: NodeInfo, devices: Sequence[Candidate], claim: Raw) -> dict[str, Any] | None:
    """kube's ``createNodeSelector``: a node-local device (the slice's or, for ``perDeviceNodeSelection``, the
    device's ``nodeName``) or one that binds to its node pins the claim to this node; otherwise the node
    selectors (one term each) are merged; none of either (``allNodes``) means no selector."""
    fields: list[Raw] = []
    expressions: list[Raw] = []
    for candidate in devices:
        spec = candidate.slice.get("spec") or {}
        source = candidate.device if spec.get("perDeviceNodeSelection") else spec
        if source.get("nodeName") is not None or candidate.device.get("bindsToNode"):
            return {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}
                ]
            }
        selector = source.get("nodeSelector")
        if selector is None:
            continue
        terms = selector.get("nodeSelectorTerms") or []
        if len(terms) > 1:
            name = (claim.get("metadata") or {}).get("name", "")
            raise AllocationError(
                f"create NodeSelector for claim {name}: unsupported ResourceSlice.NodeSelector with {len(terms)} terms"
            )
        if terms:
            _merge(terms[0].get("matchFields") or (), fields)
            _merge(terms[0].get("matchExpressions") or (), expressions)
    if not fields and not expressions:
        return None
    term: dict[str, Any] = {}
    if expressions:
        term["matchExpressions"] = expressions
    if fields:
        term["matchFields"] = fields
    return {"nodeSelectorTerms": [term]}


def _merge(new: Sequence[Raw], into: list[Raw]) -> None:
    for requirement in new:
        values = set(requirement.get("values") or ())
        if not any(
            have.get("key") == requirement.get("key")
            and have.get("operator") == requirement.get("operator")
            and set(have.get("values") or ()) == values
            for have in into
        ):
            into.append(requirement)
