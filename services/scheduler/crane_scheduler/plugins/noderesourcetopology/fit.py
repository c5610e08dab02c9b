"""Per-zone fit and the choice of zones: one pure version for one node, one vectorised over many nodes.

Resources are vectors aligned with the args' ``topologyAwareResources``; ``cpu`` is always among them when a pod
is placed at all (targets are chosen by their CPU request).

- Zone order: free millicores (allocatable - used), largest first; ties keep the NRT's zone order (upstream's
  Go 1.17 sort did so only for up to 6 zones; here it is explicit and stable for any number).
- Aware pods (single NUMA node): a zone fits when every aware resource's request <= allocatable - used. The
  result is the first fitting zone in that order, holding the whole request.
- Other pods may span zones: each zone's cpu allocatable is floored to whole cores (exclusive CPUs are whole),
  free amounts are clamped at 0 (upstream let an overcommitted zone *grow* the remaining request), and zones are
  taken greedily in order until nothing remains; the entries are then sorted by zone name (as upstream writes
  them). Upstream accepted a node whose zones ran out and silently wrote a smaller result (the agent then pins
  fewer CPUs than the limit); here such a node does not fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from crane_scheduler.plugins.noderesourcetopology.model import Result, ZoneResult

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class ZoneState:
    name: str
    allocatable: tuple[int, ...]
    used: tuple[int, ...]

    def free(self, k: int) -> int:
        return self.allocatable[k] - self.used[k]


def ordered(zones: Sequence[ZoneState], cpu: int) -> list[ZoneState]:
    """Largest free cpu first; ties in NRT order (``sorted`` is stable)."""
    return sorted(zones, key=lambda z: -z.free(cpu))


def fits(zone: ZoneState, request: Sequence[int]) -> bool:
    return all(r <= zone.free(k) for k, r in enumerate(request))


def assign(zones: Sequence[ZoneState], request: Sequence[int], aware: bool, resources: Sequence[str]) -> Result | None:
    """The zones the pod takes on one node, or None when it does not fit there."""
    cpu = resources.index("cpu")
    order = ordered(zones, cpu)
    if aware:
        for z in order:
            if fits(z, request):
                return (ZoneResult(z.name, {n: r for n, r in zip(resources, request, strict=True) if r}),)
        return None
    remaining = list(request)
    entries = []
    for z in order:
        if not any(remaining):
            break
        alloc = list(z.allocatable)
        alloc[cpu] = alloc[cpu] // 1000 * 1000
        take = [min(rem, max(0, a - u)) for rem, a, u in zip(remaining, alloc, z.used, strict=True)]
        if any(t > 0 for t in take):
            entries.append(ZoneResult(z.name, {n: t for n, t in zip(resources, take, strict=True) if t}))
            remaining = [rem - t for rem, t in zip(remaining, take, strict=True)]
    if any(remaining):
        return None
    return tuple(sorted(entries, key=lambda e: e.zone))


def evaluate(
    alloc: I64, used: I64, valid: Bools, request: I64, aware: Bools, cpu: int
) -> tuple[Bools, npt.NDArray[np.int64]]:
    """``assign`` for k nodes at once: (fits, number of zones in the result) per node.

    ``alloc``/``used`` are (k, Z, R), ``valid`` (k, Z) marks real zones (nodes have different zone counts),
    ``aware`` (k,) the awareness decided per node. Loops only over the zone positions (Z is small)."""
    k = alloc.shape[0]
    if k == 0:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
    free = alloc - used
    whole = valid & np.all(free >= request, axis=2)
    aware_ok = np.any(whole, axis=1)
    if aware.all():  # the common case: no node lets the pod span zones
        return aware_ok, aware_ok.astype(np.int64)
    key = np.where(valid, free[:, :, cpu], -(2**62))  # padding zones sort last
    order = np.argsort(-key, axis=1, kind="stable")
    floored = alloc.copy()
    floored[:, :, cpu] = floored[:, :, cpu] // 1000 * 1000
    spread_free = np.clip(floored - used, 0, None)
    spread_free = np.take_along_axis(spread_free, order[:, :, None], axis=1)
    valid_sorted = np.take_along_axis(valid, order, axis=1)
    remaining = np.broadcast_to(request, (k, len(request))).copy()
    count = np.zeros(k, dtype=np.int64)
    for j in range(alloc.shape[1]):
        take = np.minimum(remaining, np.where(valid_sorted[:, j, None], spread_free[:, j, :], 0))
        count += np.any(take > 0, axis=1)
        remaining -= take
    spread_ok = np.all(remaining == 0, axis=1)
    ok: Bools = (aware & aware_ok) | (~aware & spread_ok)
    zones = np.where(aware, 1, count)
    return ok, np.where(ok, zones, 0).astype(np.int64)
