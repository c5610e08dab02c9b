"""scheduler_perf's affinity and spreading workloads, crane-scheduler side by side with kube-scheduler.

SchedulingPodAntiAffinity, SchedulingPodAffinity, SchedulingPreferredPodAffinity, TopologySpreading and
PreferredTopologySpreading, with the pod templates of ``test/integration/scheduler_perf`` (pinned release), on one
local cluster (etcd + kube-apiserver) per run, both schedulers with the same client QPS/burst:

- N nodes (4 cpu / 32Gi / 110 pods), labelled round-robin with zones moon-1..3 (scheduler_perf labels
  SchedulingPodAffinity's nodes with one zone, zone1: with three zones every zone holds init pods, so the
  required zone affinity is satisfiable everywhere as there);
- the workload's init pods are *bound* round-robin by the benchmark (scheduler_perf schedules them with the
  scheduler under test; both contenders here start from the same placed pods instead, and neither is timed on them);
- the measured pods are created pending, then the scheduler starts; throughput = pods / (last bind - first bind).

    .venv/bin/python -m bench.scheduler.workloads                          # 500 nodes, scheduler_perf's 500Nodes
    .venv/bin/python -m bench.scheduler.workloads --nodes 5000 --scale 5000Nodes
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes_asyncio import client

from bench.scheduler import __main__ as base
from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_shared.kube import api_client_from_dict

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
ZONES = ("moon-1", "moon-2", "moon-3")
RESOURCES = {"requests": base.POD_REQUESTS, "limits": base.POD_REQUESTS}

# workload -> (init pods, measured pods) per scheduler_perf scale
SCALES: dict[str, dict[str, tuple[int, int]]] = {
    "500Nodes": {
        "SchedulingPodAntiAffinity": (100, 400),
        "SchedulingPodAffinity": (500, 1000),
        "SchedulingPreferredPodAffinity": (500, 1000),
        "TopologySpreading": (1000, 1000),
        "PreferredTopologySpreading": (1000, 1000),
    },
    "5000Nodes": {
        "SchedulingPodAntiAffinity": (1000, 1000),
        "SchedulingPodAffinity": (5000, 1000),
        "SchedulingPreferredPodAffinity": (5000, 1000),
        "TopologySpreading": (5000, 2000),
        "PreferredTopologySpreading": (5000, 2000),
    },
    "smoke": {  # a few pods each: that every workload still runs (tests/integration/test_bench_smoke.py)
        "SchedulingPodAntiAffinity": (2, 4),
        "SchedulingPodAffinity": (3, 4),
        "SchedulingPreferredPodAffinity": (3, 4),
        "TopologySpreading": (3, 4),
        "PreferredTopologySpreading": (3, 4),
    },
}


def _term(labels: dict[str, str], key: str, namespaces: list[str]) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": labels}, "topologyKey": key, "namespaces": namespaces}


def template(workload: str, namespaces: list[str], measured: bool) -> tuple[dict[str, str], dict[str, Any]]:
    """(labels, spec extras) of a pod of ``workload``; ``namespaces`` stands for scheduler_perf's sched-1, sched-0."""
    if workload == "SchedulingPodAntiAffinity":
        term = _term({"color": "green"}, HOST, namespaces)
        return {"color": "green"}, {
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        }
    if workload == "SchedulingPodAffinity":
        term = _term({"color": "blue"}, ZONE, namespaces)
        return {"color": "blue"}, {
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        }
    if workload == "SchedulingPreferredPodAffinity":
        weighted = {"weight": 1, "podAffinityTerm": _term({"color": "red"}, HOST, namespaces)}
        return {"color": "red"}, {
            "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [weighted]}}
        }
    if not measured:  # the spreading workloads' init pods: pod-default.yaml
        return {}, {}
    action = "DoNotSchedule" if workload == "TopologySpreading" else "ScheduleAnyway"
    constraint = {
        "maxSkew": 5,
        "topologyKey": ZONE,
        "whenUnsatisfiable": action,
        "labelSelector": {"matchLabels": {"color": "blue"}},
    }
    return {"color": "blue"}, {"topologySpreadConstraints": [constraint]}


def pod_body(
    name: str, labels: dict[str, str], extra: dict[str, Any], scheduler: str, node: str | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {
                "name": "pause",
                "image": "registry.k8s.io/pause:3.10.1",
                "ports": [{"containerPort": 80}],
                "resources": RESOURCES,
            }
        ],
        **extra,
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


async def create_nodes(api: client.ApiClient, n: int) -> None:
    await base.create_nodes(api, n)
    v1 = client.CoreV1Api(api)

    async def label(i: int) -> None:
        patch = {"metadata": {"labels": {ZONE: ZONES[i % len(ZONES)]}}}
        (await v1.patch_node(f"node-{i:05d}", patch, _preload_content=False)).release()

    await base.gather_limited([label(i) for i in range(n)], 100)


@contextlib.contextmanager
def measured_pods(workload: str, namespaces: list[str]) -> Iterator[None]:
    """Make the base benchmark's runners create this workload's measured pods (they call ``create_pods``)."""
    labels, extra = template(workload, namespaces, measured=True)
    with created_pods(lambda name, scheduler: pod_body(name, labels, extra, scheduler, None)):
        yield


@contextlib.contextmanager
def created_pods(
    body: Callable[[str, str], dict[str, Any]], ready: Callable[[client.ApiClient, str, int], Any] | None = None
) -> Iterator[None]:
    """Make the base benchmark's runners create ``body(name, schedulerName)`` as their measured pods (they call
    ``create_pods``), as a backlog; then await ``ready(api, namespace, n)`` (e.g. until a controller has made the
    pods' claims) before the scheduler starts."""
    original: Callable[..., Any] = base.create_pods

    async def create(api: client.ApiClient, namespace: str, n: int, scheduler: str, rate: float = 0.0) -> None:
        if rate:
            raise ValueError("a workload's measured pods are created as a backlog, not at a rate")
        v1 = client.CoreV1Api(api)

        async def one(i: int) -> None:
            resp = await v1.create_namespaced_pod(namespace, body(f"pod-{i:05d}", scheduler), _preload_content=False)
            resp.release()

        await base.gather_limited([one(i) for i in range(n)], 100)
        if ready is not None:
            await ready(api, namespace, n)

    base.create_pods = create
    try:
        yield
    finally:
        base.create_pods = original


async def init_pods(
    api: client.ApiClient, workload: str, namespace: str, namespaces: list[str], n: int, nodes: int
) -> None:
    v1 = client.CoreV1Api(api)
    labels, extra = template(workload, namespaces, measured=False)

    async def one(i: int) -> None:
        body = pod_body(f"init-{i:05d}", labels, extra, "nobody", f"node-{i % nodes:05d}")
        (await v1.create_namespaced_pod(namespace, body, _preload_content=False)).release()

    await base.gather_limited([one(i) for i in range(n)], 100)


async def one_workload(
    cluster: LocalCluster, api: client.ApiClient, args: argparse.Namespace, workload: str, run_dir: Any
) -> dict[str, Any]:
    n_init, n_measured = SCALES[args.scale][workload]
    args.pods = n_measured
    result: dict[str, Any] = {"workload": workload, "init": n_init, "pods": n_measured}
    contenders = [("ours", "crane")] + ([] if args.skip_kube else [("kube", "kube")])
    for key, who in contenders:
        tag = f"{workload.lower()[:20]}-{who}"
        measure_ns = await base.fresh_namespace(api, f"{tag}-1")
        init_ns = await base.fresh_namespace(api, f"{tag}-0")
        namespaces = [measure_ns, init_ns]
        await init_pods(api, workload, init_ns, namespaces, n_init, args.nodes_now)
        with measured_pods(workload, namespaces):
            if key == "ours":
                result["ours"], result["latency"] = await base.run_ours(cluster, api, args, run_dir, measure_ns)
            else:
                result["kube"], result["kube_latency"] = await base.run_kube(cluster, api, args, run_dir, measure_ns)
        for ns in namespaces:
            await base.delete_pods(api, ns)
    return result


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    run_dir = new_run_dir(f"bench-workloads-{args.nodes}")
    results = []
    async with LocalCluster(run_dir) as cluster:
        api = await api_client_from_dict(cluster.kubeconfig_dict(), qps=0, burst=500)
        try:
            t = time.monotonic()
            await create_nodes(api, args.nodes)
            args.nodes_now = args.nodes
            print(f"{args.nodes} nodes created in {time.monotonic() - t:.1f}s", file=sys.stderr)
            for workload in args.workloads.split(","):
                results.append(await one_workload(cluster, api, args, workload, run_dir))
                print(summary(results[-1]), file=sys.stderr)
        finally:
            await api.close()
    return results


def summary(r: dict[str, Any]) -> str:
    ours, kube = r["ours"], r.get("kube")
    ratio = f"{ours.rate / kube.rate:.2f}" if kube is not None and kube.rate > 0 else "-"
    kube_rate = f"{kube.rate:.0f} ({kube.bound}/{kube.pods})" if kube is not None else "-"
    return (
        f"{r['workload']:<31} init {r['init']:>5} measured {r['pods']:>5} | crane {ours.rate:>6.0f} "
        f"({ours.bound}/{ours.pods}) | kube {kube_rate:>14} | ratio {ratio:>5} | "
        f"decision p50 {r['latency']['p50'] * 1e3:.2f} ms p99 {r['latency']['p99'] * 1e3:.2f} ms | "
        f"CPU ms/pod crane {_cpu(ours)}, kube {_cpu(kube) if kube is not None else '-'}"
    )


def _cpu(run: Any) -> str:
    """The scheduler process's CPU per bound pod during the burst, + its child processes' (crane's API writer)."""
    n = max(run.bound, 1)
    return f"{1e3 * run.cpu_s / n:.2f}+{1e3 * run.children_cpu_s / n:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scheduler.workloads",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--scale", choices=sorted(SCALES), default="500Nodes", help="scheduler_perf's pod counts")
    parser.add_argument("--workloads", default=",".join(SCALES["500Nodes"]))
    base.contender_arguments(parser, event_concurrency=32)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--skip-kube", action="store_true")
    parser.add_argument("--plugins", choices=sorted(base.PROFILES), default="default")
    parser.add_argument(
        "--py-spy", action="store_true", help="sample crane-scheduler with py-spy (bench/scheduler/spy.py)"
    )
    args = parser.parse_args()
    results = asyncio.run(bench(args))
    print(
        f"\nscheduler_perf workloads, {args.nodes} nodes, QPS {args.qps:g}/{args.burst}, crane plugins {args.plugins}"
    )
    for r in results:
        print(summary(r))


if __name__ == "__main__":
    main()
