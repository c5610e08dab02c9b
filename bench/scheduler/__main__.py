"""SchedulingBasic, on the real API server: crane-scheduler against kube-scheduler, and the bind ceiling.

For each node count: a fresh local cluster (etcd + kube-apiserver), N nodes (4 cpu, 32Gi, 110 pods, as
scheduler_perf's node template), then three runs one after the other, each on P pre-created pending pods
(100m / 500Mi, as scheduler_perf's pod template) in a fresh namespace, deleted afterwards so every run starts
from empty nodes:

1. crane-scheduler (the real command, a child process);
2. kube-scheduler built from the same pinned Kubernetes release, same client QPS/burst;
3. binds alone: the same P pods bound round-robin by a plain client at the same concurrency, the API server's
   ceiling on this machine for the one write every scheduler must make per pod.

Throughput is pods / (last bind - first bind), observed through a watch. Our per-pod decision latency comes from
the scheduler's own ``scheduler_scheduling_algorithm_duration_seconds`` histogram (interpolated percentiles).
Every node carries crane's load annotations (fresh, usage 10-50 %, hot value 0), so Dynamic's filter, score,
estimate and own-binding paths all do their work (``--no-load`` leaves them out). Resident memory of each
scheduler is read from ``/proc``: VmRSS at the first bind (caches synced, before the burst), after the last bind,
and VmHWM (peak); ``--bound-pods N`` creates N pods already bound before the runs, so both schedulers list and
account them (memory at 5,000 nodes and 50,000 pods). ``--json FILE`` writes the figures.

    .venv/bin/python -m bench.scheduler                       # 1,000 and 5,000 nodes, 10,000 pods
    .venv/bin/python -m bench.scheduler --nodes 500 --pods 2000   # a quick run
    .venv/bin/python -m bench.scheduler --nodes 5000 --bound-pods 50000   # with memory at scale
    .venv/bin/python -m bench.scheduler --nodes 1000 --pods 5000 --scheduler-cpu 1   # each scheduler on CPU 1 alone
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import re
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client

from bench.scheduler.cpus import proc_stats, scheduler_core
from bench.scheduler.spy import Spy, render
from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_sandbox.kubebin import ensure_binaries
from crane_sandbox.procs import ManagedProcess, free_port, service_argv, tcp_open
from crane_scheduler.plugins.defaultbinder import BindConflict, bind_pod
from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.informer import EventType, Informer
from crane_shared.kube import api_client_from_dict
from crane_shared.policy import default_policy

NODE_RESOURCES = {"cpu": "4", "memory": "32Gi", "pods": "110"}
POD_REQUESTS = {"cpu": "100m", "memory": "500Mi"}


@dataclass
class Run:
    label: str
    pods: int
    bound: int
    seconds: float  # first bind .. last bind
    total_seconds: float  # process start (or first call) .. last bind
    events_at_last_bind: int = -1  # Scheduled events already written when the last pod was bound
    events_done: float = float("nan")  # seconds from the first bind until every Scheduled event was written
    rss_mib: float = float("nan")  # resident memory after the last bind
    peak_rss_mib: float = float("nan")  # VmHWM
    synced_rss_mib: float = float("nan")  # resident memory at the first bind: caches synced, burst not yet run
    cpu_s: float = float("nan")  # CPU seconds (user + system) of the scheduler's process, first .. last bind
    children_cpu_s: float = float("nan")  # the same for its child processes (crane's API writer)
    servers_cpu_s: dict[str, float] = field(default_factory=dict)  # kube-apiserver / etcd CPU, first .. last bind
    servers_cpu_all_s: dict[str, float] = field(default_factory=dict)  # the same, start .. every event written
    requests: dict[str, float] = field(default_factory=dict)  # API server requests by verb/resource, the whole run
    bind_times: list[float] = field(default_factory=list)  # each bind seen, seconds after ``start()`` was called

    @property
    def rate(self) -> float:
        return self.bound / self.seconds if self.seconds > 0 else float("nan")

    @property
    def sampled_rate(self) -> float:
        """scheduler_perf's SchedulingThroughput Average over these binds (``sampled_throughput``)."""
        samples = sampled_throughput(self.bind_times)
        return sum(samples) / len(samples) if samples else float("nan")


BIND_ATTEMPTS = 3
"""tries of each bind of the bind-ceiling run"""
SAMPLE_INTERVAL = 1.0
"""scheduler_perf's ``throughputSampleInterval``"""


def sampled_throughput(bind_times: list[float], interval: float = SAMPLE_INTERVAL) -> list[float]:
    """scheduler_perf's throughput samples (``throughputCollector.run``): a tick every ``interval`` seconds from
    the start of the measured op (time 0); ticks are ignored until one sees a pod scheduled, and that first one
    is skipped (it "is likely to be an outlier"); then each tick with new pods records new / elapsed, repeated
    once per empty tick skipped before it; the collector stops when the last pod is scheduled, so the partial
    interval after the last tick is not sampled (a run that ends within ``interval`` of its first scheduled
    tick has no sample at all)."""
    times = sorted(bind_times)
    samples: list[float] = []
    if not times:
        return samples
    started, last_count, last_tick, skipped = False, 0, 0.0, 0
    tick = interval
    while tick <= times[-1]:
        count = bisect.bisect_right(times, tick)
        if count and not started:
            started, last_count, last_tick = True, count, tick
        elif started and count == last_count:
            skipped += 1
        elif started:
            samples.extend([(count - last_count) / (tick - last_tick)] * (skipped + 1))
            last_count, last_tick, skipped = count, tick, 0
        tick += interval
    return samples


# ---------------------------------------------------------------------------------------------- cluster objects


async def gather_limited(coros: list[Any], limit: int) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> None:
        async with sem:
            await c

    await asyncio.gather(*(one(c) for c in coros))


def load_annotations(i: int) -> dict[str, str]:
    """Crane's load annotations as the annotator writes them: every metric of the default policy, fresh."""
    now = datetime.now(UTC)
    out = {s.name: encode_usage(0.1 + 0.4 * ((i * 7919) % 1000) / 1000, now) for s in default_policy().sync_policy}
    out["node_hot_value"] = encode_hot_value(0, now)
    return out


async def create_nodes(api: client.ApiClient, n: int, load: bool = True) -> None:
    v1 = client.CoreV1Api(api)

    async def one(i: int) -> None:
        name = f"node-{i:05d}"
        body: dict[str, Any] = {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "bench": "true"}}}
        if load:
            body["metadata"]["annotations"] = load_annotations(i)
        (await v1.create_node(body, _preload_content=False)).release()
        (
            await v1.patch_node_status(
                name, {"status": {"capacity": NODE_RESOURCES, "allocatable": NODE_RESOURCES}}, _preload_content=False
            )
        ).release()
        # No node lifecycle controller runs to lift the not-ready taint the API server adds.
        (
            await v1.patch_node(
                name, {"spec": {"taints": None}}, _content_type="application/merge-patch+json", _preload_content=False
            )
        ).release()

    await gather_limited([one(i) for i in range(n)], 100)


async def create_pods(api: client.ApiClient, namespace: str, n: int, scheduler: str, rate: float = 0.0) -> None:
    """Create ``n`` pending pods: as fast as 100 at a time allow (a backlog), or with ``rate`` at that steady rate
    per second (a cluster's controllers), each creation on its own schedule so a slow reply does not hold the next
    one back."""
    v1 = client.CoreV1Api(api)
    resources = {"requests": POD_REQUESTS, "limits": POD_REQUESTS}

    async def one(i: int) -> None:
        body = {
            "metadata": {"name": f"pod-{i:05d}"},
            "spec": {
                "schedulerName": scheduler,
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
            },
        }
        (await v1.create_namespaced_pod(namespace, body, _preload_content=False)).release()

    if not rate:
        await gather_limited([one(i) for i in range(n)], 100)
        return
    loop = asyncio.get_running_loop()
    start, tasks = loop.time(), []
    for i in range(n):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # the schedule itself: one creation every 1/rate seconds
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)


async def create_bound_pods(api: client.ApiClient, namespace: str, n: int, nodes: int) -> None:
    """``n`` pods already bound (``spec.nodeName`` set at creation), round-robin over the nodes: what both
    schedulers must list and account before the burst (resident memory at scale)."""
    v1 = client.CoreV1Api(api)
    resources = {"requests": POD_REQUESTS, "limits": POD_REQUESTS}

    async def one(i: int) -> None:
        body = {
            "metadata": {"name": f"bound-{i:06d}", "labels": {"app": f"bound-{i % 50}"}},
            "spec": {
                "nodeName": f"node-{i % nodes:05d}",
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
            },
        }
        (await v1.create_namespaced_pod(namespace, body, _preload_content=False)).release()

    await gather_limited([one(i) for i in range(n)], 100)


async def fresh_namespace(api: client.ApiClient, name: str) -> str:
    (await client.CoreV1Api(api).create_namespace({"metadata": {"name": name}}, _preload_content=False)).release()
    return name


async def delete_pods(api: client.ApiClient, namespace: str, deadline: float = 1800) -> None:
    """Delete a run's pods (so the next run starts from the same nodes). On a loaded machine deleting 10,000 pods
    takes longer than the API server's own request timeout (it then drops the connection, the deletion goes on),
    so the collection delete is repeated until a list finds none left."""
    v1 = client.CoreV1Api(api)
    give_up = time.monotonic() + deadline
    while time.monotonic() < give_up:
        try:
            (
                await v1.delete_collection_namespaced_pod(
                    namespace, grace_period_seconds=0, _preload_content=False, _request_timeout=120
                )
            ).release()
        except (TimeoutError, aiohttp.ClientError) as err:
            print(f"  deleting pods of {namespace}: {err!r}; checking what is left", file=sys.stderr)
        resp = await v1.list_namespaced_pod(namespace, limit=1, _preload_content=False, _request_timeout=120)
        left = json.loads(await resp.read())["items"]
        resp.release()
        if not left:
            return
        await asyncio.sleep(5)
    raise TimeoutError(f"pods of {namespace} still there after {deadline:.0f}s")


class BindWatch:
    """Records when each pod of a namespace is first seen bound (a watch, so observing costs little)."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        expected: int,
        pid: Callable[[], int | None] | None = None,
        servers: dict[str, int | None] | None = None,
    ) -> None:
        self.times: dict[str, float] = {}
        self.expected = expected
        self.done = asyncio.Event()
        self.pid = pid
        self.servers = servers or {}
        self.first_rss = float("nan")
        self.first_cpu = (float("nan"), float("nan"))
        self.first_servers_cpu: dict[str, float] = {}
        core = client.CoreV1Api(api)

        async def list_fn(**kw: Any) -> Any:
            return await core.list_namespaced_pod(namespace, **kw)

        self.informer = Informer("bench-pods", list_fn, self.seen)

    def seen(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if kind != "DELETED" and obj["spec"].get("nodeName") and obj["metadata"]["uid"] not in self.times:
            if not self.times:
                self.first_servers_cpu = servers_cpu(self.servers)
            if not self.times and self.pid is not None:
                self.first_rss = resident_mib(self.pid())[0]
                self.first_cpu = cpu_seconds(self.pid())
            self.times[obj["metadata"]["uid"]] = time.monotonic()
            if len(self.times) >= self.expected:
                self.done.set()


def cpu_seconds(pid: int | None) -> tuple[float, float]:
    """(user + system CPU seconds of a process, the same summed over its live child processes), NaN when gone."""
    tick = os.sysconf("SC_CLK_TCK")
    own, children = float("nan"), 0.0
    for entry, fields in proc_stats():
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        if entry == pid:
            own = cpu
        elif int(fields[1]) == pid:  # ppid
            children += cpu
    return own, children


def servers_cpu(servers: dict[str, int | None]) -> dict[str, float]:
    """CPU seconds so far of each named process (the API server, etcd)."""
    return {name: cpu_seconds(pid)[0] for name, pid in servers.items()}


def cluster_servers(cluster: LocalCluster) -> dict[str, int | None]:
    """The pids of the processes every scheduler's writes cost CPU in: the API server and etcd."""
    apiserver = cluster.apiserver.process if cluster.apiserver is not None else None
    return {
        "kube-apiserver": apiserver.pid if apiserver is not None else None,
        "etcd": cluster.etcd.process.pid if cluster.etcd.process else None,
    }


async def request_counts(api: client.ApiClient) -> dict[str, float]:
    """The API server's ``apiserver_request_total`` summed by verb, resource, subresource and code (its
    /metrics), so a run's requests are the difference of two reads."""
    resp = await api.call_api(
        "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False, _request_timeout=60
    )
    text = (await resp[0].read()).decode() if isinstance(resp, tuple) else (await resp.read()).decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
        group = f"{labels['group']}." if labels.get("group") else ""
        key = f"{labels.get('verb', '?')} {group}{labels.get('resource', '?')}{sub} {labels.get('code', '?')}"
        counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def resident_mib(pid: int | None) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB, NaN when it is gone."""
    found = {"VmRSS": float("nan"), "VmHWM": float("nan")}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in found:
                    found[key] = int(rest.split()[0]) / 1024
    except (OSError, TypeError):
        pass
    return found["VmRSS"], found["VmHWM"]


async def measure(
    api: client.ApiClient,
    namespace: str,
    pods: int,
    label: str,
    start: Any,
    timeout: float,
    expect_events: bool = True,
    pid: Callable[[], int | None] | None = None,
    events_timeout: float = 120,
    servers: dict[str, int | None] | None = None,
    stop: asyncio.Event | None = None,
) -> Run:
    """Run ``start()`` (a coroutine starting the scheduler or the binder) and time the binds it causes; with
    ``servers`` (name: pid) also their CPU and the API server's requests; ``stop`` ends the run before ``pods``
    binds (a workload that deletes and creates pods as it goes)."""
    servers = servers or {}
    watch = BindWatch(api, namespace, pods, pid, servers)
    stopping = asyncio.Event()
    watcher = asyncio.create_task(watch.informer.run(stopping))
    await watch.informer.synced.wait()
    requests_before = await request_counts(api) if servers else {}
    cpu_before = servers_cpu(servers)
    t0 = time.monotonic()
    await start()
    try:
        await asyncio.wait_for(_either(watch.done, stop), timeout)
    except TimeoutError:
        print(f"  {label}: only {len(watch.times)}/{pods} bound after {timeout:.0f}s", file=sys.stderr)
    stopping.set()
    watcher.cancel()
    times = sorted(watch.times.values())
    if not times:
        return Run(label, pods, 0, 0.0, 0.0)
    cpu_at_last = servers_cpu(servers)
    run = Run(label, pods, len(times), times[-1] - times[0], times[-1] - t0, await scheduled_events(api, namespace))
    run.bind_times = [t - t0 for t in times]
    run.servers_cpu_s = {k: cpu_at_last[k] - watch.first_servers_cpu.get(k, float("nan")) for k in cpu_at_last}
    if pid is not None:
        run.rss_mib, run.peak_rss_mib = resident_mib(pid())
        run.synced_rss_mib = watch.first_rss
        own, children = cpu_seconds(pid())
        run.cpu_s, run.children_cpu_s = own - watch.first_cpu[0], children - watch.first_cpu[1]
    if expect_events:
        deadline = time.monotonic() + events_timeout
        while time.monotonic() < deadline:  # polling: events have no cheaper completion signal here
            if await scheduled_events(api, namespace) >= len(times):
                run.events_done = time.monotonic() - times[0]
                break
            await asyncio.sleep(0.2)
    if servers:
        cpu_after = servers_cpu(servers)
        run.servers_cpu_all_s = {k: cpu_after[k] - cpu_before[k] for k in cpu_after}
        after = await request_counts(api)
        run.requests = {k: v - requests_before.get(k, 0.0) for k, v in after.items() if v - requests_before.get(k, 0.0)}
    return run


async def _either(a: asyncio.Event, b: asyncio.Event | None) -> None:
    if b is None:
        await a.wait()
        return
    waits = [asyncio.create_task(a.wait()), asyncio.create_task(b.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def scheduled_events(api: client.ApiClient, namespace: str) -> int:
    resp = await client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector="reason=Scheduled", _preload_content=False
    )
    count = len(json.loads(await resp.read())["items"])
    resp.release()
    return count


# ---------------------------------------------------------------------------------------------- the contenders


PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "kube": {"plugins": {"multiPoint": {"disabled": [{"name": "Dynamic"}]}}},
}


def crane_process(
    cluster: LocalCluster, run_dir: Path, cfg: dict[str, Any], *flags: str, log_level: str = "warning"
) -> tuple[ManagedProcess, int]:
    """crane-scheduler as its own process on the scheduler configuration ``cfg`` (written to ``run_dir``), with
    ``flags``; and the port of its HTTP surface (``/readyz``, ``/metrics``). Not started."""
    path = run_dir / "crane-scheduler.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    argv = service_argv(
        "crane_scheduler", cluster.kubeconfig_path, port, "--config", str(path), *flags, "--log-level", log_level
    )
    return ManagedProcess("crane-scheduler", argv, run_dir / "logs" / "crane-scheduler.log"), port


async def run_ours(
    cluster: LocalCluster,
    api: client.ApiClient,
    args: argparse.Namespace,
    run_dir: Path,
    namespace: str,
    pace: float = 0.0,
    stop: asyncio.Event | None = None,
) -> tuple[Run, dict[str, float]]:
    """One crane-scheduler run: on ``args.pods`` pods pending before it starts (a burst), or, with ``pace``, on
    pods created at that rate once it is ready (steady arrivals: the decision latency a cluster below
    saturation sees)."""
    name = "crane-bench"
    cfg = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"qps": args.qps, "burst": args.burst},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name, **PROFILES[args.plugins]}],
    }
    proc, port = crane_process(
        cluster,
        run_dir,
        cfg,
        "--bind-concurrency",
        str(args.concurrency),
        "--event-concurrency",
        str(args.event_concurrency),
        *(["--events-while-binds-wait", str(args.events_while_binds_wait)] if args.events_while_binds_wait else []),
        "--decision-workers",
        str(args.decision_workers),
    )
    if not pace:
        await create_pods(api, namespace, args.pods, name)
    spies: list[Spy] = []
    arrivals: list[asyncio.Task[None]] = []

    async def start() -> None:
        await proc.start()
        if pace:
            await proc.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), timeout=120)
            arrivals.append(asyncio.create_task(create_pods(api, namespace, args.pods, name, pace)))
        if getattr(args, "py_spy", False) and proc.pid is not None:
            spy = await Spy.attach(proc.pid, run_dir / f"py-spy-{namespace}.txt")
            spies.extend([spy] if spy is not None else [])

    servers = cluster_servers(cluster)
    try:
        async with scheduler_core(getattr(args, "scheduler_cpu", None), lambda: proc.pid, servers.values()):
            run = await measure(
                api,
                namespace,
                args.pods,
                "crane-scheduler",
                start,
                args.timeout,
                pid=lambda: proc.pid,
                servers=servers,
                stop=stop,
            )
        for spy in spies:
            print(f"  crane-scheduler's CPU samples by part ({spy.out}):\n{render(await spy.stop())}", file=sys.stderr)
        latency = await decision_latency(port, name)
    finally:
        for task in arrivals:
            task.cancel()
        await proc.stop()
    return run, latency


async def http_ok(url: str, cafile: Path | None = None) -> bool:
    """True when ``url`` answers 200 (a readiness probe); HTTPS verified against ``cafile`` when given."""
    tls = ssl.create_default_context(cafile=str(cafile)) if cafile is not None else True
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(url, ssl=tls, timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def run_kube(
    cluster: LocalCluster,
    api: client.ApiClient,
    args: argparse.Namespace,
    run_dir: Path,
    namespace: str,
    stop: asyncio.Event | None = None,
) -> tuple[Run, dict[str, float]]:
    name = "kube-bench"
    certs = run_dir / f"kube-scheduler-certs-{namespace}"
    cfg = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(cluster.kubeconfig_path), "qps": args.qps, "burst": args.burst},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name}],
    }
    path = run_dir / "kube-scheduler.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = ManagedProcess(
        "kube-scheduler",
        [
            str(ensure_binaries().scheduler),
            f"--config={path}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            f"--cert-dir={certs}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--v=1",
        ],
        run_dir / "logs" / "kube-scheduler.log",
    )
    await create_pods(api, namespace, args.pods, name)

    async def start() -> None:
        await proc.start()
        await proc.wait_ready(lambda: tcp_open("127.0.0.1", port), timeout=60)

    servers = cluster_servers(cluster)
    try:
        async with scheduler_core(getattr(args, "scheduler_cpu", None), lambda: proc.pid, servers.values()):
            run = await measure(
                api,
                namespace,
                args.pods,
                "kube-scheduler",
                start,
                args.timeout,
                pid=lambda: proc.pid,
                servers=servers,
                stop=stop,
            )
        return run, await kube_decision_latency(port, certs / "kube-scheduler.crt")
    finally:
        await proc.stop()


async def kube_decision_latency(port: int, cert: Path) -> dict[str, float]:
    """p50/p99 of kube-scheduler's ``scheduler_scheduling_algorithm_duration_seconds`` in the same run (the
    reference's decision latency on the same machine; its buckets are 1, 2, 4, 8 ... ms), verified against the
    self-signed serving certificate it wrote to its ``--cert-dir``."""
    tls = ssl.create_default_context(cafile=str(cert))
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"https://127.0.0.1:{port}/metrics", ssl=tls, timeout=aiohttp.ClientTimeout(total=10)) as r,
        ):
            r.raise_for_status()
            text = await r.text()
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        print(f"  kube-scheduler's metrics not read: {e}", file=sys.stderr)
        return {"p50": float("nan"), "p99": float("nan")}
    wall = histogram(text, "scheduler_scheduling_algorithm_duration_seconds", None)
    return {"p50": percentile(wall, 0.5), "p99": percentile(wall, 0.99)}


async def run_binds(cluster: LocalCluster, api: client.ApiClient, args: argparse.Namespace, namespace: str) -> Run:
    await create_pods(api, namespace, args.pods, "nobody")
    binder = await api_client_from_dict(cluster.kubeconfig_dict(), qps=args.qps, burst=args.burst)
    resp = await client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    pods = [(p["metadata"]["name"], p["metadata"]["uid"]) for p in json.loads(await resp.read())["items"]]
    resp.release()

    async def bind(name: str, uid: str, node: str) -> None:
        """One bind, sent again after a timeout or a dropped connection (on a loaded machine one of 10,000 times
        out now and then; it ended the whole burst before, and the run then waited for its timeout for pods no one
        bound); a 409 on the second try is the first one having landed."""
        for attempt in range(BIND_ATTEMPTS):
            try:
                await bind_pod(binder, namespace, name, uid, node)
                return
            except BindConflict:
                return
            except (TimeoutError, aiohttp.ClientError) as err:
                if attempt == BIND_ATTEMPTS - 1:
                    print(f"  binds alone: {namespace}/{name} not bound: {err!r}", file=sys.stderr)

    async def start() -> None:
        async def bind_all() -> None:
            await gather_limited(
                [bind(name, uid, f"node-{i % args.nodes_now:05d}") for i, (name, uid) in enumerate(pods)],
                args.concurrency,
            )

        asyncio.get_running_loop().create_task(bind_all())

    try:
        return await measure(
            api,
            namespace,
            args.pods,
            "binds alone",
            start,
            args.timeout,
            expect_events=False,
            servers=cluster_servers(cluster),
        )
    finally:
        await binder.close()


async def decision_latency(port: int, profile: str) -> dict[str, float]:
    """p50/p99 of our decision latency (wall clock) from the Prometheus histogram (linear interpolation in a
    bucket), the same of the decision thread's CPU time (``cpu_p50``/``cpu_p99``), and the share of decisions the
    OS preempted (``preempted``): the wall-clock p99 above the CPU one is time the thread waited for a core."""
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    wall = histogram(text, "scheduler_scheduling_algorithm_duration_seconds", profile)
    cpu = histogram(text, "crane_scheduler_scheduling_algorithm_cpu_seconds", profile)
    total = wall[-1][1] if wall else 0.0
    preempted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("crane_scheduler_scheduling_algorithm_preempted_total{") and f'profile="{profile}"' in line
    )
    return {
        "p50": percentile(wall, 0.5),
        "p99": percentile(wall, 0.99),
        "cpu_p50": percentile(cpu, 0.5),
        "cpu_p99": percentile(cpu, 0.99),
        "preempted": preempted / total if total else float("nan"),
        "count": total,
    }


def histogram(text: str, name: str, profile: str | None) -> list[tuple[float, float]]:
    """(le, cumulative count) of one profile's series of histogram ``name`` in a Prometheus text exposition (of
    its only series when ``profile`` is None)."""
    buckets: list[tuple[float, float]] = []
    prefix = name + "_bucket{"
    for line in text.splitlines():
        if line.startswith(prefix) and (profile is None or f'profile="{profile}"' in line):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    return buckets


def percentile(buckets: list[tuple[float, float]], q: float) -> float:
    """The ``q`` quantile of a cumulative histogram, interpolated linearly inside its bucket."""
    total = buckets[-1][1] if buckets else 0.0
    target, prev_le, prev_count = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= target:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (target - prev_count) / max(count - prev_count, 1e-9)
        prev_le, prev_count = le, count
    return float("nan")


# ---------------------------------------------------------------------------------------------- main


async def bench_size(args: argparse.Namespace, nodes: int) -> dict[str, Any]:
    run_dir = new_run_dir(f"bench-scheduler-{nodes}")
    async with LocalCluster(run_dir) as cluster:
        api = await api_client_from_dict(cluster.kubeconfig_dict(), qps=0, burst=500)
        try:
            t = time.monotonic()
            await create_nodes(api, nodes, load=not args.no_load)
            print(f"{nodes} nodes created in {time.monotonic() - t:.1f}s", file=sys.stderr)
            args.nodes_now = nodes
            if args.bound_pods:
                t = time.monotonic()
                await create_bound_pods(api, await fresh_namespace(api, "bench-bound"), args.bound_pods, nodes)
                print(f"{args.bound_pods} bound pods created in {time.monotonic() - t:.1f}s", file=sys.stderr)
            results: dict[str, Any] = {"nodes": nodes, "pods": args.pods, "bound_pods": args.bound_pods}
            ns = await fresh_namespace(api, "bench-crane")
            results["ours"], results["latency"] = await run_ours(cluster, api, args, run_dir, ns)
            print(f"  {nodes} nodes: {_line(results['ours'])}; decision {results['latency']}", file=sys.stderr)
            await delete_pods(api, ns)
            if not args.skip_kube:
                ns = await fresh_namespace(api, "bench-kube")
                results["kube"], results["kube_latency"] = await run_kube(cluster, api, args, run_dir, ns)
                print(f"  {nodes} nodes: {_line(results['kube'])}", file=sys.stderr)
                await delete_pods(api, ns)
            if args.paced:
                kube = results.get("kube")
                rate = args.paced * (kube.rate if kube and kube.rate > 0 else results["ours"].rate)
                ns = await fresh_namespace(api, "bench-paced")
                results["paced"], results["paced_latency"] = await run_ours(cluster, api, args, run_dir, ns, rate)
                results["paced_rate"] = rate
                print(f"  {nodes} nodes, paced at {rate:.0f}/s: decision {results['paced_latency']}", file=sys.stderr)
                await delete_pods(api, ns)
            ns = await fresh_namespace(api, "bench-binds")
            results["binds"] = await run_binds(cluster, api, args, ns)
            results["load"] = os.getloadavg()[0]
            return results
        finally:
            await api.close()


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nSchedulingBasic on the real API server; client QPS {args.qps:g} / burst {args.burst}, "
        f"bind concurrency {args.concurrency}, event writers {args.event_concurrency}"
    )
    header = (
        f"{'nodes':>6} {'pods':>6} | {'crane pods/s':>12} {'kube pods/s':>12} {'ratio':>6} | "
        f"{'decision p50':>12} {'p99':>8} | {'bind ceiling/s':>14} {'crane/ceiling':>13}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"  (1-minute load average at the end of this size's runs: {r.get('load', float('nan')):.1f})")
        ours, binds, lat = r["ours"], r["binds"], r["latency"]
        kube = r.get("kube")
        ratio = f"{ours.rate / kube.rate:6.2f}" if kube and kube.rate > 0 else "     -"
        print(
            f"{r['nodes']:>6} {r['pods']:>6} | {ours.rate:>12.0f} {(kube.rate if kube else float('nan')):>12.0f} "
            f"{ratio} | {lat['p50'] * 1e3:>10.2f}ms {lat['p99'] * 1e3:>6.2f}ms | {binds.rate:>14.0f} "
            f"{ours.rate / binds.rate if binds.rate else float('nan'):>13.2f}"
        )
        print(
            f"       crane-scheduler's decision in CPU time: p50 {lat['cpu_p50'] * 1e3:.2f} ms, p99 "
            f"{lat['cpu_p99'] * 1e3:.2f} ms; {lat['preempted'] * 100:.0f}% of decisions preempted by the OS"
        )
        if "kube_latency" in r:
            kl = r["kube_latency"]
            print(
                f"       kube-scheduler's decision (scheduling_algorithm_duration_seconds, same run): p50 "
                f"{kl['p50'] * 1e3:.2f} ms, p99 {kl['p99'] * 1e3:.2f} ms"
            )
        for run in (ours, kube):
            if run is not None:
                print(f"       {_line(run)}")
        if "paced_latency" in r:
            paced = r["paced_latency"]
            print(
                f"       paced (pods arriving at {r['paced_rate']:.0f}/s, {args.paced:g} of kube-scheduler's burst "
                f"rate): decision p50 {paced['p50'] * 1e3:.2f} ms, p99 {paced['p99'] * 1e3:.2f} ms wall; CPU p99 "
                f"{paced['cpu_p99'] * 1e3:.2f} ms; {paced['preempted'] * 100:.0f}% preempted by the OS"
            )
        for run in (ours, kube, binds):
            if run is not None and run.servers_cpu_s:
                print(f"       {_servers_line(run)}")


def _servers_line(run: Run) -> str:
    """CPU per pod the run cost the API server and etcd, and its requests per pod by verb/resource/code."""
    n = max(run.bound, 1)
    burst = ", ".join(f"{k} {1e3 * v / n:.2f}" for k, v in run.servers_cpu_s.items())
    whole = ", ".join(f"{k} {1e3 * v / n:.2f}" for k, v in run.servers_cpu_all_s.items())
    reqs = ", ".join(
        f"{k}: {v / n:.2f}" for k, v in sorted(run.requests.items(), key=lambda kv: -kv[1]) if v / n >= 0.01
    )
    return (
        f"{run.label}: server CPU ms per pod, first .. last bind: {burst}; start .. all events written: {whole}; "
        f"requests per pod: {reqs}"
    )


def _line(run: Run) -> str:
    return (
        f"{run.label}: {run.bound}/{run.pods} bound in {run.seconds:.1f}s ({run.rate:.0f}/s; "
        f"{run.total_seconds:.1f}s from process start); Scheduled events: "
        f"{run.events_at_last_bind} written by the last bind, all {run.events_done:.1f}s after the "
        f"first bind; resident {run.synced_rss_mib:.0f} MiB at the first bind (synced), "
        f"{run.rss_mib:.0f} MiB after the last (peak {run.peak_rss_mib:.0f} MiB); CPU per pod during the burst "
        f"{1e3 * run.cpu_s / max(run.bound, 1):.2f} ms (+ {1e3 * run.children_cpu_s / max(run.bound, 1):.2f} ms in "
        f"child processes); load {os.getloadavg()[0]:.1f}"
    )


def contender_arguments(parser: argparse.ArgumentParser, event_concurrency: int) -> None:
    """The arguments ``run_ours`` and ``run_kube`` read, for every benchmark that runs them (one parser each, one
    definition: a setting added here reaches them all)."""
    parser.add_argument("--qps", type=float, default=5000, help="client QPS of both schedulers and the binder")
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=1024, help="our bind concurrency, and the binder's")
    parser.add_argument("--event-concurrency", type=int, default=event_concurrency, help="our event writers")
    parser.add_argument(
        "--events-while-binds-wait", type=int, default=0, help="crane's setting of that name (0: its default)"
    )
    parser.add_argument(
        "--decision-workers",
        default="auto",
        help="crane's decider worker processes (a number, or auto: from the CPUs; their CPU counts as children's)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scheduler", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", default="1000,5000", help="comma-separated node counts")
    parser.add_argument("--pods", type=int, default=10000)
    contender_arguments(parser, event_concurrency=64)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--skip-kube", action="store_true", help="only crane-scheduler and the bind ceiling")
    parser.add_argument(
        "--plugins",
        choices=sorted(PROFILES),
        default="default",
        help="crane-scheduler's plugin set: its default (kube-scheduler's plugins + Dynamic) or exactly "
        "kube-scheduler's (Dynamic disabled), for a like-for-like comparison",
    )
    parser.add_argument("--no-load", action="store_true", help="nodes without crane's load annotations")
    parser.add_argument(
        "--bound-pods",
        type=int,
        default=0,
        help="pods created already bound before the runs (both schedulers list and account them): resident "
        "memory at scale, e.g. 50000 at 5000 nodes",
    )
    parser.add_argument(
        "--py-spy", action="store_true", help="sample crane-scheduler with py-spy (bench/scheduler/spy.py)"
    )
    parser.add_argument(
        "--paced",
        type=float,
        default=0.5,
        help="also run crane-scheduler on pods arriving steadily at this fraction of kube-scheduler's burst rate "
        "(its decision latency below saturation); 0 to skip",
    )
    parser.add_argument(
        "--scheduler-cpu",
        type=int,
        help="run each scheduler on this CPU alone, the API server, etcd and the bench on the others "
        "(bench/scheduler/cpus.py): the decision latency without sharing a core with the API server",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this file (for bench.check)")
    args = parser.parse_args()
    sizes = [int(x) for x in args.nodes.split(",") if x]

    async def all_sizes() -> list[dict[str, Any]]:
        done = []
        for n in sizes:
            done.append(await bench_size(args, n))
            if len(sizes) > 1:  # each size as soon as it is measured (a long run may be cut short)
                report(done[-1:], args)
        return done

    results = asyncio.run(all_sizes())
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(figures(results, args), indent=2) + "\n")


def figures(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The machine-readable figures of a run (the shape ``bench.check`` reads from RESULTS.md)."""
    out: dict[str, Any] = {
        "profile": args.plugins,
        "pods": args.pods,
        "bound_pods": args.bound_pods,
        "load": os.getloadavg()[0],
        "sizes": {},
    }
    if getattr(args, "scheduler_cpu", None) is not None:  # each scheduler on this CPU alone (bench.check repeats it)
        out["scheduler_cpu"] = args.scheduler_cpu
    for r in results:
        ours, kube, binds, lat = r["ours"], r.get("kube"), r["binds"], r["latency"]
        out["sizes"][str(r["nodes"])] = {
            "pods": args.pods,
            "bound_pods": args.bound_pods,
            "crane_pods_per_s": round(ours.rate, 1),
            "kube_pods_per_s": round(kube.rate, 1) if kube else None,
            "ratio_to_kube": round(ours.rate / kube.rate, 3) if kube and kube.rate > 0 else None,
            "decision_p50_ms": round(lat["p50"] * 1e3, 3),
            "decision_p99_ms": round(lat["p99"] * 1e3, 3),
            "decision_cpu_p50_ms": round(lat["cpu_p50"] * 1e3, 3),
            "decision_cpu_p99_ms": round(lat["cpu_p99"] * 1e3, 3),
            "decisions_preempted": round(lat["preempted"], 3),
            "kube_decision_p50_ms": round(r["kube_latency"]["p50"] * 1e3, 3) if "kube_latency" in r else None,
            "kube_decision_p99_ms": round(r["kube_latency"]["p99"] * 1e3, 3) if "kube_latency" in r else None,
            "bind_ceiling_per_s": round(binds.rate, 1),
            "crane_rss_mib": round(ours.rss_mib, 1),
            "kube_rss_mib": round(kube.rss_mib, 1) if kube else None,
            "crane_synced_rss_mib": round(ours.synced_rss_mib, 1),
            "kube_synced_rss_mib": round(kube.synced_rss_mib, 1) if kube else None,
            "load_at_end": round(r.get("load", float("nan")), 1),
            "server_cpu_ms_per_pod": {
                run.label: {k: round(1e3 * v / max(run.bound, 1), 3) for k, v in run.servers_cpu_all_s.items()}
                for run in (ours, kube, binds)
                if run is not None
            },
            "scheduler_cpu_ms_per_pod": {
                run.label: [
                    round(1e3 * run.cpu_s / max(run.bound, 1), 3),
                    round(1e3 * run.children_cpu_s / max(run.bound, 1), 3),
                ]
                for run in (ours, kube)
                if run is not None
            },
        }
        if "paced_latency" in r:
            paced = r["paced_latency"]
            out["sizes"][str(r["nodes"])] |= {
                "paced_rate_per_s": round(r["paced_rate"], 1),
                "paced_decision_p50_ms": round(paced["p50"] * 1e3, 3),
                "paced_decision_p99_ms": round(paced["p99"] * 1e3, 3),
                "paced_decision_cpu_p99_ms": round(paced["cpu_p99"] * 1e3, 3),
                "paced_decisions_preempted": round(paced["preempted"], 3),
            }
    return out


if __name__ == "__main__":
    main()
