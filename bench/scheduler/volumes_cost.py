"""``python -m bench.scheduler.volumes_cost``: the in-process cost of a SchedulingCSIPVs decision.

The objects of ``bench.scheduler.volumes`` (N nodes with crane's load annotations, a CSINode per node allowing
39 volumes of one driver, P pods each with its own claim bound to its own CSI PV) fed to the listers, then every
pod goes through one decision, assume and Reserve, as the scheduling loop does. Reports CPU ms per decision
(process time: other processes on a shared machine do not count); ``--profile`` prints cProfile's top
functions.

    .venv/bin/python -m bench.scheduler.volumes_cost --nodes 100 --pods 500
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from typing import Any

from bench.scheduler import __main__ as base
from bench.scheduler.affinity_cost import node_json, timed_decisions
from bench.scheduler.volumes import DRIVER, workload_objects
from crane_scheduler.simulate import Simulator, parse_pod

SCHEDULER = "crane-bench"
NAMESPACE = "pv-crane"


def objects(i: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The i-th pod, its claim and its PV, as ``bench.scheduler.volumes`` creates them, with what the API server
    and the PV controller add that the plugins read (uids, phases)."""
    pv, pvc, pod = workload_objects(NAMESPACE, i, SCHEDULER)
    pv["metadata"].update(uid=pv["metadata"]["name"], resourceVersion="1")
    pv["status"] = {"phase": "Bound"}
    pvc["metadata"].update(namespace=NAMESPACE, uid=pvc["metadata"]["name"], resourceVersion="1")
    pvc["status"] = {"phase": "Bound"}
    pod["metadata"].update(namespace=NAMESPACE, uid=f"{NAMESPACE}/{pod['metadata']['name']}")
    return pod, pvc, pv


def run(nodes: int, pods: int, plugins: str, prof: cProfile.Profile | None) -> dict[str, float]:
    config = {"profiles": [{"schedulerName": SCHEDULER, **base.PROFILES[plugins]}]}
    sim = Simulator(config, out_of_tree=False)
    for i in range(nodes):
        sim.add(node_json(i), kind="Node")
        name = f"node-{i:05d}"
        driver = {"name": DRIVER, "nodeID": name, "allocatable": {"count": 39}}
        sim.add({"metadata": {"name": name}, "spec": {"drivers": [driver]}}, kind="CSINode")
    bodies = []
    for i in range(pods):
        pod, pvc, pv = objects(i)
        sim.add(pv, kind="PersistentVolume")
        sim.add(pvc, kind="PersistentVolumeClaim")
        bodies.append(pod)
    return timed_decisions(sim, (parse_pod(body) for body in bodies), prof)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler.volumes_cost", description=__doc__)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--plugins", choices=sorted(base.PROFILES), default="default")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    args = parser.parse_args()
    prof = cProfile.Profile() if args.profile else None
    r = run(args.nodes, args.pods, args.plugins, prof)
    print(
        f"SchedulingCSIPVs {args.nodes} nodes {args.pods} pods {args.plugins}: decision+assume mean {r['mean']:.3f} ms "
        f"p50 {r['p50']:.3f} ms p99 {r['p99']:.3f} ms, placed {r['placed']:.0f}"
    )
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
