"""``python -m bench.scheduler.loop``: the whole scheduling loop in process, without an API server.

The real ``Scheduler`` (queue, algorithm, assume, Reserve, binding tasks, PostBind, reporting) with its default
profile (Dynamic on) over N annotated nodes (as ``bench.scheduler`` creates them) and P pending pods; the bind
answers at once, and the "watch" confirms the bound pods in batches, as the pod informer would. What remains is
the scheduler's own CPU per pod: the number the API-server bench cannot separate from the API server's share of
two cores. Reports the decision latency (``Algorithm.schedule``) percentiles, the time per pod of the whole loop
(decision + assume + Reserve + bind task + informer confirmation), garbage-collector pauses by generation, and
with ``--cprofile`` the top functions.

    .venv/bin/python -m bench.scheduler.loop --nodes 1000,5000 --pods 10000
    .venv/bin/python -m bench.scheduler.loop --nodes 5000 --pods 5000 --cprofile 30
    valgrind --tool=callgrind --instr-atstart=no .venv/bin/python -m bench.scheduler.loop --nodes 5000 \
        --pods 300 --workers 1 --callgrind      # instructions of the burst: valgrind's "Collected" line
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import gc
import itertools
import os
import pstats
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, cast

import msgpack
import numpy as np

from bench.scheduler.cpus import proc_stats
from crane_scheduler.deciders.pool import DeciderPool
from crane_scheduler.framework import SCHEDULED_WITH_BIND, SUCCESS, CycleState, Handle, Status
from crane_scheduler.podinfo import PodInfo
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler, tune_collector
from crane_scheduler.simulate import Simulator
from crane_scheduler.writer import ApiWriter
from crane_scheduler.writer.protocol import BIND_REPORTED, NO_DEADLINE, Reply
from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.policy import default_policy

NAME = "crane-scheduler"
CONFIRM_EVERY = 0.005
"""seconds between batches of bind confirmations (the pod watch delivers chunks, not single events)"""


def node(i: int, now: datetime) -> dict[str, Any]:
    """As ``bench.scheduler`` creates them: 4 cpu / 32Gi / 110 pods, fresh load annotations, hot value 0."""
    name = f"node-{i:05d}"
    usage = 0.1 + 0.4 * ((i * 7919) % 1000) / 1000
    annotations = {s.name: encode_usage(usage, now) for s in default_policy().sync_policy}
    annotations["node_hot_value"] = encode_hot_value(0, now)
    resources = {"cpu": "4", "memory": "32Gi", "pods": "110"}
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name, "bench": "true"},
            "annotations": annotations,
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def pod(i: int) -> dict[str, Any]:
    """As ``bench.scheduler`` creates them (100m / 500Mi requests and limits), with what the API server adds."""
    resources = {"requests": {"cpu": "100m", "memory": "500Mi"}, "limits": {"cpu": "100m", "memory": "500Mi"}}
    return {
        "metadata": {
            "name": f"pod-{i:05d}",
            "namespace": "bench",
            "uid": f"00000000-0000-0000-0000-{i:012d}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "schedulerName": NAME,
            "containers": [
                {
                    "name": "pause",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": resources,
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "securityContext": {},
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"},
    }


class Watch:
    """Instant binds; confirmations delivered to the cache in batches, as the pod watch does."""

    name = "DefaultBinder"

    def __init__(self) -> None:
        self.raw: dict[str, dict[str, Any]] = {}
        self.waiting: list[tuple[str, str]] = []
        self.confirmed = 0
        self.handle: Handle | None = None
        self._packer = msgpack.Packer()
        self._ids = itertools.count(1)

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """What ``DefaultBinder`` does in the scheduling process with the API writer: the pod's ``Scheduled`` event
        rides with the bind as a report (the writer process builds and writes it), the bind is packed for the
        writer's pipe; the bind and the event are answered at once."""
        report = self.handle.scheduled_report(pod) if self.handle is not None else None
        if report is not None:
            state[SCHEDULED_WITH_BIND] = True
            rid, event_id = next(self._ids), next(self._ids)
            message = (BIND_REPORTED, rid, pod.namespace, pod.name, pod.uid, node, event_id)
            self._packer.pack((*message, report.scheduler, report.instance, report.at, 0, NO_DEADLINE))
            report.done(Reply(201))
        self.waiting.append((pod.uid, node))
        return SUCCESS

    def deliver(self, s: Scheduler) -> None:
        batch, self.waiting = self.waiting, []
        for uid, node_name in batch:
            raw = self.raw[uid]
            s.on_pod({**raw, "spec": {**raw["spec"], "nodeName": node_name}})
        self.confirmed += len(batch)


class _EventsWithBinds:
    """The reporter's API writer here: it is there, so a bind carries its pod's ``Scheduled`` event
    (``Reporter.with_bind``) as in the scheduler; nothing is written through it (every pod is placed)."""


def _cpu_of(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes used so far, from ``/proc``."""
    wanted, tick = set(pids), os.sysconf("SC_CLK_TCK")
    return sum((int(f[11]) + int(f[12])) / tick for pid, f in proc_stats() if pid in wanted)


class Toggle(Protocol):
    def enable(self) -> None: ...

    def disable(self) -> None: ...


class CallgrindBurst:
    """``--callgrind``: valgrind's instrumentation switched on for the burst only (``callgrind_control -i on`` /
    ``off`` for this process), so the run's total counts the burst's instructions and nothing of the setup. Run the
    bench under ``valgrind --tool=callgrind --instr-atstart=no``; decider workers run uninstrumented beside it."""

    def _instrument(self, state: str) -> None:
        subprocess.run(
            ["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True, timeout=60
        )

    def enable(self) -> None:
        self._instrument("on")

    def disable(self) -> None:
        self._instrument("off")


async def run(
    nodes: int, pods: int, profiler: Toggle | None, workers: int = 0, wall_clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    watch = Watch()

    # the service's profile and clocks (handles and queue monotonic, Dynamic the wall clock), binds answered at once
    def binder(args: Any, handle: Handle) -> Watch:
        watch.handle = handle
        return watch

    sim = Simulator(clock=time.monotonic, wall_clock=wall_clock, plugins={"DefaultBinder": binder})
    pool = DeciderPool(workers, None, nodes_hint=lambda: sim.table.num_nodes) if workers else None
    s = Scheduler(
        config=sim.config,
        profiles=sim.profiles,
        table=sim.table,
        reporter=Reporter(cast(ApiWriter, _EventsWithBinds()), None, "bench"),
        bind_concurrency=1024,
        deciders=pool,
    )
    now = datetime.now(UTC)
    for i in range(nodes):
        s.on_node(node(i, now))
    for i in range(pods):
        raw = pod(i)
        watch.raw[raw["metadata"]["uid"]] = raw
        s.on_pod(raw)
    if pool is not None:
        await pool.start()
        if not await pool.wait_ready(120):  # ready: their replicas hold every node
            raise SystemExit("the decider workers did not start")
    gc.collect()
    thresholds = gc.get_threshold()
    tune_collector()  # as the scheduler does after its initial sync

    decisions: list[float] = []
    cpu: list[float] = []
    schedule = s.algorithm.schedule

    def timed(*a: Any, **kw: Any) -> Any:
        t, c = time.perf_counter(), time.thread_time()
        try:
            return schedule(*a, **kw)
        finally:
            decisions.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)

    s.algorithm.schedule = timed  # type: ignore[method-assign]
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    stopping = asyncio.Event()
    s.synced.set()
    pids = pool.pids if pool is not None else []
    t0, c0, w0 = time.perf_counter(), time.process_time(), _cpu_of(pids)
    if profiler is not None:
        profiler.enable()
    loop = asyncio.create_task(s.run(stopping))
    while watch.confirmed < pods:
        await asyncio.sleep(CONFIRM_EVERY)
        watch.deliver(s)
    elapsed, cpu_used, workers_cpu = time.perf_counter() - t0, time.process_time() - c0, _cpu_of(pids) - w0
    if profiler is not None:
        profiler.disable()
    gc.callbacks.remove(on_gc)
    stopping.set()
    s._wake()
    await loop
    hints = {
        sample.labels["result"]: int(sample.value)
        for metric in s.metrics.decider_results.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }
    if pool is not None:
        await pool.close()
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    d, dc = np.array(decisions) * 1e3, np.array(cpu) * 1e3
    return {
        "nodes": nodes,
        "pods": pods,
        "pods_per_s": pods / elapsed,
        "loop_ms_per_pod": elapsed / pods * 1e3,
        "cpu_ms_per_pod": cpu_used / pods * 1e3,
        "workers": workers,
        "workers_cpu_ms_per_pod": workers_cpu / pods * 1e3,
        "hints": hints,
        "decision_ms": {q: float(np.percentile(d, q)) for q in (50, 90, 99, 99.9)} | {"max": float(d.max())},
        "decision_cpu_ms": {q: float(np.percentile(dc, q)) for q in (50, 90, 99, 99.9)} | {"max": float(dc.max())},
        "gc": {g: (len(p), 1e3 * sum(p), 1e3 * max(p, default=0.0)) for g, p in pauses.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler.loop", description=__doc__)
    parser.add_argument("--nodes", default="1000,5000")
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument(
        "--workers", default="0", help="decider worker processes, a list to compare (e.g. 0,1,2,4); 0: none"
    )
    parser.add_argument("--cprofile", type=int, default=0, help="print the top N functions by own time")
    parser.add_argument("--cprofile-out", help="also dump the profile (pstats) to this file")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="under valgrind --tool=callgrind --instr-atstart=no: instructions counted for the burst only, with "
        "Dynamic's clock held still (its decay then does the same work however slow the run)",
    )
    args = parser.parse_args()
    for n, workers in ((int(x), int(w)) for x in args.nodes.split(",") for w in args.workers.split(",")):
        profiler: Toggle | None = cProfile.Profile(time.process_time) if args.cprofile else None
        wall_clock = time.time
        if args.callgrind:
            profiler, wall_clock = CallgrindBurst(), functools.partial(float, time.time() + 1.0)
        r = asyncio.run(run(n, args.pods, profiler, workers, wall_clock))
        print(
            f"{n:>6} nodes, {r['pods']} pods, {workers} workers: {r['pods_per_s']:.0f} pods/s "
            f"({r['loop_ms_per_pod']:.3f} ms per pod, {r['cpu_ms_per_pod']:.3f} ms CPU per pod in the scheduling "
            f"process, {r['workers_cpu_ms_per_pod']:.3f} in the workers) {r['hints'] or ''}",
            flush=True,
        )
        for what in ("decision_ms", "decision_cpu_ms"):
            dm = r[what]
            print(
                f"        {what}: p50 {dm[50]:.3f} p90 {dm[90]:.3f} p99 {dm[99]:.3f} p99.9 {dm[99.9]:.3f} "
                f"max {dm['max']:.2f}"
            )
        for g, (count, total, worst) in r["gc"].items():
            print(f"        gc gen{g}: {count} collections, {total:.1f} ms in all, longest {worst:.2f} ms")
        if isinstance(profiler, cProfile.Profile):
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)
            if args.cprofile_out:
                profiler.dump_stats(args.cprofile_out)


if __name__ == "__main__":
    main()
