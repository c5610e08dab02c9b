"""``python -m bench.gangs.live``: interleaved gangs on the real API server, crane-scheduler side by side with
kubernetes-sigs/scheduler-plugins' scheduler (kube-scheduler with Coscheduling, built from its pinned module in
``sandbox/schedplugins``).

One local cluster (etcd + kube-apiserver), N plain node objects (4 cpu / 32Gi / 110 pods, as ``bench.scheduler``;
no kubelet), the PodGroup CRD. Per contender, in a fresh namespace: G PodGroups of 4-64 members (sizes drawn with
a fixed seed, ``minMember`` = size), then their pods created interleaved (member 0 of every group, member 1 of
every group, ...) at ``--rate`` pods/s once the scheduler is ready (Jobs' controllers creating their pods side by
side; ``--rate 0``: all pending before the scheduler starts, a backlog). Each member asks for ``--cpu`` of a
node's 4 CPUs, so the cluster holds only part of the gangs at once: they must run in turn. A gang whose members are
all bound "runs" for ``--hold`` seconds and is then deleted by the benchmark (a finished Job), freeing its nodes for
the next ones.

Both schedulers run one profile: Coscheduling as QueueSort and multiPoint over kube's default plugins
(crane-scheduler's Dynamic disabled, like for like), ``permitWaitingTimeSeconds`` and ``podGroupBackoffSeconds``
the same, same client QPS/burst, no leader election. A run ends when every gang completed, when no member was
bound for ``--stall`` seconds (longer than the Permit timeout: gangs still waiting then are stuck), or at
``--timeout``. Reported per scheduler:

- gangs completed (every member bound at once), and gangs never completed (deadlocked or stuck at the end);
- gangs timed out: groups with at least one ``rejected due to timeout after waiting`` FailedScheduling event (the
  Permit wait's end in both schedulers' wording), and the count of those events;
- partially bound groups: at the end, groups with some but not all members bound (they hold nodes for nothing,
  scheduler-plugins #930); also every group seen partially bound for longer than ``--partial-grace`` seconds
  (a gang's binds land one by one, so a moment's partial state is normal);
- time to place all: first pod created (or, for a backlog, scheduler start) to the last gang completed; pods/s:
  members of completed gangs / that time.

    .venv/bin/python -m bench.gangs.live                          # 1,000 nodes, 120 gangs of 4-64, 200 pods/s
    .venv/bin/python -m bench.gangs.live --rate 0                 # the same pods all pending at the start
    .venv/bin/python -m bench.gangs.live --nodes 200 --gangs 30   # a quick run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client

from bench.scheduler import __main__ as base
from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_sandbox.crds import PODGROUP_CRD, install_crd
from crane_sandbox.kubebin import ensure_coscheduler
from crane_sandbox.procs import ManagedProcess, free_port, tcp_open
from crane_scheduler.simulate import POD_GROUP_LABEL, POD_GROUP_RESOURCE
from crane_shared.informer import EventType, Informer
from crane_shared.kube import api_client_from_dict, raw_json

GROUP, VERSION, PLURAL = POD_GROUP_RESOURCE

TIMEOUT_WORDS = "rejected due to timeout after waiting"
"""kube's framework wording when a Permit wait ends (``framework.runtime``'s waiting pod), also crane's."""


@dataclass
class Outcome:
    label: str
    gangs: int
    pods: int
    completed: int = 0
    never_completed: int = 0
    timed_out_gangs: int = 0
    timeout_events: int = 0
    partial_at_end: int = 0
    partial_stuck: int = 0  # groups partially bound for longer than the grace at some point
    place_all_s: float = float("nan")  # scheduler start .. last gang completed (NaN: not every gang completed)
    last_completion_s: float = float("nan")
    pods_completed: int = 0
    ended_by: str = ""
    arrivals_s: float = 0.0  # with --rate: the first to the last member created
    completions: list[float] = field(default_factory=list)  # seconds after start, one per completed gang

    @property
    def pods_per_s(self) -> float:
        span = self.place_all_s if self.place_all_s == self.place_all_s else self.last_completion_s
        return self.pods_completed / span if span and span == span else 0.0


def gang_sizes(gangs: int, low: int, high: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(gangs)]


def interleaved(sizes: list[int]) -> list[tuple[int, int]]:
    """(group, member) in creation order: member 0 of every group, then member 1, ...: the groups' pods mixed."""
    return [(g, i) for i in range(max(sizes, default=0)) for g, size in enumerate(sizes) if i < size]


def group_name(g: int) -> str:
    return f"gang-{g:04d}"


async def create_groups(api: client.ApiClient, namespace: str, sizes: list[int], timeout_s: int) -> None:
    custom = client.CustomObjectsApi(api)

    async def group(g: int) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PodGroup",
            "metadata": {"name": group_name(g)},
            "spec": {"minMember": sizes[g], "scheduleTimeoutSeconds": timeout_s},
        }
        await raw_json(
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, _preload_content=False)
        )

    await base.gather_limited([group(g) for g in range(len(sizes))], 50)


async def create_members(
    api: client.ApiClient, namespace: str, sizes: list[int], scheduler: str, cpu: str, rate: float
) -> None:
    """Every member, interleaved: ten at a time as fast as they go (a backlog), or at ``rate`` pods/s (Jobs'
    controllers creating their pods side by side while the scheduler works)."""
    v1 = client.CoreV1Api(api)
    resources = {"requests": {"cpu": cpu, "memory": "1Gi"}, "limits": {"cpu": cpu, "memory": "1Gi"}}

    async def member(g: int, i: int) -> None:
        body = {
            "metadata": {"name": f"{group_name(g)}-{i:02d}", "labels": {POD_GROUP_LABEL: group_name(g)}},
            "spec": {
                "schedulerName": scheduler,
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10", "resources": resources}],
            },
        }
        (await v1.create_namespaced_pod(namespace, body, _preload_content=False)).release()

    order = interleaved(sizes)
    if not rate:  # ten at a time keeps the creation order close to the interleaved one
        await base.gather_limited([member(g, i) for g, i in order], 10)
        return
    loop = asyncio.get_running_loop()
    start, tasks = loop.time(), []
    for k, (g, i) in enumerate(order):
        delay = start + k / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # the schedule itself: one creation every 1/rate seconds
        tasks.append(asyncio.create_task(member(g, i)))
    await asyncio.gather(*tasks)


class GangWatch:
    """Bound members per group (a pod watch); a group complete at once is deleted ``hold`` seconds later."""

    def __init__(self, api: client.ApiClient, namespace: str, sizes: dict[str, int], hold: float) -> None:
        self.sizes, self.hold, self.namespace = sizes, hold, namespace
        self.bound: dict[str, set[str]] = {g: set() for g in sizes}
        self.completed: dict[str, float] = {}
        self.first_bind: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.names: dict[str, list[str]] = {}  # the bound members' names per group
        self.binds: list[float] = []  # seconds after start, one per member bound
        self.partial_stuck: set[str] = set()
        self.last_bind = time.monotonic()
        self.all_done = asyncio.Event()
        self.started = float("nan")
        self.core = client.CoreV1Api(api)
        self._deleting: list[asyncio.Task[None]] = []

        async def list_fn(**kw: Any) -> Any:
            return await self.core.list_namespaced_pod(namespace, **kw)

        self.informer = Informer("bench-gangs", list_fn, self.seen)

    def seen(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        group = (obj["metadata"].get("labels") or {}).get(POD_GROUP_LABEL)
        if group not in self.bound or kind == "DELETED" or not obj["spec"].get("nodeName"):
            return
        members = self.bound[group]
        if obj["metadata"]["uid"] in members:
            return
        members.add(obj["metadata"]["uid"])
        self.names.setdefault(group, []).append(obj["metadata"]["name"])
        self.last_bind = time.monotonic()
        self.binds.append(self.last_bind - self.started)
        self.first_bind.setdefault(group, self.last_bind)
        if len(members) >= self.sizes[group] and group not in self.completed:
            self.completed[group] = time.monotonic() - self.started
            self._deleting.append(asyncio.create_task(self._finish(group)))
            if len(self.completed) == len(self.sizes):
                self.all_done.set()

    def partial(self) -> list[str]:
        """Groups with some but not all members bound now."""
        return [g for g, m in self.bound.items() if g not in self.completed and 0 < len(m) < self.sizes[g]]

    def note_stuck(self, grace: float) -> None:
        now = time.monotonic()
        self.partial_stuck.update(g for g in self.partial() if now - self.first_bind[g] > grace)

    async def _finish(self, group: str) -> None:
        """The gang ran: delete its pods (no kubelet, so at once), as a finished Job's pods leave their nodes. One
        DELETE per pod, all at once: a DeleteCollection by label makes the API server scan every pod of the
        namespace in etcd for each group (thousands of pods), which under a scheduler's load took 10-20 s per
        wave and, not the schedulers, set the pace of the runs."""
        await asyncio.sleep(self.hold)

        async def delete(name: str) -> None:
            with contextlib.suppress(client.ApiException):  # gone already
                await raw_json(
                    self.core.delete_namespaced_pod(
                        name, self.namespace, grace_period_seconds=0, _preload_content=False
                    )
                )

        await asyncio.gather(*(delete(name) for name in self.names.get(group, ())))
        self.deleted[group] = time.monotonic() - self.started

    def timeline(self) -> dict[str, Any]:
        """When things happened, in seconds after the start: per group its first member bound, all bound
        (complete), its pods deleted; and members bound per second."""
        per_second: dict[int, int] = {}
        for at in self.binds:
            per_second[int(at)] = per_second.get(int(at), 0) + 1
        groups = {
            g: {
                "size": self.sizes[g],
                "first_bind": round(self.first_bind[g] - self.started, 3) if g in self.first_bind else None,
                "complete": round(self.completed[g], 3) if g in self.completed else None,
                "deleted": round(self.deleted[g], 3) if g in self.deleted else None,
            }
            for g in sorted(self.sizes)
        }
        return {
            "binds_per_second": [per_second.get(s, 0) for s in range(max(per_second, default=-1) + 1)],
            "groups": groups,
        }

    async def wait(self, timeout: float, stall: float, grace: float, alive: Callable[[], bool]) -> str:
        """Until every gang completed (``done``), no bind for ``stall`` seconds (``stall``), ``timeout``, or the
        scheduler process is gone (``exited``)."""
        deadline = time.monotonic() + timeout
        while not self.all_done.is_set():
            self.note_stuck(grace)
            now = time.monotonic()
            if not alive():
                return "exited"
            if now > deadline:
                return "timeout"
            if now - self.last_bind > stall:
                return "stall"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.all_done.wait(), min(1.0, deadline - now))
        return "done"

    async def close(self) -> None:
        for task in self._deleting:
            task.cancel()
        await asyncio.gather(*self._deleting, return_exceptions=True)


async def timeouts(api: client.ApiClient, namespace: str) -> tuple[int, int]:
    """(groups with a Permit-timeout FailedScheduling event, such events) in ``namespace``."""
    events = await raw_json(
        client.CoreV1Api(api).list_namespaced_event(
            namespace, field_selector="reason=FailedScheduling", _preload_content=False
        )
    )
    groups: set[str] = set()
    count = 0
    for e in events["items"]:
        if TIMEOUT_WORDS in (e.get("message") or ""):
            count += e.get("count") or 1
            groups.add(e["involvedObject"]["name"].rsplit("-", 1)[0])
    return len(groups), count


def scheduler_config(name: str, args: argparse.Namespace, kubeconfig: Path | None) -> dict[str, Any]:
    connection: dict[str, Any] = {"qps": args.qps, "burst": args.burst}
    if kubeconfig is not None:
        connection["kubeconfig"] = str(kubeconfig)
    plugins: dict[str, Any] = {
        "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
        "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
    }
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": connection,
        "leaderElection": {"leaderElect": False},
        "profiles": [
            {
                "schedulerName": name,
                "plugins": plugins,
                "pluginConfig": [
                    {
                        "name": "Coscheduling",
                        "args": {
                            "permitWaitingTimeSeconds": args.permit_wait,
                            "podGroupBackoffSeconds": args.backoff,
                        },
                    }
                ],
            }
        ],
    }


def with_dynamic_off(cfg: dict[str, Any]) -> dict[str, Any]:
    cfg["profiles"][0]["plugins"]["multiPoint"]["disabled"] = [{"name": "Dynamic"}]
    return cfg


Probe = Callable[[], Awaitable[bool]]


Started = tuple[ManagedProcess, Probe, str | None]
"""a contender's process, its readiness probe and its plain-HTTP /metrics address (None: not scraped)"""


def ours(cluster: LocalCluster, args: argparse.Namespace, run_dir: Path, name: str) -> Started:
    cfg = with_dynamic_off(scheduler_config(name, args, None))
    proc, port = base.crane_process(cluster, run_dir, cfg, "--bind-concurrency", str(args.concurrency))
    return proc, lambda: base.http_ok(f"http://127.0.0.1:{port}/readyz"), f"http://127.0.0.1:{port}/metrics"


def reference(cluster: LocalCluster, args: argparse.Namespace, run_dir: Path, name: str) -> Started:
    path = run_dir / "coscheduler.yaml"
    path.write_text(yaml.safe_dump(scheduler_config(name, args, cluster.kubeconfig_path)))
    port = free_port()
    argv = [
        str(ensure_coscheduler().coscheduler),
        f"--config={path}",
        f"--secure-port={port}",
        "--bind-address=127.0.0.1",
        f"--cert-dir={run_dir / 'coscheduler-certs'}",
        "--v=1",
    ]
    proc = ManagedProcess("scheduler-plugins", argv, run_dir / "logs" / "coscheduler.log")
    return proc, lambda: tcp_open("127.0.0.1", port), None


Contender = Callable[[LocalCluster, argparse.Namespace, Path, str], Started]


async def scrape(url: str) -> str:
    """The scheduler's metrics text at the end of a run (for the timeline), or why not."""
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            return await r.text()
    except (aiohttp.ClientError, TimeoutError) as err:
        return f"# not scraped: {err!r}\n"


async def run_one(
    cluster: LocalCluster, api: client.ApiClient, args: argparse.Namespace, run_dir: Path, label: str, make: Contender
) -> Outcome:
    namespace = await base.fresh_namespace(api, f"gangs-{label}")
    sizes = gang_sizes(args.gangs, args.min_size, args.max_size, args.seed)
    name = f"{label}-gangs"
    t = time.monotonic()
    await create_groups(api, namespace, sizes, args.schedule_timeout)
    if not args.rate:
        await create_members(api, namespace, sizes, name, args.cpu, 0)
    took = time.monotonic() - t
    print(f"  {label}: {len(sizes)} PodGroups, {sum(sizes)} pods created in {took:.1f}s", file=sys.stderr)
    watch = GangWatch(api, namespace, {group_name(g): s for g, s in enumerate(sizes)}, args.hold)
    stopping = asyncio.Event()
    watcher = asyncio.create_task(watch.informer.run(stopping))
    await watch.informer.synced.wait()
    proc, ready, metrics_url = make(cluster, args, run_dir, name)
    arrivals: list[asyncio.Task[None]] = []
    arrived: list[float] = []
    try:
        watch.started = time.monotonic()
        await proc.start()
        if args.rate:  # the clock starts with the first pod
            await proc.wait_ready(ready, timeout=120)
            watch.started = time.monotonic()
            arrivals.append(asyncio.create_task(create_members(api, namespace, sizes, name, args.cpu, args.rate)))
            arrivals[0].add_done_callback(lambda _: arrived.append(time.monotonic() - watch.started))
        watch.last_bind = watch.started
        ended_by = await watch.wait(args.timeout, args.stall, args.partial_grace, lambda: proc.running)
        if not proc.running and proc.proc is not None:  # said, not hidden: the scheduler died mid-run
            ended_by += f" (the scheduler exited with {proc.proc.returncode})"
        out = Outcome(label, len(sizes), sum(sizes), ended_by=ended_by)
        out.partial_at_end = len(watch.partial())
        out.arrivals_s = arrived[0] if arrived else 0.0
        if args.timeline is not None:
            args.timeline.mkdir(parents=True, exist_ok=True)
            (args.timeline / f"{label}.json").write_text(json.dumps(watch.timeline(), indent=1) + "\n")
            if metrics_url is not None and proc.running:
                (args.timeline / f"{label}-metrics.txt").write_text(await scrape(metrics_url))
    finally:
        for task in arrivals:
            task.cancel()
        await proc.stop()
        stopping.set()
        await watch.close()
        watcher.cancel()
    out.completed = len(watch.completed)
    out.never_completed = out.gangs - out.completed
    out.partial_stuck = len(watch.partial_stuck)
    out.completions = sorted(watch.completed.values())
    out.pods_completed = sum(watch.sizes[g] for g in watch.completed)
    if out.completions:
        out.last_completion_s = out.completions[-1]
        if out.completed == out.gangs:
            out.place_all_s = out.completions[-1]
    out.timed_out_gangs, out.timeout_events = await timeouts(api, namespace)
    await base.delete_pods(api, namespace)
    return out


async def bench(args: argparse.Namespace) -> list[Outcome]:
    if not args.skip_reference:
        await asyncio.to_thread(ensure_coscheduler)  # before the cluster: the first build takes minutes
    run_dir = new_run_dir(f"bench-gangs-{args.nodes}")
    outcomes = []
    async with LocalCluster(run_dir) as cluster:
        api = await api_client_from_dict(cluster.kubeconfig_dict(), qps=0, burst=500)
        try:
            await install_crd(api, PODGROUP_CRD)
            t = time.monotonic()
            await base.create_nodes(api, args.nodes, load=False)
            print(f"{args.nodes} nodes created in {time.monotonic() - t:.1f}s", file=sys.stderr)
            contenders: list[tuple[str, Contender]] = [("crane", ours)]
            if not args.skip_reference:
                contenders.append(("reference", reference))
            for label, make in contenders:
                outcomes.append(await run_one(cluster, api, args, run_dir, label, make))
                print(f"  {line(outcomes[-1])}", file=sys.stderr)
        finally:
            await api.close()
    return outcomes


def line(o: Outcome) -> str:
    place = f"{o.place_all_s:.1f}s" if o.place_all_s == o.place_all_s else "not all placed"
    return (
        f"{o.label}: {o.completed}/{o.gangs} gangs completed, {o.never_completed} never completed "
        f"(run ended by {o.ended_by}), {o.timed_out_gangs} gangs timed out ({o.timeout_events} timeout events), "
        f"partially bound groups {o.partial_at_end} at the end ({o.partial_stuck} partial for a while), "
        f"time to place all {place}, "
        f"{o.pods_per_s:.1f} pods/s ({o.pods_completed} pods of completed gangs)"
        + (f", members created over {o.arrivals_s:.1f}s" if o.arrivals_s else "")
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gangs.live", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gangs", type=int, default=120)
    parser.add_argument("--min-size", type=int, default=4)
    parser.add_argument("--max-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--cpu", default="1500m", help="each member's CPU request (nodes have 4): 2 members a node")
    parser.add_argument(
        "--rate",
        type=float,
        default=200,
        help="create the members at this many pods/s once the scheduler is ready (0: all pending before it starts)",
    )
    parser.add_argument("--hold", type=float, default=2.0, help="seconds a complete gang runs before it is deleted")
    parser.add_argument("--permit-wait", type=int, default=60, help="Coscheduling's permitWaitingTimeSeconds")
    parser.add_argument("--schedule-timeout", type=int, default=60, help="each PodGroup's scheduleTimeoutSeconds")
    parser.add_argument("--backoff", type=int, default=0, help="Coscheduling's podGroupBackoffSeconds")
    parser.add_argument(
        "--partial-grace", type=float, default=10, help="a group partially bound longer than this is counted"
    )
    parser.add_argument("--stall", type=float, default=150, help="end a run after this long without a bind")
    parser.add_argument("--timeout", type=float, default=900, help="end a run after this long")
    parser.add_argument("--qps", type=float, default=5000, help="client QPS of both schedulers")
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=1024, help="our bind concurrency")
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--timeline",
        type=Path,
        help="write each contender's timeline (per group: first bind, complete, deleted; binds per second) and "
        "crane-scheduler's metrics at the end into this folder",
    )
    args = parser.parse_args(argv)
    outcomes = asyncio.run(bench(args))
    sizes = gang_sizes(args.gangs, args.min_size, args.max_size, args.seed)
    print(
        f"\n{args.nodes} nodes x 4 CPUs, {args.gangs} gangs of {args.min_size}-{args.max_size} ({sum(sizes)} pods of "
        f"{args.cpu} CPU, interleaved), hold {args.hold:g}s, permit wait {args.permit_wait}s"
    )
    for o in outcomes:
        print(line(o))
    if len(outcomes) == 2 and outcomes[1].pods_per_s > 0:
        print(f"ratio crane / reference pods/s: {outcomes[0].pods_per_s / outcomes[1].pods_per_s:.2f}")
    if args.json:
        figures = {o.label: {**asdict(o), "pods_per_s": o.pods_per_s} for o in outcomes}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
