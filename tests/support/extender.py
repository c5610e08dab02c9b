"""Request and node builders shared by the extender's unit tests: JSON exactly as kube-scheduler sends it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from crane_shared.annotations import encode_hot_value, encode_usage
from tests.support.policy import UPSTREAM_METRICS as METRICS

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def usage(
    value: float | dict[str, float],
    *,
    age: timedelta = timedelta(seconds=10),
    hot: int | None = None,
    now: datetime = NOW,
) -> dict[str, str]:
    """Load annotations: one value for every metric of the default policy, or per metric."""
    values = value if isinstance(value, dict) else dict.fromkeys(METRICS, value)
    out = {m: encode_usage(v, now - age) for m, v in values.items()}
    if hot is not None:
        out["node_hot_value"] = encode_hot_value(hot, now - age)
    return out


def node(name: str, annotations: dict[str, str] | None = None, cpu: str = "8", memory: str = "32Gi") -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "labels": {"kubernetes.io/hostname": name},
            "annotations": annotations or {},
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    name: str = "p",
    *,
    uid: str = "pod-uid",
    cpu: str | None = None,
    memory: str | None = None,
    owner_kind: str | None = None,
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid}
    if owner_kind:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner_kind, "name": "owner", "uid": "o", "controller": True}
        ]
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "pause", "resources": {"requests": requests}}]},
    }


def nodes_args(the_pod: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """ExtenderArgs of a scheduler with nodeCacheCapable: false (full node objects)."""
    return {"Pod": the_pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


def names_args(the_pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs of a scheduler with nodeCacheCapable: true (names only)."""
    return {"Pod": the_pod, "Nodes": None, "NodeNames": names}
