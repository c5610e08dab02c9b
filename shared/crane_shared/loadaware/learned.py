"""Estimates learned from real usage: a pod is expected to use what the running pods of its workload use.

The factor estimate (``factor x request``, ``EstimateArgs``) guesses: a CPU-heavy workload that uses its whole
request is under-estimated at 0.6, a memory-heavy one that reserves far more than it touches is over-estimated.
When enough running pods of the same workload have been measured (the annotator's ``crane.io/pod-usage``, see
``crane_shared.batch``), a high percentile of their usage replaces the guess, both for the pod being scheduled
and for a pod just bound (whose usage the averaged metrics have not absorbed yet).

A **workload** is one pod template of one controller: the same namespace, controller owner (its UID) and
``pod-template-hash`` (Deployments' ReplicaSets) or ``controller-revision-hash`` (StatefulSets, DaemonSets) label.
Pods of another template revision are another workload: a rollout that changes the resources starts over from the
factor until the new revision has enough measured pods.

Pure: no I/O; the scheduler keeps the index (``crane_scheduler.loadaware.learned``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from crane_shared.batch import PodUsage

TEMPLATE_LABELS = ("pod-template-hash", "controller-revision-hash")
"""labels naming a pod's template revision, in the order they are looked up"""

WorkloadKey = tuple[str, str, str]
"""(namespace, controller owner UID, template hash)"""


@dataclass(frozen=True)
class LearnArgs:
    """When and how the estimate is learned (``estimate.learned`` in the Dynamic plugin's args)."""

    enabled: bool = True
    min_pods: int = 3
    """measured running pods of the workload needed; fewer: the factor estimate"""
    percentile: float = 90.0
    """of the measured pods' usage, per resource (linear interpolation between the nearest ranks)"""
    max_age: timedelta = timedelta(minutes=10)
    """a pod-usage annotation older than this is not used (the annotator is down or the node gone)"""


def workload_key(metadata: Mapping[str, Any] | None) -> WorkloadKey | None:
    """The workload a pod belongs to, or None (no controller owner or no template label: not learnable)."""
    metadata = metadata or {}
    owners = metadata.get("ownerReferences")
    labels = metadata.get("labels")
    if not isinstance(owners, list) or not isinstance(labels, dict):
        return None
    owner = next((o for o in owners if isinstance(o, dict) and o.get("controller") is True), None)
    if owner is None or not isinstance(owner.get("uid"), str) or not owner["uid"]:
        return None
    for label in TEMPLATE_LABELS:
        revision = labels.get(label)
        if isinstance(revision, str) and revision:
            return (str(metadata.get("namespace") or ""), owner["uid"], revision)
    return None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation (numpy's default); ``values`` not empty."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def learned_usage(samples: Sequence[PodUsage], args: LearnArgs) -> PodUsage | None:
    """The workload's expected usage per pod, or None when there are too few measured pods (or learning is off)."""
    if not args.enabled or len(samples) < args.min_pods or not samples:
        return None
    return PodUsage(
        percentile([s.cpu_cores for s in samples], args.percentile),
        percentile([s.memory_bytes for s in samples], args.percentile),
    )
