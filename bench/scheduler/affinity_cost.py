"""``python -m bench.scheduler.affinity_cost``: the per-decision cost of scheduler_perf's affinity and spreading
workloads, in process (no API server).

The same pods as ``bench.scheduler.workloads`` (scheduler_perf's templates and 500Nodes/5000Nodes counts) on a
node table of N nodes (hostname + zone labels, crane's load annotations): the init pods bound round-robin, then
every measured pod goes through one decision (``Algorithm.schedule``), assume and Reserve, as the scheduling loop
does; ``SchedulingBasic`` (plain pods) is the baseline. Reports CPU ms per decision (process time, so other
processes on a shared machine do not count; mean, p50 and p99) per workload; ``--profile`` prints cProfile's
top functions, to find where a decision's time goes.

    .venv/bin/python -m bench.scheduler.affinity_cost --nodes 500
    .venv/bin/python -m bench.scheduler.affinity_cost --nodes 5000 --scale 5000Nodes --plugins kube --profile
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from bench.scheduler import __main__ as base
from bench.scheduler.workloads import HOST, SCALES, ZONE, ZONES, pod_body, template
from crane_scheduler.algorithm import Algorithm, ScheduleResult
from crane_scheduler.config import parse_config
from crane_scheduler.framework import Handle
from crane_scheduler.framework.registry import Registry
from crane_scheduler.framework.runtime import Profile, build_profiles
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import builtin_registry
from crane_scheduler.podinfo import PodInfo, parse_node, parse_pod

SCHEDULER = "crane-bench"
BASIC = "SchedulingBasic"


def node_json(i: int) -> dict[str, Any]:
    name = f"node-{i:05d}"
    return {
        "metadata": {
            "name": name,
            "uid": name,
            "labels": {HOST: name, ZONE: ZONES[i % len(ZONES)], "bench": "true"},
            "annotations": base.load_annotations(i),
        },
        "spec": {},
        "status": {"capacity": base.NODE_RESOURCES, "allocatable": base.NODE_RESOURCES},
    }


def _pod(name: str, namespace: str, labels: dict[str, str], extra: dict[str, Any], node: str | None) -> Any:
    body = pod_body(name, labels, extra, SCHEDULER, node)
    body["metadata"].update(namespace=namespace, uid=f"{namespace}/{name}")
    return parse_pod(body)


def build(nodes: int, plugins: str, registry: Registry | None = None) -> tuple[NodeTable, Profile]:
    """The node table and the profile; ``registry`` defaults to the built-in plugins only (kube-scheduler's: no
    Dynamic, which the scheduler adds from its entry point, ``crane_scheduler.__main__.plugin_registry``)."""
    table = NodeTable(capacity=nodes)
    for i in range(nodes):
        table.upsert_node(parse_node(node_json(i)))
    config = {"profiles": [{"schedulerName": SCHEDULER, **base.PROFILES[plugins]}]}
    registry = builtin_registry() if registry is None else registry
    profiles = build_profiles(parse_config(config), registry, lambda name: Handle(table, profile=name))
    return table, profiles[SCHEDULER]


def run(workload: str, nodes: int, scale: str, plugins: str, prof: cProfile.Profile | None) -> dict[str, float]:
    table, profile = build(nodes, plugins)
    namespaces = ["sched-1", "sched-0"]
    labels: dict[str, str]
    extra: dict[str, Any]
    if workload == BASIC:  # the plain-pod baseline: as many pods as the spreading workloads measure
        n_init, n_measured = 0, SCALES[scale]["TopologySpreading"][1]
        labels, extra = {}, {}
    else:
        n_init, n_measured = SCALES[scale][workload]
        labels, extra = template(workload, namespaces, measured=False)
    for i in range(n_init):
        table.add_pod(_pod(f"init-{i:05d}", "sched-0", labels, extra, f"node-{i % nodes:05d}"))
    if workload != BASIC:
        labels, extra = template(workload, namespaces, measured=True)
    pods = (_pod(f"pod-{i:05d}", "sched-1", labels, extra, None) for i in range(n_measured))
    return {**timed_decisions(table, profile, pods, prof), "pods": n_measured}


def timed_decisions(
    table: NodeTable, profile: Profile, pods: Iterable[PodInfo], prof: cProfile.Profile | None
) -> dict[str, float]:
    """Each pod through one decision, assume and Reserve, as the scheduling loop does: CPU ms per pod (mean,
    p50, p99) and how many were placed."""
    algorithm = Algorithm(table, 0)
    times = []
    placed = 0
    for pod in pods:
        state: dict[str, Any] = {}
        if prof is not None:
            prof.enable()
        t = time.process_time()
        result = algorithm.schedule(profile, pod, state)
        if isinstance(result, ScheduleResult):
            table.assume(pod, result.node)
            profile.run_reserve(state, pod, result.node)
            placed += 1
        times.append(time.process_time() - t)
        if prof is not None:
            prof.disable()
    ms = np.array(times) * 1e3
    return {
        "mean": float(ms.mean()),
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "placed": placed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler.affinity_cost", description=__doc__)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--scale", choices=sorted(SCALES), default="500Nodes")
    parser.add_argument("--workloads", default=",".join([BASIC, *SCALES["500Nodes"]]))
    parser.add_argument("--plugins", choices=sorted(base.PROFILES), default="default")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions per workload")
    args = parser.parse_args()
    for workload in args.workloads.split(","):
        prof = cProfile.Profile() if args.profile else None
        r = run(workload, args.nodes, args.scale, args.plugins, prof)
        print(
            f"{workload:<31} {args.nodes:>5} nodes {args.plugins:<7} | decision+assume mean {r['mean']:.3f} ms "
            f"p50 {r['p50']:.3f} ms p99 {r['p99']:.3f} ms | placed {r['placed']}/{r['pods']}",
            flush=True,
        )
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
