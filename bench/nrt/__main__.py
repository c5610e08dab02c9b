"""``python -m bench.nrt``: decision latency with NodeResourceTopologyMatch on, against the same profile without it.

Both profiles see the same node table (N nodes, each with a two-zone NRT of 16 CPUs per zone and bound pods
holding zone results); each decision runs PreFilter to node selection (``Simulator.place``), no binding. The
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

from crane_scheduler.simulate import Simulator, parse_pod

PLUGIN = "NodeResourceTopologyMatch"
ANNOTATION_RESULT = "topology.crane.io/topology-result"
"""a bound pod's zones, as crane's agent and the plugin's PreBind write them"""


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


def setup(n: int, rng: random.Random) -> tuple[Simulator, Simulator]:
    """The profile with the plugin and the one without, over one node table (the built-in plugins, no Dynamic)."""
    enabled = [{"name": PLUGIN, "weight": 2}]
    with_nrt = {"profiles": [{"schedulerName": "on", "plugins": {"multiPoint": {"enabled": enabled}}}]}
    on = Simulator(with_nrt, out_of_tree=False)
    off = Simulator({"profiles": [{"schedulerName": "off"}]}, out_of_tree=False, table=on.table)
    on.sync("Node", [_node(f"n{i}") for i in range(n)])
    on.sync("NodeResourceTopology", [_nrt(f"n{i}") for i in range(n)])
    for i in range(n * 4):  # ~4 pods per node holding 1-4 CPUs of one zone
        node = f"n{rng.randrange(n)}"
        on.add(_pod(f"b{i}", str(rng.randint(1, 4)), node, f"node{rng.randrange(2)}"), kind="Pod")
    return on, off


def measure(sim: Simulator, pods: list[Any]) -> list[float]:
    sim.reseed(0)
    out = []
    for pod in pods:
        t0 = time.perf_counter()
        placement = sim.place(pod)
        out.append(time.perf_counter() - t0)
        assert placement.node is not None, placement.message
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
        on, off = setup(n, rng)
        for kind, cpu in (("whole-cpu", "4"), ("fraction", "1500m")):
            pods = [parse_pod(_pod(f"{kind}{i}", cpu)) for i in range(args.pods)]
            measure(on, pods[:20])  # warm up
            t_off, t_on = measure(off, pods), measure(on, pods)
            p50 = statistics.median(t_off), statistics.median(t_on)
            p99 = (statistics.quantiles(t_off, n=100)[98], statistics.quantiles(t_on, n=100)[98])
            print(
                f"{n:>6} {kind:10} {p50[0] * 1e3:>7.2f}ms {p50[1] * 1e3:>7.2f}ms {p50[1] / p50[0]:>6.2f}"
                f" {p99[0] * 1e3:>7.2f}ms {p99[1] * 1e3:>7.2f}ms {p99[1] / p99[0]:>6.2f}"
            )


if __name__ == "__main__":
    main()
