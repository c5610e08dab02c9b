"""The chart's recording rules (``deploy/helm/crane-scheduler/files/recording-rules.yml``) evaluated by a real
Prometheus scraping the real kube-state-metrics (built by ``scripts/tools kube-state-metrics``, watching the
session's API server) and an exporter of known node-exporter and cAdvisor series, values asserted.

The batch rules find batch pods by kube-state-metrics' ``kube_pod_container_resource_requests`` for the extended
resources ``crane.io/batch-*`` (as it sanitizes them), their node by its ``node`` label and the node's CPU by its
``kube_node_status_capacity``: only the real exporter says whether those names and labels are right.

The rules are the chart's verbatim but for the groups' evaluation intervals (30 s, 1 m, 5 m there; 1 s here, so
the test takes seconds). Every input is constant (counters at a constant rate), so each window's average or
maximum is the input's value once the window holds a sample; the rules are loaded only once every input has been
scraped twice, so no window holds an evaluation made before the inputs were there.

Node ``busy``: 8 cores, 32 GiB; idle CPU 4 of 8 cores (50 %), 16 GiB available (50 %); a batch pod (requests
``crane.io/batch-cpu`` and ``-memory``) using 2 cores and 8 GiB (25 % each), a regular pod (cpu requests) using
1 core. Node ``idle``: no batch pod, 10 % CPU, 25 % memory.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import ManagedProcess, free_port
from crane_sandbox.prometheus import PrometheusServer, Sample
from crane_shared.batch import BATCH_CPU, BATCH_MEMORY
from tests.support.deploy import CHART, prefetch, tool
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

prefetch("tools", "kube-state-metrics")

RULES = CHART / "files" / "recording-rules.yml"
GI = 1 << 30
CORES = 8
BUSY, IDLE = "10.9.0.1:9100", "10.9.0.2:9100"  # node-exporter's instances


class Exporter:
    """node-exporter and cAdvisor series of the two nodes, counters with explicit timestamps (exact rates)."""

    def __init__(self, busy: str, idle: str, namespace: str) -> None:
        self.nodes = {BUSY: busy, IDLE: idle}
        self.namespace = namespace
        self.start_ms = int(time.time() * 1000)
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    def text(self) -> str:
        now_ms = int(time.time() * 1000)
        t = (now_ms - self.start_ms) / 1000  # small: the counters' rates exact to ~1e-13
        busy = self.nodes[BUSY]
        ns = self.namespace
        lines = ["# TYPE node_cpu_seconds_total counter"]
        for instance, idle_rate in ((BUSY, 0.5), (IDLE, 0.9)):  # one CPU series per node: the idle share
            labels = f'instance="{instance}",cpu="0",mode="idle"'
            lines.append(f"node_cpu_seconds_total{{{labels}}} {idle_rate * t!r} {now_ms}")
        lines.append("# TYPE node_memory_MemTotal_bytes gauge")
        lines += [f'node_memory_MemTotal_bytes{{instance="{i}"}} {32 * GI}' for i in (BUSY, IDLE)]
        lines.append("# TYPE node_memory_MemAvailable_bytes gauge")
        lines += [f'node_memory_MemAvailable_bytes{{instance="{BUSY}"}} {16 * GI}',
                  f'node_memory_MemAvailable_bytes{{instance="{IDLE}"}} {24 * GI}']  # fmt: skip
        lines.append("# TYPE node_uname_info gauge")
        lines += [f'node_uname_info{{instance="{i}",nodename="{n}"}} 1' for i, n in self.nodes.items()]
        lines.append("# TYPE container_cpu_usage_seconds_total counter")
        for pod, cores in (("batch", 2.0), ("regular", 1.0)):
            labels = f'namespace="{ns}",pod="{pod}",container="c",node="{busy}"'
            lines.append(f"container_cpu_usage_seconds_total{{{labels}}} {cores * t!r} {now_ms}")
            pod_cgroup = f'namespace="{ns}",pod="{pod}",container="",node="{busy}"'  # cAdvisor's pod total: left out
            lines.append(f"container_cpu_usage_seconds_total{{{pod_cgroup}}} {cores * t!r} {now_ms}")
        lines.append("# TYPE container_memory_working_set_bytes gauge")
        for pod, size in (("batch", 8 * GI), ("regular", 4 * GI)):
            labels = f'namespace="{ns}",pod="{pod}",container="c",node="{busy}"'
            lines.append(f"container_memory_working_set_bytes{{{labels}}} {size}")
        return "\n".join(lines) + "\n"

    async def __aenter__(self) -> Exporter:
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text=self.text())

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


class RulesPrometheus(PrometheusServer):
    """Scrapes kube-state-metrics and the exporter every second; ``load_rules`` adds the chart's rules (1 s)."""

    def __init__(self, run_dir: Path, jobs: dict[str, str]) -> None:
        super().__init__(run_dir)
        self.jobs = jobs
        self.rule_files: list[str] = []

    def write_config(self) -> None:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": self.rule_files,
            "scrape_configs": [
                {"job_name": job, "honor_labels": True, "static_configs": [{"targets": [target]}]}
                for job, target in self.jobs.items()
            ],
        }
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    async def load_rules(self) -> None:
        shipped = yaml.safe_load(RULES.read_text())
        groups = [{**group, "interval": "1s"} for group in shipped["groups"]]
        assert [{k: v for k, v in g.items() if k != "interval"} for g in groups] == [
            {k: v for k, v in g.items() if k != "interval"} for g in shipped["groups"]
        ]
        path = self.run_dir / "recording-rules.yml"
        path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        self.rule_files = [str(path)]
        await self.set_targets(self.targets)  # rewrites the config and reloads it


async def _http_ok(url: str) -> bool:
    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
        return r.status == 200


@pytest.fixture
async def nodes(kube: client.ApiClient, namespace: str) -> AsyncIterator[tuple[str, str]]:
    """The two nodes and the busy node's pods in the API server, as kube-state-metrics lists them."""
    label = uuid.uuid4().hex[:6]
    busy, idle = f"rules-{label}-busy", f"rules-{label}-idle"
    core = client.CoreV1Api(kube)
    resources = {"cpu": str(CORES), "memory": "32Gi", "pods": "110"}
    for name in (busy, idle):
        await core.create_node(
            {"metadata": {"name": name}, "status": {"capacity": resources, "allocatable": resources}}
        )
    batch = {BATCH_CPU: "2000", BATCH_MEMORY: str(8 * GI)}
    pods: dict[str, dict[str, Any]] = {
        "batch": {"requests": batch, "limits": batch},
        "regular": {"requests": {"cpu": "1"}},
    }
    for pod, resources_of in pods.items():
        container = {"name": "c", "image": "pause", "resources": resources_of}
        await core.create_namespaced_pod(
            namespace, {"metadata": {"name": pod}, "spec": {"nodeName": busy, "containers": [container]}}
        )
    try:
        yield busy, idle
    finally:
        for name in (busy, idle):
            await core.delete_node(name)


@pytest.fixture
async def prometheus(
    cluster: LocalCluster, nodes: tuple[str, str], namespace: str, tmp_path: Path
) -> AsyncIterator[RulesPrometheus]:
    ksm_port, telemetry = free_port(), free_port()
    ksm = ManagedProcess(
        "kube-state-metrics",
        [
            tool("kube-state-metrics"),
            f"--kubeconfig={cluster.kubeconfig_path}",
            "--host=127.0.0.1",
            f"--port={ksm_port}",
            "--telemetry-host=127.0.0.1",
            f"--telemetry-port={telemetry}",
            "--resources=pods,nodes",
            f"--namespaces={namespace}",
        ],
        tmp_path / "kube-state-metrics.log",
    )
    async with Exporter(*nodes, namespace) as exporter:
        server = RulesPrometheus(
            tmp_path, {"kube-state-metrics": f"127.0.0.1:{ksm_port}", "nodes": f"127.0.0.1:{exporter.port}"}
        )
        try:
            await ksm.start()
            await ksm.wait_ready(lambda: _http_ok(f"http://127.0.0.1:{ksm_port}/healthz"), timeout=60)
            await server.start()
            yield server
        finally:
            await server.stop()
            await ksm.stop()


def by_instance(samples: list[Sample]) -> dict[str, float]:
    return {s.labels.get("instance", ""): s.value for s in samples}


async def test_the_charts_batch_rules_give_each_policy_metric_its_batch_share_from_kube_state_metrics(
    prometheus: RulesPrometheus, nodes: tuple[str, str], namespace: str
) -> None:
    busy, _ = nodes
    # every input scraped twice (irate's two samples) before the rules are evaluated once
    inputs = {
        f'kube_pod_container_resource_requests{{namespace="{namespace}",pod="batch",resource=~"crane_io_batch_.+"}}': 2,
        f'kube_node_status_capacity{{node="{busy}",resource="cpu"}}': 1,
        f'container_cpu_usage_seconds_total{{namespace="{namespace}",pod="batch",container="c"}}': 1,
        f'node_cpu_seconds_total{{instance="{BUSY}",mode="idle"}}': 1,
    }
    for series, count in inputs.items():
        await prometheus.wait_for(f"count_over_time({series}[10s])", scraped_twice(count), timeout=60)
    requests = by_labels(await prometheus.query(f'kube_pod_container_resource_requests{{namespace="{namespace}"}}'))
    assert requests[("batch", "crane_io_batch_cpu", "integer")] == 2000, requests  # as kube-state-metrics names it
    await prometheus.load_rules()

    # percent, per node-exporter instance: the batch pod's 2 of 8 cores and 8 of 32 GiB; the regular pod's core
    # and the rest of the node's usage are not batch; the idle node's shares are 0, not missing
    expected = {
        "batch_cpu_usage_active": {BUSY: 25.0, IDLE: 0.0},
        "batch_mem_usage_active": {BUSY: 25.0, IDLE: 0.0},
        "cpu_usage_avg_5m": {BUSY: 50.0, IDLE: 10.0},
        "batch_cpu_usage_avg_5m": {BUSY: 25.0, IDLE: 0.0},
        "regular_cpu_usage_avg_5m": {BUSY: 25.0, IDLE: 10.0},
        "batch_cpu_usage_max_avg_1h": {BUSY: 25.0, IDLE: 0.0},
        "batch_cpu_usage_max_avg_1d": {BUSY: 25.0, IDLE: 0.0},
        "mem_usage_avg_5m": {BUSY: 50.0, IDLE: 25.0},
        "batch_mem_usage_avg_5m": {BUSY: 25.0, IDLE: 0.0},
        "regular_mem_usage_avg_5m": {BUSY: 25.0, IDLE: 25.0},
        "batch_mem_usage_max_avg_1h": {BUSY: 25.0, IDLE: 0.0},
        "batch_mem_usage_max_avg_1d": {BUSY: 25.0, IDLE: 0.0},
    }
    last: dict[str, dict[str, float]] = {}

    def right(name: str) -> bool:
        got, want = last.get(name, {}), expected[name]
        return set(got) == set(want) and all(abs(got[i] - v) < 1e-4 for i, v in want.items())

    async def all_as_expected() -> bool:
        for name in expected:
            last[name] = by_instance(await prometheus.query(name))
        return all(right(name) for name in expected)

    try:
        await eventually(all_as_expected, timeout=60, interval=0.5, what="the recorded values")
    except AssertionError:
        wrong = {name: f"{last.get(name)}, expected {want}" for name, want in expected.items() if not right(name)}
        raise AssertionError(f"recorded values (percent by instance) differ: {wrong}") from None


def scraped_twice(series: int) -> Callable[[list[Sample]], bool]:
    return lambda result: len(result) == series and all(s.value >= 2 for s in result)


def by_labels(samples: list[Sample]) -> dict[tuple[str, str, str], float]:
    return {(s.labels["pod"], s.labels["resource"], s.labels["unit"]): s.value for s in samples}
