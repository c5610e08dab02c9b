"""The structured-parameters allocator: kube's ``structured.Allocator`` as 1.35's default gates select it (the
"incubating" implementation: DRAAdminAccess and DRAPrioritizedList on; partitionable devices, device taints,
binding conditions and consumable capacity off), over the API's JSON (resource.k8s.io/v1).

``Allocator`` is built once per scheduling cycle from the device classes, the slices and the devices already
allocated; ``allocate(node, claims)`` answers one node: the allocation result of each claim, in order, or None
when the claims do not fit there. The search is kube's: depth first over claims, their requests (a
``firstAvailable`` request tries its subrequests in order), the devices each needs, and the candidate devices in
pool, slice and device order; the first complete solution wins. What kube answers with an error is raised:
``AllocationError`` (the plugin's Error status: a broken selector, an unknown class...), ``FailedOnNode`` (kube's
``ErrFailedAllocationOnNode``: unschedulable on this node with that message) and ``AllocationTimeout`` (the
filter timeout).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from crane_scheduler.plugins.dynamicresources.nodeview import (
    Candidate,
    DeviceCache,
    NodeView,
    Shape,
    shape_of,
    untolerated_taint,
    verdict,
)
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


@dataclass(frozen=True, slots=True)
class Features:
    admin_access: bool = True
    prioritized_list: bool = True


def claim_ref(claim: Raw) -> str:
    """``klog.KObj(claim)``: namespace/name."""
    meta = claim.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    return f"{ns}/{name}" if ns else name


def device_id_text(device: DeviceID) -> str:
    return "/".join(device)


def allocated_devices(claims: Sequence[Raw]) -> set[DeviceID]:
    """The devices the claims' allocations hold (kube's ``foreachAllocatedDevice``): admin access holds none."""
    out: set[DeviceID] = set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation")
        for result in ((allocation or {}).get("devices") or {}).get("results") or ():
            if not result.get("adminAccess"):
                out.add((result.get("driver", ""), result.get("pool", ""), result.get("device", "")))
    return out


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


@dataclass(slots=True)
class _MatchAttribute:
    """All in-scope devices share the attribute's value (string, int, bool or version)."""

    requests: frozenset[str]
    attribute: str
    value: Raw | None = None
    count: int = 0

    def _applies(self, request: str, sub: str | None) -> bool:
        if not self.requests:
            return True
        return request in self.requests or (sub is not None and f"{request}/{sub}" in self.requests)

    def add(self, request: str, sub: str | None, device: Raw, device_id: DeviceID) -> bool:
        if not self._applies(request, sub):
            return True
        attr = lookup_attribute(device, device_id, self.attribute)
        if attr is None:
            return False
        if self.count == 0:
            self.value, self.count = attr, 1
            return True
        assert self.value is not None
        for kind in ("string", "int", "bool", "version"):
            if attr.get(kind) is not None:
                if self.value.get(kind) is None or self.value[kind] != attr[kind]:
                    return False
                break
        else:
            return False
        self.count += 1
        return True

    def remove(self, request: str, sub: str | None) -> None:
        if self._applies(request, sub):
            self.count -= 1


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
    the node views and selector verdicts across cycles (the plugin's); without it they last for this allocator."""

    def __init__(
        self,
        classes: Mapping[str, Raw],
        slices: Sequence[Raw],
        allocated: Container[DeviceID],
        features: Features = Features(),
        clock: Callable[[], float] = time.monotonic,
        cache: DeviceCache | None = None,
    ) -> None:
        self.classes = classes
        self.allocated = allocated
        self.features = features
        self.clock = clock
        self.cache = cache if cache is not None else DeviceCache()
        self.cache.refresh(classes, slices)

    def allocate(
        self, node: NodeInfo, claims: Sequence[Raw], deadline: float | None = None
    ) -> list[dict[str, Any]] | None:
        view = self.cache.view(node)
        if view.error is not None:
            raise AllocationError(view.error)
        return _Search(self, node, claims, view, deadline).run()

    def plan(self, claims: Sequence[Raw]) -> Plan | None:
        """The claims as one count of devices of one shape, when that is all they ask: every request an
        ``exactly`` of ExactCount without admin access, all of one class and selectors, no constraint, nothing
        ``allocate`` would refuse before searching. None otherwise (``allocate`` answers each node)."""
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
        there, invalid pools change the message, gathering the pools failed). Exact because with one shape and no
        constraint, kube's depth-first search takes the first free devices in order and never needs to go back:
        it succeeds if and only if there are enough. The counts are the shape's column (``DeviceCache.column``,
        kept across cycles when ``allocated`` logs its changes, ``nodeview.HeldLog``): one numpy comparison for all
        nodes. ``nodes_version``: the node table's, see ``ShapeColumn.sync``."""
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


class _Search:
    """One ``Allocate`` call (kube's ``allocator``)."""

    def __init__(
        self, owner: Allocator, node: NodeInfo, claims: Sequence[Raw], view: NodeView, deadline: float | None
    ) -> None:
        self.owner = owner
        self.node = node
        self.claims = claims
        self.view = view
        self.pools = view.pools
        self.deadline = deadline
        self.requests: dict[tuple[int, int, int], _Request] = {}
        self.constraints: list[list[_MatchAttribute]] = []
        self.allocating: dict[DeviceID, set[int]] = {}
        self.results: list[list[tuple[_Request, Candidate]]] = [[] for _ in claims]
        self.invocations = 0

    # -- preparation (kube's loop over claims before allocateOne)

    def run(self) -> list[dict[str, Any]] | None:
        for ci, claim in enumerate(self.claims):
            self._prepare_claim(ci, claim)
        try:
            done = self._allocate_one((0, 0, 0, 0), False)
        except _MaxSizeExceeded:  # kube returns errAllocationResultMaxSizeExceeded itself from Allocate
            raise AllocationError("allocation max size exceeded") from None
        if not done:
            if self.view.invalid:
                raise FailedOnNode("invalid resource pools were encountered")
            return None
        return [self._result(ci, claim) for ci, claim in enumerate(self.claims)]

    def _prepare_claim(self, ci: int, claim: Raw) -> None:
        devices = (claim.get("spec") or {}).get("devices") or {}
        min_devices = 0
        for ri, request in enumerate(devices.get("requests") or ()):
            subs = request.get("firstAvailable") or ()
            if subs:
                if not self.owner.features.prioritized_list:
                    raise AllocationError(
                        f"claim {claim_ref(claim)}, request {request.get('name', '')}: has subrequests, "
                        "but the DRAPrioritizedList feature is disabled"
                    )
                least = None
                for si, sub in enumerate(subs):
                    data = self._validate(claim, sub.get("name", ""), request.get("name", ""), sub, False, ci, ri, si)
                    self.requests[(ci, ri, si)] = data
                    least = data.num_devices if least is None else min(least, data.num_devices)
                min_devices += least or 0
            else:
                exactly = request.get("exactly") or {}
                admin = exactly.get("adminAccess")
                data = self._validate(claim, request.get("name", ""), None, exactly, admin is not None, ci, ri, 0)
                data.admin_access = bool(admin)
                self.requests[(ci, ri, 0)] = data
                min_devices += data.num_devices
        if min_devices > ALLOCATION_RESULTS_MAX_SIZE:
            raise AllocationError(
                f"claim {claim_ref(claim)}: number of requested devices {min_devices} exceeds the claim limit of "
                f"{ALLOCATION_RESULTS_MAX_SIZE}"
            )
        constraints: list[_MatchAttribute] = []
        for i, constraint in enumerate(devices.get("constraints") or ()):
            if not constraint.get("matchAttribute"):
                raise AllocationError(
                    f"claim {claim_ref(claim)}, constraint #{i}: empty constraint (unsupported constraint type?)"
                )
            constraints.append(
                _MatchAttribute(frozenset(constraint.get("requests") or ()), constraint["matchAttribute"])
            )
        self.constraints.append(constraints)

    def _validate(
        self, claim: Raw, name: str, parent: str | None, spec: Raw, has_admin: bool, ci: int, ri: int, si: int
    ) -> _Request:
        where = f"claim {claim_ref(claim)}, request {name}"
        for i, selector in enumerate(spec.get("selectors") or ()):
            if not (selector.get("cel") or {}).get("expression"):
                raise AllocationError(f"{where}, selector #{i}: CEL expression empty (unsupported selector type?)")
        if has_admin and not self.owner.features.admin_access:
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
                    if self._selectable(ci, data, candidate):
                        data.all_devices.append(candidate)
            data.num_devices = len(data.all_devices)
        else:
            raise AllocationError(f"{where}: unsupported count mode {mode}")
        return data

    # -- the search (kube's allocateOne)

    def _allocate_one(self, r: tuple[int, int, int, int], allocate_sub: bool) -> bool:
        self.invocations += 1
        if self.deadline is not None and self.owner.clock() > self.deadline:
            raise AllocationTimeout("filter operation aborted: context deadline exceeded")
        ci, ri, si, di = r
        if ci >= len(self.claims):
            return True
        requests = ((self.claims[ci].get("spec") or {}).get("devices") or {}).get("requests") or ()
        if ri >= len(requests):
            try:
                return self._allocate_one((ci + 1, 0, 0, 0), False)
            except _MaxSizeExceeded:
                return False
        data = self.requests[(ci, ri, si)]
        if not allocate_sub and data.parent is not None:
            all_exceeded = True
            sub = 0
            while (ci, ri, sub) in self.requests:
                try:
                    success = self._allocate_one((ci, ri, sub, di), True)
                except _MaxSizeExceeded:
                    sub += 1
                    continue
                all_exceeded = False
                if success:
                    data.selected_sub = sub
                    return True
                sub += 1
            if all_exceeded:
                raise _MaxSizeExceeded
            return False

        if data.mode == ALL and not data.all_devices:
            return False
        if di >= data.num_devices:
            return self._allocate_one((ci, ri + 1, 0, 0), False)
        if len(self.results[ci]) + data.num_devices - di > ALLOCATION_RESULTS_MAX_SIZE:
            raise _MaxSizeExceeded
        if data.mode == ALL:
            undo = self._allocate_device(r, data, data.all_devices[di], must=True)
            if undo is None:
                return False
            # kube continues with subRequestIndex 0 here (its deviceIndices literal leaves it out): kept as is.
            try:
                done = self._allocate_one((ci, ri, 0, di + 1), allocate_sub)
            except BaseException:
                undo()
                raise
            if not done:
                undo()
            return done

        for pool, candidates in zip(self.pools, self.view.candidates, strict=True):
            if pool.incomplete or pool.invalid:
                continue
            for candidate in candidates:
                if data.admin_access:
                    if ci in self.allocating.get(candidate.id, ()):
                        continue
                elif self._in_use(candidate.id):
                    continue
                if not self._selectable(ci, data, candidate):
                    continue
                undo = self._allocate_device(r, data, candidate, must=False)
                if undo is None:
                    continue
                try:
                    done = self._allocate_one((ci, ri, si, di + 1), allocate_sub)
                except BaseException:
                    undo()
                    raise
                if done:
                    return True
                undo()
        return False

    def _in_use(self, device: DeviceID) -> bool:
        return device in self.owner.allocated or bool(self.allocating.get(device))

    def _selectable(self, ci: int, data: _Request, candidate: Candidate) -> bool:
        if candidate.device.get("bindingConditions"):
            return False  # DRADeviceBindingConditions is off
        if untolerated_taint(candidate.device):
            return False  # device taints: no request's tolerations are read yet
        v = verdict(candidate, data.shape)
        if v is True or v is False:
            return v
        on_class, i, text = v
        where = (
            f"class {(data.class_.get('metadata') or {}).get('name', '')}"
            if on_class
            else f"claim {claim_ref(self.claims[ci])}"
        )
        raise AllocationError(f"{where}: selector #{i}: {text}")

    def _allocate_device(
        self, r: tuple[int, int, int, int], data: _Request, candidate: Candidate, must: bool
    ) -> Callable[[], None] | None:
        ci = r[0]
        if data.admin_access:
            if ci in self.allocating.get(candidate.id, ()):
                return None
        elif self._in_use(candidate.id):
            return None
        if candidate.device.get("consumesCounters"):
            return None  # DRAPartitionableDevices is off
        base, sub = (data.name, None) if data.parent is None else (data.parent, data.name)
        constraints = self.constraints[ci]
        for i, constraint in enumerate(constraints):
            if not constraint.add(base, sub, candidate.device, candidate.id):
                if must:
                    raise AllocationError(
                        f"claim {claim_ref(self.claims[ci])}, request {data.name}: cannot add device "
                        f"{device_id_text(candidate.id)} because a claim constraint would not be satisfied"
                    )
                for earlier in constraints[:i]:
                    earlier.remove(base, sub)
                return None
        self.allocating.setdefault(candidate.id, set()).add(ci)
        results = self.results[ci]
        before = len(results)
        results.append((data, candidate))

        def undo() -> None:
            for constraint in constraints:
                constraint.remove(base, sub)
            self.allocating[candidate.id].discard(ci)
            del results[before:]

        return undo

    # -- the result (kube's loop after allocateOne)

    def _result(self, ci: int, claim: Raw) -> dict[str, Any]:
        out_results: list[dict[str, Any]] = []
        for data, candidate in self.results[ci]:
            entry: dict[str, Any] = {
                "request": data.full_name,
                "driver": candidate.id[0],
                "pool": candidate.id[1],
                "device": candidate.id[2],
            }
            if data.admin_access:
                entry["adminAccess"] = True
            if data.spec.get("tolerations"):
                entry["tolerations"] = list(data.spec["tolerations"])
            out_results.append(entry)
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
                if request.get("name") in wanted:
                    config.append({"source": "FromClaim", "requests": list(wanted), **_device_configuration(c)})
                    continue
                data = self.requests[(ci, ri, 0)]
                if data.parent is None:
                    continue
                chosen = (request.get("firstAvailable") or ())[data.selected_sub]
                if f"{request.get('name', '')}/{chosen.get('name', '')}" in wanted:
                    config.append({"source": "FromClaim", "requests": list(wanted), **_device_configuration(c)})
        allocation: dict[str, Any] = {"devices": {"results": out_results}}
        if config:
            allocation["devices"]["config"] = config
        selector = _node_selector(claim, [candidate for _, candidate in self.results[ci]])
        if selector is not None:
            allocation["nodeSelector"] = selector
        return allocation


def _device_configuration(config: Raw) -> dict[str, Any]:
    """The inlined ``DeviceConfiguration`` (``opaque``) of a class or claim config entry."""
    return {k: v for k, v in config.items() if k not in ("requests", "source")}


def _node_selector(claim: Raw, devices: Sequence[Candidate]) -> dict[str, Any] | None:
    """kube's ``createNodeSelector``: a node-local device pins the claim to that node; otherwise the slices' node
    selectors (one term each) are merged; none of either (``allNodes``) means no selector."""
    fields: list[Raw] = []
    expressions: list[Raw] = []
    for candidate in devices:
        spec = candidate.slice.get("spec") or {}
        if spec.get("nodeName"):
            return {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [spec["nodeName"]]}]}
                ]
            }
        selector = spec.get("nodeSelector")
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
