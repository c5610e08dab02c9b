"""The pure parts of Coscheduling: the PodGroup as the plugin reads it, group membership, the quorum, the queue
order, the resource-gap check, the PodGroup status (scheduler-plugins' PodGroup controller semantics) and the
reference's messages. No I/O, no clock: time is an argument."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from crane_shared.podresources import resource_value

GROUP = "scheduling.x-k8s.io"
VERSION = "v1alpha1"
PLURAL = "podgroups"
KIND = "PodGroup"
POD_GROUP_LABEL = f"{GROUP}/pod-group"
"""The label that makes a pod a member of the PodGroup it names (same namespace)."""

PENDING, SCHEDULING, RUNNING, FINISHED, FAILED, UNKNOWN = (
    "Pending",
    "Scheduling",
    "Running",
    "Finished",
    "Failed",
    "Unknown",
)
"""PodGroup phases (scheduler-plugins ``v1alpha1.PodGroupPhase``)."""

NOT_FOUND = "PodGroup not found"


class PodGroupError(ValueError):
    """A PodGroup the plugin cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class PodGroup:
    namespace: str
    name: str
    min_member: int
    min_resources: Mapping[str, int]
    """cpu in millicores, the rest in base units (as pods' requests)"""
    schedule_timeout: float | None
    """``spec.scheduleTimeoutSeconds``; None: the plugin's ``permitWaitingTimeSeconds``"""
    created: float
    """creationTimestamp, seconds since the epoch (the queue order)"""
    status: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return full_name(self.namespace, self.name)


def full_name(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(math.floor(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_pod_group(raw: Mapping[str, Any]) -> PodGroup:
    """The PodGroup object; ``PodGroupError`` naming the field when it cannot be read (the API server validates
    the CRD's schema, so this catches only what the schema lets through)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    min_member = spec.get("minMember") or 0
    if not isinstance(min_member, int) or min_member < 0:
        raise PodGroupError(f"PodGroup {name}: spec.minMember must be a non-negative integer, got {min_member!r}")
    resources: dict[str, int] = {}
    for res, value in (spec.get("minResources") or {}).items():
        try:
            resources[res] = resource_value(res, value)
        except (ValueError, ArithmeticError) as err:
            raise PodGroupError(f"PodGroup {name}: spec.minResources.{res}: {err}") from None
    timeout = spec.get("scheduleTimeoutSeconds")
    if timeout is not None and (not isinstance(timeout, int) or timeout < 0):
        raise PodGroupError(f"PodGroup {name}: spec.scheduleTimeoutSeconds must be a non-negative integer")
    try:
        created = parse_time(meta.get("creationTimestamp")) or 0.0
    except ValueError:
        raise PodGroupError(f"PodGroup {name}: metadata.creationTimestamp is not a time") from None
    return PodGroup(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        min_member=min_member,
        min_resources=resources,
        schedule_timeout=float(timeout) if timeout is not None else None,
        created=created,
        status=dict(raw.get("status") or {}),
    )


def group_of(pod_raw: Mapping[str, Any]) -> str | None:
    """``namespace/group`` of the PodGroup the pod joins with its label; None for a pod of no group."""
    meta = pod_raw.get("metadata") or {}
    name = (meta.get("labels") or {}).get(POD_GROUP_LABEL)
    return full_name(str(meta.get("namespace", "")), name) if name else None


def sort_key(priority: int, group_created: float | None, initial: float, namespace: str, name: str) -> tuple[Any, ...]:
    """Coscheduling's ``Less`` as a key: higher priority first, then the PodGroup's creation time (a pod of no
    group, or of a group not known yet: its first attempt), then ``namespace/name``. A group's members share
    the time, so they come out of the queue together."""
    return (-priority, group_created if group_created is not None else initial, f"{namespace}/{name}")


def resource_gap(
    need: Mapping[str, int], free_per_node: Iterable[Mapping[str, int]], min_member: int
) -> dict[str, int] | None:
    """scheduler-plugins' ``CheckClusterResource``: walk the nodes subtracting what each has free (the group's
    own pods not counted as using it) from ``minResources`` plus ``minMember`` pods; what is still missing when
    the nodes run out, or None when they suffice."""
    gap = {k: v for k, v in need.items() if v > 0}
    if min_member > 0:
        gap["pods"] = min_member
    if not gap:
        return None
    for free in free_per_node:
        for res in list(gap):
            left = gap[res] - free.get(res, 0)
            if left <= 0:
                del gap[res]
            else:
                gap[res] = left
        if not gap:
            return None
    return gap


def format_gap(gap: Mapping[str, int]) -> str:
    """The gap as Go prints a ResourceList (``map[cpu:2 memory:1Gi]``), quantities in their canonical form."""
    return "map[" + " ".join(f"{k}:{_quantity(k, v)}" for k, v in sorted(gap.items())) + "]"


def _quantity(res: str, value: int) -> str:
    if res == "cpu":
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    for suffix, scale in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale}{suffix}"
    return str(value)


# ------------------------------------------------------------------------------------------ messages (verbatim)


def not_enough_siblings(pod: str, count: int, min_member: int) -> str:
    return (
        f"pre-filter pod {pod} cannot find enough sibling pods, current pods number: {count}, "
        f"minMember of group: {min_member}"
    )


def failed_recently(group: str) -> str:
    return f"podGroup {group} failed recently"


def rejected_with(group: str, pod: str) -> str:
    """What a member that fits hears when a sibling does not: the reference's PostFilter rejection."""
    return f"PodGroup {group} gets rejected due to Pod {pod} is unschedulable even after PostFilter"


# ------------------------------------------------------------------------------------------ status


@dataclass(frozen=True, slots=True)
class Member:
    """A pod of the group as the status counts it."""

    phase: str  # pod.status.phase
    bound: bool
    owners: tuple[str, ...] = ()


def settled_status(group: PodGroup, members: list[Member], namespace: str, now: float) -> dict[str, Any]:
    """``next_status`` repeated until the phase stops moving (at most one pass per phase), in one write. The
    upstream controller gets there by requeueing after each status update; one step per change here could leave a
    group that is whole and bound at ``Pending`` (with ``scheduled`` counting its members) until its next change."""
    status = group.status
    for _ in range(4):  # "" -> Pending -> Scheduling -> Running -> Finished at the most
        step = next_status(replace(group, status=status), members, namespace, now)
        if step.get("phase") == status.get("phase"):
            return step
        status = step
    return dict(status)


def next_status(group: PodGroup, members: list[Member], namespace: str, now: float) -> dict[str, Any]:
    """The PodGroup's status after one reconcile, as scheduler-plugins' PodGroup controller computes it:
    Pending until ``minMember`` pods exist, then Scheduling (``occupiedBy`` from the first pod's owners,
    ``scheduleStartTime``), Running once ``minMember`` run or succeeded, Failed once one failed and the failed,
    running and succeeded reach ``minMember``, Finished once ``minMember`` succeeded; Finished and Failed are
    final. ``scheduled`` (members bound) is kept too."""
    old = dict(group.status)
    phase = old.get("phase") or ""
    if phase in (FINISHED, FAILED):
        return old
    status = dict(old)
    running = sum(1 for m in members if m.phase == "Running")
    succeeded = sum(1 for m in members if m.phase == "Succeeded")
    failed = sum(1 for m in members if m.phase == "Failed")
    status["scheduled"] = sum(1 for m in members if m.bound)
    if phase == "":
        status["phase"] = PENDING
    elif phase == PENDING:
        if len(members) >= group.min_member and members:
            status["phase"] = SCHEDULING
            owners = sorted(f"{namespace}/{o}" for o in members[0].owners)
            if owners:
                status["occupiedBy"] = ",".join(owners)
    else:
        status.update(running=running, succeeded=succeeded, failed=failed)
        if len(members) < group.min_member:
            status["phase"] = PENDING
        elif succeeded + running < group.min_member:
            status["phase"] = SCHEDULING
        else:
            status["phase"] = RUNNING
        if failed and failed + running + succeeded >= group.min_member:
            status["phase"] = FAILED
        if succeeded >= group.min_member:
            status["phase"] = FINISHED
    if status.get("phase") == SCHEDULING and not status.get("scheduleStartTime"):
        status["scheduleStartTime"] = format_time(now)
    return status


def member_of(pod_raw: Mapping[str, Any]) -> Member:
    meta = pod_raw.get("metadata") or {}
    return Member(
        phase=str((pod_raw.get("status") or {}).get("phase") or "Pending"),
        bound=bool((pod_raw.get("spec") or {}).get("nodeName")),
        owners=tuple(str(o.get("name", "")) for o in meta.get("ownerReferences") or ()),
    )
