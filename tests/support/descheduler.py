"""Node and pod JSON for the descheduler's tests: load annotations stamped ``at``, pods owned by a ReplicaSet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from crane_shared.annotations import annotation_key, encode_usage

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
OLD = (NOW - timedelta(hours=1)).isoformat().replace("+00:00", "Z")


def node(
    name: str,
    cpu: float | None = 0.3,
    mem: float | None = 0.3,
    *,
    at: datetime = NOW,
    cores: int = 8,
    memory: int = 32 << 30,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A node annotated with cpu/mem usage (``*_avg_5m`` and ``*_max_avg_1h``) stamped ``at``; None leaves it out."""
    notes: dict[str, str] = {}
    for metric, value in (("cpu", cpu), ("mem", mem)):
        if value is not None:
            for suffix in ("usage_avg_5m", "usage_max_avg_1h"):
                notes[annotation_key(f"{metric}_{suffix}")] = encode_usage(value, at)
    notes |= annotations or {}
    return {
        "metadata": {"name": name, "labels": labels or {}, "annotations": notes},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"allocatable": {"cpu": str(cores), "memory": str(memory), "pods": "110"}},
    }


def pod(
    name: str,
    node_name: str,
    *,
    namespace: str = "default",
    cpu: str = "500m",
    memory: str = "512Mi",
    priority: int = 0,
    qos: str = "Burstable",
    owner_kind: str | None = "ReplicaSet",
    owner: str = "web-abc",
    created: str = OLD,
    annotations: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    ready: bool = True,
    priority_class: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "creationTimestamp": created,
        "annotations": annotations or {},
    }
    if owner_kind:
        meta["ownerReferences"] = [{"kind": owner_kind, "name": owner, "uid": f"uid-{owner}", "controller": True}]
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "priority": priority,
        "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        "volumes": volumes or [],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "metadata": meta,
        "spec": spec,
        "status": {
            "phase": phase,
            "qosClass": qos,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
