"""The unsupported-field gate: a pod that uses a field no plugin here reads yet is refused, never placed as if the
field were absent (a PVC-backed pod placed away from its volume's zone).

``UNSUPPORTED`` is the table: one entry per field, each a predicate over the pod's spec. A plugin that starts
supporting a field removes its entry (VolumeBinding & co. remove the volume ones). The refusal is
UnschedulableAndUnresolvable and names the field, e.g. ``0/3 nodes are available: pod uses
spec.volumes[0].persistentVolumeClaim, which crane-scheduler does not support yet.``
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import Any

Spec = Mapping[str, Any]

GATE = "UnsupportedFields"
"""The rejector name the queue sees (no plugin registers events under it, so any cluster event retries)."""

# In-tree volume sources kube-scheduler counts against CSI attach limits through CSI migration (translated to
# their CSI drivers on nodes whose CSINode says so), which NodeVolumeLimits does not do. PVCs, generic ephemeral
# volumes, inline CSI, RBD and iSCSI are handled by VolumeBinding, VolumeRestrictions, VolumeZone and
# NodeVolumeLimits.
VOLUME_SOURCES: tuple[str, ...] = (
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "azureDisk",
    "cinder",
)


def _volumes(spec: Spec) -> str | None:
    for i, volume in enumerate(spec.get("volumes") or ()):
        for source in VOLUME_SOURCES:
            if volume.get(source) is not None:
                return f"spec.volumes[{i}].{source}"
    return None


def _field(path: str) -> Callable[[Spec], str | None]:
    key = path.removeprefix("spec.")

    def check(spec: Spec) -> str | None:
        return path if spec.get(key) else None

    return check


UNSUPPORTED: dict[str, Callable[[Spec], str | None]] = {
    "spec.volumes": _volumes,
    # The Workload API's gangs, 1.37's (PodGroup) and 1.35's (Workload): read where the profile enables
    # GangScheduling, refused elsewhere
    "spec.schedulingGroup": _field("spec.schedulingGroup"),
    "spec.workloadRef": _field("spec.workloadRef"),
}
"""field -> check(spec) returning the offending field path (None: the pod does not use it).

Pod fields Kubernetes 1.36-1.37 added, and why each is here or not (reviewed against k8s.io/api v0.37.2's PodSpec):
``schedulingGroup`` is above; ``evictionResponders`` (EvictionRequestAPI, alpha) is about who answers an
eviction, not placement: kube-scheduler 1.37 does not read it either (its preemption deletes victims, as crane's
does), so it passes."""


def unsupported_field(pod_raw: Mapping[str, Any], supported: Container[str] = frozenset()) -> str | None:
    """The first field ``pod_raw`` uses that is in ``UNSUPPORTED``, as a path into the pod; None if none. Fields in
    ``supported`` are read by a plugin of the pod's profile (``supports_fields``: GangScheduling's schedulingGroup and
    workloadRef)."""
    spec = pod_raw.get("spec") or {}
    for name, check in UNSUPPORTED.items():
        if name in supported:
            continue
        found = check(spec)
        if found is not None:
            return found
    return None


def refusal(path: str) -> str:
    return f"pod uses {path}, which crane-scheduler does not support yet"
