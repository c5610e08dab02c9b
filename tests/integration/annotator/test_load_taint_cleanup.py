"""``cranectl load-taint clear``, the chart's pre-delete hook command, on the real API server as the hook's own
ServiceAccount (its rules rendered from the chart): it scales the annotator to zero, waits until the annotator's
Lease is free, then lifts ``crane.io/load-hot`` from every node, keeping the other taints."""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime

import pytest
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.rbac import service_identity
from crane_shared.events import micro_time
from crane_shared.kube import raw_json
from crane_shared.loadtaintpolicy import TAINT_KEY

pytestmark = pytest.mark.integration

OTHER = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
OURS = {"key": TAINT_KEY, "value": "cpu_usage_avg_5m", "effect": "NoSchedule"}


async def test_the_uninstall_hook_stops_the_annotator_waits_for_its_lease_and_lifts_every_load_taint(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str
) -> None:
    hook = await service_identity(cluster, "uninstall", namespace)
    annotator = hook.account.removesuffix("-uninstall") + "-annotator"  # the chart's names: <prefix>-<component>
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    labels = {"app": "annotator"}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "a", "image": "crane-annotator"}]}}
    spec = {"replicas": 2, "selector": {"matchLabels": labels}, "template": template}
    await apps.create_namespaced_deployment(namespace, {"metadata": {"name": annotator}, "spec": spec})
    # the annotator's leader holds its Lease (renewed 1 s ago, for 4 s)
    lease = {
        "metadata": {"name": annotator},
        "spec": {"holderIdentity": "annotator-0", "leaseDurationSeconds": 4, "renewTime": micro_time(time.time() - 1)},
    }
    await client.CoordinationV1Api(kube).create_namespaced_lease(namespace, lease)
    names = [f"{namespace}-hot", f"{namespace}-both", f"{namespace}-other"]
    for name, taints in zip(names, ([OURS], [OTHER, OURS], [OTHER]), strict=True):
        await core.create_node({"metadata": {"name": name}, "spec": {"taints": taints}})
    try:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cranectl",
            "load-taint",
            "clear",
            "--kubeconfig",
            str(hook.kubeconfig),
            f"--stop-annotator={namespace}/{annotator}",
            f"--lease={namespace}/{annotator}",
            "--timeout=30",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        took = time.monotonic() - started
        assert proc.returncode == 0, err.decode()
        assert "lifted from 2 node(s)" in out.decode(), out.decode()
        deployment = await raw_json(apps.read_namespaced_deployment(annotator, namespace, _preload_content=False))
        assert deployment["spec"]["replicas"] == 0
        assert took >= 2, "cleared before the annotator's Lease had expired"
        for name, kept in zip(names, ([], [OTHER], [OTHER]), strict=True):
            node = await raw_json(core.read_node(name, _preload_content=False))
            taints = [t for t in node["spec"].get("taints") or [] if not t["key"].startswith("node.kubernetes.io/")]
            assert taints == kept, name  # (the API server's admission adds node.kubernetes.io/not-ready: kept too)
    finally:
        for name in names:
            await core.delete_node(name)


async def test_it_refuses_to_clear_while_the_lease_stays_held(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str
) -> None:
    hook = await service_identity(cluster, "uninstall", namespace)
    annotator = hook.account.removesuffix("-uninstall") + "-annotator"
    renewed = micro_time(datetime.now(UTC).timestamp())
    held = {"holderIdentity": "a", "leaseDurationSeconds": 3600, "renewTime": renewed}
    lease = {"metadata": {"name": annotator}, "spec": held}
    await client.CoordinationV1Api(kube).create_namespaced_lease(namespace, lease)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cranectl",
        "load-taint",
        "clear",
        "--kubeconfig",
        str(hook.kubeconfig),
        f"--lease={namespace}/{annotator}",
        "--timeout=2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1 and "still held after 2s: stopping here" in err.decode()
