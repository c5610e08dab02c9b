"""``python -m bench.descheduler``: the wall time of one descheduler round (the pure core, in process) at scale.

Per size: ``nodes`` nodes with the annotator's load annotations (one in ten hot, the rest with room), ``pods``
Running pods spread over them (50 workloads in 50 namespaces), every pod measured. Reported: the first round (every
pod read), a steady round (pods unchanged: read from the round-to-round cache), the evictions planned, and the
reference measured in the same run: decoding every node's annotations with the scheduler's own ``node_load``,
which any round pays (the floor).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from crane_descheduler.classify import Detector
from crane_descheduler.policy import default_policy
from crane_descheduler.rounds import run_round
from crane_descheduler.targets import SchedulerSnapshot
from crane_shared.annotations import annotation_key, encode_usage
from crane_shared.batch import PodUsage
from crane_shared.loadaware.dynamic import DynamicArgs, node_load
from crane_shared.policy import default_policy as scheduler_policy

NOW = datetime.now(UTC)


def nodes(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        usage = 0.9 if i % 10 == 0 else 0.3
        notes = {
            annotation_key(f"{r}_{m}"): encode_usage(usage if r == "cpu" else 0.3, NOW)
            for r in ("cpu", "mem")
            for m in ("usage_avg_5m", "usage_max_avg_1h")
        }
        out.append(
            {
                "metadata": {"name": f"node-{i:05d}", "labels": {}, "annotations": notes},
                "spec": {},
                "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}},
            }
        )
    return out


def pods(p: int, n: int) -> list[dict[str, Any]]:
    created = (NOW - timedelta(hours=1)).isoformat()
    out = []
    for j in range(p):
        owner = f"w{j % 50}"
        out.append(
            {
                "metadata": {
                    "name": f"p{j}",
                    "namespace": f"ns{j % 50}",
                    "uid": f"u{j}",
                    "resourceVersion": "1",
                    "creationTimestamp": created,
                    "ownerReferences": [{"kind": "ReplicaSet", "name": owner, "uid": owner, "controller": True}],
                },
                "spec": {
                    "nodeName": f"node-{j % n:05d}",
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
                },
                "status": {
                    "phase": "Running",
                    "qosClass": "Burstable",
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    return out


def measure(n: int, p: int) -> dict[str, Any]:
    node_objs, pod_objs = nodes(n), pods(p, n)
    usage = {f"ns{j % 50}/p{j}": PodUsage(0.5, 1 << 28) for j in range(p)}
    args = DynamicArgs(scheduler_policy())
    policy = default_policy(scheduler_policy())
    detectors = {f"node-{i:05d}": Detector(hot=True) for i in range(n)}
    cache: dict[str, Any] = {}
    snapshot = SchedulerSnapshot()  # the scheduler's node table for the target check, kept as the service keeps it
    started = time.perf_counter()
    first = run_round(node_objs, pod_objs, usage, policy, args, detectors, NOW, (), (), cache, (), snapshot)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    run_round(node_objs, pod_objs, usage, policy, args, detectors, NOW, (), (), cache, (), snapshot)
    steady = time.perf_counter() - started
    started = time.perf_counter()
    for node in node_objs:
        node_load(node["metadata"]["name"], node["metadata"]["annotations"], args, NOW)
    floor = time.perf_counter() - started
    return {
        "nodes": n,
        "pods": p,
        "first_round_s": round(cold, 3),
        "steady_round_s": round(steady, 3),
        "decode_annotations_s": round(floor, 3),
        "evictions": len(first.plan.evictions),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.descheduler", description=__doc__)
    parser.add_argument("--sizes", default="1000x20000,5000x50000", help="NODESxPODS,... (default %(default)s)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    rows = []
    print(f"{'nodes':>6} {'pods':>7} {'first round':>12} {'steady round':>13} {'decode only':>12} {'evictions':>9}")
    for size in args.sizes.split(","):
        n, p = (int(x) for x in size.lower().split("x"))
        row = measure(n, p)
        rows.append(row)
        print(
            f"{n:>6} {p:>7} {row['first_round_s']:>11.3f}s {row['steady_round_s']:>12.3f}s "
            f"{row['decode_annotations_s']:>11.3f}s {row['evictions']:>9}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"results": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
