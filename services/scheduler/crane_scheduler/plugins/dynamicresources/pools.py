"""ResourceSlices gathered into the pools a node can use: kube 1.37's ``GatherPools`` of the "incubating" allocator
(the one 1.37's default gates select: partitionable devices, device taints, binding conditions and consumable
capacity on; compatibility groups off).

A slice counts for a node by ``nodeName``, ``allNodes`` or ``nodeSelector``, or, with ``perDeviceNodeSelection``,
when one of its devices selects the node (each device is then checked on its own, ``device_selects``); a slice
that sets none of them (a future kind) is skipped, and so is one whose devices declare compatibility groups
(DRADeviceCompatibilityGroups is off: its pool is then incomplete). Per (driver, pool) only the newest
generation counts. A pool with fewer slices of that generation than ``resourceSliceCount`` is incomplete (none
of its devices is used; an "All" request fails on it), unless a newer generation exists in slices that do not
reach the node (the driver is replacing it: left out); when the slices that do not reach the node complete it,
their devices (``not_targeting``) still count for the shared counters. A pool is invalid with a device name twice
among the slices reaching the node, a counter set name twice, or a device consuming a counter set or counter the
pool does not declare (``sharedCounters`` of its counter slices).

Order (kube's since 1.36): pools by (driver, pool name), those with a device that has binding conditions last;
a pool's slices by name. The first-solution search follows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from crane_scheduler.plugins.dynamicresources.capacity import parse
from crane_scheduler.plugins.nodeaffinity import requirement_matches
from crane_scheduler.podinfo import NodeInfo, parse_term

Raw = Mapping[str, Any]
CounterSets = dict[str, dict[str, Decimal]]
"""counter set name -> counter name -> value"""


class PoolError(Exception):
    """A slice whose node selection cannot be evaluated (kube: ``failed to perform node selection``)."""


@dataclass(slots=True)
class Pool:
    driver: str
    name: str
    slices: list[Raw] = field(default_factory=list)  # device slices reaching the node, by name
    not_targeting: list[Raw] = field(default_factory=list)  # device slices of the pool that do not
    counter_sets: CounterSets = field(default_factory=dict)
    incomplete: bool = False
    invalid: bool = False
    invalid_reason: str = ""
    binding_conditions: bool = False

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"


def node_selector_matches(node: NodeInfo, selector: Raw) -> bool:
    """kube's ``nodeaffinity.NewNodeSelector(...).Match``: any term matches; an empty term matches nothing."""
    terms = selector.get("nodeSelectorTerms") or ()
    parsed = [parse_term(t) for t in terms]
    for term in parsed:
        if term is not None and not term.valid:
            raise PoolError(f"failed to parse node selector {dict(selector)}")
    return any(term is not None and all(requirement_matches(node, r) for r in term.requirements) for term in parsed)


def node_matches(node: NodeInfo, node_name: str, all_nodes: bool, selector: Raw | None) -> bool:
    """kube's ``NodeMatches``: by name, all nodes, or a node selector; none of them matches nothing."""
    if node_name:
        return node.name == node_name
    if all_nodes:
        return True
    if selector is not None:
        return node_selector_matches(node, selector)
    return False


def device_selects(node: NodeInfo, device: Raw) -> bool:
    """A device of a ``perDeviceNodeSelection`` slice: whether it reaches ``node`` (``PoolError``)."""
    return node_matches(node, device.get("nodeName") or "", bool(device.get("allNodes")), device.get("nodeSelector"))


def _spec(slice_: Raw) -> Raw:
    return slice_.get("spec") or {}


def _pool_key(slice_: Raw) -> tuple[str, str]:
    spec = _spec(slice_)
    return spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")


def _generation(slice_: Raw) -> int:
    return int((_spec(slice_).get("pool") or {}).get("generation") or 0)


def _slice_count(slice_: Raw) -> int:
    return int((_spec(slice_).get("pool") or {}).get("resourceSliceCount") or 0)


def _name(slice_: Raw) -> str:
    return str((slice_.get("metadata") or {}).get("name", ""))


def uses_compatibility_groups(slice_: Raw) -> bool:
    return any(
        consumption.get("compatibilityGroups")
        for device in _spec(slice_).get("devices") or ()
        for consumption in device.get("consumesCounters") or ()
    )


def _reaches(slice_: Raw, node: NodeInfo) -> bool | None:
    """Whether the slice has devices reachable from ``node``; None when it uses no known node selection."""
    spec = _spec(slice_)
    name, all_nodes, selector = spec.get("nodeName") or "", bool(spec.get("allNodes")), spec.get("nodeSelector")
    if name or all_nodes or selector is not None:
        try:
            return node_matches(node, name, all_nodes, selector)
        except PoolError as err:
            raise PoolError(f"failed to perform node selection for slice {_name(slice_)}: {err}") from None
    if spec.get("perDeviceNodeSelection"):
        for device in spec.get("devices") or ():
            try:
                if device_selects(node, device):
                    return True
            except PoolError as err:
                raise PoolError(
                    f"failed to perform node selection for device {device.get('name', '')} in slice "
                    f"{_name(slice_)}: {err}"
                ) from None
        return False
    return None


def gather_pools(slices: Sequence[Raw], node: NodeInfo, candidates: Iterable[Raw] | None = None) -> list[Pool]:
    """The pools with devices reachable from ``node`` (see the module's docstring). ``candidates``, when given,
    are the slices that may reach the node (an index by ``nodeName``: every other one is known not to); the
    completeness check still reads all ``slices``. The result does not depend on the order of either."""
    by_pool: dict[tuple[str, str], list[Raw]] = {}
    for s in slices if candidates is None else candidates:
        if uses_compatibility_groups(s):
            continue
        if not _reaches(s, node):
            continue
        key = _pool_key(s)
        have = by_pool.get(key)
        if have is None or _generation(s) > _generation(have[0]):
            by_pool[key] = [s]
        elif _generation(s) == _generation(have[0]):
            have.append(s)
    pools: list[Pool] = []
    for (driver, name), chosen in by_pool.items():
        generation, wanted = _generation(chosen[0]), _slice_count(chosen[0])
        if len(chosen) == wanted:
            pools.append(_build(driver, name, chosen, None))
            continue
        obsolete, everything = _slices_of_generation(slices, driver, name, generation)
        if obsolete:
            continue
        everything = [s for s in everything if not uses_compatibility_groups(s)]
        if len(everything) != wanted:
            pools.append(Pool(driver, name, incomplete=True))
            continue
        pools.append(_build(driver, name, chosen, everything))
    pools.sort(key=lambda p: (p.binding_conditions, p.driver, p.name))
    return pools


def _build(driver: str, name: str, chosen: list[Raw], everything: list[Raw] | None) -> Pool:
    """kube's ``buildPool``: the device slices reaching the node (by name), the others, the counter sets."""
    reaching = sorted(chosen, key=_name)
    device_slices = [s for s in reaching if not _spec(s).get("sharedCounters")]
    counter_slices = [s for s in reaching if _spec(s).get("sharedCounters")]
    others: list[Raw] = []
    if everything is not None and len(reaching) < len(everything):
        names = {_name(s) for s in reaching}
        for s in everything:
            if _name(s) in names:
                continue
            (counter_slices if _spec(s).get("sharedCounters") else others).append(s)
    pool = Pool(driver, name, device_slices, others)
    duplicate = _duplicate_device(device_slices)
    if duplicate is not None:
        return Pool(driver, name, invalid=True, invalid_reason=f"duplicate device name {duplicate}")
    counter_sets: CounterSets = {}
    for s in counter_slices:
        for counter_set in _spec(s).get("sharedCounters") or ():
            set_name = str(counter_set.get("name", ""))
            if set_name in counter_sets:
                return Pool(driver, name, invalid=True, invalid_reason=f"duplicate counter set name {set_name}")
            counter_sets[set_name] = {
                counter: parse((value or {}).get("value", "0")).value
                for counter, value in (counter_set.get("counters") or {}).items()
            }
    for group in (device_slices, others):
        problem = _counter_consumption_problem(counter_sets, group)
        if problem is not None:
            return Pool(driver, name, invalid=True, invalid_reason=problem)
    pool.counter_sets = counter_sets
    pool.binding_conditions = any(
        device.get("bindingConditions") is not None for s in device_slices for device in _spec(s).get("devices") or ()
    )
    return pool


def _counter_consumption_problem(counter_sets: CounterSets, slices: Sequence[Raw]) -> str | None:
    for s in slices:
        for device in _spec(s).get("devices") or ():
            for consumption in device.get("consumesCounters") or ():
                set_name = str(consumption.get("counterSet", ""))
                counters = counter_sets.get(set_name)
                if counters is None:
                    return f"counter set {set_name} not found"
                for counter in consumption.get("counters") or {}:
                    if counter not in counters:
                        return f"counter {counter} not found in counter set {set_name}"
    return None


def _slices_of_generation(slices: Sequence[Raw], driver: str, name: str, generation: int) -> tuple[bool, list[Raw]]:
    """kube's ``checkSlicesInPool``: (a newer generation exists, the pool's slices of ``generation``)."""
    out: list[Raw] = []
    for s in slices:
        if _pool_key(s) != (driver, name):
            continue
        g = _generation(s)
        if g > generation:
            return True, []
        if g == generation:
            out.append(s)
    return False, out


def _duplicate_device(slices: Sequence[Raw]) -> str | None:
    seen: set[str] = set()
    for s in slices:
        for device in _spec(s).get("devices") or ():
            name = str(device.get("name", ""))
            if name in seen:
                return name
            seen.add(name)
    return None
