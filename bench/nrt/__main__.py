"""``python -m bench.nrt``: decision latency with NodeResourceTopologyMatch on, against the same profile without it.

Both profiles see the same node table (N nodes, each with a two-zone NRT of 16 CPUs per zone and bound pods
holding zone results); each decision runs PreFilter to node selection (``Algorithm.schedule``), no binding. The
pods are Guaranteed with whole CPUs (the plugin's targets: it evaluates every node's zones) or fractional
(non-targets: the plugin only classifies the pod). Reported: median and p99 per decision, and the ratio
plugin-on / plugin-off measured in the same run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from crane_scheduler.algorithm import Algorithm, ScheduleResult
from crane_scheduler.config import parse_config
from crane_scheduler.framework import Handle
from crane_scheduler.framework.runtime import Profile, build_profiles
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import builtin_registry
from crane_scheduler.plugins.noderesourcetopology.model import ANNOTATION_RESULT
from crane_scheduler.plugins.noderesourcetopology.plugin import NodeResourceTopologyMatch
from crane_scheduler.podinfo import PodInfo, parse_node, parse_pod

PLUGIN = "NodeResourceTopologyMatch"


def _node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "status": {"allocatable": alloc}}


def _nrt(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "craneManagerPolicy": {"cpuManagerPolicy": "Static", "topologyManagerPolicy": "SingleNUMANodePodLevel"},
        "zones": [
            {"name": f"node{z}", "type": "Node", "resources": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}
            for z in range(2)
        ],
    }


def _pod(name: str, cpu: str, node: str = "", zone: str = "") -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "1Gi"}
    meta: dict[str, Any] = {"name": name, "namespace": "bench", "uid": name}
    if zone:
        cores = int(cpu)
        meta["annotations"] = {
            ANNOTATION_RESULT: f'[{{"name":"{zone}","type":"Node","resources":{{"capacity":{{"cpu":"{cores}"}}}}}}]'
        }
    return {
        "metadata": meta,
        "spec": {
            "schedulerName": "crane-scheduler",
            "nodeName": node or None,
            "containers": [{"name": "c", "resources": {"requests": res, "limits": dict(res)}}],
        },
    }


def setup(n: int, rng: random.Random) -> tuple[NodeTable, Profile, Profile]:
    table = NodeTable()
    for i in range(n):
        table.upsert_node(parse_node(_node(f"n{i}")))
    registry = builtin_registry()
    with_nrt = parse_config(
        {"profiles": [{"schedulerName": "on", "plugins": {"multiPoint": {"enabled": [{"name": PLUGIN, "weight": 2}]}}}]}
    )
    on = build_profiles(with_nrt, registry, lambda name: Handle(table, profile=name))["on"]
    off = build_profiles(parse_config({"profiles": [{"schedulerName": "off"}]}), registry, lambda name: Handle(table))
    plugin = on.plugins[PLUGIN]
    assert isinstance(plugin, NodeResourceTopologyMatch)
    plugin.replace_topologies([_nrt(f"n{i}") for i in range(n)])
    for i in range(n * 4):  # ~4 pods per node holding 1-4 CPUs of one zone
        node = f"n{rng.randrange(n)}"
        table.add_pod(parse_pod(_pod(f"b{i}", str(rng.randint(1, 4)), node, f"node{rng.randrange(2)}")))
    return table, on, off["off"]


def measure(table: NodeTable, profile: Profile, pods: list[PodInfo]) -> list[float]:
    algo = Algorithm(table, rng=random.Random(0))
    out = []
    for pod in pods:
        t0 = time.perf_counter()
        result = algo.schedule(profile, pod, {})
        out.append(time.perf_counter() - t0)
        assert isinstance(result, ScheduleResult), result
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.nrt", description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--pods", type=int, default=300, help="decisions per measurement")
    args = parser.parse_args()
    rng = random.Random(1)
    print(
        f"{'nodes':>6} {'pods':10} {'off p50':>9} {'on p50':>9} {'ratio':>6} {'off p99':>9} {'on p99':>9} {'ratio':>6}"
    )
    for n in args.nodes:
        table, on, off = setup(n, rng)
        for kind, cpu in (("whole-cpu", "4"), ("fraction", "1500m")):
            pods = [parse_pod(_pod(f"{kind}{i}", cpu)) for i in range(args.pods)]
            measure(table, on, pods[:20])  # warm up
            t_off, t_on = measure(table, off, pods), measure(table, on, pods)
            p50 = statistics.median(t_off), statistics.median(t_on)
            p99 = (statistics.quantiles(t_off, n=100)[98], statistics.quantiles(t_on, n=100)[98])
            print(
                f"{n:>6} {kind:10} {p50[0] * 1e3:>7.2f}ms {p50[1] * 1e3:>7.2f}ms {p50[1] / p50[0]:>6.2f}"
                f" {p99[0] * 1e3:>7.2f}ms {p99[1] * 1e3:>7.2f}ms {p99[1] / p99[0]:>6.2f}"
            )


if __name__ == "__main__":
    main()
