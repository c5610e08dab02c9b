"""Mode "second scheduler": crane-scheduler serves ``schedulerName: crane-scheduler`` beside the real
kube-scheduler binary, which keeps ``default-scheduler``. (Mode "replace" is the default, covered by
test_workloads.) Also the simulated nodes' NodeResourceTopology objects: node-0001 publishes the default two
zones, node-0002 none (``off``)."""

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
from crane_sandbox.topology import TopologySpec
from crane_scheduler.plugins.noderesourcetopology.model import ANNOTATION_RESULT, GROUP, PLURAL, VERSION
from crane_shared.kube import api_client_from_dict, raw_json
from cranectl.__main__ import render_explain


@pytest.fixture(scope="module")
async def second() -> AsyncIterator[tuple[Sandbox, client.ApiClient]]:
    sb = Sandbox(nodes=2, mode="second", services=("scheduler",), node_topologies={"node-0002": TopologySpec(zones=0)})
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


async def test_nodes_publish_their_topology_and_a_whole_cpu_pod_gets_a_zone(
    second: tuple[Sandbox, client.ApiClient],
) -> None:
    sandbox, api = second
    crd = client.CustomObjectsApi(api)
    nrts = await raw_json(crd.list_cluster_custom_object(GROUP, VERSION, PLURAL, _preload_content=False))
    nodes = await raw_json(client.CoreV1Api(api).list_node(_preload_content=False))
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in nodes["items"]}
    by_name = {o["metadata"]["name"]: o for o in nrts["items"]}
    assert sorted(by_name) == ["node-0001"] and sandbox.topologies == 1
    nrt = by_name["node-0001"]
    assert nrt["metadata"]["ownerReferences"][0]["uid"] == uids["node-0001"]  # deleted with its node
    assert nrt["craneManagerPolicy"] == {
        "cpuManagerPolicy": "Static",
        "topologyManagerPolicy": "SingleNUMANodePodLevel",
    }
    assert [(z["name"], z["resources"]["allocatable"]["cpu"]) for z in nrt["zones"]] == [("node0", "4"), ("node1", "4")]

    resources = {"cpu": "4", "memory": "256Mi"}
    body = pod("numa", "crane-scheduler")
    body["spec"]["containers"][0]["resources"] = {"requests": resources, "limits": dict(resources)}
    await client.CoreV1Api(api).create_namespaced_pod("default", body)
    assert await running_on(api, "numa") == "node-0001"  # node-0002 has no NRT: fail closed, as upstream
    placed = await raw_json(client.CoreV1Api(api).read_namespaced_pod("numa", "default", _preload_content=False))
    result = json.loads(placed["metadata"]["annotations"][ANNOTATION_RESULT])
    assert [z["name"] for z in result] in (["node0"], ["node1"])
    status, decision = await asyncio.to_thread(explain_status, sandbox, "numa")
    assert status == 200 and decision is not None
    assert f"NUMA zones: {result[0]['name']} (cpu=4)" in render_explain(decision)


async def test_a_deleted_node_takes_its_topology_with_it(second: tuple[Sandbox, client.ApiClient]) -> None:
    """The NRT is owned by its Node: kube-controller-manager's garbage collector deletes it (last test: the fleet
    loses a node)."""
    _, api = second
    crd = client.CustomObjectsApi(api)
    await raw_json(client.CoreV1Api(api).delete_node("node-0001", _preload_content=False))
    deadline = time.monotonic() + 120  # the collector notices a CRD installed after it started on its next resync
    while True:
        nrts = await raw_json(crd.list_cluster_custom_object(GROUP, VERSION, PLURAL, _preload_content=False))
        if not nrts["items"]:
            return
        assert time.monotonic() < deadline, f"NRTs left after their node was deleted: {nrts['items']}"
        await asyncio.sleep(0.5)
