"""Simulated GPUs of the sandbox's nodes: the ResourceSlices (resource.k8s.io/v1) a DRA driver's kubelet plugin
would publish for them, and the DeviceClasses that select them.

KWOK's kubelets run no DRA driver, so the sandbox publishes what one would, per node with ``count`` GPUs, in one
pool (the node's name) of two slices:

- ``<node>-gpu.sandbox.crane.io``: the GPUs ``gpu-0``... with attributes ``model``, ``numa`` (the device's NUMA
  zone, spread over the node's zones like its CPUs), ``index``, ``partition`` (``whole``) and capacity ``memory``.
  The last GPU is partitionable (DRAPartitionableDevices, on in 1.37): besides ``gpu-<n>`` itself it is published
  as four partitions ``gpu-<n>-p0``..``p3`` (``partition: quarter``, 20Gi each), all consuming the GPU's counters
  (memory 80Gi, slices 4), so a partition taken leaves the whole GPU unallocatable and the whole GPU taken leaves
  no partition. The first node with GPUs also has a spare ``gpu-<count>`` tainted ``sandbox.crane.io/unhealthy``
  (NoSchedule, DRADeviceTaints): no claim gets it unless a request tolerates the taint.
- ``<node>-gpu.sandbox.crane.io-counters``: the counter sets of the partitionable GPU (``sharedCounters``).

Each slice is owned by its Node (``ownerReferences`` with the node's uid), so the garbage collector deletes it
with the node. The DeviceClass ``gpu`` selects the whole GPUs and maps the extended resource ``example.com/gpu``
(DRAExtendedResource, GA in 1.37): a pod asking ``example.com/gpu: 1`` in its resources, on these nodes where no
device plugin publishes it, gets one through a claim the scheduler makes; ``gpu-partition`` selects the
partitions. A ResourceClaimTemplate asking for ``deviceClassName: gpu`` gets a whole GPU. Nothing runs on the
devices: claims are allocated by the scheduler, reserved for their pod, and freed by kube-controller-manager's
resourceclaim controller once the pod is gone.

Command line form (``parse_devices``)::

    gpu=8     eight GPUs on the node (``gpu=0``: none)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_sandbox.fleet import SimNode
from crane_shared.kube import raw_json

DRIVER = "gpu.sandbox.crane.io"
DEVICE_CLASS = "gpu"
PARTITION_CLASS = "gpu-partition"
EXTENDED_RESOURCE = "example.com/gpu"
MODEL = "sim-gpu-80g"
MEMORY = "80Gi"
PARTITIONS = 4
PARTITION_MEMORY = "20Gi"
TAINT = {"key": "sandbox.crane.io/unhealthy", "value": "ecc-errors", "effect": "NoSchedule"}
TIMEOUT = 10.0


def parse_devices(text: str) -> int:
    """``gpu=N`` -> N; ``ValueError`` names the bad part."""
    kind, sep, count = text.strip().partition("=")
    if not sep or kind.strip() != "gpu":
        raise ValueError(f"devices {text!r}: expected gpu=COUNT, e.g. gpu=8")
    if not count.strip().isdigit():
        raise ValueError(f"devices {text!r}: the number of GPUs must be a non-negative integer, got {count!r}")
    return int(count)


def parse_node_devices(text: str) -> tuple[str, int]:
    """``NODE=gpu=N`` (the per-node override on the command line)."""
    name, sep, spec = text.partition("=")
    if not sep or not name or "=" not in spec:
        raise ValueError(f"node devices {text!r}: expected NODE=gpu=COUNT, e.g. node-0003=gpu=0")
    return name, parse_devices(spec)


def gpu(index: int, count: int, zones: int) -> dict[str, Any]:
    """Device ``gpu-<index>`` of a node with ``count`` GPUs over ``zones`` NUMA zones (the first half on zone 0...)."""
    numa = min(index, count - 1) * max(zones, 1) // count
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "model": {"string": MODEL},
            "numa": {"int": numa},
            "index": {"int": index},
            "partition": {"string": "whole"},
        },
        "capacity": {"memory": {"value": MEMORY}},
    }


def counter_set(index: int) -> str:
    return f"gpu-{index}"


def _consumes(index: int, memory: str, slices: int) -> list[dict[str, Any]]:
    return [
        {"counterSet": counter_set(index), "counters": {"memory": {"value": memory}, "slices": {"value": str(slices)}}}
    ]


def partitions(index: int, count: int, zones: int) -> list[dict[str, Any]]:
    """The partitionable GPU ``gpu-<index>``: the whole GPU and its quarters, all consuming its counters."""
    whole = {**gpu(index, count, zones), "consumesCounters": _consumes(index, MEMORY, PARTITIONS)}
    out = [whole]
    for p in range(PARTITIONS):
        part = gpu(index, count, zones)
        part["name"] = f"gpu-{index}-p{p}"
        part["attributes"] = {**part["attributes"], "partition": {"string": "quarter"}, "parent": {"int": index}}
        part["capacity"] = {"memory": {"value": PARTITION_MEMORY}}
        part["consumesCounters"] = _consumes(index, PARTITION_MEMORY, 1)
        out.append(part)
    return out


def _metadata(name: str, node: str, uid: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if uid is not None:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]
    return metadata


def node_slices(node: str, count: int, zones: int, uid: str | None = None, spare: bool = False) -> list[dict[str, Any]]:
    """The ResourceSlices of ``node``'s ``count`` GPUs (owned by the Node ``uid`` when given): the devices (the last
    GPU partitionable; a tainted spare when ``spare``) and the partitionable GPU's counters."""
    devices = [gpu(i, count, zones) for i in range(count - 1)] + partitions(count - 1, count, zones)
    if spare:
        devices.append({**gpu(count, count, zones), "taints": [dict(TAINT)]})
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": _metadata(f"{node}-{DRIVER}", node, uid),
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, "devices": devices},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": _metadata(f"{node}-{DRIVER}-counters", node, uid),
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": pool,
                "sharedCounters": [
                    {
                        "name": counter_set(count - 1),
                        "counters": {"memory": {"value": MEMORY}, "slices": {"value": str(PARTITIONS)}},
                    }
                ],
            },
        },
    ]


def _selector(partition: str) -> list[dict[str, Any]]:
    expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].partition == "{partition}"'
    return [{"cel": {"expression": expression}}]


def device_class() -> dict[str, Any]:
    """Whole GPUs, also asked for as the extended resource ``example.com/gpu``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": _selector("whole"), "extendedResourceName": EXTENDED_RESOURCE},
    }


def partition_class() -> dict[str, Any]:
    """A quarter of a partitionable GPU."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": PARTITION_CLASS},
        "spec": {"selectors": _selector("quarter")},
    }


async def publish_devices(
    api: client.ApiClient,
    fleet: Sequence[SimNode],
    default: int,
    per_node: Mapping[str, int] | None = None,
    zones: int = 2,
) -> int:
    """Publish the DeviceClass and the ResourceSlice of every node of ``fleet`` with GPUs (after the nodes exist:
    each slice is owned by its Node); returns how many GPUs were published. Raises for a per-node override naming
    a node outside the fleet."""
    per_node = dict(per_node or {})
    unknown = sorted(set(per_node) - {n.name for n in fleet})
    if unknown:
        raise ValueError(f"node devices given for nodes not in the fleet: {unknown}")
    counts = {n.name: per_node.get(n.name, default) for n in fleet}
    if not any(counts.values()):
        return 0
    v1 = client.CoreV1Api(api)
    nodes = await raw_json(v1.list_node(_preload_content=False, _request_timeout=TIMEOUT))
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in nodes.get("items", [])}
    resource = client.ResourceV1Api(api)
    with_gpus = [n for n, c in counts.items() if c]
    bodies = [device_class(), partition_class()] + [
        s for n in with_gpus for s in node_slices(n, counts[n], zones, uids.get(n), spare=n == with_gpus[0])
    ]
    for body in bodies:
        create = resource.create_device_class if body["kind"] == "DeviceClass" else resource.create_resource_slice
        try:
            await raw_json(create(body, _preload_content=False, _request_timeout=TIMEOUT))
        except ApiException as err:
            if err.status != 409:  # kept if present (a restarted sandbox on the same cluster)
                raise
    return sum(counts.values())
