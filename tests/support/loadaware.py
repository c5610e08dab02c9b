"""The Dynamic plugin built in a profile over a node table, and nodes annotated with load, for the loadaware tests."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import Diagnosis
from crane_scheduler.loadaware.plugin import Dynamic
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import parse_pod
from crane_scheduler.simulate import Simulator
from crane_shared.annotations import encode_hot_value, encode_usage
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
from tests.support.scheduler import container, node, pod

NOW = 1_800_000_000.0


def loaded(
    name: str, usage: float, cpu: str = "16", memory: str = "64Gi", hot: int | None = None, age: float = 10
) -> dict[str, Any]:
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp(NOW - age, UTC)
    n = node(name, cpu=cpu, memory=memory)
    n["metadata"]["annotations"] = {m: encode_usage(usage, stamp) for m in METRICS}
    if hot is not None:
        n["metadata"]["annotations"]["node_hot_value"] = encode_hot_value(hot, stamp)
    return n


class Setup:
    """The default profile with Dynamic (weight 3, ``args``) over ``nodes``, on the clock ``NOW``."""

    def __init__(self, *nodes: dict[str, Any], args: dict[str, Any] | None = None) -> None:
        config = {
            "profiles": [
                {
                    "schedulerName": "crane-scheduler",
                    "plugins": {"multiPoint": {"enabled": [{"name": "Dynamic", "weight": 3}]}},
                    "pluginConfig": [{"name": "Dynamic", "args": args or {}}],
                }
            ]
        }
        self.sim = Simulator(config, clock=lambda: NOW)
        self.sim.sync("Node", nodes)
        self.table: NodeTable = self.sim.table
        self.profile = self.sim.profiles["crane-scheduler"]
        self.algorithm = self.sim.algorithm

    @property
    def plugin(self) -> Dynamic:
        plugin = self.sim.plugin("Dynamic")
        assert isinstance(plugin, Dynamic)
        return plugin

    def place(self, raw_pod: dict[str, Any]) -> str | Diagnosis:
        """The decision, and the pod assumed and reserved on its node (the next one sees it); the algorithm's own
        ``Diagnosis`` when no node fits."""
        info = parse_pod(raw_pod)
        state: dict[str, Any] = {}
        result = self.algorithm.schedule(self.profile, info, state)
        if isinstance(result, ScheduleResult):
            self.table.assume(info, result.node)
            assert self.profile.run_reserve(state, info, result.node).success
            return result.node
        assert isinstance(result, Diagnosis), result
        return result


# -- batch pods and measured pod usage (crane_shared.batch), written directly as the annotator would ----------------


def with_batch_usage(n: dict[str, Any], cpu: float, memory: float, age: float = 10) -> dict[str, Any]:
    """``n`` with the batch pods' usage annotated (fractions of the node), stamped ``age`` seconds before NOW."""
    stamp = datetime.fromtimestamp(NOW - age, UTC)
    annotations = n["metadata"].setdefault("annotations", {})
    annotations[BATCH_CPU_USAGE_KEY] = encode_usage(cpu, stamp)
    annotations[BATCH_MEMORY_USAGE_KEY] = encode_usage(memory, stamp)
    return n


def batch_pod(name: str, cpu_millis: int = 500, memory: str = "1Gi") -> dict[str, Any]:
    """A batch pod: it requests the reclaimed capacity (``crane.io/batch-*``), nothing regular."""
    return pod(name, containers=[container(extra={BATCH_CPU: str(cpu_millis), BATCH_MEMORY: memory})])


def replica(workload: str, i: int, cpu: str, memory: str, namespace: str = "ns") -> dict[str, Any]:
    """Replica ``i`` of a Deployment-like workload: controller owner ``workload`` and one pod-template-hash."""
    raw = pod(f"{workload}-{i}", cpu=cpu, memory=memory)
    raw["metadata"]["namespace"] = namespace
    raw["metadata"]["labels"] = {"app": workload, "pod-template-hash": f"{workload}-h1"}
    raw["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": workload, "uid": f"rs-{workload}", "controller": True}
    ]
    return raw


def with_pod_usage(n: dict[str, Any], usage: Mapping[str, tuple[float, float]], age: float = 10) -> dict[str, Any]:
    """``n`` with ``crane.io/pod-usage``: ``namespace/name -> (cores, bytes)`` measured ``age`` seconds before NOW."""
    pods = {key: PodUsage(cpu, memory) for key, (cpu, memory) in usage.items()}
    n["metadata"].setdefault("annotations", {})[POD_USAGE_KEY] = encode_pod_usage(
        pods, datetime.fromtimestamp(NOW - age, UTC)
    )
    return n
