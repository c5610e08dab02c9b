"""``python -m bench.simulate``: ``cranectl simulate``'s cost at scale (10,000 pods onto 5,000 nodes by default).

A synthetic snapshot (every node with the load annotations, ``--bound`` pods bound per node) and one Deployment of
``--pods`` replicas; the phases timed are those of the command: reading the snapshot file, loading it into the
simulator, placing the pods one after another (each seeing the ones before), rendering the table and the JSON, and
the plot. Peak RSS is the process's (``ru_maxrss``); the load average is printed beside the numbers (the machine
is shared). With ``--no-dynamic`` the same run without the load-aware plugin (the default profile of the built-in
plugins only) is the reference: the ratio is what real load costs on top of kube's plugins.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cranectl import whatif
from cranectl.snapshot import KIND, read

METRICS = ["cpu_usage_avg_5m", "cpu_usage_max_avg_1h", "cpu_usage_max_avg_1d"]
METRICS += ["mem_usage_avg_5m", "mem_usage_max_avg_1h", "mem_usage_max_avg_1d"]
NO_DYNAMIC = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [
        {"schedulerName": "default-scheduler", "plugins": {"multiPoint": {"disabled": [{"name": "Dynamic"}]}}}
    ],
}


def snapshot(nodes: int, bound: int, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S+00:00")
    objects: list[dict[str, Any]] = []
    for i in range(nodes):
        name = f"node-{i:05d}"
        resources = {"cpu": "32", "memory": "128Gi", "pods": "110"}
        usage = rng.uniform(0.05, 0.7)
        objects.append(
            {
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": f"z{i % 3}"},
                    "annotations": {m: f"{usage:.5f},{stamp}" for m in METRICS},
                },
                "spec": {},
                "status": {"allocatable": resources, "capacity": resources},
            }
        )
        for j in range(bound):
            requests = {"cpu": rng.choice(["250m", "500m", "1", "2"]), "memory": rng.choice(["512Mi", "1Gi", "4Gi"])}
            objects.append(
                {
                    "kind": "Pod",
                    "metadata": {"name": f"b-{i}-{j}", "namespace": "default", "uid": f"u-{i}-{j}"},
                    "spec": {"nodeName": name, "containers": [{"name": "c", "resources": {"requests": requests}}]},
                    "status": {"phase": "Running"},
                }
            )
    return {"apiVersion": "crane.io/v1alpha1", "kind": KIND, "takenAt": now.isoformat(), "objects": objects}


def deployment(replicas: int) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": "web"}},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}}, "template": template},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.simulate", description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--bound", type=int, default=2, help="pods bound per node in the snapshot")
    parser.add_argument("--no-dynamic", action="store_true", help="the reference: kube's plugins only")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snapshot.json"
        doc = snapshot(args.nodes, args.bound)
        if args.no_dynamic:
            doc["schedulerConfig"] = NO_DYNAMIC
        path.write_text(json.dumps(doc))
        del doc
        times: dict[str, float] = {}
        start = time.perf_counter()
        snap = read(path)
        times["read"] = time.perf_counter() - start
        workload = whatif.expand([deployment(args.pods)])
        setup = whatif.base_setup(snap)
        phases: dict[str, float] = {}
        start = time.perf_counter()
        outcome = whatif.run(snap, workload, setup, phases=phases)
        times |= phases
        times["run"] = time.perf_counter() - start
        start = time.perf_counter()
        whatif.table([outcome], limit=50)
        whatif.as_json([outcome], snap)
        times["table+json"] = time.perf_counter() - start
        if not args.no_plot:
            start = time.perf_counter()
            whatif.plot_png([outcome])
            times["plot"] = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load = os.getloadavg()
    label = "kube's plugins only (reference)" if args.no_dynamic else "with Dynamic (the default profile)"
    print(f"{args.pods} pods onto {args.nodes} nodes ({args.bound} bound per node), {label}")
    print(f"{outcome.placed}/{len(outcome.pods)} pods placed, {len(outcome.pods) - outcome.placed} pending")
    for phase, seconds in times.items():
        print(f"  {phase:14} {seconds:7.2f} s")
    print(f"  per pod        {times['place'] / max(1, args.pods) * 1000:7.3f} ms")
    print(f"  peak RSS       {rss:7.0f} MiB")
    print(f"  load average   {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
