"""Reclaimable capacity of a node for batch pods, and when to publish it: pure functions over plain dataclasses.

koordinator's ``CalculateBatchResourceByPolicy`` (``pkg/slo-controller/noderesource/plugins/util/util.go``), per
resource, with ``policy`` from ``spec.reclaim`` (``crane_shared.reclaimpolicy``)::

    usage:            total x threshold - max(system used, reserved) - sum(used of regular pods)
    request:          total x threshold - reserved                   - sum(request of regular pods)
    maxUsageRequest:  total x threshold - max(system used, reserved) - sum(max(request, used) of regular pods)

    system used = node used - sum(used of every measured pod on the node)      (never below 0)
                  node used - batch share - sum(used of the measured regular pods)   (with the batch share)
    reserved    = capacity - allocatable                                        (kubelet's reservations)

The batch share is the batch pods' share of the node metric, measured over its own window (``batchMetrics``,
``crane_shared.batch``): the node metric is an average that takes a window to absorb batch pods that just
started, while their usage now counts at once, so without it the system usage reads too low (down to 0) right
after batch pods start and the node lends more than it has.

A regular pod without a measurement (just started, or its series not scraped yet) counts with its request, as
koordinator subtracts the requests of pods scheduled after its metric snapshot. Batch pods count only through
node usage (they are what the reclaimed capacity is for). Inputs older than ``degradeAfter`` (node usage or the
pods' usage) give zero: a node whose metrics stopped does not keep lending capacity it cannot see.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from crane_shared.batch import PodUsage
from crane_shared.reclaimpolicy import NodeOverride, ReclaimPolicy, ResourceReclaim

Why = Literal["ok", "stale", "off", "bad-override"]


@dataclass(frozen=True)
class Resources:
    """CPU in cores, memory in bytes."""

    cpu: float
    memory: float

    def of(self, resource: str) -> float:
        return self.cpu if resource == "cpu" else self.memory


@dataclass(frozen=True)
class NodePod:
    """A pod bound to the node (not finished): its ``namespace/name``, class and requests."""

    key: str
    batch: bool
    requests: Resources
    started: float | None = None
    """``status.startTime`` (epoch seconds); None when not started or unreadable (its usage then counts in full)"""


@dataclass(frozen=True)
class NodeInputs:
    capacity: Resources
    allocatable: Resources
    pods: Sequence[NodePod]
    usage: Resources | None
    """the node's measured usage (absolute), None when never measured in this term"""
    usage_at: float | None
    pod_usage: Mapping[str, PodUsage]
    pod_usage_at: float | None
    """when the pods' usage was last measured (one query for all nodes), None when never in this term"""
    override: NodeOverride | None
    """the node's ``crane.io/batch-reclaim``; None when it does not parse (nothing is reclaimed then)"""
    batch_share: Mapping[str, float] = field(default_factory=dict)
    """resource -> the batch pods' share of the node metric (absolute), for those measured with it in one round"""


@dataclass(frozen=True)
class Reclaimable:
    cpu_milli: int
    memory_bytes: int
    why: Why


ZERO_CPU_MEMORY = (0, 0)


def stale(inputs: NodeInputs, policy: ReclaimPolicy, now: float, since: float) -> bool:
    """Whether the inputs are older than ``degradeAfter``; never-measured inputs are as old as ``since`` (the
    start of this leadership term), so a node that never gets a measurement degrades as a stale one does."""
    limit = policy.degrade_after.total_seconds()
    oldest = min(inputs.usage_at or since, inputs.pod_usage_at or since)
    return now - oldest > limit


def measured(inputs: NodeInputs) -> bool:
    return inputs.usage is not None and inputs.pod_usage_at is not None


def reclaimable(inputs: NodeInputs, policy: ReclaimPolicy, now: float, since: float) -> Reclaimable | None:
    """What the node can lend to batch pods now; None while it cannot be told yet (no measurement so far in this
    term, and not for ``degradeAfter``): the published value is left as it is."""
    if inputs.override is None:
        return Reclaimable(0, 0, "bad-override")
    if inputs.override.off:
        return Reclaimable(0, 0, "off")
    if stale(inputs, policy, now, since):
        return Reclaimable(0, 0, "stale")
    if not measured(inputs):
        return None
    cpu = _resource("cpu", policy.cpu, inputs)
    memory = _resource("memory", policy.memory, inputs)
    return Reclaimable(max(0, math.floor(cpu * 1000)), max(0, math.floor(memory)), "ok")


def _resource(name: str, rule: ResourceReclaim, inputs: NodeInputs) -> float:
    assert inputs.usage is not None and inputs.override is not None
    total = inputs.capacity.of(name)
    reserved = max(0.0, total - inputs.allocatable.of(name))
    threshold = inputs.override.threshold(name, rule)
    measured_pods = [inputs.pod_usage[p.key] for p in inputs.pods if p.key in inputs.pod_usage]
    pods_used = sum(u.cpu_cores if name == "cpu" else u.memory_bytes for u in measured_pods)
    share = inputs.batch_share.get(name)
    if share is not None:
        regular_used = sum(
            inputs.pod_usage[p.key].of(name) for p in inputs.pods if not p.batch and p.key in inputs.pod_usage
        )
        system_used = max(0.0, inputs.usage.of(name) - share - regular_used)
    else:
        system_used = max(0.0, inputs.usage.of(name) - pods_used)
    regular = 0.0
    for pod in inputs.pods:
        if pod.batch:
            continue
        request = pod.requests.of(name)
        usage = inputs.pod_usage.get(pod.key)
        used = request if usage is None else (usage.cpu_cores if name == "cpu" else usage.memory_bytes)
        regular += {"usage": used, "request": request, "maxUsageRequest": max(used, request)}[rule.policy]
    system = reserved if rule.policy == "request" else max(system_used, reserved)
    return total * threshold - system - regular


def batch_usage(inputs: NodeInputs, now: float | None = None, window: float = 0.0) -> Resources:
    """The batch pods' measured usage as a fraction of the node's capacity (0 with no capacity), as far as it is
    inside the node's usage metric: a pod started less than ``window`` seconds before ``now`` counts for the part of
    the window it has run. The node metric averages over that window (``podUsageWindow`` matches it) while a pod's
    usage is its value now, so without this a regular pod would read a node whose batch pods just started as nearly
    empty (the whole batch share taken out of an average that holds little of it) and be placed there."""
    cpu = memory = 0.0
    for pod in inputs.pods:
        usage = inputs.pod_usage.get(pod.key)
        if pod.batch and usage is not None:
            share = 1.0
            if now is not None and window > 0 and pod.started is not None:
                share = min(1.0, max(0.0, (now - pod.started) / window))
            cpu += usage.cpu_cores * share
            memory += usage.memory_bytes * share
    return Resources(
        cpu / inputs.capacity.cpu if inputs.capacity.cpu > 0 else 0.0,
        memory / inputs.capacity.memory if inputs.capacity.memory > 0 else 0.0,
    )


def node_pod_usage(inputs: NodeInputs) -> dict[str, PodUsage]:
    """Every measured pod of the node, for ``crane.io/pod-usage``."""
    return {p.key: inputs.pod_usage[p.key] for p in inputs.pods if p.key in inputs.pod_usage}


@dataclass(frozen=True)
class Published:
    """What node status carries (or this term last wrote) and since when."""

    cpu_milli: int
    memory_bytes: int
    at: float


def should_write(
    new: Reclaimable, old: Published | None, capacity: Resources, policy: ReclaimPolicy, now: float
) -> bool:
    """The write budget (koordinator's ``resourceDiffThreshold`` / ``updateTimeThresholdSeconds``, measured
    against capacity so small values near zero do not flap): write when a value moves by more than
    ``changeThreshold`` of the node's capacity, when it becomes or stops being zero (a degrade to zero is never
    held back), or when it differs at all and the last write is ``maxAge`` old. Nothing published and nothing to
    lend: no write (a node without the resource reads as zero)."""
    if old is None:
        return (new.cpu_milli, new.memory_bytes) != ZERO_CPU_MEMORY
    pairs = (
        (new.cpu_milli, old.cpu_milli, capacity.cpu * 1000),
        (new.memory_bytes, old.memory_bytes, capacity.memory),
    )
    if all(n == o for n, o, _ in pairs):
        return False
    if any((n == 0) != (o == 0) for n, o, _ in pairs):
        return True
    if any(abs(n - o) > policy.change_threshold * total for n, o, total in pairs):
        return True
    return now - old.at >= policy.max_age.total_seconds()
