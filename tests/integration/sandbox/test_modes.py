"""Mode "second scheduler": crane-scheduler serves ``schedulerName: crane-scheduler`` beside the real
kube-scheduler binary, which keeps ``default-scheduler``. (Mode "replace" is the default, covered by
test_workloads.)"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from crane_sandbox.sandbox import Sandbox
from crane_shared.kube import api_client_from_dict, raw_json


@pytest.fixture(scope="module")
async def second() -> AsyncIterator[tuple[Sandbox, client.ApiClient]]:
    sb = Sandbox(nodes=2, mode="second", services=("scheduler",))
    await sb.start()
    assert sb.cluster is not None
    api = await api_client_from_dict(sb.cluster.kubeconfig_dict())
    try:
        yield sb, api
    finally:
        await api.close()
        await sb.stop()


def pod(name: str, scheduler: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "nginx"}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": name}, "spec": spec}


async def running_on(api: client.ApiClient, name: str, timeout: float = 60) -> str:
    v1 = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        body = await raw_json(v1.read_namespaced_pod(name, "default", _preload_content=False))
        if body.get("status", {}).get("phase") == "Running":
            return str(body["spec"]["nodeName"])
        assert time.monotonic() < deadline, f"pod {name} not Running after {timeout:.0f}s: {body.get('status')}"
        await asyncio.sleep(0.25)


def explain_status(sandbox: Sandbox, name: str) -> tuple[int, dict[str, Any] | None]:
    url = f"http://127.0.0.1:{sandbox.ports['scheduler']}/debug/explain/default/{name}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, None


async def test_each_scheduler_serves_its_own_pods(second: tuple[Sandbox, client.ApiClient]) -> None:
    sandbox, api = second
    assert sandbox.kube_scheduler is not None and sandbox.kube_scheduler.running
    v1 = client.CoreV1Api(api)
    await v1.create_namespaced_pod("default", pod("by-kube", None))
    await v1.create_namespaced_pod("default", pod("by-crane", "crane-scheduler"))
    kube_node = await running_on(api, "by-kube")
    crane_node = await running_on(api, "by-crane")
    status, decision = await asyncio.to_thread(explain_status, sandbox, "by-crane")
    assert status == 200 and decision is not None and decision["result"].get("node") == crane_node
    status, _ = await asyncio.to_thread(explain_status, sandbox, "by-kube")
    assert status == 404  # crane-scheduler never saw it: kube-scheduler placed it
    events = await raw_json(
        client.EventsV1Api(api).list_namespaced_event(
            "default", field_selector="regarding.name=by-kube", _preload_content=False
        )
    )
    scheduled = [e for e in events["items"] if e.get("reason") == "Scheduled"]
    assert scheduled and kube_node in scheduled[0]["note"]
