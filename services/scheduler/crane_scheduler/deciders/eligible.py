"""Which pods a decider worker may decide: pure functions over the pod and its profile.

A worker's replica holds nodes, placed pods, nominations and the objects the plugins watch; it does not hold
the state Reserve plugins keep for volumes, claims, NUMA zones or gangs. So a worker decides a pod only when
its decision reads nothing else: its profile's plugins are ones whose inputs the replica has (``REPLICATED``, or a
plugin that replays its own Reserve on the replica, ``replicated_reserve``), and the pod has no claim, no
volume that binds, no gang, no nomination and only resources the node itself offers. Everything else goes
through the whole cycle in the scheduling process, unchanged. The answer is a reason (for the metrics' label
and the debug log), or None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crane_scheduler.framework.runtime import Profile
from crane_scheduler.podinfo import PodInfo

REPLICATED = frozenset(
    {
        "PrioritySort",
        "NodeUnschedulable",
        "NodeName",
        "NodeDeclaredFeatures",
        "TaintToleration",
        "NodeAffinity",
        "NodePorts",
        "NodeResourcesFit",
        "NodeResourcesBalancedAllocation",
        "VolumeRestrictions",
        "NodeVolumeLimits",
        "VolumeBinding",
        "VolumeZone",
        "DynamicResources",
        "DefaultPreemption",
        "InterPodAffinity",
        "PodTopologySpread",
        "ImageLocality",
        "DefaultBinder",
    }
)
"""kube's plugins: for a pod without claims and bound volumes, they read only nodes, placed pods and their
watched objects (namespaces, the owners of default spread constraints), all of which the replica holds;
VolumeBinding's and DynamicResources' Reserve do nothing for such a pod"""

PLAIN_VOLUMES = frozenset({"emptyDir", "configMap", "secret", "downwardAPI", "projected", "hostPath"})
"""volume sources no scheduler plugin reads (a pod's service-account token is a projected volume)"""

NODE_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pods")
NODE_RESOURCE_PREFIXES = ("hugepages-", "crane.io/batch-")
"""resources the node's allocatable offers (crane's batch resources are node allocatable, written by the
annotator); any other extended resource may be DRA's (a DeviceClass's ``extendedResourceName``)"""


def profile_refusal(profile: Profile) -> str | None:
    """Why no pod of ``profile`` goes to a worker: a plugin whose inputs the replica lacks (NUMA zones, gangs,
    out-of-tree plugins); None when its pods may."""
    for name, plugin in profile.plugins.items():
        if name not in REPLICATED and not getattr(plugin, "replicated_reserve", False):
            return f"plugin {name}"
    return None


def pod_refusal(pod: PodInfo) -> str | None:
    """Why this pod is decided in the scheduling process; None when a worker may decide it."""
    raw = pod.raw
    spec: Mapping[str, Any] = raw.get("spec") or {}
    if spec.get("resourceClaims"):
        return "resourceClaims"
    for volume in spec.get("volumes") or ():
        if not PLAIN_VOLUMES.issuperset(k for k in volume if k != "name"):
            return "volumes"
    if (raw.get("status") or {}).get("nominatedNodeName"):
        return "nominatedNodeName"
    for resource in pod.requests:
        if resource not in NODE_RESOURCES and not resource.startswith(NODE_RESOURCE_PREFIXES):
            return "extended resource"
    return None
