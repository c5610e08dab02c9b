"""``python -m bench.scheduler.dynamic_cost``: Dynamic's Filter + Score per decision against recent bindings.

In process, no API server: N annotated nodes in a node table, the Dynamic plugin alone, and 0, 1,000 and 10,000
pods reserved (bound) in the last minutes. The cost per decision should not grow with the bindings: their effects
are cached per node (``loadaware/recent.py``). Reports ms per decision (mean over 200 decisions).

    .venv/bin/python -m bench.scheduler.dynamic_cost --nodes 1000,5000
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np

from crane_scheduler.framework import Handle
from crane_scheduler.loadaware.args import parse_args
from crane_scheduler.loadaware.plugin import Dynamic
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import parse_node, parse_pod
from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.policy import default_policy

START = 1_800_000_000.0


def _node(i: int) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(START - 30, UTC)
    annotations = {
        s.name: encode_usage(0.1 + 0.4 * ((i * 7919) % 1000) / 1000, stamp) for s in default_policy().sync_policy
    }
    annotations["node_hot_value"] = encode_hot_value(0, stamp)
    resources = {"cpu": "4", "memory": "32Gi", "pods": "110"}
    return {
        "metadata": {"name": f"n{i}", "labels": {}, "annotations": annotations},
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def _pod(name: str) -> dict[str, Any]:
    resources = {"requests": {"cpu": "100m", "memory": "500Mi"}}
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": name},
        "spec": {"containers": [{"name": "c", "image": "pause", "resources": resources}]},
    }


def cost(nodes: int, bindings: tuple[int, ...] = (0, 1000, 10000), decisions: int = 200) -> dict[int, float]:
    table = NodeTable()
    for i in range(nodes):
        table.upsert_node(parse_node(_node(i)))
    clock = [START]
    plugin = Dynamic(parse_args({}), Handle(table), wall_clock=lambda: clock[0])
    pod = parse_pod(_pod("p"))
    rows = np.arange(nodes)
    out: dict[int, float] = {}
    bound = 0
    for target in bindings:
        while bound < target:
            clock[0] += 0.01
            plugin.reserve({}, parse_pod(_pod(f"b{bound}")), f"n{bound % nodes}")
            bound += 1
        started = time.thread_time()  # CPU time: the machine is shared
        for _ in range(decisions):
            clock[0] += 0.001
            state: dict[str, Any] = {}
            plugin.filter(state, pod, table)
            plugin.score(state, pod, table, rows)
        out[target] = (time.thread_time() - started) / decisions * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler.dynamic_cost", description=__doc__)
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--bindings", default="0,1000,10000", help="recent bindings held, comma-separated")
    parser.add_argument("--decisions", type=int, default=200, help="decisions timed per point")
    args = parser.parse_args()
    bindings = tuple(int(x) for x in args.bindings.split(","))
    for n in (int(x) for x in args.nodes.split(",")):
        for bound, ms in cost(n, bindings, args.decisions).items():
            print(f"{n:>6} nodes, {bound:>6} recent bindings: {ms:6.3f} ms per Filter + Score", flush=True)


if __name__ == "__main__":
    main()
