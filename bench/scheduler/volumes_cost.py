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
import time
from typing import Any

import numpy as np

from bench.scheduler import __main__ as base
from bench.scheduler.affinity_cost import node_json
from bench.scheduler.volumes import DRIVER
from crane_scheduler.algorithm import Algorithm, ScheduleResult
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
    """The i-th pod, its claim and its PV, as ``bench.scheduler.volumes`` creates them (plus what the API server
    adds that the plugins read)."""
    claim, volume = f"data-{i:05d}", f"{NAMESPACE}-pv-{i:05d}"
    pv = {
        "metadata": {"name": volume, "uid": volume, "resourceVersion": "1"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": DRIVER, "volumeHandle": volume},
            "claimRef": {"namespace": NAMESPACE, "name": claim},
            "persistentVolumeReclaimPolicy": "Retain",
        },
        "status": {"phase": "Bound"},
    }
    pvc = {
        "metadata": {
            "name": claim,
            "namespace": NAMESPACE,
            "uid": claim,
            "resourceVersion": "1",
            "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeName": volume,
            "storageClassName": "",
        },
        "status": {"phase": "Bound"},
    }
    pod = {
        "metadata": {"name": f"pod-{i:05d}", "namespace": NAMESPACE, "uid": f"{NAMESPACE}/pod-{i:05d}"},
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [
                {
                    "name": "pause",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "500Mi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }
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
    profile = profiles[SCHEDULER]
    algorithm = Algorithm(table, 0)
    times = []
    placed = 0
    for body in bodies:
        info = parse_pod(body)
        state: dict[str, Any] = {}
        if prof is not None:
            prof.enable()
        t = time.process_time()
        result = algorithm.schedule(profile, info, state)
        if isinstance(result, ScheduleResult):
            table.assume(info, result.node)
            profile.run_reserve(state, info, result.node)
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
