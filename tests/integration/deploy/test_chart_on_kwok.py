"""The chart's Deployments become available on a cluster with kubelets: the sandbox's control plane with
kube-controller-manager, the stock kube-scheduler and KWOK's simulated kubelets (which run every pod without
pulling its image). ``helm install --wait`` returns only once every Deployment is available.

Needs the sandbox's KWOK support (``crane_sandbox.kwok``); skipped, saying so, on a tree without it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio import client

from crane_sandbox.sandbox import Sandbox
from crane_shared.kube import api_client_from_dict
from tests.support.deploy import CHART, helm

pytest.importorskip("crane_sandbox.kwok", reason="the sandbox on this tree has no KWOK (simulated kubelets)")


async def test_chart_deployments_become_available_on_kwok_nodes() -> None:
    # control plane + controllers + kube-scheduler + 3 KWOK nodes; none of crane's services (the chart brings them)
    options: dict[str, Any] = {"nodes": 3, "mode": "second", "services": ()}
    sandbox = Sandbox(**options)
    await sandbox.start()
    assert sandbox.cluster is not None
    kubeconfig = ["--kubeconfig", str(sandbox.cluster.kubeconfig_path)]
    api = await api_client_from_dict(sandbox.cluster.kubeconfig_dict())
    try:
        result = await asyncio.to_thread(
            helm,
            "install",
            "crane",
            str(CHART),
            *kubeconfig,
            "--namespace",
            "crane-system",
            "--create-namespace",
            "--set",
            "extender.enabled=true",
            "--wait",
            "--timeout",
            "5m",
        )
        print(result.stdout)
        resp = await client.AppsV1Api(api).list_namespaced_deployment("crane-system", _preload_content=False)
        deployments = json.loads(await resp.read())["items"]
        available = {d["metadata"]["name"]: d["status"].get("availableReplicas", 0) for d in deployments}
        wanted = {d["metadata"]["name"]: d["spec"]["replicas"] for d in deployments}
        assert available == wanted, (available, wanted)
        assert set(wanted) == {
            "crane-redis",
            "crane-event-recorder",
            "crane-annotator",
            "crane-scheduler",
            "crane-extender",
            "crane-descheduler",
        }
    finally:
        await asyncio.to_thread(helm, "uninstall", "crane", *kubeconfig, "--namespace", "crane-system", check=False)
        await api.close()
        await sandbox.stop()
