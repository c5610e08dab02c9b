"""The extender on the real API server: in-process as an aiohttp app, and the real kube-scheduler configured with
it (shared by the extender's end-to-end tests and the pod-class tests)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from crane_extender.server import Extender, ExtenderMetrics, make_app
from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import ManagedProcess, free_port
from crane_sandbox.rbac import identity
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.policy import default_policy


@contextlib.asynccontextmanager
async def extender_in_process(registry: CollectorRegistry) -> AsyncIterator[str]:
    """The extender as an aiohttp sub-app on a free port, without node cache; yields the urlPrefix."""
    app = web.Application()
    app.add_subapp(
        "/extender", make_app(Extender(DynamicArgs(default_policy()), metrics=ExtenderMetrics.create(registry)))
    )
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/extender"
    finally:
        await runner.cleanup()


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
        return r.status, await r.text()


@contextlib.asynccontextmanager
async def extender_process(cluster: LocalCluster, run_dir: Path) -> AsyncIterator[str]:
    """``python -m crane_extender --node-cache`` as a child process, ready (node cache synced)."""
    port = free_port()
    proc = ManagedProcess(
        "crane-extender",
        [
            sys.executable,
            "-m",
            "crane_extender",
            "--node-cache",
            "--port",
            str(port),
            "--listen-address",
            "127.0.0.1",
            "--kubeconfig",
            str(identity(cluster, "extender").kubeconfig),  # the chart's extender ServiceAccount
            "--log-level",
            "debug",
        ],
        run_dir / "logs" / f"crane-extender-{port}.log",
    )
    await proc.start()
    try:

        async def ready() -> bool:
            return (await get(f"http://127.0.0.1:{port}/readyz"))[0] == 200

        await proc.wait_ready(ready, timeout=30)
        yield f"http://127.0.0.1:{port}/extender"
    finally:
        await proc.stop()


@contextlib.asynccontextmanager
async def kube_scheduler(
    cluster: LocalCluster, run_dir: Path, tmp_path: Path, url_prefix: str, *, node_cache: bool, scheduler_name: str
) -> AsyncIterator[ManagedProcess]:
    """The real kube-scheduler with one profile and our extender, exactly as the README configures it."""
    assert cluster.binaries is not None
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(cluster.kubeconfig_path)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": scheduler_name}],
        "extenders": [
            {
                "urlPrefix": url_prefix,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": 1,
                "nodeCacheCapable": node_cache,
                "ignorable": False,  # here an extender failure must show, not be skipped
                "httpTimeout": "5s",
            }
        ],
    }
    path = tmp_path / "kube-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = ManagedProcess(
        "kube-scheduler",
        [str(cluster.binaries.scheduler), f"--config={path}", "--secure-port=0", "--v=2"],
        run_dir / "logs" / f"kube-scheduler-{scheduler_name}.log",
    )
    await proc.start()
    try:
        yield proc
    finally:
        await proc.stop()
