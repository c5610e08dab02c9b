"""The Dynamic plugin built in a profile over a node table, and nodes annotated with load, for the loadaware tests."""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from crane_scheduler.algorithm import Algorithm, ScheduleResult
from crane_scheduler.config import parse_config
from crane_scheduler.framework import Diagnosis, Handle
from crane_scheduler.framework.runtime import build_profiles
from crane_scheduler.loadaware.args import parse_args
from crane_scheduler.loadaware.plugin import Dynamic
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import builtin_registry
from crane_scheduler.podinfo import parse_node, parse_pod
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
    def __init__(self, *nodes: dict[str, Any], args: dict[str, Any] | None = None) -> None:
        self.table = NodeTable(capacity=2)
        for n in nodes:
            self.table.upsert_node(parse_node(n))
        registry = builtin_registry()
        self.plugins: list[Dynamic] = []

        def factory(raw: Any, handle: Handle) -> Dynamic:
            p = Dynamic(parse_args(raw), handle, wall_clock=lambda: NOW)
            self.plugins.append(p)
            return p

        registry.register("Dynamic", factory)
        config = parse_config(
            {
                "profiles": [
                    {
                        "schedulerName": "crane-scheduler",
                        "plugins": {"multiPoint": {"enabled": [{"name": "Dynamic", "weight": 3}]}},
                        "pluginConfig": [{"name": "Dynamic", "args": args or {}}],
                    }
                ]
            }
        )
        self.profile = next(iter(build_profiles(config, registry, lambda name: Handle(self.table)).values()))
        self.algorithm = Algorithm(self.table, rng=random.Random(0))

    @property
    def plugin(self) -> Dynamic:
        return self.plugins[0]

    def place(self, raw_pod: dict[str, Any]) -> str | Diagnosis:
        info = parse_pod(raw_pod)
        state: dict[str, Any] = {}
        result = self.algorithm.schedule(self.profile, info, state)
        if isinstance(result, ScheduleResult):
            for pl in self.profile.reserve:
                pl.reserve(state, info, result.node)
            self.table.assume(info, result.node)
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
