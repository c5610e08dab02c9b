"""HTTP exporter serving the simulated fleet as node-exporter series (and each Running pod's cAdvisor-like
``container_*`` series, in its node's shard), split into shards. Two more series, as the real exporters name them,
let the batch recording rules (``sandbox/prometheus/rules-fast.yml``) find the batch pods of each node:
``node_uname_info{nodename}`` (node-exporter) and, for pods requesting batch resources, kube-state-metrics'
``kube_pod_container_resource_requests{resource="crane_io_batch_cpu"}``. In the sandbox all come from one scrape,
so a pod's usage and its batch label appear together.

One Python scrape of 5000 nodes takes about a second, longer than the 1 s scrape interval the fast rules use;
so the fleet is split over ``/metrics/shard/<i>`` paths (at most ``shard_size`` nodes each) that Prometheus
scrapes as separate targets, in parallel. ``/metrics`` serves the whole fleet for humans and debugging.

CPU counters carry explicit timestamps (the instant they were integrated to). Rendering 1000 nodes takes
0.1-0.3 s and shards contend for the GIL, so the delay between Prometheus's scrape timestamp and the moment the
counters were read varies by a large fraction of the 1 s interval; ``irate`` over such samples was off by
+-4 percentage points at 3000 nodes. With the read time attached the rate is exact. (The recorded
``cpu_usage_active`` still goes stale promptly when the exporter stops: ``irate`` needs two samples within its
window.)
"""

from __future__ import annotations

import asyncio
import math
import re
import zlib
from collections.abc import Iterable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from crane_sandbox.fleet import FleetState, NodeSample
from crane_sandbox.procs import free_port

DEFAULT_SHARD_SIZE = 1000


class _SamplesCollector:
    """Yields node-exporter families for a fixed snapshot (taken on the event loop, rendered in a thread)."""

    def __init__(self, samples: Sequence[NodeSample]) -> None:
        self._samples = samples

    def collect(self) -> Iterable[Metric]:
        cpu = CounterMetricFamily(
            "node_cpu_seconds_total",
            "Seconds the CPUs spent in each mode.",
            labels=["instance", "cpu", "mode"],
        )
        available = GaugeMetricFamily(
            "node_memory_MemAvailable_bytes",
            "Memory information field MemAvailable_bytes.",
            labels=["instance"],
        )
        total = GaugeMetricFamily(
            "node_memory_MemTotal_bytes", "Memory information field MemTotal_bytes.", labels=["instance"]
        )
        labels = ["namespace", "pod", "container", "node"]
        pod_cpu = CounterMetricFamily(
            "container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds (cAdvisor).", labels=labels
        )
        pod_memory = GaugeMetricFamily(
            "container_memory_working_set_bytes", "Current working set in bytes (cAdvisor).", labels=labels
        )
        requests = GaugeMetricFamily(
            "kube_pod_container_resource_requests",
            "The number of requested resource by a container (kube-state-metrics; batch resources only).",
            labels=["namespace", "pod", "container", "node", "resource", "unit"],
        )
        for s in self._samples:
            cpu.add_metric([s.instance, "0", "idle"], s.cpu_idle_seconds, timestamp=s.at)
            cpu.add_metric([s.instance, "0", "user"], s.cpu_user_seconds, timestamp=s.at)
            available.add_metric([s.instance], s.mem_available_bytes)
            total.add_metric([s.instance], s.mem_total_bytes)
            for p in s.pods:
                key = [p.namespace, p.pod, p.container, p.node]
                pod_cpu.add_metric(key, p.cpu_seconds, timestamp=s.at)
                pod_memory.add_metric(key, p.memory_bytes)
                for resource, amount in p.batch:  # kube-state-metrics' sanitized name: crane_io_batch_cpu
                    requests.add_metric([*key, re.sub(r"[^a-zA-Z0-9_]", "_", resource), "integer"], amount)
        return [cpu, available, total, pod_cpu, pod_memory, requests]


def render(samples: Sequence[NodeSample]) -> bytes:
    """Prometheus text exposition of a snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SamplesCollector(samples))
    return generate_latest(registry) + _static(samples)


def _static(samples: Sequence[NodeSample]) -> bytes:
    """node-exporter's ``node_uname_info`` and kube-state-metrics' CPU ``kube_node_status_capacity`` per node,
    formatted directly: two constant series per node would cost prometheus_client's per-sample rendering half
    again the node-exporter series' time."""
    uname = [f'node_uname_info{{instance="{_label(s.instance)}",nodename="{_label(s.nodename)}"}} 1.0' for s in samples]
    capacity = [
        f'kube_node_status_capacity{{node="{_label(s.nodename)}",resource="cpu",unit="core"}} {float(s.cpu_cores)!r}'
        for s in samples
    ]
    return "\n".join(
        [
            "# HELP node_uname_info Labeled system information (node-exporter).",
            "# TYPE node_uname_info gauge",
            *uname,
            "# HELP kube_node_status_capacity The capacity for different resources of a node (kube-state-metrics).",
            "# TYPE kube_node_status_capacity gauge",
            *capacity,
            "",
        ]
    ).encode()


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def shard_count(nodes: int, shard_size: int = DEFAULT_SHARD_SIZE) -> int:
    return max(1, math.ceil(nodes / shard_size))


def shard_of(node_name: str, shards: int) -> int:
    """Stable shard of a node: nodes added later keep the others where they are (no series move targets)."""
    return zlib.crc32(node_name.encode()) % shards


class FleetExporter:
    """Serves ``state`` on ``host:port``. The shard count is fixed at construction: it is baked into the
    Prometheus scrape config."""

    def __init__(
        self,
        state: FleetState,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        shard_size: int = DEFAULT_SHARD_SIZE,
        shards: int | None = None,
    ) -> None:
        self.state = state
        self.host = host
        self.port = port or free_port(host)
        self.shards = shards or shard_count(len(state.nodes), shard_size)
        self._runner: web.AppRunner | None = None

    def targets(self) -> list[tuple[str, str]]:
        """(host:port, metrics path) of every shard, for the Prometheus scrape config."""
        return [(f"{self.host}:{self.port}", f"/metrics/shard/{i}") for i in range(self.shards)]

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._all)
        app.router.add_get("/metrics/shard/{shard:\\d+}", self._shard)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _all(self, _request: web.Request) -> web.Response:
        return await self._respond(self.state.snapshot())

    async def _shard(self, request: web.Request) -> web.Response:
        shard = int(request.match_info["shard"])
        if shard >= self.shards:
            raise web.HTTPNotFound(text=f"shard {shard} of {self.shards}")
        names = [n for n in self.state.nodes if shard_of(n, self.shards) == shard]
        return await self._respond(self.state.snapshot(names))

    @staticmethod
    async def _respond(samples: list[NodeSample]) -> web.Response:
        body = await asyncio.to_thread(render, samples)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
