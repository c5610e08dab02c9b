"""Pods and nodes as the scheduler needs them, parsed once from the API's JSON.

Informers hand us raw JSON dicts (no kubernetes-asyncio models: deserialising a V1Pod costs more than a whole
scheduling decision). Everything a plugin asks about a pod on every cycle (requests, tolerations, affinity, host
ports) is computed here once per pod update, with kube-scheduler's rules:

- requests: max(sum of app containers + sidecars, each init container + the sidecars started before it), then
  pod-level requests where set, plus overhead (component-helpers ``PodRequests``), read with the pod's status as
  kube-scheduler 1.37 reads a pod on a node (``UseStatusResources``: a pod resizing in place holds the max of its
  spec, allocated and actuated resources, ``crane_shared.podresources.status_requests``); ``fit_requests`` is the
  spec's reading, NodeResourcesFit's request for the pod being scheduled (the same dict unless the status speaks
  of resources);
- the non-zero variants used only for scoring count a container without a cpu/memory request as 100m / 200Mi:
  ``nonzero_*`` as a pod on a node is counted (kube's ``PodInfo.CalculateResource``: with pod-level requests only
  for a resource the pod names nowhere); ``score_requests`` and ``score_nonzero_*`` as NodeResourcesFit's Score
  reads the pod being scheduled: kube's Fit never gives its scorer the PodLevelResources and in-place resize
  options (BalancedAllocation does), so it reads the containers' requests of the spec, both defaults, overhead,
  and no pod-level request (the same dict as ``requests`` for a pod without pod-level requests or status).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from crane_shared.podresources import CPU as CPU
from crane_shared.podresources import DEFAULT_MEMORY_REQUEST as DEFAULT_MEMORY_REQUEST
from crane_shared.podresources import DEFAULT_MILLI_CPU_REQUEST as DEFAULT_MILLI_CPU_REQUEST
from crane_shared.podresources import EPHEMERAL as EPHEMERAL
from crane_shared.podresources import MEMORY as MEMORY
from crane_shared.podresources import (
    NON_MISSING,
    non_missing_for,
    pod_level_requests_set,
    pod_requests_of,
    resize_status_present,
)
from crane_shared.podresources import PODS as PODS
from crane_shared.podresources import pod_requests as pod_requests
from crane_shared.podresources import resource_list as resource_list
from crane_shared.podresources import resource_value as resource_value


def is_scalar_resource(name: str) -> bool:
    """Extended resources, hugepages and attachable volumes: the ``ScalarResources`` of kube-scheduler."""
    return name not in (CPU, MEMORY, EPHEMERAL, PODS)


# ---------------------------------------------------------------------------------------------- taints


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """core/v1 ``Toleration.ToleratesTaint``: empty effect or key match all; Exists ignores the value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


def tolerated(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    return any(t.tolerates(taint) for t in tolerations)


# ---------------------------------------------------------------------------------------------- affinity


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions``/``matchFields`` entry; ``field`` marks a ``metadata.name`` requirement."""

    key: str
    operator: str
    values: tuple[str, ...]
    field: bool = False


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """Requirements ANDed; ``valid`` False when the term cannot parse (kube: matches nothing)."""

    requirements: tuple[Requirement, ...]
    valid: bool = True


@dataclass(frozen=True, slots=True)
class PreferredTerm:
    weight: int
    term: SelectorTerm


def _valid_requirement(r: Requirement) -> bool:
    if r.field:
        return r.key == "metadata.name" and r.operator in ("In", "NotIn") and len(r.values) == 1
    if r.operator in ("In", "NotIn"):
        return len(r.values) > 0
    if r.operator in ("Exists", "DoesNotExist"):
        return not r.values
    if r.operator in ("Gt", "Lt"):
        return len(r.values) == 1 and parse_int(r.values[0]) is not None
    return False


def parse_int(text: str) -> int | None:
    try:
        return int(text, 10) if re.fullmatch(r"[+-]?\d+", text) else None
    except ValueError:  # pragma: no cover
        return None


def parse_term(raw: Mapping[str, Any] | None) -> SelectorTerm | None:
    """A NodeSelectorTerm; None for an empty term, which kube-scheduler skips (it selects no node)."""
    raw = raw or {}
    reqs = [
        Requirement(e.get("key", ""), e.get("operator", ""), tuple(e.get("values") or ()), field=is_field)
        for key, is_field in (("matchExpressions", False), ("matchFields", True))
        for e in raw.get(key) or ()
    ]
    if not reqs:
        return None
    return SelectorTerm(tuple(reqs), valid=all(_valid_requirement(r) for r in reqs))


# ---------------------------------------------------------------------------------------------- pods


@dataclass(frozen=True, slots=True)
class HostPort:
    ip: str
    protocol: str
    port: int

    def conflicts(self, other: HostPort) -> bool:
        """Same protocol and port, and either side bound to all addresses or both to the same one."""
        return (
            self.port == other.port
            and self.protocol == other.protocol
            and (self.ip == other.ip or "0.0.0.0" in (self.ip, other.ip))
        )


@dataclass(slots=True)
class PodInfo:
    """What the scheduler reads from a pod; ``raw`` keeps the API object for plugins that need more."""

    uid: str
    namespace: str
    name: str
    scheduler_name: str
    node_name: str
    priority: int
    generation: int
    deleting: bool
    gated: bool
    requests: dict[str, int]
    nonzero_cpu: int
    nonzero_memory: int
    fit_requests: dict[str, int]
    score_requests: dict[str, int]
    score_nonzero_cpu: int
    score_nonzero_memory: int
    host_ports: tuple[HostPort, ...]
    tolerations: tuple[Toleration, ...]
    node_selector: dict[str, str]
    required_terms: tuple[SelectorTerm, ...] | None
    preferred_terms: tuple[PreferredTerm, ...]
    scheduled_condition: tuple[str, str, str] | None  # (status, reason, message) of PodScheduled
    scheduled_at: str | None  # lastTransitionTime of PodScheduled=True (set by the API on binding)
    raw: dict[str, Any] = field(repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def spec_equal(self, other: PodInfo) -> bool:
        """Did anything the scheduler reads change (spec, labels, annotations)? Status-only updates do not count."""
        a, b = self.raw, other.raw
        am, bm = a.get("metadata", {}), b.get("metadata", {})
        return bool(
            a.get("spec") == b.get("spec")
            and am.get("labels") == bm.get("labels")
            and am.get("annotations") == bm.get("annotations")
        )


def _host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    containers = [c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"]
    containers += list(spec.get("containers") or ())
    return tuple(
        HostPort(p.get("hostIP") or "0.0.0.0", p.get("protocol") or "TCP", int(p["hostPort"]))
        for c in containers
        for p in c.get("ports") or ()
        if int(p.get("hostPort") or 0) > 0
    )


def _states_cpu_and_memory(spec: Mapping[str, Any]) -> bool:
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or ():
            requests = (c.get("resources") or {}).get("requests") or {}
            if CPU not in requests or MEMORY not in requests:
                return False
    return True


@dataclass(frozen=True, slots=True)
class _Sizes:
    requests: dict[str, int]
    nonzero: tuple[int, int]
    fit_requests: dict[str, int]
    score_requests: dict[str, int]
    score_nonzero: tuple[int, int]


def _nonzero(reqs: Mapping[str, int]) -> tuple[int, int]:
    return reqs.get(CPU, 0), reqs.get(MEMORY, 0)


def _sizes(raw: Mapping[str, Any], spec: Mapping[str, Any]) -> _Sizes:
    """The pod's readings (module docstring), each computed once; most pods need one or two passes: without
    resources in their status the spec's reading is the status', and a pod whose containers state cpu and memory
    has no default to fill in."""
    with_status = resize_status_present(raw)
    spec_reqs = pod_requests_of(raw, use_status=False)
    stated = pod_requests_of(raw, use_status=True) if with_status else spec_reqs
    # a status' lists (allocated, actuated) may leave out what the spec states: the shortcut is the spec's only
    states_both = not with_status and _states_cpu_and_memory(spec)
    missing = non_missing_for(stated, spec)
    if not missing or states_both:
        nonzero = _nonzero(stated)
    else:
        nonzero = _nonzero(pod_requests_of(raw, use_status=with_status, non_missing=missing))
    requests = {k: v for k, v in stated.items() if v}
    fit = requests if not with_status else {k: v for k, v in spec_reqs.items() if v}
    if with_status or pod_level_requests_set(spec):  # NodeResourcesFit's Score reads neither
        scored = pod_requests_of(raw, use_status=False, non_missing=NON_MISSING, skip_pod_level=True)
        return _Sizes(requests, nonzero, fit, {k: v for k, v in scored.items() if v}, _nonzero(scored))
    score_nonzero = nonzero  # no pod-level requests: both defaults for a placed pod too
    return _Sizes(requests, nonzero, fit, requests, score_nonzero)


def parse_pod(raw: dict[str, Any]) -> PodInfo:
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    sizes = _sizes(raw, spec)
    node_aff = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_aff.get("requiredDuringSchedulingIgnoredDuringExecution")
    required_terms = None
    if required is not None:
        required_terms = tuple(t for t in map(parse_term, required.get("nodeSelectorTerms") or ()) if t)
    preferred = tuple(
        PreferredTerm(int(p.get("weight") or 0), t)
        for p in node_aff.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
        if int(p.get("weight") or 0) != 0 and (t := parse_term(p.get("preference"))) is not None and t.valid
    )
    cond = scheduled_condition(raw)
    return PodInfo(
        uid=meta.get("uid", ""),
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        scheduler_name=spec.get("schedulerName") or "default-scheduler",
        node_name=spec.get("nodeName") or "",
        priority=int(spec.get("priority") or 0),
        generation=int(meta.get("generation") or 0),
        deleting=bool(meta.get("deletionTimestamp")),
        gated=bool(spec.get("schedulingGates")),
        requests=sizes.requests,
        nonzero_cpu=sizes.nonzero[0],
        nonzero_memory=sizes.nonzero[1],
        fit_requests=sizes.fit_requests,
        score_requests=sizes.score_requests,
        score_nonzero_cpu=sizes.score_nonzero[0],
        score_nonzero_memory=sizes.score_nonzero[1],
        host_ports=_host_ports(spec),
        tolerations=tuple(
            Toleration(t.get("key") or "", t.get("operator") or "Equal", t.get("value") or "", t.get("effect") or "")
            for t in spec.get("tolerations") or ()
        ),
        node_selector=dict(spec.get("nodeSelector") or {}),
        required_terms=required_terms,
        preferred_terms=preferred,
        scheduled_condition=(cond.get("status", ""), cond.get("reason", ""), cond.get("message", "")) if cond else None,
        scheduled_at=cond.get("lastTransitionTime") if cond and cond.get("status") == "True" else None,
        raw=raw,
    )


_SAME_METADATA = ("uid", "name", "namespace", "generation", "deletionTimestamp", "labels", "annotations")


def bound_version(pending: PodInfo, raw: dict[str, Any]) -> PodInfo | None:
    """``parse_pod(raw)`` for ``raw``, the bound object of the pending pod ``pending``, read from ``pending``'s
    readings where the bind changed nothing they come from; None when something else changed (parse it).

    The API server's binding sets ``spec.nodeName`` and the PodScheduled condition (and a new resourceVersion):
    every reading but the node and the condition is then the pending version's. The informer confirming an
    assumption does this once per pod on the scheduling process's critical path, where a full parse is among its
    larger costs; the comparisons below are C-level dict and list equality."""
    spec, before = raw.get("spec") or {}, pending.raw.get("spec") or {}
    node = spec.get("nodeName")
    if not node or before.get("nodeName") or len(spec) != len(before) + 1:
        return None
    rest = spec.copy()  # the spec less its node, compared as a whole (in C, not key by key)
    del rest["nodeName"]
    if rest != before:
        return None
    meta, old_meta = raw.get("metadata") or {}, pending.raw.get("metadata") or {}
    for key in _SAME_METADATA:
        if meta.get(key) != old_meta.get(key):
            return None
    if resize_status_present(raw) or resize_status_present(pending.raw):
        return None  # the status' resources are readings too
    cond = scheduled_condition(raw)
    return PodInfo(
        uid=pending.uid,
        namespace=pending.namespace,
        name=pending.name,
        scheduler_name=pending.scheduler_name,
        node_name=str(node),
        priority=pending.priority,
        generation=pending.generation,
        deleting=pending.deleting,
        gated=pending.gated,
        requests=pending.requests,
        nonzero_cpu=pending.nonzero_cpu,
        nonzero_memory=pending.nonzero_memory,
        fit_requests=pending.fit_requests,
        score_requests=pending.score_requests,
        score_nonzero_cpu=pending.score_nonzero_cpu,
        score_nonzero_memory=pending.score_nonzero_memory,
        host_ports=pending.host_ports,
        tolerations=pending.tolerations,
        node_selector=pending.node_selector,
        required_terms=pending.required_terms,
        preferred_terms=pending.preferred_terms,
        scheduled_condition=(cond.get("status", ""), cond.get("reason", ""), cond.get("message", "")) if cond else None,
        scheduled_at=cond.get("lastTransitionTime") if cond and cond.get("status") == "True" else None,
        raw=raw,
    )


UNSCHEDULABLE = "Unschedulable"
"""PodScheduled=False's reason when no node fits (kube's ``v1.PodReasonUnschedulable``)"""
SCHEDULER_ERROR = "SchedulerError"
"""... when the attempt failed for another reason (``v1.PodReasonSchedulerError``)"""


def scheduled_condition(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """The object's PodScheduled condition, if it has one."""
    conditions = (raw.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if c.get("type") == "PodScheduled"), None)


def bound_object(
    assumed: dict[str, Any], node: str, resource_version: str, condition: dict[str, Any] | None
) -> dict[str, Any]:
    """The bound pod's object rebuilt from the pending one ``assumed`` and what a bind changes: ``spec.nodeName``,
    the resourceVersion and the PodScheduled condition (replaced where it was, else added). For a pod whose bound
    version ``bound_version`` read from ``assumed``, every reading of the result is the bound object's (its
    ``managedFields`` are the pending one's: nothing reads them)."""
    meta = {**(assumed.get("metadata") or {}), "resourceVersion": resource_version}
    spec = {**(assumed.get("spec") or {}), "nodeName": node}
    status = dict(assumed.get("status") or {})
    old = list(status.get("conditions") or ())
    at = next((i for i, c in enumerate(old) if c.get("type") == "PodScheduled"), len(old))
    conditions = [*old[:at], *([condition] if condition is not None else []), *old[at + 1 :]]
    if conditions or "conditions" in status:
        status["conditions"] = conditions
    return {**assumed, "metadata": meta, "spec": spec, "status": status}


def unscheduled_condition(pod: PodInfo, reason: str, message: str) -> dict[str, Any]:
    """PodScheduled=False as kube's ``updatePod`` writes it after a failed attempt (for a strategic merge patch of
    the pod's status: conditions merge by type)."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": reason,
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "observedGeneration": pod.generation or None,
    }


# ---------------------------------------------------------------------------------------------- nodes


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    allocatable: Mapping[str, int]
    raw: dict[str, Any] = field(repr=False, compare=False)
    declared_features: tuple[str, ...] = ()
    """``status.declaredFeatures`` as the node states them (NodeDeclaredFeatures reads the ones it knows)"""


def parse_node(raw: dict[str, Any]) -> NodeInfo:
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    return NodeInfo(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        taints=tuple(
            Taint(t.get("key", ""), t.get("value") or "", t.get("effect", "")) for t in spec.get("taints") or ()
        ),
        unschedulable=bool(spec.get("unschedulable")),
        allocatable=resource_list(status.get("allocatable")),
        raw=raw,
        declared_features=tuple(status.get("declaredFeatures") or ()),
    )
