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
from crane_scheduler.config import parse_config
from crane_scheduler.framework import Handle
from crane_scheduler.framework.runtime import build_profiles
from crane_scheduler.listers import Listers
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import builtin_registry
from crane_scheduler.podinfo import parse_node, parse_pod

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
    table = NodeTable(capacity=nodes)
    listers = Listers()
    for i in range(nodes):
        table.upsert_node(parse_node(node_json(i)))
        name = f"node-{i:05d}"
        listers.apply(
            "csinodes",
            "ADDED",
            {
                "metadata": {"name": name},
                "spec": {"drivers": [{"name": DRIVER, "nodeID": name, "allocatable": {"count": 39}}]},
            },
        )
    bodies = []
    for i in range(pods):
        pod, pvc, pv = objects(i)
        listers.apply("pvs", "ADDED", pv)
        listers.apply("pvcs", "ADDED", pvc)
        bodies.append(pod)
    config = {"profiles": [{"schedulerName": SCHEDULER, **base.PROFILES[plugins]}]}
    profiles = build_profiles(
        parse_config(config), builtin_registry(), lambda name: Handle(table, profile=name, listers=listers)
    )
    return timed_decisions(table, profiles[SCHEDULER], (parse_pod(body) for body in bodies), prof)


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
