"""``python -m bench.scheduler.affinity_cost``: the per-decision cost of scheduler_perf's affinity and spreading
workloads, in process (no API server).

The same pods as ``bench.scheduler.workloads`` (scheduler_perf's templates and 500Nodes/5000Nodes counts) on a
node table of N nodes (hostname + zone labels, crane's load annotations): the init pods bound round-robin, then
every measured pod goes through one decision, assume and Reserve (``Simulator.schedule``), as the scheduling loop
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
from crane_scheduler.simulate import Simulator, parse_pod

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
    return body


def build(nodes: int, plugins: str, out_of_tree: bool = False) -> Simulator:
    """The scheduler over N nodes; the built-in plugins only by default (kube-scheduler's: no Dynamic, which the
    scheduler adds from its entry point: ``out_of_tree``)."""
    config = {"profiles": [{"schedulerName": SCHEDULER, **base.PROFILES[plugins]}]}
    sim = Simulator(config, out_of_tree=out_of_tree)
    sim.sync("Node", [node_json(i) for i in range(nodes)])
    return sim


def run(workload: str, nodes: int, scale: str, plugins: str, prof: cProfile.Profile | None) -> dict[str, float]:
    sim = build(nodes, plugins)
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
        sim.add(_pod(f"init-{i:05d}", "sched-0", labels, extra, f"node-{i % nodes:05d}"), kind="Pod")
    if workload != BASIC:
        labels, extra = template(workload, namespaces, measured=True)
    pods = (_pod(f"pod-{i:05d}", "sched-1", labels, extra, None) for i in range(n_measured))
    return {**timed_decisions(sim, (parse_pod(body) for body in pods), prof), "pods": n_measured}


def timed_decisions(sim: Simulator, pods: Iterable[Any], prof: cProfile.Profile | None) -> dict[str, float]:
    """Each pod (parsed) through one decision, assume and Reserve, as the scheduling loop does: CPU ms per pod
    (mean, p50, p99) and how many were placed."""
    times = []
    placed = 0
    for pod in pods:
        if prof is not None:
            prof.enable()
        t = time.process_time()
        if sim.schedule(pod).node is not None:
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
