"""Pods and nodes as the scheduler needs them, parsed once from the API's JSON.

Informers hand us raw JSON dicts (no kubernetes-asyncio models: deserialising a V1Pod costs more than a whole
scheduling decision). Everything a plugin asks about a pod on every cycle (requests, tolerations, affinity, host
ports) is computed here once per pod update, with kube-scheduler's rules:

- requests: max(sum of app containers + sidecars, each init container + the sidecars started before it), then
  pod-level requests where set, plus overhead (component-helpers ``PodRequests``);
- the non-zero variant used only for scoring counts a container without a cpu/memory request as 100m / 200Mi.
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


_NON_MISSING = {CPU: DEFAULT_MILLI_CPU_REQUEST, MEMORY: DEFAULT_MEMORY_REQUEST}


def _states_cpu_and_memory(spec: Mapping[str, Any]) -> bool:
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or ():
            requests = (c.get("resources") or {}).get("requests") or {}
            if CPU not in requests or MEMORY not in requests:
                return False
    return True


def parse_pod(raw: dict[str, Any]) -> PodInfo:
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    stated = pod_requests(spec)
    requests = {k: v for k, v in stated.items() if v}
    # The scoring defaults fill in only what a container leaves out: when every container states both, they are
    # the stated requests (most pods; one pass over the containers instead of two).
    nonzero = stated if _states_cpu_and_memory(spec) else pod_requests(spec, _NON_MISSING)
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
    cond = next((c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"), None)
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
        requests=requests,
        nonzero_cpu=nonzero.get(CPU, 0),
        nonzero_memory=nonzero.get(MEMORY, 0),
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


UNSCHEDULABLE = "Unschedulable"
"""PodScheduled=False's reason when no node fits (kube's ``v1.PodReasonUnschedulable``)"""
SCHEDULER_ERROR = "SchedulerError"
"""... when the attempt failed for another reason (``v1.PodReasonSchedulerError``)"""


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
    )
