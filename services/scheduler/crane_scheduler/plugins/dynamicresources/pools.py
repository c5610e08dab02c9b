"""ResourceSlices gathered into the pools a node can use (kube's ``GatherPools``, the "incubating" allocator
that 1.35's default gates select: DRAAdminAccess and DRAPrioritizedList on, DRAPartitionableDevices off).

A slice counts for a node by ``nodeName``, ``allNodes`` or ``nodeSelector``; a slice that sets none of them (a
future kind) is skipped, and so is one using partitionable devices (``perDeviceNodeSelection``,
``sharedCounters``), as kube does with that gate off. Per (driver, pool) only the newest generation counts. A pool
with fewer slices of that generation than ``resourceSliceCount`` is incomplete (none of its devices is used; an
"All" request fails on it), unless a newer generation exists in slices that do not reach the node: then the
driver is replacing it and it is left out. A pool with a device name twice is invalid.

Order: kube walks a Go map, so the order of pools is unspecified there; here pools are sorted by (driver, pool)
and a pool's slices by name, which the first-solution search then follows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crane_scheduler.plugins.nodeaffinity import requirement_matches
from crane_scheduler.podinfo import NodeInfo, parse_term

Raw = Mapping[str, Any]


class PoolError(Exception):
    """A slice whose node selection cannot be evaluated (kube: ``failed to perform node selection``)."""


@dataclass(slots=True)
class Pool:
    driver: str
    name: str
    slices: list[Raw] = field(default_factory=list)
    incomplete: bool = False
    invalid: bool = False
    invalid_reason: str = ""

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


def _spec(slice_: Raw) -> Raw:
    return slice_.get("spec") or {}


def _pool_key(slice_: Raw) -> tuple[str, str]:
    spec = _spec(slice_)
    return spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")


def _generation(slice_: Raw) -> int:
    return int((_spec(slice_).get("pool") or {}).get("generation") or 0)


def _slice_count(slice_: Raw) -> int:
    return int((_spec(slice_).get("pool") or {}).get("resourceSliceCount") or 0)


def _reaches(slice_: Raw, node: NodeInfo) -> bool | None:
    """Whether the slice's devices are reachable from ``node``; None when it uses no known node selection."""
    spec = _spec(slice_)
    name = spec.get("nodeName") or ""
    if name:
        return node.name == name
    if spec.get("allNodes"):
        return True
    selector = spec.get("nodeSelector")
    if selector is not None:
        try:
            return node_selector_matches(node, selector)
        except PoolError as err:
            meta = slice_.get("metadata") or {}
            raise PoolError(f"failed to perform node selection for slice {meta.get('name', '')}: {err}") from None
    return None


def gather_pools(slices: Sequence[Raw], node: NodeInfo, candidates: Iterable[Raw] | None = None) -> list[Pool]:
    """The pools with devices reachable from ``node`` (see the module's docstring). ``candidates``, when given,
    are the slices that may reach the node (an index by ``nodeName``: every other one is known not to); the
    completeness check still reads all ``slices``. The result does not depend on the order of either."""
    everything = slices
    by_pool: dict[tuple[str, str], list[Raw]] = {}
    for s in everything if candidates is None else candidates:
        spec = _spec(s)
        if spec.get("perDeviceNodeSelection") is not None or spec.get("sharedCounters"):
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
    for (driver, name), chosen in sorted(by_pool.items()):
        pool = Pool(driver, name, sorted(chosen, key=lambda s: (s.get("metadata") or {}).get("name", "")))
        generation, wanted = _generation(chosen[0]), _slice_count(chosen[0])
        if len(chosen) != wanted:
            obsolete, count = _count_generation(everything, driver, name, generation)
            if obsolete:
                continue
            if count != wanted:
                pools.append(Pool(driver, name, incomplete=True))
                continue
        duplicate = _duplicate_device(pool.slices)
        if duplicate is not None:
            pools.append(Pool(driver, name, invalid=True, invalid_reason=f"duplicate device name {duplicate}"))
            continue
        pools.append(pool)
    return pools


def _count_generation(slices: Sequence[Raw], driver: str, name: str, generation: int) -> tuple[bool, int]:
    """(a newer generation exists, the number of slices of ``generation``) over every slice of the pool."""
    count = 0
    for s in slices:
        if _pool_key(s) != (driver, name):
            continue
        g = _generation(s)
        if g > generation:
            return True, 0
        count += g == generation
    return False, count


def _duplicate_device(slices: Sequence[Raw]) -> str | None:
    seen: set[str] = set()
    for s in slices:
        for device in _spec(s).get("devices") or ():
            name = str(device.get("name", ""))
            if name in seen:
                return name
            seen.add(name)
    return None
