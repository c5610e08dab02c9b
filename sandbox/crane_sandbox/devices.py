"""Simulated GPUs of the sandbox's nodes: the ResourceSlices (resource.k8s.io/v1) a DRA driver's kubelet plugin
would publish for them, and the DeviceClass that selects them.

KWOK's kubelets run no DRA driver, so the sandbox publishes what one would: per node one ResourceSlice of driver
``gpu.sandbox.crane.io``, pool = the node's name, ``count`` devices ``gpu-0``... with attributes ``model``,
``numa`` (the device's NUMA zone, spread over the node's zones like its CPUs) and capacity ``memory``. Each slice
is owned by its Node (``ownerReferences`` with the node's uid), so the garbage collector deletes it with the node.
The DeviceClass ``gpu`` selects the driver's devices by CEL (``device.driver == "gpu.sandbox.crane.io"``); a
ResourceClaimTemplate asking for ``deviceClassName: gpu`` gets one of them. Nothing runs on the devices: claims
are allocated by the scheduler, reserved for their pod, and freed by kube-controller-manager's resourceclaim
controller once the pod is gone.

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
MODEL = "sim-gpu-80g"
MEMORY = "80Gi"
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
    numa = index * max(zones, 1) // count
    return {
        "name": f"gpu-{index}",
        "attributes": {"model": {"string": MODEL}, "numa": {"int": numa}, "index": {"int": index}},
        "capacity": {"memory": {"value": MEMORY}},
    }


def node_slice(node: str, count: int, zones: int, uid: str | None = None) -> dict[str, Any]:
    """The ResourceSlice of ``node``'s ``count`` GPUs (owned by the Node ``uid`` when given)."""
    metadata: dict[str, Any] = {"name": f"{node}-{DRIVER}"}
    if uid is not None:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [gpu(i, count, zones) for i in range(count)],
        },
    }


def device_class() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
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
    bodies = [device_class()] + [node_slice(n, c, zones, uids.get(n)) for n, c in counts.items() if c]
    for body in bodies:
        create = resource.create_device_class if body["kind"] == "DeviceClass" else resource.create_resource_slice
        try:
            await raw_json(create(body, _preload_content=False, _request_timeout=TIMEOUT))
        except ApiException as err:
            if err.status != 409:  # kept if present (a restarted sandbox on the same cluster)
                raise
    return sum(counts.values())
