"""Zone accounting: what every pod's result takes from its node's zones, and the zones as numpy rows.

``ZoneUsage`` is the cache of results. A bound pod counts with the result written on it (so the cache is rebuilt
from the pods' annotations after a restart, and pods placed by another replica or profile count too); a pod
whose result is only *assumed* (Reserve done, PreBind not yet seen by the informer) counts with the result this
scheduler chose. The annotation wins once the informer sees it; an assumed result without a bound pod expires
after ``ttl`` (upstream's 30 minutes) in case a pod vanishes without an event.

``ZoneTable`` keeps, per node-table row, the NRT's policies (``code``), zone allocatables and zone usage as
(rows, zones, resources) int64 tensors, so Filter evaluates every node with one numpy expression.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from crane_scheduler.plugins.noderesourcetopology.fit import ZoneState
from crane_scheduler.plugins.noderesourcetopology.model import NodeTopology, Result

NO_NRT, KUBELET, STATIC_SPREAD, STATIC_AWARE = 0, 1, 2, 3
"""``ZoneTable.code``: no (valid) NRT; cpuManagerPolicy None; Static and not aware by default; Static and
SingleNUMANodePodLevel."""

Totals = dict[str, dict[str, int]]  # zone -> resource -> used


def node_code(topo: NodeTopology | None) -> int:
    if topo is None:
        return NO_NRT
    if not topo.static:
        return KUBELET
    return STATIC_AWARE if topo.aware_by_default else STATIC_SPREAD


@dataclass(slots=True)
class _Assumed:
    node: str
    result: Result
    deadline: float


class ZoneUsage:
    def __init__(self, ttl: float = 1800.0) -> None:
        self.ttl = ttl
        self._bound: dict[str, tuple[str, Result]] = {}
        self._assumed: dict[str, _Assumed] = {}
        self._node_of: dict[str, str] = {}  # uid -> node it counts on (effective entry)
        self._by_node: dict[str, dict[str, Result]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_node.values())

    def result_of(self, uid: str) -> tuple[str, Result] | None:
        node = self._node_of.get(uid)
        return None if node is None else (node, self._by_node[node][uid])

    def is_assumed(self, uid: str) -> bool:
        return uid in self._assumed

    def _refresh(self, uid: str) -> set[str]:
        """Recompute which result ``uid`` counts with; returns the nodes whose usage changed."""
        changed = set()
        old = self._node_of.pop(uid, None)
        if old is not None:
            del self._by_node[old][uid]
            if not self._by_node[old]:
                del self._by_node[old]
            changed.add(old)
        effective: tuple[str, Result] | None = self._bound.get(uid)
        if effective is None and uid in self._assumed:
            a = self._assumed[uid]
            effective = (a.node, a.result)
        if effective is not None and effective[1]:
            node, result = effective
            self._node_of[uid] = node
            self._by_node.setdefault(node, {})[uid] = result
            changed.add(node)
        return changed

    def set_bound(self, uid: str, node: str, result: Result | None) -> set[str]:
        """A bound pod seen by the informer, with the result decoded from its annotation (None: none or bad)."""
        if result:
            self._bound[uid] = (node, result)
            self._assumed.pop(uid, None)
        else:
            self._bound.pop(uid, None)
        return self._refresh(uid)

    def assume(self, uid: str, node: str, result: Result, now: float) -> set[str]:
        self._assumed[uid] = _Assumed(node, result, now + self.ttl)
        return self._refresh(uid)

    def forget(self, uid: str) -> set[str]:
        """Unreserve: the assumed result is dropped (a result already on the bound pod stays)."""
        if self._assumed.pop(uid, None) is None:
            return set()
        return self._refresh(uid)

    def remove(self, uid: str) -> set[str]:
        """The pod is gone (deleted, or its assumption forgotten by the cache)."""
        self._bound.pop(uid, None)
        self._assumed.pop(uid, None)
        return self._refresh(uid)

    def expire(self, now: float) -> set[str]:
        changed: set[str] = set()
        for uid in [u for u, a in self._assumed.items() if a.deadline <= now]:
            del self._assumed[uid]
            changed |= self._refresh(uid)
        return changed

    def totals(self, node: str, without: frozenset[str] | set[str] = frozenset()) -> Totals:
        """What the node's pods take from each zone (``without`` those pods: preemption's what-if)."""
        out: Totals = {}
        for uid, result in self._by_node.get(node, {}).items():
            if uid in without:
                continue
            for entry in result:
                zone = out.setdefault(entry.zone, {})
                for res, amount in entry.capacity.items():
                    zone[res] = zone.get(res, 0) + amount
        return out


class ZoneTable:
    """Per node-table row: NRT code, zone names, allocatable and used per (zone, aware resource)."""

    def __init__(self, resources: Sequence[str], capacity: int = 64) -> None:
        self.resources = tuple(resources)
        self.cap = capacity
        self.width = 2  # zone slots per row; grows with the largest NRT seen
        r = len(self.resources)
        self.code = np.zeros(capacity, dtype=np.int8)
        self.alloc = np.zeros((capacity, self.width, r), dtype=np.int64)
        self.used = np.zeros((capacity, self.width, r), dtype=np.int64)
        self.valid = np.zeros((capacity, self.width), dtype=bool)
        self.zone_names: list[tuple[str, ...]] = [()] * capacity
        self.topology: list[NodeTopology | None] = [None] * capacity

    def ensure(self, rows: int, width: int = 0) -> None:
        if rows <= self.cap and width <= self.width:
            return
        cap = max(self.cap, 1)
        while cap < rows:
            cap *= 2
        width = max(width, self.width)
        r = len(self.resources)

        def grown(a: Any, shape: tuple[int, ...]) -> Any:
            out = np.zeros(shape, dtype=a.dtype)
            out[tuple(slice(0, s) for s in a.shape)] = a
            return out

        self.code = grown(self.code, (cap,))
        self.alloc = grown(self.alloc, (cap, width, r))
        self.used = grown(self.used, (cap, width, r))
        self.valid = grown(self.valid, (cap, width))
        self.zone_names += [()] * (cap - self.cap)
        self.topology += [None] * (cap - self.cap)
        self.cap, self.width = cap, width

    def write(self, row: int, topo: NodeTopology | None, totals: Totals) -> int:
        """(Re)fill one row from its node's NRT and zone usage; returns the row's code."""
        zones = topo.numa_zones if topo is not None and topo.static else ()
        self.ensure(row + 1, len(zones))
        self.topology[row] = topo
        self.code[row] = node_code(topo)
        self.alloc[row] = 0
        self.valid[row] = False
        for z, zone in enumerate(zones):
            self.valid[row, z] = True
            for k, res in enumerate(self.resources):
                self.alloc[row, z, k] = zone.allocatable.get(res, 0)
        self.zone_names[row] = tuple(z.name for z in zones)
        self.write_used(row, totals)
        return int(self.code[row])

    def write_used(self, row: int, totals: Totals) -> None:
        """Usage by zone name; results naming zones this NRT does not have are ignored (as upstream)."""
        self.used[row] = 0
        for z, name in enumerate(self.zone_names[row]):
            used = totals.get(name)
            if used:
                for k, res in enumerate(self.resources):
                    self.used[row, z, k] = used.get(res, 0)

    def zones(self, row: int) -> list[ZoneState]:
        """One row as ``ZoneState``s, for the per-node ``fit.assign`` (Reserve) and explain."""
        return [
            ZoneState(name, tuple(int(v) for v in self.alloc[row, z]), tuple(int(v) for v in self.used[row, z]))
            for z, name in enumerate(self.zone_names[row])
        ]

    def rows_with(self, codes: Iterable[int], n: int) -> npt.NDArray[np.intp]:
        return np.flatnonzero(np.isin(self.code[:n], list(codes)))
