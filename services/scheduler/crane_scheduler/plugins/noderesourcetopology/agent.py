"""The NRT object crane-agent would publish for a node: for simulated nodes (sandbox) and tests.

crane-agent (gocrane/crane pkg/topology) builds it from sysfs and the kubelet's configuration:

- ``craneManagerPolicy.cpuManagerPolicy``: ``None`` when the kubelet's own CPU manager is ``static`` (the kubelet
  owns cpusets), else ``Static``; ``topologyManagerPolicy``: ``None`` when the node label
  ``topology.crane.io/topology-awareness`` parses false, else ``SingleNUMANodePodLevel``.
- ``reserved`` = kubeReserved + systemReserved; with ``reservedSystemCPUs`` its cpu is the number of listed CPUs.
  ``attributes[go.crane.io/reserved-system-cpus]`` is the kubelet's string (possibly empty).
- One ``Node`` zone per NUMA node, sorted by ID, named ``node<ID>``, costs = the distances. capacity = logical
  CPUs and memory; allocatable = capacity - reserve, the reserve taken greedily from the lowest ID upwards (with a
  CPU list, each zone's cpu reserve is the number of listed CPUs it owns); ``reservedCPUNums`` = ceil(the zone's cpu
  reserve). Upstream carried ``2 x reserve - capacity`` to the next zone when a zone could not absorb
  its share; the remainder carried here is ``reserve - capacity``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from crane_scheduler.plugins.noderesourcetopology.model import (
    ANNOTATION_AWARENESS,
    CPU_POLICY_NONE,
    CPU_POLICY_STATIC,
    GROUP,
    KIND,
    TOPOLOGY_POLICY_NONE,
    TOPOLOGY_POLICY_SINGLE_NUMA,
    VERSION,
    format_quantity,
    parse_go_bool,
)

RESERVED_CPUS_ATTRIBUTE = "go.crane.io/reserved-system-cpus"


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its logical CPU ids and usable memory in bytes."""

    id: int
    cpus: tuple[int, ...]
    memory: int
    distances: Mapping[int, int] = field(default_factory=dict)  # other NUMA id -> distance (10 = local)


def parse_cpuset(text: str) -> set[int]:
    """A Linux cpuset list (``0-3,8``); ``ValueError`` names the bad part."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"invalid cpuset part {part!r} in {text!r}")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _greedy(total: int, capacities: Sequence[int]) -> list[int]:
    """Take ``total`` from the zones in order, each up to its capacity."""
    out = []
    for cap in capacities:
        take = min(total, cap)
        out.append(take)
        total -= take
    return out


def build_topology(
    node: str,
    numa: Sequence[NumaNode],
    *,
    reserved: Mapping[str, int] | None = None,
    reserved_system_cpus: str = "",
    kubelet_cpu_manager_policy: str = "none",
    node_labels: Mapping[str, str] | None = None,
    node_uid: str | None = None,
) -> dict[str, Any]:
    """The NRT JSON; ``reserved`` in scheduler units (cpu millicores, memory bytes): kubeReserved + systemReserved."""
    reserved = dict(reserved or {})
    listed = parse_cpuset(reserved_system_cpus)
    if reserved_system_cpus:
        reserved["cpu"] = len(listed) * 1000
    zones = sorted(numa, key=lambda z: z.id)
    if listed:
        cpu_reserve = [len(listed & set(z.cpus)) * 1000 for z in zones]
    else:
        cpu_reserve = _greedy(reserved.get("cpu", 0), [len(z.cpus) * 1000 for z in zones])
    mem_reserve = _greedy(reserved.get("memory", 0), [z.memory for z in zones])
    reserved_nums = [math.ceil(r / 1000) for r in cpu_reserve]
    aware = parse_go_bool((node_labels or {}).get(ANNOTATION_AWARENESS, ""))
    out_zones = []
    for z, cpu_r, mem_r, nums in zip(zones, cpu_reserve, mem_reserve, reserved_nums, strict=True):
        capacity = {"cpu": len(z.cpus) * 1000, "memory": z.memory}
        allocatable = {"cpu": capacity["cpu"] - cpu_r, "memory": capacity["memory"] - mem_r}
        resources: dict[str, Any] = {
            "capacity": {k: format_quantity(k, v) for k, v in capacity.items()},
            "allocatable": {k: format_quantity(k, v) for k, v in allocatable.items()},
        }
        if nums:
            resources["reservedCPUNums"] = nums
        out_zones.append(
            {
                "name": f"node{z.id}",
                "type": "Node",
                "costs": [
                    {"name": f"node{o.id}", "value": z.distances.get(o.id, 10 if o.id == z.id else 20)} for o in zones
                ],
                "resources": resources,
            }
        )
    meta: dict[str, Any] = {"name": node}
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": meta,
        "craneManagerPolicy": {
            "cpuManagerPolicy": CPU_POLICY_NONE if kubelet_cpu_manager_policy == "static" else CPU_POLICY_STATIC,
            "topologyManagerPolicy": TOPOLOGY_POLICY_NONE if aware is False else TOPOLOGY_POLICY_SINGLE_NUMA,
        },
        "reserved": {k: format_quantity(k, v) for k, v in sorted(reserved.items())},
        "attributes": {RESERVED_CPUS_ATTRIBUTE: reserved_system_cpus},
        "zones": out_zones,
    }


def uniform_numa(nodes: int, cpus_per_node: int, memory_per_node: int) -> list[NumaNode]:
    """``nodes`` NUMA nodes with consecutive CPU ids and the usual distances (10 local, 21 remote)."""
    return [
        NumaNode(
            i,
            tuple(range(i * cpus_per_node, (i + 1) * cpus_per_node)),
            memory_per_node,
            {j: 10 if i == j else 21 for j in range(nodes)},
        )
        for i in range(nodes)
    ]
