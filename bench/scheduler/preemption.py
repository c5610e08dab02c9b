"""PreemptionBasic (scheduler_perf), scaled to this machine: crane-scheduler against kube-scheduler.

A fresh local cluster (etcd + kube-apiserver), N nodes (4 cpu, 32Gi, 110 pods); for each contender, in fresh
namespaces: 4 low-priority pods (900m / 500Mi each, as scheduler_perf's low-priority template) bound to every node
so every node is full, then M high-priority pods of the same size, pending for the contender. Each one can only
be placed by preempting a victim. The victims have terminationGracePeriodSeconds 0, standing in for the kubelet
that would confirm their deletion. Throughput is high-priority pods bound / (last bind - first bind).

``--arrival pending`` (the default, this bench's history) starts each scheduler with every preemptor pending;
``--arrival running`` follows scheduler_perf's order: the scheduler runs and is ready (``/readyz``) before the
preemptors are created, so first attempts, evictions and retries interleave with the arrivals, and the time
from the first creation to the last bind is printed too.

    .venv/bin/python -m bench.scheduler.preemption                      # 500 nodes, 2,000 victims, 500 preemptors
    .venv/bin/python -m bench.scheduler.preemption --nodes 100 --pods 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client

from bench.scheduler.__main__ import (
    PROFILES,
    Run,
    crane_process,
    create_nodes,
    decision_latency,
    fresh_namespace,
    gather_limited,
    http_ok,
    measure,
    sampled_throughput,
)
from bench.scheduler.preemption_trace import PreemptionTrace
from bench.scheduler.spy import Spy, render
from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_sandbox.kubebin import ensure_binaries
from crane_sandbox.procs import ManagedProcess, free_port, tcp_open
from crane_shared.kube import api_client_from_dict

POD = {"cpu": "900m", "memory": "500Mi"}
PER_NODE = 4


def body(name: str, scheduler: str, priority_class: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": POD}}],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


async def prepare(api: client.ApiClient, label: str, nodes: int, pods: int, scheduler: str) -> tuple[str, str]:
    """Victims bound to every node (in their own namespace), then the pending preemptors."""
    v1 = client.CoreV1Api(api)
    low = await fresh_namespace(api, f"low-{label}")
    high = await fresh_namespace(api, f"high-{label}")
    victims = [body(f"low-{i:05d}", scheduler, "bench-low", f"node-{i % nodes:05d}") for i in range(nodes * PER_NODE)]
    await gather_limited(
        [_create(v1, low, v) for v in victims],
        100,
    )
    await gather_limited([_create(v1, high, body(f"high-{i:05d}", scheduler, "bench-high")) for i in range(pods)], 100)
    return low, high


async def _create(v1: client.CoreV1Api, namespace: str, pod: dict[str, Any]) -> None:
    (await v1.create_namespaced_pod(namespace, pod, _preload_content=False)).release()


async def cleanup(api: client.ApiClient, *namespaces: str) -> None:
    for ns in namespaces:
        (
            await client.CoreV1Api(api).delete_collection_namespaced_pod(
                ns, grace_period_seconds=0, _preload_content=False
            )
        ).release()


def scheduler_process(label: str, cluster: LocalCluster, run_dir: Path, args: argparse.Namespace) -> ManagedProcess:
    name = f"{label}-bench"
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"qps": args.qps, "burst": args.burst},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name}],
    }
    if label == "kube":
        path = run_dir / f"{label}.yaml"
        port = free_port()
        cfg["clientConnection"]["kubeconfig"] = str(cluster.kubeconfig_path)
        path.write_text(yaml.safe_dump(cfg))
        argv = [
            str(ensure_binaries().scheduler),
            f"--config={path}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            f"--cert-dir={run_dir / 'kube-scheduler-certs'}",  # its self-signed serving cert, to verify /readyz
        ]
        proc = ManagedProcess(f"{label}-scheduler", argv, run_dir / "logs" / f"{label}-scheduler.log")
    else:
        cfg["profiles"][0].update(PROFILES[getattr(args, "profile", "default")])
        proc, port = crane_process(cluster, run_dir, cfg, log_level=getattr(args, "log_level", "warning"))
    proc.port = port  # type: ignore[attr-defined]
    return proc


def readyz(label: str, port: int, run_dir: Path) -> Callable[[], Awaitable[bool]]:
    """The scheduler's readiness probe (caches synced): crane's plain HTTP, kube-scheduler's TLS one verified
    against the certificate it wrote to its ``--cert-dir``."""
    if label != "kube":
        return lambda: http_ok(f"http://127.0.0.1:{port}/readyz")
    cert = run_dir / "kube-scheduler-certs" / "kube-scheduler.crt"

    async def probe() -> bool:
        return cert.exists() and await http_ok(f"https://127.0.0.1:{port}/readyz", cafile=cert)

    return probe


async def contender(
    label: str, cluster: LocalCluster, api: client.ApiClient, run_dir: Path, args: argparse.Namespace
) -> Run:
    proc = scheduler_process(label, cluster, run_dir, args)
    running = getattr(args, "arrival", "pending") == "running"
    low, high = await prepare(api, label, args.nodes, 0 if running else args.pods, f"{label}-bench")
    try:
        if getattr(args, "trace", False):
            async with PreemptionTrace(api, high, low) as trace:
                run = await measure_spied(label, proc, api, high, run_dir, args)
            print(f"  {label}: where the preemptors waited (API server's view):\n{trace.summary()}", file=sys.stderr)
            trace.dump(run_dir / f"trace-{label}.json")
        else:
            run = await measure_spied(label, proc, api, high, run_dir, args)
        resp = await client.CoreV1Api(api).list_namespaced_pod(low, _preload_content=False)
        left = len(json.loads(await resp.read())["items"])
        resp.release()
        print(f"  {label}: {args.nodes * PER_NODE - left} victims deleted", file=sys.stderr)
        return run
    finally:
        await proc.stop()
        await cleanup(api, low, high)


async def measure_spied(
    label: str, proc: ManagedProcess, api: client.ApiClient, namespace: str, run_dir: Path, args: argparse.Namespace
) -> Run:
    """``measure`` with the scheduler started by it; with ``--py-spy``, crane-scheduler's CPU samples by part."""
    spies: list[Spy] = []
    port: int = proc.port  # type: ignore[attr-defined]

    async def launch() -> None:
        await proc.start()
        if label == "crane" and getattr(args, "py_spy", False) and proc.pid is not None:
            spy = await Spy.attach(proc.pid, run_dir / f"py-spy-{namespace}.txt")
            spies.extend([spy] if spy is not None else [])
        await proc.wait_ready(lambda: tcp_open("127.0.0.1", port), timeout=60)

    if getattr(args, "arrival", "pending") == "running":
        await launch()
        await proc.wait_ready(readyz(label, port, run_dir), timeout=120)
        v1, name = client.CoreV1Api(api), f"{label}-bench"

        async def start() -> None:  # scheduler_perf's order: the preemptors arrive while the scheduler runs
            await gather_limited(
                [_create(v1, namespace, body(f"high-{i:05d}", name, "bench-high")) for i in range(args.pods)], 100
            )
    else:
        start = launch

    run = await measure(
        api, namespace, args.pods, f"{label}-scheduler", start, args.timeout, expect_events=False, pid=lambda: proc.pid
    )
    print(
        f"  {label}-scheduler's CPU from first to last bind: {run.cpu_s:.2f} s (children {run.children_cpu_s:.2f} s) "
        f"in {run.seconds:.2f} s; {run.total_seconds:.2f} s from "
        + ("the first preemptor's creation" if getattr(args, "arrival", "pending") == "running" else "its start"),
        file=sys.stderr,
    )
    for spy in spies:
        print(f"  crane-scheduler's CPU samples by part ({spy.out}):\n{render(await spy.stop())}", file=sys.stderr)
    if label == "crane":
        latency = await decision_latency(port, f"{label}-bench")
        print(
            f"  crane-scheduler's attempts: {await attempts(port)}; decision p50 {latency['p50'] * 1e3:.2f} ms, "
            f"p99 {latency['p99'] * 1e3:.2f} ms (wall, scheduling algorithm only)",
            file=sys.stderr,
        )
    return run


async def attempts(port: int) -> dict[str, float]:
    """Scheduling attempts by result and preemption attempts, from the scheduler's metrics: how often a pod was
    decided again before it was bound; and the mean time from a preemption's decision to its API calls
    acknowledged and to its last victim gone from the cache."""
    out: dict[str, float] = {}
    sums: dict[tuple[str, str], float] = {}
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith("scheduler_schedule_attempts_total{"):
                result = line.split('result="')[1].split('"')[0]
                out[result] = out.get(result, 0) + float(line.rsplit(" ", 1)[1])
            elif line.startswith("crane_scheduler_preemption_attempts_total "):
                out["preemption"] = float(line.rsplit(" ", 1)[1])
            elif line.startswith("crane_scheduler_preemption_victims_total "):
                out["victims"] = float(line.rsplit(" ", 1)[1])
            elif line.startswith(
                ("crane_scheduler_preemption_step_seconds_sum{", "crane_scheduler_preemption_step_seconds_count{")
            ):
                step = line.split('step="')[1].split('"')[0]
                part = "sum" if "_sum{" in line else "count"
                sums[(step, part)] = float(line.rsplit(" ", 1)[1])
    for step in ("api", "victims_gone"):
        if sums.get((step, "count")):
            out[f"{step} mean ms"] = round(sums[(step, "sum")] / sums[(step, "count")] * 1e3, 1)
    return out


async def run(args: argparse.Namespace) -> list[Run]:
    run_dir = new_run_dir("bench-preemption")
    async with LocalCluster(run_dir) as cluster:
        api = await api_client_from_dict(cluster.kubeconfig_dict())
        try:
            scheduling = client.SchedulingV1Api(api)
            for name, value in (("bench-low", 1), ("bench-high", 1000)):
                await scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
            await create_nodes(api, args.nodes)
            return [await contender(label, cluster, api, run_dir, args) for label in ("crane", "kube")]
        finally:
            await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.scheduler.preemption", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=500, help="high-priority pods (each needs one victim)")
    parser.add_argument("--qps", type=float, default=5000)
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--timeout", type=float, default=600)
    add_py_spy(parser)
    parser.add_argument(
        "--trace", action="store_true", help="time each preemptor's steps through a watch (preemption_trace.py)"
    )
    parser.add_argument(
        "--arrival",
        choices=("pending", "running"),
        default="pending",
        help="pending: every preemptor exists before the scheduler starts (this bench's history); running: "
        "scheduler_perf's order, the preemptors are created once the scheduler is ready",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="default",
        help="crane-scheduler's profile: default (Dynamic on, the issue's target) or kube (Dynamic off)",
    )
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(
        f"PreemptionBasic: {args.nodes} nodes, {args.nodes * PER_NODE} victims, {args.pods} preemptors "
        f"(arrival: {args.arrival})"
    )
    print_runs(results, creation=args.arrival == "running")


def add_py_spy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--py-spy", action="store_true", help="sample crane-scheduler with py-spy (bench/scheduler/spy.py)"
    )
    parser.add_argument("--log-level", default="warning", help="crane-scheduler's log level (its log in the run dir)")


def print_runs(results: list[Run], creation: bool = False) -> None:
    """Each scheduler's pods/s, then crane's ratio to kube-scheduler measured in the same run; with ``creation``
    (preemptors created while the scheduler runs) also counted from the first creation to the last bind."""
    for r in results:
        rate = r.bound / r.seconds if r.seconds > 0 else float("nan")
        line = f"  {r.label:16s} bound {r.bound}/{r.pods} in {r.seconds:.2f}s: {rate:.1f} pods/s"
        if creation and r.total_seconds > 0:
            line += f"; {r.total_seconds:.2f}s from the first creation: {r.bound / r.total_seconds:.1f} pods/s"
        samples = sampled_throughput(r.bind_times)
        line += f"; scheduler_perf's sampled average {r.sampled_rate:.1f} pods/s ({len(samples)} samples)"
        print(line)
    if len(results) == 2 and results[1].seconds > 0 and results[0].seconds > 0:
        ours, kube = (r.bound / r.seconds for r in results)
        print(f"  ratio crane/kube: {ours / kube:.2f}")
        if creation and results[0].total_seconds > 0 and results[1].total_seconds > 0:
            ours, kube = (r.bound / r.total_seconds for r in results)
            print(f"  ratio crane/kube from the first creation: {ours / kube:.2f}")
        ours, kube = (r.sampled_rate for r in results)
        print(f"  ratio crane/kube of scheduler_perf's sampled averages: {ours / kube:.2f}")  # nan: too short


if __name__ == "__main__":
    main()
