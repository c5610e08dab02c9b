"""NRT objects, pods and a plugin on a node table, for the NodeResourceTopologyMatch unit tests."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import CycleState, Diagnosis, Handle, Status
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.noderesourcetopology.args import parse_args
from crane_scheduler.plugins.noderesourcetopology.model import (
    ANNOTATION_AWARENESS,
    ANNOTATION_CPU_POLICY,
    ANNOTATION_RESULT,
    ZoneResult,
    encode_result,
)
from crane_scheduler.plugins.noderesourcetopology.plugin import NAME, NodeResourceTopologyMatch
from crane_scheduler.podinfo import PodInfo, parse_node, parse_pod
from crane_scheduler.simulate import Simulator
from tests.support.scheduler import node

NOW = 1_800_000_000.0
_uids = itertools.count(1)
ZoneSpec = tuple[str, str] | tuple[str, str, str] | tuple[str, dict[str, str]]


def nrt(
    name: str,
    zones: Sequence[ZoneSpec],
    cpu_policy: str = "Static",
    topology_policy: str = "SingleNUMANodePodLevel",
) -> dict[str, Any]:
    """An NRT as crane-agent writes it; a zone is (name, cpu[, memory]) or (name, {resource: quantity})."""
    out = []
    for z in zones:
        if isinstance(z[1], dict):
            alloc = dict(z[1])
        else:
            alloc = {"cpu": z[1]}
            if len(z) > 2:
                alloc["memory"] = str(z[2])
        out.append(
            {
                "name": z[0],
                "type": "Node",
                "costs": [{"name": z[0], "value": 10}],
                "resources": {"capacity": dict(alloc), "allocatable": alloc},
            }
        )
    return {
        "apiVersion": "topology.crane.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "craneManagerPolicy": {"cpuManagerPolicy": cpu_policy, "topologyManagerPolicy": topology_policy},
        "reserved": {"cpu": "0"},
        "attributes": {"go.crane.io/reserved-system-cpus": ""},
        "zones": out,
    }


F_ZONES: list[ZoneSpec] = [("node1", "2.5", "4Gi"), ("node2", "3.9", "4Gi")]


def guaranteed(
    cpu: str,
    memory: str | None = None,
    *,
    name: str = "p",
    aware: str | None = None,
    cpu_policy: str | None = None,
    node_name: str = "",
    result: Sequence[tuple[str, dict[str, int]]] | None = None,
    owner: str | None = None,
    extra: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod whose one container has requests == limits (a target when cpu is whole cores)."""
    resources = {"cpu": cpu} | ({"memory": memory} if memory else {}) | (extra or {})
    annotations = {}
    if aware is not None:
        annotations[ANNOTATION_AWARENESS] = aware
    if cpu_policy is not None:
        annotations[ANNOTATION_CPU_POLICY] = cpu_policy
    if result is not None:
        annotations[ANNOTATION_RESULT] = encode_result(tuple(ZoneResult(z, c) for z, c in result))
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}-{next(_uids)}"}
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "o", "apiVersion": "apps/v1", "uid": "x"}]
    return {
        "metadata": meta,
        "spec": {
            "schedulerName": "crane-scheduler",
            "nodeName": node_name or None,
            "containers": containers
            or [{"name": "c", "image": "pause", "resources": {"requests": resources, "limits": dict(resources)}}],
        },
    }


def cpus(n: float) -> dict[str, int]:
    return {"cpu": int(n * 1000)}


class Setup:
    """A node table with the plugin registered on it (before any pod, as in the scheduler)."""

    def __init__(self, *nodes: str, resources: list[str] | None = None, args: dict[str, Any] | None = None) -> None:
        self.table = NodeTable(capacity=2)
        raw_args = args if args is not None else ({"topologyAwareResources": resources} if resources else {})
        self.handle = Handle(self.table, profile="crane-scheduler")
        self.plugin = NodeResourceTopologyMatch(parse_args(raw_args), self.handle, wall_clock=lambda: self.now)
        self.now = NOW
        for n in nodes:
            self.add_node(n)

    def add_node(self, name: str, cpu: str = "64", memory: str = "256Gi") -> None:
        self.table.upsert_node(parse_node(node(name, cpu=cpu, memory=memory)))

    def topology(self, obj: dict[str, Any]) -> None:
        self.plugin.set_topology(obj)

    def bind(self, raw: dict[str, Any], node_name: str) -> PodInfo:
        raw["spec"]["nodeName"] = node_name
        info = parse_pod(raw)
        self.table.add_pod(info)
        return info

    def filter(self, raw: dict[str, Any]) -> tuple[CycleState, dict[str, str]]:
        """Runs PreFilter and Filter: the cycle state and the rejection reason per rejected node."""
        state: CycleState = {}
        pod = parse_pod(raw)
        res = self.plugin.pre_filter(state, pod, self.table)
        assert res.status.success, res.status
        reasons: dict[str, str] = {}
        for r in self.plugin.filter(state, pod, self.table):
            for row in r.mask.nonzero()[0]:
                reasons.setdefault(self.table.names[int(row)], r.reason)
        return state, reasons

    def score(self, state: CycleState, raw: dict[str, Any], *nodes: str) -> list[int]:
        import numpy as np

        rows = np.array([self.table.rows[n] for n in nodes], dtype=np.intp)
        return [int(s) for s in self.plugin.score(state, parse_pod(raw), self.table, rows)]

    def reserve(self, state: CycleState, raw: dict[str, Any], node_name: str) -> Status:
        pod = parse_pod(raw)
        self.table.assume(pod, node_name)
        return self.plugin.reserve(state, pod, node_name)

    def result(self, state: CycleState) -> list[tuple[str, dict[str, int]]] | None:
        chosen = state.get(f"{self.plugin.name}.result")
        return None if chosen is None else [(e.zone, dict(e.capacity)) for e in chosen[1]]


def decide(
    setup: Setup, raw: dict[str, Any], weight: int = 2
) -> tuple[ScheduleResult | Diagnosis | Status, CycleState]:
    """One decision through the real framework with the plugin enabled (the Setup's instance)."""
    config = {
        "profiles": [
            {
                "schedulerName": "crane-scheduler",
                "plugins": {"multiPoint": {"enabled": [{"name": NAME, "weight": weight}]}},
            }
        ]
    }
    sim = Simulator(
        config, table=setup.table, plugins={NAME: lambda args, handle: setup.plugin}, out_of_tree=False, seed=0
    )
    state: CycleState = {}
    return sim.algorithm.schedule(sim.profiles["crane-scheduler"], parse_pod(raw), state), state
