"""Nodes annotated as the annotator would (load, the batch pods' usage, per-pod usage), batch pods and workload
replicas, for the pod-class and learned-estimate tests on the real API server."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client

from crane_shared.annotations import encode_usage
from crane_shared.batch import (
    BATCH_CPU,
    BATCH_CPU_USAGE_KEY,
    BATCH_MEMORY,
    BATCH_MEMORY_USAGE_KEY,
    POD_USAGE_KEY,
    PodUsage,
    encode_pod_usage,
)
from tests.support.policy import UPSTREAM_METRICS as METRICS

BATCH_ALLOCATABLE = {BATCH_CPU: "4000", BATCH_MEMORY: str(8 * 2**30)}
"""reclaimed capacity published on a node (what the annotator's round writes in node status)"""


async def annotate(
    kube: client.ApiClient,
    node: str,
    usage: float,
    *,
    memory: float | None = None,
    batch: float | None = None,
    pods: Mapping[str, tuple[float, float]] | None = None,
) -> None:
    """Every metric of the default policy at ``usage`` (the memory metrics at ``memory`` when given), the batch
    pods' share ``batch`` of CPU and memory, and ``pods`` (``namespace/name -> (cores, bytes)``) as
    ``crane.io/pod-usage``; stamped now, one merge patch."""
    now = datetime.now(UTC)
    annotations = {
        m: encode_usage(memory if memory is not None and m.startswith("mem") else usage, now) for m in METRICS
    }
    if batch is not None:
        annotations[BATCH_CPU_USAGE_KEY] = annotations[BATCH_MEMORY_USAGE_KEY] = encode_usage(batch, now)
    if pods is not None:
        annotations[POD_USAGE_KEY] = encode_pod_usage({k: PodUsage(*v) for k, v in pods.items()}, now)
    body = {"metadata": {"annotations": annotations}}
    await client.CoreV1Api(kube).patch_node(node, body, _content_type="application/merge-patch+json")


def batch_resources(cpu_millis: int = 500, memory: str = "1Gi") -> dict[str, Any]:
    """A batch container's resources: the reclaimed capacity, requests equal to limits (extended resources)."""
    amounts = {BATCH_CPU: str(cpu_millis), BATCH_MEMORY: memory}
    return {"requests": amounts, "limits": amounts}


def as_replica(pod: dict[str, Any], workload: str) -> dict[str, Any]:
    """``pod`` made a replica of a Deployment-like ``workload``: its ReplicaSet as controller owner, one template
    hash (no controller manager runs in the test cluster, so the owner need not exist)."""
    meta = pod["metadata"]
    meta.setdefault("labels", {}).update({"app": workload, "pod-template-hash": f"{workload}-h1"})
    meta["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": workload, "uid": f"rs-{workload}", "controller": True}
    ]
    return pod


def dynamic_config(scheduler_name: str, **plugin_args: Any) -> dict[str, Any]:
    """A scheduler configuration whose one profile gives the Dynamic plugin (default policy) ``plugin_args``."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": scheduler_name, "pluginConfig": [{"name": "Dynamic", "args": plugin_args}]}],
    }
