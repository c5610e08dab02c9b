"""``python -m bench.gangs``: per-gang decision time of the gang cycle (Coscheduling, all or nothing).

kube's scheduler_perf gang case (``gangscheduling/performance-config.yaml``, 1.36 PodGroups): 5,000 nodes, 1,000
gangs of 3, metric ``scheduler_podgroup_scheduling_attempt_duration_seconds`` (threshold 8 ms, measured ~3.7 ms
there). Here: the scheduler in-process over its node table (no API server; a binder that succeeds at once), the
gangs' PodGroups known to the plugin, every pod pending before the first pop; each gang cycle (one pop: the
member, its siblings taken from the queue, three decisions, three assumptions and Reserves, three binding tasks
started) is timed from the pop to the cycle's end. Not a comparison with the real scheduler-plugins binary.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from typing import Any

from crane_scheduler.framework import SUCCESS, CycleState, Status
from crane_scheduler.podinfo import PodInfo
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler
from crane_scheduler.simulate import POD_GROUP_LABEL, POD_GROUP_RESOURCE, Simulator

GROUP, VERSION, _ = POD_GROUP_RESOURCE

CONFIG = {
    "profiles": [
        {
            "schedulerName": "crane-scheduler",
            "plugins": {
                "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
                "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
            },
        }
    ]
}
_uids = itertools.count()


class Binder:
    name = "DefaultBinder"

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        return SUCCESS


def _node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "status": {"allocatable": alloc}}


def _member(group: str, i: int) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "1Gi"}
    return {
        "metadata": {
            "name": f"{group}-{i}",
            "namespace": "bench",
            "uid": f"u{next(_uids)}",
            "labels": {POD_GROUP_LABEL: group},
        },
        "spec": {"schedulerName": "crane-scheduler", "containers": [{"name": "c", "resources": {"requests": res}}]},
    }


def _group(name: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "bench", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"minMember": size},
    }


async def run(nodes: int, gangs: int, size: int) -> list[float]:
    binder = Binder()
    sim = Simulator(
        CONFIG, clock=time.monotonic, out_of_tree=False, plugins={"DefaultBinder": lambda args, handle: binder}
    )
    s = Scheduler(config=sim.config, profiles=sim.profiles, table=sim.table, reporter=Reporter(None, None, "bench"))
    for i in range(nodes):
        s.on_node(_node(f"n{i}"))
    for g in range(gangs):
        sim.add(_group(f"g{g}", size))  # the PodGroup watch's event
        for i in range(size):
            s.on_pod(_member(f"g{g}", i))
    times = []
    while True:
        await s._slots.acquire()
        start = time.perf_counter()
        qp = s.queue.pop(s.clock())
        if qp is None:
            break
        s.schedule_one(qp)
        times.append(time.perf_counter() - start)
        await asyncio.sleep(0)
    await s.drain()
    assert len(sim.table.pods) == gangs * size, "every member placed"
    return times


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gangs", description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gangs", type=int, default=1000)
    parser.add_argument("--size", type=int, default=3, help="members per gang (minMember)")
    args = parser.parse_args()
    times = asyncio.run(run(args.nodes, args.gangs, args.size))
    ms = sorted(t * 1000 for t in times)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(
        f"{args.nodes} nodes, {args.gangs} gangs of {args.size}: per gang cycle mean {statistics.fmean(ms):.2f} ms, "
        f"median {statistics.median(ms):.2f} ms, p99 {p99:.2f} ms ({len(ms)} cycles)"
    )


if __name__ == "__main__":
    main()
