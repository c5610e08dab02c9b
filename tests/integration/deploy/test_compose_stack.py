"""The whole local stack, docker-compose.yml, started for real: Debian's docker-compose drives podman (its
Docker-compatible API) and the stack does what the product is for.

The public images the file names cannot be pulled here (no registry); an override file swaps in local equivalents:
KWOK's cluster image built by KWOK's own recipe from the pinned binaries (deploy/compose/kwok-cluster.Dockerfile),
Redis and Prometheus from Debian's packages, the service and fleet images built from their Dockerfiles on the local
Debian base. Grafana is the one service not started: no Grafana server can be built here (its Go module is refused
by the module proxy, no other reachable registry packages it: docs/deploy.md); the dashboards are evaluated
against the real Prometheus by test_dashboards.py instead.

Checks: a Deployment whose pods name crane-scheduler gets every pod bound by crane-scheduler (its Scheduled
events), each binding is recorded once in Redis by the event-recorder, and the annotator annotates the fleet's nodes
(load from Prometheus's recording rules, hot value from the binding records).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
import yaml
from kubernetes_asyncio import client

from crane_sandbox.procs import ManagedProcess, tcp_open
from crane_shared.bindings import BindingSchema
from crane_shared.kube import api_client_from_dict
from tests.support.deploy import REPO, podman, prefetch
from tests.support.scheduler_cluster import wait_for

prefetch("tools", "kwokctl")
prefetch("tools", "kubectl")

PROJECT = "cranestacktest"
STARTED = ("kwok", "fleet", "redis", "prometheus", "event-recorder", "annotator", "scheduler", "descheduler")
PORTS = {"kwok": 8080, "fleet": 9100, "redis": 6379, "prometheus": 9090, "event-recorder": 8081, "annotator": 8082}
PORTS |= {"scheduler": 10261, "descheduler": 8084}
ENDPOINTS = {
    "kwok": "http://127.0.0.1:8080/readyz",
    "fleet": "http://127.0.0.1:9100/metrics",
    "prometheus": "http://127.0.0.1:9090/-/ready",
    "event-recorder": "http://127.0.0.1:8081/readyz",
    "annotator": "http://127.0.0.1:8082/healthz",
    "scheduler": "http://127.0.0.1:10261/readyz",
    "descheduler": "http://127.0.0.1:8084/readyz",
}
REPLICAS = 6


async def _ok(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def deployment() -> dict[str, Any]:
    container = {"name": "web", "image": "pause", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"schedulerName": "crane-scheduler", "containers": [container]},
            },
        },
    }


async def test_compose_local_stack_comes_up_and_schedules_records_and_annotates(
    images: dict[str, str], standins: dict[str, str], kwok_cluster: str, fleet_image: str, tmp_path: Path
) -> None:
    busy = [f"{name} :{port}" for name, port in PORTS.items() if await tcp_open("127.0.0.1", port)]
    assert not busy, f"the compose stack's ports are taken on this machine (another stack running?): {busy}"
    socket = tmp_path / "podman.sock"
    api = ManagedProcess(
        "podman-api", [str(REPO / "scripts" / "container-engine"), "docker-api", str(socket)], tmp_path / "podman.log"
    )
    await api.start()
    override = tmp_path / "override.yml"
    swap = {"kwok": kwok_cluster, "fleet": fleet_image} | {k: standins[k] for k in ("redis", "prometheus")}
    swap |= {name: images[name] for name in ("event-recorder", "annotator", "scheduler", "descheduler")}
    override.write_text(yaml.safe_dump({"services": {k: {"image": v} for k, v in swap.items()}}))
    files = ["-p", PROJECT, "-f", str(REPO / "docker-compose.yml"), "-f", str(override)]
    env = {**os.environ, "DOCKER_HOST": f"unix://{socket}"}

    def compose(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(REPO / "scripts" / "container-engine"), "compose", *files, *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=REPO,
            check=False,
        )

    kube = await api_client_from_dict(yaml.safe_load((REPO / "deploy" / "compose" / "kubeconfig").read_text()))
    r = aioredis.from_url("redis://127.0.0.1:6379/0")
    try:
        await wait_for(lambda: asyncio.to_thread(socket.exists), timeout=30, what="podman's API socket")
        up = await asyncio.to_thread(compose, "up", "-d", "--no-build", *STARTED)
        assert up.returncode == 0, up.stdout + up.stderr
        for name, url in ENDPOINTS.items():
            await wait_for(functools.partial(_ok, url), timeout=180, interval=1, what=f"{name} from docker-compose")
        ps = podman("ps", "--filter", f"label=com.docker.compose.project={PROJECT}", "--format", "{{.Names}}")
        running = sorted(ps.stdout.split())
        print("\ncompose services up:", running)
        assert len(running) == len(STARTED), running

        v1 = client.CoreV1Api(kube)

        async def ready_nodes() -> list[str]:
            nodes = (await v1.list_node()).items
            ready = [
                n.metadata.name
                for n in nodes
                if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            ]
            return ready if len(ready) >= 10 else []

        fleet = await wait_for(ready_nodes, timeout=120, interval=1, what="the fleet's 10 nodes Ready (KWOK)")
        await v1.create_namespace({"metadata": {"name": "web"}})
        await client.AppsV1Api(kube).create_namespaced_deployment("web", deployment())

        async def placed() -> dict[str, str]:
            pods = (await v1.list_namespaced_pod("web", label_selector="app=web")).items
            bound = {
                p.metadata.name: p.spec.node_name for p in pods if p.spec.node_name and p.status.phase == "Running"
            }
            return bound if len(bound) == REPLICAS else {}

        pods = await wait_for(placed, timeout=120, interval=1, what="the Deployment's pods bound and Running")
        assert set(pods.values()) <= set(fleet)

        async def scheduled_by() -> dict[str, str]:
            resp = await client.EventsV1Api(kube).list_namespaced_event("web", _preload_content=False)
            events = json.loads(await resp.read())["items"]
            found = {e["regarding"]["name"]: e["reportingController"] for e in events if e["reason"] == "Scheduled"}
            return found if set(pods) <= set(found) else {}

        reporters = await wait_for(scheduled_by, timeout=60, interval=1, what="the pods' Scheduled events")
        assert {reporters[name] for name in pods} == {"crane-scheduler"}, reporters

        schema = BindingSchema()
        per_node = {node: list(pods.values()).count(node) for node in set(pods.values())}

        async def recorded() -> dict[str, int]:
            counts = {node: await r.zcard(schema.node_key(node)) for node in per_node}
            return counts if counts == per_node else {}

        await wait_for(recorded, timeout=60, interval=1, what=f"one binding record per pod in Redis {per_node}")

        async def annotated() -> dict[str, dict[str, str]]:
            nodes = {n.metadata.name: n.metadata.annotations or {} for n in (await v1.list_node()).items}
            # load from Prometheus's recording rules; the hot value from the Redis binding records (0 for a node
            # with fewer recent bindings than a hot-value rule's count: the policy's integer division)
            done = all({"cpu_usage_avg_5m", "mem_usage_avg_5m", "node_hot_value"} <= set(nodes[name]) for name in fleet)
            return nodes if done else {}

        # the annotator's first round can find Prometheus's recording rules still empty; the next is one sync
        # period later (cpu_usage_avg_5m: 3m)
        nodes = await wait_for(annotated, timeout=300, interval=2, what="the fleet's nodes annotated")
        sample = next(iter(per_node))
        print(
            f"{sample}: "
            + ", ".join(f"{k}={v}" for k, v in sorted(nodes[sample].items()) if "usage" in k or "hot" in k)
        )
    finally:
        await r.aclose()
        await kube.close()
        logs = await asyncio.to_thread(compose, "logs", "--no-color", "--tail", "15")
        print(logs.stdout[-6000:], logs.stderr[-2000:])
        down = await asyncio.to_thread(compose, "down", "-v")
        print(down.stdout[-2000:], down.stderr[-2000:])
        await api.stop()
