"""``python -m bench.scheduler.pod_memory``: resident memory per bound pod in the scheduler's cache, in process.

5,000 nodes and 50,000 bound pods decoded from API-shaped JSON (with the ``managedFields`` entry the API server
adds for a client's create) and fed through the scheduler's cache handlers, as the pod informer does; reports the
growth of VmRSS. ``--keep-managed-fields`` measures without the cache's trimming (the code before it).

    .venv/bin/python -m bench.scheduler.pod_memory
    .venv/bin/python -m bench.scheduler.pod_memory --keep-managed-fields
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from datetime import UTC, datetime
from typing import Any

import crane_scheduler.internal.cache as cache_module
from bench.scheduler.loop import node, pod
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler
from crane_scheduler.simulate import Simulator

MANAGED_FIELDS = [
    {
        "manager": "python",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-11-22T20:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:spec": {
                "f:containers": {
                    'k:{"name":"pause"}': {
                        ".": {},
                        "f:image": {},
                        "f:imagePullPolicy": {},
                        "f:name": {},
                        "f:resources": {
                            ".": {},
                            "f:limits": {".": {}, "f:cpu": {}, "f:memory": {}},
                            "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}},
                        },
                        "f:terminationMessagePath": {},
                        "f:terminationMessagePolicy": {},
                    }
                },
                "f:dnsPolicy": {},
                "f:enableServiceLinks": {},
                "f:nodeName": {},
                "f:restartPolicy": {},
                "f:schedulerName": {},
                "f:securityContext": {},
                "f:terminationGracePeriodSeconds": {},
            }
        },
    }
]


def resident_mib() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler.pod_memory", description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--keep-managed-fields", action="store_true", help="do not trim (the code before)")
    args = parser.parse_args()
    if args.keep_managed_fields:
        cache_module.trim = lambda raw: raw
    sim = Simulator(clock=time.monotonic, wall_clock=time.time)  # the service's profile and clocks
    s = Scheduler(config=sim.config, profiles=sim.profiles, table=sim.table, reporter=Reporter(None, None, "bench"))
    now = datetime.now(UTC)
    for i in range(args.nodes):
        s.cache.node_event("ADDED", node(i, now), None)
    texts = []
    for i in range(args.pods):
        raw = pod(i)
        raw["metadata"]["managedFields"] = MANAGED_FIELDS
        raw["spec"]["nodeName"] = f"node-{i % args.nodes:05d}"
        texts.append(json.dumps(raw).encode())
    gc.collect()
    before = resident_mib()
    informer_view: dict[str, Any] = {}  # the informer keeps every object it emitted
    for text in texts:
        raw = json.loads(text)
        informer_view[raw["metadata"]["uid"]] = raw
        s.cache.pod_event("ADDED", raw, None)
    texts.clear()
    gc.collect()
    grown = resident_mib() - before
    print(
        f"{args.pods} bound pods on {args.nodes} nodes "
        f"({'managedFields kept' if args.keep_managed_fields else 'managedFields trimmed'}): "
        f"+{grown:.0f} MiB resident, {grown * 1024 / args.pods:.1f} KiB per pod; {len(informer_view)} in the view"
    )


if __name__ == "__main__":
    main()
