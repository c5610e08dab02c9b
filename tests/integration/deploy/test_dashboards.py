"""Every panel of the shipped Grafana dashboards, evaluated against a real Prometheus scraping the real stack.

The stack is the sandbox (API server, Redis, the simulated node-exporter fleet, event-recorder, annotator,
scheduler and descheduler as processes with their real command lines) plus kube-state-metrics built from its Go
module, and a Prometheus configured as a user would: the recording rules, the shipped alert rules, and scrape jobs
for the fleet, kube-state-metrics and the services. A small workload runs (pods placed by crane-scheduler, one
that fits nowhere, one malformed Scheduled event) and then each panel query must return data, as Grafana would
ask for it (a range query over the last minutes).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client

from crane_sandbox.fleet import make_fleet
from crane_sandbox.procs import ManagedProcess, free_port
from crane_sandbox.prometheus import PrometheusServer, rules_path
from crane_sandbox.sandbox import Sandbox
from crane_shared.kube import api_client_from_dict
from crane_shared.policy import default_policy
from tests.support.deploy import ALERTS, DASHBOARDS, REPO, prefetch, tool

prefetch("tools", "kube-state-metrics")
prefetch("tools", "grafanaquery")

SERVICES = ("event-recorder", "annotator", "scheduler")


class StackPrometheus(PrometheusServer):
    """Prometheus as deployed next to crane: recording and alert rules, the fleet, kube-state-metrics, services."""

    def __init__(self, run_dir: Path, jobs: dict[str, list[str]], fleet: list[tuple[str, str]]) -> None:
        super().__init__(run_dir, fleet, rules="fast")
        self.jobs = jobs

    def write_config(self) -> None:
        scrape = [
            {
                "job_name": "fleet",
                "honor_labels": True,
                "static_configs": [
                    {"targets": [address], "labels": {"__metrics_path__": path, "instance": f"{address}{path}"}}
                    for address, path in self.targets
                ],
            }
        ]
        scrape += [
            {"job_name": job, "honor_labels": job == "kube-state-metrics", "static_configs": [{"targets": targets}]}
            for job, targets in self.jobs.items()
        ]
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_path("fast")), str(ALERTS)],
            "scrape_configs": scrape,
        }
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))


@dataclass
class Stack:
    sandbox: Sandbox
    prometheus: StackPrometheus
    api: client.ApiClient


def fleet() -> list[Any]:
    nodes = make_fleet(6, instance_styles=("ip:port", "ip", "name"), base_cpu_fraction=0.2)
    nodes[0] = replace(nodes[0], base_cpu_fraction=0.9)  # over the 65 % threshold: the Dynamic filter refuses it
    return nodes


async def _http_ok(url: str) -> bool:
    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
        return r.status == 200


@pytest.fixture(scope="module")
async def stack() -> AsyncIterator[Stack]:
    ksm_bin = await asyncio.to_thread(tool, "kube-state-metrics")
    sandbox = Sandbox(fleet=fleet())
    await sandbox.start()
    assert sandbox.cluster is not None and sandbox.exporter is not None
    assert not sandbox.skipped, f"services without an entry point: {sandbox.skipped}"
    run_dir = sandbox.run_dir / "dashboards"
    ksm_port, ksm_telemetry = free_port(), free_port()
    ksm = ManagedProcess(
        "kube-state-metrics",
        [
            ksm_bin,
            f"--kubeconfig={sandbox.cluster.kubeconfig_path}",
            "--host=127.0.0.1",
            f"--port={ksm_port}",
            "--telemetry-host=127.0.0.1",
            f"--telemetry-port={ksm_telemetry}",
            "--resources=pods,nodes",
        ],
        sandbox.run_dir / "logs" / "kube-state-metrics.log",
    )
    jobs = {name: [f"127.0.0.1:{port}"] for name, port in sandbox.ports.items()}
    jobs["kube-state-metrics"] = [f"127.0.0.1:{ksm_port}"]
    prometheus = StackPrometheus(run_dir, jobs, sandbox.exporter.targets())
    api = await api_client_from_dict(sandbox.cluster.kubeconfig_dict())
    try:
        await ksm.start()
        await ksm.wait_ready(lambda: _http_ok(f"http://127.0.0.1:{ksm_port}/healthz"), timeout=60)
        await prometheus.start()
        yield Stack(sandbox, prometheus, api)
    finally:
        await api.close()
        await prometheus.stop()
        await ksm.stop()
        await sandbox.stop()


def panels() -> list[tuple[str, str, dict[str, Any]]]:
    """(dashboard file, panel title, target) for every query of every shipped dashboard."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target))
    return out


async def query_range(prometheus: PrometheusServer, expr: str, minutes: float = 3) -> list[dict[str, Any]]:
    """The query as Grafana sends it for a time series panel: a range query, step 5 s."""
    end = time.time()
    params = {"query": expr, "start": str(end - 60 * minutes), "end": str(end), "step": "5"}
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{prometheus.url}/api/v1/query_range", params=params, timeout=aiohttp.ClientTimeout(total=30)) as r,
    ):
        body = await r.json(content_type=None)
    assert body["status"] == "success", f"{expr}: {body.get('error')}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def run_workload(api: client.ApiClient, scheduler: str) -> None:
    """Pods for crane-scheduler (most fit, one fits nowhere) and one malformed Scheduled event."""
    v1 = client.CoreV1Api(api)
    await v1.create_namespace({"metadata": {"name": "dash"}})

    def pod(name: str, cpu: str) -> dict[str, Any]:
        container = {"name": "c", "image": "pause", "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}
        return {"metadata": {"name": name}, "spec": {"schedulerName": scheduler, "containers": [container]}}

    for i in range(12):
        await v1.create_namespaced_pod("dash", pod(f"web-{i}", "500m"))
    nowhere = pod("nowhere", "100m")
    nowhere["spec"]["nodeSelector"] = {"crane.test/no-such-label": "x"}  # unschedulable whatever the capacity
    await v1.create_namespaced_pod("dash", nowhere)
    await client.EventsV1Api(api).create_namespaced_event(
        "dash",
        {
            "metadata": {"name": "malformed-scheduled"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reason": "Scheduled",
            "action": "Binding",
            "type": "Normal",
            "note": "this is not a binding message",
            "reportingController": "test",
            "reportingInstance": "test",
            "regarding": {"kind": "Pod", "namespace": "dash", "name": "web-0"},
        },
    )


async def test_every_dashboard_panel_returns_data_from_the_real_stack(stack: Stack) -> None:
    # the name crane-scheduler serves in the sandbox ("default-scheduler" where it replaces kube-scheduler)
    await run_workload(stack.api, getattr(stack.sandbox, "scheduler_name", "crane-scheduler"))
    targets = panels()
    assert len(targets) >= 30
    # The threshold panel draws the limits the scheduler has loaded (its gauge): one series per enabled predicate
    # once each recorded metric exists, and the node the fleet keeps at 90 % CPU is over cpu_usage_avg_5m's 65 %.
    [threshold] = [t for _, title, t in targets if title.startswith("Nodes over each threshold")]
    predicates = {p.name for p in default_policy().predicate if p.max_limit_percent > 0}
    deadline = time.monotonic() + 120
    while True:
        counts = [len(await query_range(stack.prometheus, t["expr"])) for _, _, t in targets]
        over = {
            r["metric"]["metric"]: float(r["values"][-1][1])
            for r in await query_range(stack.prometheus, threshold["expr"])
        }
        if (all(counts) and set(over) == predicates and over["cpu_usage_avg_5m"] >= 1) or time.monotonic() > deadline:
            break
        await asyncio.sleep(2)
    lines = [
        f"{n:4d} series  {dash:26} {title} [{t['refId']}] {t['expr']}"
        for (dash, title, t), n in zip(targets, counts, strict=True)
    ]
    report = stack.sandbox.run_dir / "dashboard-panels.txt"
    report.write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
    empty = [line for line, n in zip(lines, counts, strict=True) if n == 0]
    assert not empty, "panels without data:\n" + "\n".join(empty)

    assert set(over) == predicates, over
    assert over["cpu_usage_avg_5m"] >= 1, over


def grafana_query(url: str, queries: list[dict[str, Any]], minutes: float = 3) -> dict[str, dict[str, Any]]:
    """One panel's queries through Grafana's Prometheus datasource backend (``scripts/tools grafanaquery``), as
    Grafana's frontend posts them to /api/ds/query: the dashboard's query models with the datasource variable
    resolved, an interval and a point budget; the datasource's settings as deploy/compose provisions them."""
    provisioned = yaml.safe_load((REPO / "deploy/compose/grafana/datasources/prometheus.yml").read_text())
    [datasource] = provisioned["datasources"]
    assert datasource["type"] == "prometheus" and datasource["access"] == "proxy"
    end = int(time.time() * 1000)
    body = {
        "url": url,
        "jsonData": datasource.get("jsonData", {}),
        "from": end - int(minutes * 60_000),
        "to": end,
        "queries": [
            q | {"datasource": {"type": "prometheus", "uid": "prometheus"}, "intervalMs": 5000, "maxDataPoints": 500}
            for q in queries
        ],
    }
    out = subprocess.run(
        [tool("grafanaquery")], input=json.dumps(body), capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, dict[str, Any]] = json.loads(out.stdout)
    return result


async def test_every_panel_query_evaluates_through_grafanas_prometheus_backend(stack: Stack) -> None:
    """What Grafana's /api/ds/query answers for each panel: no error, and data frames with points for every query.
    (No Grafana server can be built here; this is its Prometheus backend, github.com/grafana/grafana/pkg/promlib.)"""
    await asyncio.to_thread(tool, "grafanaquery")
    by_panel: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for dash, title, target in panels():
        by_panel.setdefault((dash, title), []).append(target)
    deadline = time.monotonic() + 120
    while True:
        answers = {
            key: await asyncio.to_thread(grafana_query, stack.prometheus.url, targets)
            for key, targets in by_panel.items()
        }
        missing = [
            f"{dash} / {title} [{ref}]: {answer.get(ref)}"
            for (dash, title), answer in answers.items()
            for ref in (t["refId"] for t in by_panel[(dash, title)])
            if ref not in answer or answer[ref].get("error") or not answer[ref]["points"]
        ]
        if not missing or time.monotonic() > deadline:
            break
        await asyncio.sleep(2)
    lines = [
        f"{a[t['refId']]['series']:4d} series {a[t['refId']]['points']:6d} points  {dash:26} {title} [{t['refId']}]"
        for (dash, title), a in answers.items()
        for t in by_panel[(dash, title)]
        if t["refId"] in a
    ]
    print("\nthrough Grafana's Prometheus backend:\n" + "\n".join(lines))
    assert not missing, "panels Grafana would show empty or failing:\n" + "\n".join(missing)


async def test_alert_rules_load_and_evaluate_on_the_real_stack(stack: Stack) -> None:
    async with aiohttp.ClientSession() as s, s.get(f"{stack.prometheus.url}/api/v1/rules?type=alert") as r:
        groups = (await r.json())["data"]["groups"]
    rules = {rule["name"]: rule for g in groups for rule in g["rules"]}
    shipped = {rule["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for rule in g["rules"]}
    assert set(rules) == shipped

    async def all_evaluated() -> bool:
        async with aiohttp.ClientSession() as s, s.get(f"{stack.prometheus.url}/api/v1/rules?type=alert") as r:
            body = await r.json()
        return all(rule["health"] == "ok" for g in body["data"]["groups"] for rule in g["rules"])

    deadline = time.monotonic() + 30
    while not await all_evaluated():
        assert time.monotonic() < deadline, f"alert rules not healthy: {rules}"
        await asyncio.sleep(1)
    # The services are up and reachable: none of the "down" alerts is pending or firing.
    async with aiohttp.ClientSession() as s, s.get(f"{stack.prometheus.url}/api/v1/alerts") as r:
        active = {a["labels"]["alertname"] for a in (await r.json())["data"]["alerts"]}
    assert not active & {"CraneAnnotatorDown", "CraneEventRecorderDown", "CraneSchedulerDown", "CraneAnnotatorNoLeader"}
