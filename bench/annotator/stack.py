"""The benchmark's world: a local cluster with N nodes, a fleet exporter in its own process, a real Prometheus.

The scrape and rule intervals are 5 s (not the sandbox's 1 s): on a small machine the exporter and Prometheus
would otherwise eat the CPU both annotators are measured on. The rules keep upstream's metric names and
``max_over_time`` windows; only the short windows are widened to fit the 5 s scrape.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

from kubernetes_asyncio import client

from crane_sandbox.exporter import shard_count
from crane_sandbox.fleet import SimNode, make_fleet
from crane_sandbox.pod_follower import create_nodes
from crane_sandbox.procs import ManagedProcess, free_port, tcp_open
from crane_sandbox.prometheus import PrometheusServer
from crane_shared.policy import default_policy

METRICS = default_policy().metrics()
"""upstream's six series, in its policy's order (the shipped default policy)"""
RULES = """\
groups:
  - name: bench
    interval: 5s
    rules:
      - record: cpu_usage_active
        expr: 100 - (avg by (instance) (irate(node_cpu_seconds_total{mode="idle"}[15s])) * 100)
      - record: mem_usage_active
        expr: 100*(1-node_memory_MemAvailable_bytes/node_memory_MemTotal_bytes)
      - record: cpu_usage_avg_5m
        expr: avg_over_time(cpu_usage_active[30s])
      - record: mem_usage_avg_5m
        expr: avg_over_time(mem_usage_active[30s])
      - record: cpu_usage_max_avg_1h
        expr: max_over_time(cpu_usage_avg_5m[1h])
      - record: cpu_usage_max_avg_1d
        expr: max_over_time(cpu_usage_avg_5m[1d])
      - record: mem_usage_max_avg_1h
        expr: max_over_time(mem_usage_avg_5m[1h])
      - record: mem_usage_max_avg_1d
        expr: max_over_time(mem_usage_avg_5m[1d])
"""
SHARD_SIZE = 1000


def fleet(n: int) -> list[SimNode]:
    """N nodes whose series use the three instance styles in turn (IP, IP:port, name), with varied loads."""
    nodes = make_fleet(n, instance_styles=("ip", "ip:port", "name"))
    return [
        replace(node, base_cpu_fraction=0.05 + (i * 37 % 60) / 100, base_mem_fraction=0.1 + (i * 53 % 70) / 100)
        for i, node in enumerate(nodes)
    ]


async def start_exporter(n: int, run_dir: Path) -> tuple[ManagedProcess, list[tuple[str, str]]]:
    port = free_port()
    proc = ManagedProcess(
        "fleet-exporter",
        [
            sys.executable,
            "-m",
            "bench.annotator.exporter",
            "--nodes",
            str(n),
            "--port",
            str(port),
            "--shard-size",
            str(SHARD_SIZE),
        ],
        run_dir / "fleet-exporter.log",
    )
    await proc.start()
    await proc.wait_ready(lambda: tcp_open("127.0.0.1", port), timeout=60)
    shards = shard_count(n, SHARD_SIZE)
    return proc, [(f"127.0.0.1:{port}", f"/metrics/shard/{i}") for i in range(shards)]


async def start_prometheus(targets: list[tuple[str, str]], run_dir: Path) -> PrometheusServer:
    rules = run_dir / "bench-rules.yml"
    rules.write_text(RULES)
    prometheus = PrometheusServer(run_dir, targets, rules=rules, scrape_interval="5s", evaluation_interval="5s")
    await prometheus.start(timeout=60)
    return prometheus


async def wait_for_series(prometheus: PrometheusServer, n: int, timeout: float = 180) -> None:
    for metric in METRICS:
        await prometheus.wait_for(
            f"count({metric})", lambda r: bool(r) and r[0].value >= n, timeout=timeout, interval=1.0
        )


async def create_fleet_nodes(kube: client.ApiClient, nodes: list[SimNode]) -> None:
    await create_nodes(kube, nodes, concurrency=32)


async def gather_setup(
    kube: client.ApiClient, nodes: list[SimNode], run_dir: Path
) -> tuple[ManagedProcess, PrometheusServer]:
    exporter, targets = await start_exporter(len(nodes), run_dir)
    prometheus, _ = await asyncio.gather(start_prometheus(targets, run_dir), create_fleet_nodes(kube, nodes))
    return exporter, prometheus
