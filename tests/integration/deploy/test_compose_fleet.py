"""The docker-compose stack's fleet (deploy/compose/fleet.py) as the process the fleet container runs: it registers
its simulated nodes in the cluster and serves their node-exporter series.

Needs the sandbox's KWOK support (the fleet's nodes are KWOK nodes); skipped, saying so, on a tree without it.
"""

from __future__ import annotations

import json
import sys

import aiohttp
import pytest
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import ManagedProcess, free_port
from tests.support.deploy import REPO
from tests.support.scheduler_cluster import wait_for

pytest.importorskip("crane_sandbox.kwok", reason="the sandbox on this tree has no KWOK (the fleet's nodes are KWOK's)")


async def test_compose_fleet_registers_nodes_and_serves_their_series(
    cluster: LocalCluster, kube: client.ApiClient
) -> None:
    port = free_port()
    fleet = ManagedProcess(
        "compose-fleet",
        [
            sys.executable,
            str(REPO / "deploy" / "compose" / "fleet.py"),
            "--kubeconfig",
            str(cluster.kubeconfig_path),
            "--nodes",
            "4",
            "--port",
            str(port),
        ],
        cluster.run_dir / "logs" / "compose-fleet.log",
    )
    await fleet.start()
    try:

        async def metrics() -> str | None:
            try:
                async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
                    return await r.text() if r.status == 200 else None
            except aiohttp.ClientError:
                return None

        text = await wait_for(metrics, timeout=60, what="the fleet's /metrics")
        assert text.count("node_memory_MemTotal_bytes{instance=") == 4
        resp = await client.CoreV1Api(kube).list_node(_preload_content=False)
        nodes = json.loads(await resp.read())["items"]
        kwok = [n for n in nodes if (n["metadata"].get("annotations") or {}).get("kwok.x-k8s.io/node") == "fake"]
        assert len(kwok) >= 4
    finally:
        await fleet.stop()
