"""Resource quantities of pods, with kube's rules (component-helpers ``PodRequests``); pure, no I/O.

Shared by the scheduler (NodeResourcesFit accounting) and the load domain (pod sizing for the usage estimate),
so both read a pod's size the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crane_shared.quantity import quantity

CPU, MEMORY, EPHEMERAL, PODS = "cpu", "memory", "ephemeral-storage", "pods"
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024


def resource_value(name: str, text: str | int | float) -> int:
    """CPU in millicores, everything else in its base unit."""
    return quantity(text, milli=name == CPU)


def resource_list(raw: Mapping[str, Any] | None) -> dict[str, int]:
    return {name: resource_value(name, value) for name, value in (raw or {}).items()}


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max_into(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        if v > into.get(k, 0):
            into[k] = v


def pod_requests(spec: Mapping[str, Any], non_missing: Mapping[str, int] | None = None) -> dict[str, int]:
    """component-helpers ``PodRequests``: sidecar-aware init container rule, pod-level requests, overhead.

    ``non_missing`` fills in requests a container does not state (the scoring-only 100m/200Mi defaults)."""

    def container_reqs(c: Mapping[str, Any]) -> dict[str, int]:
        reqs = resource_list((c.get("resources") or {}).get("requests"))
        for k, v in (non_missing or {}).items():
            reqs.setdefault(k, v)
        return reqs

    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        _add(total, container_reqs(c))
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for c in spec.get("initContainers") or ():
        reqs = container_reqs(c)
        if c.get("restartPolicy") == "Always":
            _add(total, reqs)
            _add(sidecars, reqs)
            effective = dict(sidecars)
        else:
            effective = dict(reqs)
            _add(effective, sidecars)
        _max_into(init_max, effective)
    _max_into(total, init_max)
    pod_level = (spec.get("resources") or {}).get("requests")
    if pod_level:
        for k, v in resource_list(pod_level).items():
            if k in (CPU, MEMORY) or k.startswith("hugepages-"):
                total[k] = v
    if spec.get("overhead"):
        _add(total, resource_list(spec["overhead"]))
    return total
