"""``python -m bench.scheduler.writer_cost``: the API writer process's CPU per pod, and how far events trail binds.

A local cluster (etcd + kube-apiserver), P pods, and the scheduler's write path alone: ``ApiWriter`` (the child
process) fed by the scheduler's own code, the bind as ``DefaultBinder`` sends it (``bind_concurrency`` binds in
flight) and, for each bind that succeeds, the ``Scheduled`` event through ``Reporter`` (``event_concurrency``
workers). Reports the writer's CPU (``/proc``, user + system) per pod over the whole window, binds AND events
(the scheduler bench reads it first bind .. last bind, which leaves out events still queued), when the last bind
and the last event completed, and the event lag (bind done -> its event written) p50 / p99 / max.

    .venv/bin/python -m bench.scheduler.writer_cost --pods 5000 [--py-spy]

Before/after against another commit's writer: ``git archive <commit> services/scheduler | tar -x -C /tmp/before``
and the same command with ``PYTHONPATH=/tmp/before/services/scheduler`` (the writer process inherits it).

``--py-spy`` samples the writer process and prints its hottest frames (self and inclusive share).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from bench.scheduler.__main__ import create_pods, fresh_namespace, gather_limited
from bench.scheduler.spy import Spy
from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_scheduler.metrics import SchedulerMetrics
from crane_scheduler.reporting import Reporter
from crane_scheduler.writer import ApiWriter, Connection
from crane_shared.kube import api_client_from_dict


def process_cpu(pid: int) -> float:
    """user + system CPU seconds of one process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = new_run_dir("bench-writer-cost")
    async with LocalCluster(run_dir) as cluster:
        api = await api_client_from_dict(cluster.kubeconfig_dict(), qps=0, burst=500)
        options: dict[str, Any] = {"qps": args.qps, "burst": args.burst, "connections": args.connections}
        if "report_connections" in Connection.__dataclass_fields__:  # older writers (a before/after) have none
            options["report_connections"] = args.event_concurrency
        writer = ApiWriter(Connection(kubeconfig_dict=cluster.kubeconfig_dict(), **options), log_level="warning")
        try:
            ns = await fresh_namespace(api, "bench-writer")
            await create_pods(api, ns, args.pods, "nobody")
            resp = await client.CoreV1Api(api).list_namespaced_pod(ns, _preload_content=False)
            pods = [(p["metadata"]["name"], p["metadata"]["uid"]) for p in (await _json(resp))["items"]]
            await writer.start()
            assert writer._proc is not None
            pid = writer._proc.pid
            metrics = SchedulerMetrics(CollectorRegistry())
            reporter = Reporter(writer, api, "bench", workers=args.event_concurrency, metrics=metrics)
            bound_at: dict[str, float] = {}
            lags: list[float] = []
            original = reporter._create_event

            async def timed_event(namespace: str, body: dict[str, Any], kind: str, term: Any = None) -> None:
                await original(namespace, body, kind, term)
                uid = body["regarding"]["uid"]
                lags.append(time.monotonic() - bound_at[uid])

            reporter._create_event = timed_event  # type: ignore[method-assign]
            stopping = asyncio.Event()
            reporting = asyncio.create_task(reporter.run(stopping))
            spy = await Spy.attach(pid, run_dir / "py-spy-writer.txt", rate=args.rate) if args.py_spy else None
            failures = Counter[int]()
            cpu0, t0 = process_cpu(pid), time.monotonic()

            async def bind(i: int, name: str, uid: str) -> None:
                reply = await writer.bind(ns, name, uid, f"node-{i % 1000:05d}")
                if not reply.ok:
                    if not failures:
                        print(f"first failed bind: {reply.describe()}", file=sys.stderr)
                    failures[reply.status] += 1
                    return
                bound_at[uid] = time.monotonic()
                reporter.scheduled(ns, name, uid, f"node-{i % 1000:05d}", "bench")

            await gather_limited([bind(i, n, u) for i, (n, u) in enumerate(pods)], args.bind_concurrency)
            binds_done = time.monotonic() - t0
            await reporter.drain()
            events_done = time.monotonic() - t0
            cpu = process_cpu(pid) - cpu0
            if spy is not None:
                await spy.stop()
                print(hottest(spy.out), file=sys.stderr)
            stopping.set()
            reporter.close()
            await reporting
        finally:
            await writer.close()
            await api.close()
    return {
        "pods": len(pods),
        "failed_binds": dict(failures),
        "events_written": len(lags),
        "writer_cpu_ms_per_pod": 1e3 * cpu / max(len(pods), 1),
        "binds_done_s": binds_done,
        "events_done_s": events_done,
        "event_lag_s": {"p50": percentile(lags, 0.5), "p99": percentile(lags, 0.99), "max": max(lags, default=0)},
        "load": os.getloadavg()[0],
    }


async def _json(resp: Any) -> Any:
    import json

    data = await resp.read()
    resp.release()
    return json.loads(data)


def hottest(path: Path, top: int = 25) -> str:
    """The frames with the most samples: self (leaf) and inclusive, as shares of all samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines() if path.exists() else ():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        if any("_find_and_load" in f for f in frames):
            continue
        total += int(n)
        own[frames[-1]] += int(n)
        for f in set(frames):
            inclusive[f] += int(n)
    lines = [f"writer samples: {total}", "self:"]
    lines += [f"  {100 * c / max(total, 1):5.1f}%  {f}" for f, c in own.most_common(top)]
    lines.append("inclusive:")
    lines += [f"  {100 * c / max(total, 1):5.1f}%  {f}" for f, c in inclusive.most_common(top * 2)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scheduler.writer_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--qps", type=float, default=5000)
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--connections", type=int, default=64, help="the writer's --writer-connections")
    parser.add_argument("--bind-concurrency", type=int, default=1024)
    parser.add_argument("--event-concurrency", type=int, default=64)
    parser.add_argument("--py-spy", action="store_true", help="sample the writer process with py-spy")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    lag = result["event_lag_s"]
    print(
        f"writer CPU {result['writer_cpu_ms_per_pod']:.3f} ms/pod (bind + Scheduled event) over {result['pods']} pods; "
        f"binds done {result['binds_done_s']:.1f}s, events done {result['events_done_s']:.1f}s; event lag "
        f"p50 {lag['p50']:.2f}s p99 {lag['p99']:.2f}s max {lag['max']:.2f}s; failed binds {result['failed_binds']}; "
        f"events {result['events_written']}; load {result['load']:.2f}"
    )


if __name__ == "__main__":
    main()
