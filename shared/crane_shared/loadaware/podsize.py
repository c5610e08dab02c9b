"""How big a pod is for the load policy, one rule for the scheduler plugin and the extender.

- DaemonSet pods are exempt from the Dynamic filter (upstream: any owner reference of kind DaemonSet).
- A pod's estimated size is its requests by kube's ``PodRequests`` rule (init containers, sidecars, pod-level
  requests, overhead); a resource without any request falls back to its pod-level limit (``spec.resources``),
  else the sum of the containers' limits, which is what the API server's defaulting (request := limit, at the
  pod level too) gives a pod it admitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crane_shared.podresources import CPU, MEMORY, pod_requests, resource_value


@dataclass(frozen=True)
class PodSize:
    cpu: float
    """cores"""
    memory: float
    """bytes"""


def is_daemonset_pod(metadata: Mapping[str, Any] | None) -> bool:
    """Owned by a DaemonSet (any owner reference of that kind, as upstream); tolerant of malformed owners."""
    owners = (metadata or {}).get("ownerReferences")
    return isinstance(owners, list) and any(isinstance(o, dict) and o.get("kind") == "DaemonSet" for o in owners)


def pod_size(spec: Mapping[str, Any] | None, requests: Mapping[str, int] | None = None) -> PodSize:
    """The pod's estimated (cores, bytes); ``requests`` may pass ``pod_requests(spec)`` when already computed.

    Raises ValueError/TypeError for unparseable quantities (callers decide whether that refuses the pod)."""
    spec = spec or {}
    if requests is None:
        requests = pod_requests(spec)
    cpu = requests.get(CPU, 0) / 1000
    memory = float(requests.get(MEMORY, 0))
    if cpu and memory:
        return PodSize(cpu, memory)
    limits = {CPU: 0, MEMORY: 0}
    for container in spec.get("containers") or ():
        for name, text in ((container.get("resources") or {}).get("limits") or {}).items():
            if name in limits:
                limits[name] += resource_value(name, text)
    for name, text in ((spec.get("resources") or {}).get("limits") or {}).items():
        if name in limits:  # kube's PodLimits: the pod-level limit replaces the containers' sum
            limits[name] = resource_value(name, text)
    return PodSize(cpu or limits[CPU] / 1000, memory or float(limits[MEMORY]))
