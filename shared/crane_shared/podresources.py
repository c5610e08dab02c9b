"""Resource quantities of pods, with kube's rules (component-helpers ``PodRequests``, v1.37); pure, no I/O.

Shared by the scheduler (NodeResourcesFit accounting) and the load domain (pod sizing for the usage estimate),
so both read a pod's size the same way.

Two readings of one pod, as kube-scheduler 1.37 makes them:

- ``pod_requests(spec)``: what the spec asks (an incoming pod's NodeResourcesFit request, ``UseStatusResources``
  off): max(app containers + sidecars, each init container + the sidecars before it), pod-level cpu, memory and
  hugepages requests in their place where set, plus overhead;
- ``status_requests(pod)``: what a pod holds on its node while it may be resizing in place
  (``UseStatusResources``, InPlacePodVerticalScaling GA, and InPlacePodLevelResourcesVerticalScaling, beta and on in
  1.37): per resource the max of the spec's, the allocated and the actuated aggregates (container statuses'
  ``allocatedResources`` and ``resources.requests``, or the pod-level ``status.allocatedResources`` and
  ``status.resources.requests`` where the kubelet reports those), the spec left out when the resize is Infeasible;
  pod-level requests likewise max(spec, ``status.resources.requests``, ``status.allocatedResources``). A pod whose
  status says nothing of resources reads as its spec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from crane_shared.quantity import quantity

CPU, MEMORY, EPHEMERAL, PODS = "cpu", "memory", "ephemeral-storage", "pods"
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024
HUGEPAGES_PREFIX = "hugepages-"

Json = Mapping[str, Any]
Resources = dict[str, int]


def resource_value(name: str, text: str | int | float) -> int:
    """CPU in millicores, everything else in its base unit."""
    return quantity(text, milli=name == CPU)


def resource_list(raw: Mapping[str, Any] | None) -> dict[str, int]:
    return {name: resource_value(name, value) for name, value in (raw or {}).items()}


def is_supported_pod_level_resource(name: str) -> bool:
    """component-helpers ``IsSupportedPodLevelResource``: cpu, memory and hugepages."""
    return name in (CPU, MEMORY) or name.startswith(HUGEPAGES_PREFIX)


def pod_level_requests_set(spec: Json) -> bool:
    """``IsPodLevelRequestsSet``: ``spec.resources.requests`` names a supported pod-level resource."""
    requests = (spec.get("resources") or {}).get("requests") or {}
    return any(is_supported_pod_level_resource(name) for name in requests)


def pod_level_resources_set(spec: Json) -> bool:
    """``IsPodLevelResourcesSet``: requests or limits at the pod level name a supported resource."""
    resources = spec.get("resources") or {}
    return any(is_supported_pod_level_resource(n) for key in ("requests", "limits") for n in resources.get(key) or {})


def _add(into: dict[str, int], other: Mapping[str, int] | None) -> None:
    for k, v in (other or {}).items():
        into[k] = into.get(k, 0) + v


def _max_into(into: dict[str, int], other: Mapping[str, int] | None) -> None:
    """``maxResourceList``: a name absent from ``into`` is taken whatever its value (kube's keys matter)."""
    for k, v in (other or {}).items():
        if k not in into or v > into[k]:
            into[k] = v


def _max(first: Mapping[str, int] | None, *others: Mapping[str, int] | None) -> Resources:
    out = dict(first or {})
    for other in others:
        _max_into(out, other)
    return out


def _conditions_say(status: Json, reason: str) -> bool:
    for c in status.get("conditions") or ():
        if c.get("type") == "PodResizePending":
            return bool(c.get("reason") == reason)
    return False


def resize_infeasible(status: Json) -> bool:
    """``IsPodResizeInfeasible``: the first ``PodResizePending`` condition's reason is Infeasible."""
    return _conditions_say(status, "Infeasible")


def resize_deferred(status: Json) -> bool:
    """``IsPodResizeDeferred``: the first ``PodResizePending`` condition's reason is Deferred."""
    return _conditions_say(status, "Deferred")


ContainerFn = Callable[[Json, "Json | None", bool], "Mapping[str, Any] | None"]


def _spec_requests(c: Json, cs: Json | None, infeasible: bool) -> Mapping[str, Any] | None:
    return (c.get("resources") or {}).get("requests")


def _allocated_requests(c: Json, cs: Json | None, infeasible: bool) -> Mapping[str, Any] | None:
    if cs is not None and cs.get("allocatedResources") is not None:
        return cs["allocatedResources"]  # type: ignore[no-any-return]
    return None if infeasible else _spec_requests(c, cs, infeasible)


def _actuated_requests(c: Json, cs: Json | None, infeasible: bool) -> Mapping[str, Any] | None:
    if cs is not None and (cs.get("resources") or {}).get("requests") is not None:
        return cs["resources"]["requests"]  # type: ignore[no-any-return]
    if cs is not None and cs.get("allocatedResources") is not None:
        return cs["allocatedResources"]  # type: ignore[no-any-return]
    return None if infeasible else _spec_requests(c, cs, infeasible)


def _status_of(status: Json, name: str) -> Json | None:
    """``findContainerStatus``: app container statuses first, then init container statuses."""
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or ():
            if cs.get("name") == name:
                return cs  # type: ignore[no-any-return]
    return None


def _aggregate(
    spec: Json, status: Json | None, fn: ContainerFn, non_missing: Mapping[str, int] | None, infeasible: bool
) -> Resources:
    """``aggregateContainerResourcesByFn``: the sidecar-aware init container rule over ``fn``'s list per
    container (``status`` None: no container status is looked up)."""

    def of(c: Json) -> Resources:
        res = resource_list(fn(c, None if status is None else _status_of(status, c.get("name", "")), infeasible))
        for k, v in (non_missing or {}).items():
            res.setdefault(k, v)  # ``applyNonMissing``: only what the container leaves out
        return res

    total: Resources = {}
    for c in spec.get("containers") or ():
        _add(total, of(c))
    sidecars: Resources = {}
    init_max: Resources = {}
    for c in spec.get("initContainers") or ():
        res = of(c)
        if c.get("restartPolicy") == "Always":
            _add(total, res)
            _add(sidecars, res)
            effective = sidecars
        else:
            effective = dict(res)
            _add(effective, sidecars)
        _max_into(init_max, effective)
    _max_into(total, init_max)
    return total


def _containers(
    pod: Json, use_status: bool, non_missing: Mapping[str, int] | None, pod_level_resize: bool
) -> Resources:
    """``AggregateContainerRequests``."""
    spec = pod.get("spec") or {}
    if not use_status:
        return _aggregate(spec, None, _spec_requests, non_missing, False)
    status = pod.get("status") or {}
    infeasible = resize_infeasible(status)
    spec_reqs = _aggregate(spec, status, _spec_requests, non_missing, infeasible)
    pod_status_resources = status.get("resources") or {}
    if (
        pod_level_resize
        and status.get("allocatedResources") is not None
        and pod_status_resources.get("requests") is not None
    ):
        # the kubelet's pod-level totals, when it reports them
        allocated = resource_list(status["allocatedResources"])
        actuated = resource_list(pod_status_resources["requests"])
    else:
        allocated = _aggregate(spec, status, _allocated_requests, non_missing, infeasible)
        actuated = _aggregate(spec, status, _actuated_requests, non_missing, infeasible)
    return _max(actuated, allocated) if infeasible else _max(spec_reqs, actuated, allocated)


def pod_requests_of(
    pod: Json,
    *,
    use_status: bool,
    non_missing: Mapping[str, int] | None = None,
    pod_level_resize: bool = True,
    skip_pod_level: bool = False,
) -> Resources:
    """component-helpers ``PodRequests`` (v1.37) over a pod's JSON: ``use_status`` is ``UseStatusResources``,
    ``pod_level_resize`` ``InPlacePodLevelResourcesVerticalScalingEnabled`` (on in 1.37), ``non_missing``
    ``NonMissingContainerRequests`` (filled in per container where it states nothing), ``skip_pod_level``
    ``SkipPodLevelResources``. Keys are kube's: a resource some container states as 0 is present with 0."""
    spec = pod.get("spec") or {}
    reqs = _containers(pod, use_status, non_missing, pod_level_resize)
    if not skip_pod_level and pod_level_requests_set(spec):
        effective = resource_list((spec.get("resources") or {}).get("requests"))
        status = pod.get("status") or {}
        pod_status_resources = status.get("resources")
        if pod_level_resize and use_status and pod_status_resources is not None:
            # ``effectivePodLevelResources``: max(spec unless Infeasible, actuated, allocated)
            effective = _max(
                None if resize_infeasible(status) else effective,
                resource_list((pod_status_resources or {}).get("requests")),
                resource_list(status.get("allocatedResources")),
            )
        for name, value in effective.items():
            if is_supported_pod_level_resource(name):
                reqs[name] = value
    _add(reqs, resource_list(spec.get("overhead")))
    return reqs


def pod_requests(spec: Json, non_missing: Mapping[str, int] | None = None) -> Resources:
    """``PodRequests`` of a spec (no status): the sidecar-aware init container rule, pod-level requests, overhead.

    ``non_missing`` fills in requests a container does not state (the scoring-only 100m/200Mi defaults)."""
    return pod_requests_of({"spec": spec}, use_status=False, non_missing=non_missing)


NON_MISSING = {CPU: DEFAULT_MILLI_CPU_REQUEST, MEMORY: DEFAULT_MEMORY_REQUEST}
"""kube-scheduler's defaults for a container without a cpu or memory request, in scoring only"""


def non_missing_for(requests: Mapping[str, int], spec: Json) -> dict[str, int]:
    """kube-scheduler's ``getNonMissingContainerRequests`` for a pod on a node: both defaults, or with pod-level
    requests only those of a resource the pod's requests do not name at all (the pod level speaks for the rest)."""
    if not pod_level_requests_set(spec):
        return dict(NON_MISSING)
    return {k: v for k, v in NON_MISSING.items() if k not in requests}


def resize_status_present(pod: Json) -> bool:
    """Whether the pod's status could make ``status_requests`` differ from its spec's requests: resources in a
    container status or at the pod level, or a PodResizePending condition. Most pods have none (a pending pod
    never), and then one reading serves both."""
    status = pod.get("status") or {}
    if status.get("resources") is not None or status.get("allocatedResources") is not None:
        return True
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or ():
            if cs.get("allocatedResources") is not None or (cs.get("resources") or {}).get("requests") is not None:
                return True
    return any(c.get("type") == "PodResizePending" for c in status.get("conditions") or ())
