"""``python -m bench.extender``: filter + prioritize latency of the extender, as kube-scheduler sees it.

For 100, 1000 and 5000 candidate nodes, in both wire modes: without node cache (every request carries the full
node objects, about 8 KB each) and with it (names only). The extender runs in its own process (an HTTP server
on loopback, the real handlers, a node cache of 5000 nodes and 1000 recent bindings); the client sends
pre-encoded bodies one pod at a time, filter then prioritize, as kube-scheduler does, and times each round trip
to the last response byte; every fifth pod the node-load memo is emptied first (the cold case, as right after
the annotator rewrote every node). Next to it, the reference measured in the same run: the same body to an endpoint
that only parses the JSON and answers ``{}`` (the transport and decoding floor). kube-scheduler's default
``httpTimeout`` is 5 s per call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import platform
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp

from bench.extender.server import serve
from bench.extender.workload import fleet, pod
from crane_sandbox.procs import free_port

TIMEOUT_S = 5.0


def _percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, int]:
    started = time.perf_counter()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        data = await resp.read()
        assert resp.status == 200, data[:200]
    return time.perf_counter() - started, len(data)


async def measure(
    base: str, nodes: int, cached: bool, iterations: int, all_nodes: list[dict[str, Any]]
) -> dict[str, Any]:
    candidates = all_nodes[:nodes]
    filt, prio, both, echo, cold = [], [], [], [], []
    body_bytes = 0
    answer_bytes = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for it in range(iterations + 2):  # two warm-up rounds
            args: dict[str, Any] = {"Pod": pod(it)}
            if cached:
                args |= {"Nodes": None, "NodeNames": [n["metadata"]["name"] for n in candidates]}
            else:
                args |= {"Nodes": {"metadata": {}, "items": candidates}, "NodeNames": None}
            body = json.dumps(args).encode()
            if it >= 2 and it % 5 == 0:  # every fifth pod also after a full annotator round (memo empty)
                await _post(session, f"{base}/clear-memo", b"{}")
                c, _ = await _post(session, f"{base}/extender/filter", body)
                cold.append(c)
            f, size = await _post(session, f"{base}/extender/filter", body)
            p, _ = await _post(session, f"{base}/extender/prioritize", body)
            e, _ = await _post(session, f"{base}/echo", body)
            if it >= 2:
                filt.append(f)
                prio.append(p)
                both.append(f + p)
                echo.append(e)
                body_bytes, answer_bytes = len(body), size

    def stats(samples: list[float]) -> dict[str, float]:
        return {
            "p50_ms": 1000 * statistics.median(samples),
            "p99_ms": 1000 * _percentile(samples, 0.99),
            "max_ms": 1000 * max(samples),
        }

    return {
        "nodes": nodes,
        "mode": "nodeCacheCapable" if cached else "Nodes",
        "iterations": iterations,
        "request_bytes": body_bytes,
        "filter_answer_bytes": answer_bytes,
        "filter": stats(filt),
        "prioritize": stats(prio),
        "filter+prioritize": stats(both),
        "reference_json_only": stats(echo),
        "filter_cold": stats(cold) if cold else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.extender", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[100, 1000, 5000],
        help="candidate node counts, comma-separated",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=0,
        help="pods per size and mode (default: 200 / 60 / 20 for 100 / 1000 / 5000+ nodes)",
    )
    p.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=["Nodes", "nodeCacheCapable"],
        help="wire modes, comma-separated: Nodes (node objects in every request), nodeCacheCapable (names only)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p.parse_args(argv)


def _iterations(nodes: int, asked: int) -> int:
    if asked:
        return asked
    return 200 if nodes <= 100 else 60 if nodes <= 1000 else 20


async def run(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    largest = max(args.sizes)
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    server = ctx.Process(target=serve, args=(port, largest, ready), daemon=True)
    server.start()
    try:
        if not await asyncio.to_thread(ready.wait, 120):
            raise RuntimeError("bench extender server did not start")
        all_nodes = fleet(largest)
        base = f"http://127.0.0.1:{port}"
        rows = []
        for nodes in args.sizes:
            for cached in (False, True):
                if ("nodeCacheCapable" if cached else "Nodes") not in args.modes:
                    continue
                row = await measure(base, nodes, cached, _iterations(nodes, args.iterations), all_nodes)
                rows.append(row)
                _print_row(row)
    finally:
        server.terminate()
        server.join(10)
    return {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()[0]},
        "timeout_ms": 1000 * TIMEOUT_S,
        "results": rows,
        "retention": str(timedelta(minutes=5)),
    }


def _print_row(row: dict[str, Any]) -> None:
    both, ref = row["filter+prioritize"], row["reference_json_only"]
    cold = row["filter_cold"]
    worst_call = max(row["filter"]["max_ms"], row["prioritize"]["max_ms"], cold["max_ms"] if cold else 0)
    print(
        f"{row['nodes']:>5} nodes  {row['mode']:<16} request {row['request_bytes'] / 1e6:6.2f} MB  "
        f"filter+prioritize p50 {both['p50_ms']:7.1f} ms  p99 {both['p99_ms']:7.1f} ms  "
        f"(filter p99 {row['filter']['p99_ms']:6.1f}, prioritize p99 {row['prioritize']['p99_ms']:6.1f}; "
        f"JSON-only reference p50 {ref['p50_ms']:6.1f} ms; memo-cold filter p50 "
        f"{cold['p50_ms'] if cold else math.nan:6.1f} ms)  worst call {100 * worst_call / (1000 * TIMEOUT_S):4.1f}% "
        f"of the 5 s timeout",
        flush=True,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
