"""Extended resources backed by devices (DRAExtendedResource, GA and on in 1.37): kube's
``extendeddynamicresources.go``.

A DeviceClass maps an extended resource name to itself: ``spec.extendedResourceName`` (``example.com/gpu``), and
always the implicit ``deviceclass.resource.kubernetes.io/<class name>`` (``ClassResolver``). A pod asking for
such a resource in its containers' requests gets devices through DRA on a node whose allocatable does not offer
the resource (no device plugin publishes it): the scheduler makes one claim for all such requests of the pod,
with one ``exactly`` request per container and resource (``container-<i>-request-<j>``: the container's index
among init and app containers, the resource's index among the container's sorted request names), an init
container reusing the requests of the long-lived containers after it, and the pod's
``status.extendedResourceClaimStatus`` maps each (container, resource) to its request. The claim exists only in
memory (``<extended-resources>``, a temporary uid) until PreBind creates it (``generateName``
``<pod>-extended-resources-``, owned by the pod, annotated ``resource.kubernetes.io/extended-resource-claim``).
On a node whose allocatable has the resource, NodeResourcesFit counts it as usual and no device is allocated
for it.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from crane_scheduler.plugins.dynamicresources.capacity import parse
from crane_scheduler.podinfo import NodeInfo, PodInfo

Raw = Mapping[str, Any]

CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
"""``resourceapi.ResourceDeviceClassPrefix``: every class's implicit extended resource name."""
CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
"""``resourceapi.ExtendedResourceClaimAnnotation``"""
IN_MEMORY_NAME = "<extended-resources>"
"""kube's ``specialClaimInMemName``: the claim not written yet (not a valid name, so never a real claim's)."""

REASON_CANNOT_FIT = "cannot fit resource"
REASON_STALE = "cannot schedule extended resource claim"


def is_extended_name(name: str) -> bool:
    """kube's ``IsDRAExtendedResourceName``: an extended resource name (a domain outside kubernetes.io, not a
    ``requests.`` quota name) or a class's implicit name."""
    if name.startswith(CLASS_PREFIX):
        return True
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


class ClassResolver:
    """Extended resource name -> DeviceClass (kube's ``ExtendedResourceCache``). Two classes naming the same
    resource: the newer one (``creationTimestamp``), then the lower name. kube's cache also drops the implicit
    name of an older class it learns of after a newer one with the same explicit name (the order of the
    informer's events decides there); here every class keeps its implicit name."""

    def __init__(self, classes: Mapping[str, Raw]) -> None:
        self.objects = list(classes.values())
        self.by_resource: dict[str, Raw] = {}
        explicit: dict[str, Raw] = {}
        for class_ in self.objects:
            meta = class_.get("metadata") or {}
            self.by_resource[CLASS_PREFIX + str(meta.get("name", ""))] = class_
            name = (class_.get("spec") or {}).get("extendedResourceName")
            if not name:
                continue
            have = explicit.get(name)
            if have is None or _newer(class_, have):
                explicit[name] = class_
        self.by_resource.update(explicit)

    def class_for(self, resource: str) -> Raw | None:
        return self.by_resource.get(resource)

    def backed(self, resource: str) -> bool:
        return resource in self.by_resource


def _newer(a: Raw, b: Raw) -> bool:
    ma, mb = a.get("metadata") or {}, b.get("metadata") or {}
    ta, tb = str(ma.get("creationTimestamp") or ""), str(mb.get("creationTimestamp") or "")
    if ta != tb:
        return ta > tb
    return str(ma.get("name", "")) < str(mb.get("name", ""))


_RESOLVERS: dict[int, ClassResolver] = {}


def resolver(classes: Mapping[str, Raw]) -> ClassResolver:
    """The resolver of ``classes`` (kept while the same class objects are there: the informer replaces an object
    on every change)."""
    key = id(classes)
    have = _RESOLVERS.get(key)
    values = list(classes.values())
    if have is not None and len(have.objects) == len(values) and all(map(operator.is_, have.objects, values)):
        return have
    if len(_RESOLVERS) > 16:
        _RESOLVERS.clear()
    made = _RESOLVERS[key] = ClassResolver(classes)
    return made


def has_scalar_requests(pod: PodInfo) -> bool:
    """The pod asks for something besides cpu, memory, ephemeral storage and pods: only then can a request be a
    DRA-backed extended resource (most pods: no, and the resolver is not looked at)."""
    return not _NATIVE.issuperset(pod.requests)


def backed_requests(pod: PodInfo, classes: ClassResolver) -> dict[str, int]:
    """The pod's scalar requests (kube's ``podScalarResources``) when one of them is a DRA-backed extended
    resource, else an empty dict (the pod does not use the feature)."""
    scalars = {name: value for name, value in pod.requests.items() if name not in _NATIVE}
    if any(value and is_extended_name(name) and classes.backed(name) for name, value in scalars.items()):
        return scalars
    return {}


_NATIVE = frozenset(("cpu", "memory", "ephemeral-storage", "pods"))


def find_claim(pod: PodInfo, claims: Sequence[Raw]) -> Raw | None:
    """kube's ``findExtendedResourceClaim``: the claim made for the pod in an earlier cycle (annotated, the pod
    its controlling owner)."""
    for claim in claims:
        meta = claim.get("metadata") or {}
        if (meta.get("annotations") or {}).get(CLAIM_ANNOTATION) != "true":
            continue
        for ref in meta.get("ownerReferences") or ():
            if ref.get("name") == pod.name and ref.get("controller") and ref.get("uid") == pod.uid:
                return claim
    return None


class ClaimIndex:
    """The claims made for pods' extended resources (annotated, a pod their controlling owner), by that pod's uid:
    kube's ``findExtendedResourceClaim`` without reading every claim per pod. Kept by the claims changed since the
    last lookup (the lister's ``changed_keys``), or recounted whole without them."""

    def __init__(self, changed: set[str] | None = None) -> None:
        self.changed = changed
        self.by_uid: dict[str, str] = {}
        self.uid_of: dict[str, str] = {}
        self._seen = False

    def update(self, claims: Mapping[str, Raw]) -> None:
        if self.changed is not None and self._seen:
            keys = list(self.changed)
            self.changed.clear()
        else:
            keys = [*claims, *self.uid_of]
            if self.changed is not None:
                self.changed.clear()
                self._seen = True
        for key in keys:
            old = self.uid_of.pop(key, None)
            if old is not None and self.by_uid.get(old) == key:
                del self.by_uid[old]
            claim = claims.get(key)
            meta = (claim or {}).get("metadata") or {}
            if claim is None or (meta.get("annotations") or {}).get(CLAIM_ANNOTATION) != "true":
                continue
            for ref in meta.get("ownerReferences") or ():
                if ref.get("controller") and ref.get("uid"):
                    self.by_uid[str(ref["uid"])] = key
                    self.uid_of[key] = str(ref["uid"])

    def key_of(self, pod: PodInfo, claims: Mapping[str, Raw]) -> str | None:
        self.update(claims)
        return self.by_uid.get(pod.uid)


def in_memory_claim(pod: PodInfo) -> dict[str, Any]:
    """The claim kube keeps in memory until PreBind writes it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "namespace": pod.namespace,
            "name": IN_MEMORY_NAME,
            "uid": str(uuid.uuid4()),
            "generateName": f"{pod.name}-extended-resources-",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid, "controller": True}
            ],
            "annotations": {CLAIM_ANNOTATION: "true"},
        },
        "spec": {"devices": {}},
    }


def is_in_memory(claim: Raw) -> bool:
    return (claim.get("metadata") or {}).get("name") == IN_MEMORY_NAME


def has_requests(claim: Raw) -> bool:
    """Whether a claim has ``spec.devices.requests`` (kube: non-nil)."""
    return ((claim.get("spec") or {}).get("devices") or {}).get("requests") is not None


@dataclass(frozen=True, slots=True)
class NodeRequests:
    """What a node needs the claim to allocate: the DRA-backed resources (sorted name -> quantity)."""

    resources: tuple[tuple[str, int], ...]


def node_requests(scalars: Mapping[str, int], node: NodeInfo, classes: ClassResolver) -> NodeRequests | str:
    """kube's ``filterExtendedResources`` for a node: the resources the claim must allocate there (those backed by
    a class the node's allocatable does not offer), or the reason the node cannot take the pod."""
    wanted: list[tuple[str, int]] = []
    for name, quantity in scalars.items():
        if not is_extended_name(name) or quantity == 0:
            continue
        allocatable = node.allocatable.get(name)
        if classes.backed(name) and not allocatable:
            wanted.append((name, quantity))
        elif allocatable is None:
            return REASON_CANNOT_FIT
    return NodeRequests(tuple(sorted(wanted)))


def node_claim(claim: Raw, pod: Raw, wanted: NodeRequests, classes: ClassResolver) -> tuple[dict[str, Any], list[Any]]:
    """The claim a node needs (``claim`` with the requests) and the container-to-request mappings."""
    requests, mappings = requests_and_mappings(pod, dict(wanted.resources), classes)
    spec = dict(claim.get("spec") or {})
    devices = dict(spec.get("devices") or {})
    if requests:
        devices["requests"] = requests
    else:
        devices.pop("requests", None)
    return {**claim, "spec": {**spec, "devices": devices}}, mappings


def _as_int64(raw: Any) -> int | None:
    """``Quantity.AsInt64``: the value when it is a whole number, else None."""
    try:
        value = parse(raw).value
    except ValueError:
        return None
    return int(value) if value == value.to_integral_value() else None


def _request_and_mappings(
    index: int, container: Raw, resource: str, class_name: str, reusable: Sequence[dict[str, Any] | None]
) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """kube's ``createResourceRequestAndMappings``."""
    requests = (container.get("resources") or {}).get("requests")
    if not requests or resource not in requests:
        return None, []
    wanted = _as_int64(requests[resource])
    if not wanted:
        return None, []
    mappings: list[dict[str, str]] = []
    total = 0
    name = str(container.get("name", ""))
    for r in reusable:
        if r is None:
            continue
        total += int(r["exactly"]["count"])
        mappings.append({"containerName": name, "resourceName": resource, "requestName": r["name"]})
        if total >= wanted:
            return None, mappings
    position = sorted(requests).index(resource)
    request_name = f"container-{index}-request-{position}"
    request = {
        "name": request_name,
        "exactly": {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": wanted - total},
    }
    mappings.append({"containerName": name, "resourceName": resource, "requestName": request_name})
    return request, mappings


def requests_and_mappings(
    pod: Raw, resources: Mapping[str, int], classes: ClassResolver
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """kube's ``createRequestsAndMappings``: the claim's requests (sorted by name) and the mappings (per resource:
    the long-lived containers', then the init containers')."""
    spec = pod.get("spec") or {}
    inits = list(spec.get("initContainers") or ())
    containers = [*inits, *(spec.get("containers") or ())]
    long_lived = [i for i, c in enumerate(containers) if i >= len(inits) or c.get("restartPolicy") == "Always"]
    short_lived = [i for i in range(len(inits)) if containers[i].get("restartPolicy") != "Always"]
    out_requests: list[dict[str, Any]] = []
    out_mappings: list[dict[str, str]] = []
    for resource in sorted(resources):
        class_ = classes.class_for(resource)
        if class_ is None:
            continue
        class_name = str((class_.get("metadata") or {}).get("name", ""))
        long_requests: list[dict[str, Any] | None] = [None] * len(containers)
        long_mappings: list[dict[str, str]] = []
        for i in long_lived:
            request, mapped = _request_and_mappings(i, containers[i], resource, class_name, [])
            long_requests[i] = request
            long_mappings.extend(mapped)
        short_max: dict[str, Any] | None = None
        short_names: set[str] = set()
        short_mappings: list[dict[str, str]] = []
        for i in short_lived:
            request, mapped = _request_and_mappings(i, containers[i], resource, class_name, long_requests[i:])
            if request is not None:
                short_names.add(request["name"])
                if short_max is None or short_max["exactly"]["count"] < request["exactly"]["count"]:
                    short_max = request
            short_mappings.extend(mapped)
        if short_max is not None and len(short_names) > 1:
            short_names.discard(short_max["name"])
            for m in short_mappings:
                if m["requestName"] in short_names:
                    m["requestName"] = short_max["name"]
        if short_max is not None:
            out_requests.append(short_max)
        out_requests.extend(r for r in long_requests if r is not None)
        out_mappings.extend(long_mappings)
        out_mappings.extend(short_mappings)
    out_requests.sort(key=lambda r: r["name"])
    return out_requests, out_mappings
