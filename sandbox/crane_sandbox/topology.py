"""NUMA topology of the simulated nodes: the NodeResourceTopology objects crane-agent would publish for them.

The sandbox installs the NRT CRD (``deploy/crds/``) and publishes one NRT per simulated node, built by the
product's ``agent.build_topology`` (crane-agent's rules: ``Node`` zones ``node0``..., reserved CPUs taken from the
zones that own them, ``craneManagerPolicy`` Static / SingleNUMANodePodLevel) and written by its
``publish_topologies``. Each NRT is owned by its Node (``ownerReferences`` with the node's uid), so the garbage
collector deletes it with the node.

Per node: ``TopologySpec`` (number of NUMA zones splitting the node's CPUs and memory, reserved CPUs as a cpuset);
zones 0 means no NRT (a node crane-agent does not run on). Command line form (``parse_topology``)::

    2                 two zones, nothing reserved (the default)
    4:reserved=0-1    four zones, CPUs 0 and 1 reserved for the system (kubelet reservedSystemCPUs)
    off               no NRT object
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from crane_sandbox.crds import NRT_CRD
from crane_sandbox.crds import install_crd as install_crd_file
from crane_sandbox.fleet import SimNode
from crane_scheduler.plugins.noderesourcetopology.agent import NumaNode, build_topology, parse_cpuset
from crane_scheduler.plugins.noderesourcetopology.publish import publish_topologies
from crane_shared.kube import raw_json

TIMEOUT = 10.0


@dataclass(frozen=True)
class TopologySpec:
    """A simulated node's NUMA layout: ``zones`` NUMA nodes (0: no NRT) and the kubelet's reservedSystemCPUs."""

    zones: int = 2
    reserved_cpus: str = ""

    def __post_init__(self) -> None:
        if self.zones < 0:
            raise ValueError(f"NUMA zones must be >= 0, got {self.zones}")
        parse_cpuset(self.reserved_cpus)  # ValueError names the bad part


def parse_topology(text: str) -> TopologySpec:
    """``N``, ``N:reserved=CPUSET`` or ``off``; ``ValueError`` names the bad part."""
    text = text.strip()
    if text == "off":
        return TopologySpec(zones=0)
    head, _, rest = text.partition(":")
    if not head.isdigit():
        raise ValueError(f"topology {text!r}: the number of NUMA zones must be an integer or 'off', got {head!r}")
    reserved = ""
    for option in filter(None, (o.strip() for o in rest.split(":"))):
        key, sep, value = option.partition("=")
        if key != "reserved" or not sep:
            raise ValueError(f"topology {text!r}: unknown option {option!r} (expected reserved=CPUSET)")
        reserved = value
    return TopologySpec(int(head), reserved)


def parse_node_topology(text: str) -> tuple[str, TopologySpec]:
    """``NODE=SPEC`` (the per-node override on the command line)."""
    name, sep, spec = text.partition("=")
    if not sep or not name:
        raise ValueError(f"node topology {text!r}: expected NODE=SPEC, e.g. node-0001=4:reserved=0-1")
    return name, parse_topology(spec)


def numa_layout(node: SimNode, spec: TopologySpec) -> list[NumaNode]:
    """The node's logical CPUs and memory split over ``spec.zones`` NUMA nodes as evenly as possible (the first
    zones take the remainder), consecutive CPU ids, distances 10 local / 21 remote."""
    cpus = int(node.cpu_cores)
    if spec.zones == 0:
        return []
    if cpus < spec.zones:
        raise ValueError(f"node {node.name}: {cpus} CPUs cannot make {spec.zones} NUMA zones")
    listed = parse_cpuset(spec.reserved_cpus)
    if listed and max(listed) >= cpus:
        raise ValueError(f"node {node.name}: reserved CPUs {spec.reserved_cpus!r} beyond its {cpus} CPUs")
    out, first = [], 0
    for i in range(spec.zones):
        count = cpus // spec.zones + (1 if i < cpus % spec.zones else 0)
        memory = node.memory_bytes // spec.zones + (1 if i < node.memory_bytes % spec.zones else 0)
        distances = {j: 10 if i == j else 21 for j in range(spec.zones)}
        out.append(NumaNode(i, tuple(range(first, first + count)), memory, distances))
        first += count
    return out


def node_topology(node: SimNode, spec: TopologySpec, uid: str | None = None) -> dict[str, Any] | None:
    """The NRT object for ``node`` (owned by the Node ``uid`` when given), or None with zones 0."""
    if spec.zones == 0:
        return None
    return build_topology(
        node.name,
        numa_layout(node, spec),
        reserved_system_cpus=spec.reserved_cpus,
        node_labels=node.labels,
        node_uid=uid,
    )


async def install_crd(api: client.ApiClient, timeout: float = 30.0) -> None:
    """Create the NRT CRD (kept if present) and wait until it is Established."""
    await install_crd_file(api, NRT_CRD, timeout)


async def publish_fleet(
    api: client.ApiClient,
    fleet: Sequence[SimNode],
    default: TopologySpec,
    per_node: Mapping[str, TopologySpec] | None = None,
) -> int:
    """Publish the NRT of every node of ``fleet`` (after the nodes exist: each NRT is owned by its Node); returns
    how many were published. Raises for a per-node override naming a node outside the fleet."""
    per_node = dict(per_node or {})
    unknown = sorted(set(per_node) - {n.name for n in fleet})
    if unknown:
        raise ValueError(f"node topology given for nodes not in the fleet: {unknown}")
    v1 = client.CoreV1Api(api)
    nodes = await raw_json(v1.list_node(_preload_content=False, _request_timeout=TIMEOUT))
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in nodes.get("items", [])}
    objs = []
    for node in fleet:
        obj = node_topology(node, per_node.get(node.name, default), uids.get(node.name))
        if obj is not None:
            objs.append(obj)
    await publish_topologies(api, objs)
    return len(objs)
