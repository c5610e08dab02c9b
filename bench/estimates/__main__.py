"""Learned estimates against the factor estimate on the same scale-up: ``python -m bench.estimates``.

On a real API server (etcd + kube-apiserver) with crane-scheduler (in process, the chart's scheduler identity, the
default policy), eight nodes of 16 cores / 64Gi whose real usage is uneven (CPU 0.22-0.43, memory 0.25-0.46).
Two workloads whose real usage differs from ``0.6 x request`` in opposite directions, each with three running
replicas already measured:

- ``cpu-heavy``: requests 2 cores / 2Gi, uses 1.9 cores / 1.5Gi (the factor under-estimates CPU: 1.2 cores);
- ``memory-heavy``: requests 0.5 core / 12Gi, uses 0.3 core / 2.5Gi (the factor over-estimates memory: 7.2Gi).

The bench writes what the annotator would (the usage annotations of each node and ``crane.io/pod-usage`` with the
running replicas' usage) from a usage model, stamped just before the scale-up, then creates ``--replicas`` new
replicas of one workload at once and waits until each is bound or reported unschedulable. Once per workload and
per estimate (``estimate.learned.enabled`` true or false), each on fresh nodes. From the model it reports:

- overloaded nodes: real usage after the scale-up above the 0.65 threshold (CPU or memory), and the highest;
- replicas left Pending although some node had real headroom for them (requests fit and real usage stays under
  the threshold), counted greedily node by node.

The annotations do not move during the scale-up (no annotator runs): only the estimates of the pods just bound
keep the scheduler from piling onto a node, which is what this bench compares.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_sandbox.rbac import DEFAULT_NAMESPACE, install_identities
from crane_shared.kube import api_client_from_dict
from tests.support.scheduler_cluster import create_nodes, create_pods, in_process, node, pod, pods_json
from tests.support.usage_cluster import annotate, as_replica, dynamic_config

GI = 2**30
THRESHOLD = 0.65
NODES = 8
CORES, MEMORY = 16.0, 64.0 * GI
RUNNING = 3
"""measured replicas already running (on the first three nodes)"""


@dataclass(frozen=True)
class Workload:
    name: str
    request: tuple[str, str]
    request_amount: tuple[float, float]
    """(cores, bytes) of the request"""
    real: tuple[float, float]
    """(cores, bytes) each replica really uses"""


WORKLOADS = (
    Workload("cpu-heavy", ("2", "2Gi"), (2.0, 2.0 * GI), (1.9, 1.5 * GI)),
    Workload("memory-heavy", ("500m", "12Gi"), (0.5, 12.0 * GI), (0.3, 2.5 * GI)),
)


def base_usage(i: int) -> tuple[float, float]:
    """Node i's real usage before the scale-up (its running replicas included), as fractions."""
    return 0.22 + 0.03 * i, 0.25 + 0.03 * i


@dataclass
class Outcome:
    workload: str
    estimate: str
    bound: int
    pending: int
    overloaded_nodes: int
    peak_cpu: float
    peak_memory: float
    pending_with_headroom: int
    per_node: list[int]
    seconds: float


def judge(w: Workload, placed: list[str | None], nodes: list[str], running: dict[str, int]) -> tuple[Any, ...]:
    """Real usage per node after the placements (the usage model), and the pending replicas that had a place."""
    cpu = [base_usage(i)[0] for i in range(len(nodes))]
    mem = [base_usage(i)[1] for i in range(len(nodes))]
    req_cpu = [running.get(n, 0) * w.request_amount[0] for n in nodes]
    req_mem = [running.get(n, 0) * w.request_amount[1] for n in nodes]
    per_node = [0] * len(nodes)
    for where in placed:
        if where is None:
            continue
        i = nodes.index(where)
        per_node[i] += 1
        cpu[i] += w.real[0] / CORES
        mem[i] += w.real[1] / MEMORY
        req_cpu[i] += w.request_amount[0]
        req_mem[i] += w.request_amount[1]
    overloaded = sum(1 for c, m in zip(cpu, mem, strict=True) if c > THRESHOLD or m > THRESHOLD)
    peak_cpu, peak_mem = max(cpu), max(mem)
    headroom = 0
    for _ in range(sum(1 for p in placed if p is None)):
        for i in range(len(nodes)):
            fits = req_cpu[i] + w.request_amount[0] <= CORES and req_mem[i] + w.request_amount[1] <= MEMORY
            cool = cpu[i] + w.real[0] / CORES <= THRESHOLD and mem[i] + w.real[1] / MEMORY <= THRESHOLD
            if fits and cool:
                headroom += 1
                cpu[i] += w.real[0] / CORES
                mem[i] += w.real[1] / MEMORY
                req_cpu[i] += w.request_amount[0]
                req_mem[i] += w.request_amount[1]
                break
    return overloaded, peak_cpu, peak_mem, headroom, per_node


async def scale_up(
    cluster: LocalCluster, kube: client.ApiClient, w: Workload, learned: bool, run: int, n: int
) -> Outcome:
    group = f"est{run}"
    namespace = f"est{run}-{w.name}"
    scheduler = f"crane-est{run}"
    await client.CoreV1Api(kube).create_namespace({"metadata": {"name": namespace}})
    names = [f"{group}-n{i}" for i in range(NODES)]
    await create_nodes(kube, [node(name, group, cpu="16", memory="64Gi") for name in names])
    cpu, memory = w.request
    running = {names[i]: 1 for i in range(RUNNING)}
    peers = [
        as_replica(pod(f"{w.name}-{i}", "nobody", cpu, memory, node_name=names[i]), w.name) for i in range(RUNNING)
    ]
    await create_pods(kube, namespace, peers)
    for i, name in enumerate(names):
        measured = {f"{namespace}/{w.name}-{i}": w.real} if i < RUNNING else {}
        await annotate(kube, name, base_usage(i)[0], memory=base_usage(i)[1], pods=measured)
    new = [as_replica(pod(f"{w.name}-{RUNNING + i}", scheduler, cpu, memory), w.name) for i in range(n)]
    wanted = {p["metadata"]["name"] for p in new}
    config = dynamic_config(scheduler, estimate={"learned": {"enabled": learned}})
    started = time.monotonic()
    async with in_process(cluster, config, f"crane.test/group={group}", load_aware=True):
        await create_pods(kube, namespace, new)
        while True:
            pods = [p for p in await pods_json(kube, namespace) if p["metadata"]["name"] in wanted]
            decided = [p for p in pods if p["spec"].get("nodeName") or _refused(p)]
            if len(decided) == len(wanted):
                break
            if time.monotonic() - started > 120:
                raise TimeoutError(f"{len(wanted) - len(decided)} replicas undecided after 120 s")
            await asyncio.sleep(0.2)
        seconds = time.monotonic() - started
    placed = [p["spec"].get("nodeName") for p in pods]
    overloaded, peak_cpu, peak_mem, headroom, per_node = judge(w, placed, names, running)
    bound = sum(1 for p in placed if p)
    return Outcome(
        w.name,
        "learned" if learned else "factor",
        bound,
        len(placed) - bound,
        overloaded,
        round(peak_cpu, 3),
        round(peak_mem, 3),
        headroom,
        per_node,
        round(seconds, 2),
    )


def _refused(p: dict[str, Any]) -> bool:
    conds = (p.get("status") or {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)


async def main_async(replicas: int) -> list[Outcome]:
    run_dir = new_run_dir("bench-estimates")
    outcomes: list[Outcome] = []
    async with LocalCluster(run_dir) as cluster:
        kube = await api_client_from_dict(cluster.kubeconfig_dict())
        try:
            await install_identities(cluster, kube, DEFAULT_NAMESPACE)
            run = 0
            for w in WORKLOADS:
                for learned in (False, True):
                    outcomes.append(await scale_up(cluster, kube, w, learned, run, replicas))
                    run += 1
        finally:
            await kube.close()
    return outcomes


def report(outcomes: list[Outcome], replicas: int, out: Path | None) -> None:
    load = os.getloadavg()[0]
    print(f"{replicas} replicas at once; {NODES} nodes of 16 cores / 64Gi; threshold {THRESHOLD}; load {load:.2f}")
    print(
        "| workload | estimate | bound | pending | overloaded nodes | peak real CPU | peak real memory "
        "| pending with real headroom | replicas per node |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for o in outcomes:
        print(
            f"| {o.workload} | {o.estimate} | {o.bound} | {o.pending} | {o.overloaded_nodes} | {o.peak_cpu:.3f} "
            f"| {o.peak_memory:.3f} | {o.pending_with_headroom} | {'/'.join(map(str, o.per_node))} |"
        )
    if out is not None:
        out.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.estimates", description=__doc__)
    parser.add_argument("--replicas", type=int, default=30, help="replicas created at once per scale-up")
    parser.add_argument("--json", type=Path, default=None, help="also write the outcomes here")
    args = parser.parse_args()
    report(asyncio.run(main_async(args.replicas)), args.replicas, args.json)


if __name__ == "__main__":
    main()
