"""The sandbox is a real cluster: workloads a platform team runs go through kube-controller-manager, are placed
by crane-scheduler (serving ``default-scheduler``), and are run by KWOK's simulated kubelets. Three of its nodes
have two simulated GPUs each (DRA ResourceSlices), the fourth none.

One sandbox for the module (its start-up is the expensive part); every test works in its own namespace and
awaits conditions by polling the API against a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes_asyncio import client

from crane_sandbox.devices import DEVICE_CLASS, DRIVER
from crane_sandbox.sandbox import Sandbox, node_is_ready
from crane_shared.kube import api_client_from_dict, raw_json
from tests.support.waiting import eventually

T = TypeVar("T")
NODES = 4
GPUS = 2
NO_GPU = "node-0004"
GRACE = 50.0
"""kube-controller-manager's default --node-monitor-grace-period: a node whose Lease is older is tainted."""


@pytest.fixture(scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    sb = Sandbox(nodes=NODES, devices=GPUS, node_devices={NO_GPU: 0})
    await sb.start()
    try:
        yield sb
    finally:
        await sb.stop()


@pytest.fixture(scope="module")
async def api(sandbox: Sandbox) -> AsyncIterator[client.ApiClient]:
    assert sandbox.cluster is not None
    api = await api_client_from_dict(sandbox.cluster.kubeconfig_dict())
    yield api
    await api.close()


@pytest.fixture
async def ns(api: client.ApiClient, request: pytest.FixtureRequest) -> str:
    """A fresh namespace whose ``default`` ServiceAccount exists (the admission plugin refuses pods before)."""
    name = str(request.node.name).removeprefix("test_").replace("_", "-")[:50].strip("-")
    v1 = client.CoreV1Api(api)
    await v1.create_namespace({"metadata": {"name": name}})

    async def has_account() -> bool:
        accounts = await v1.list_namespaced_service_account(name)
        return any(a.metadata.name == "default" for a in accounts.items)

    await eventually(has_account, 30, f"ServiceAccount {name}/default", interval=0.25)
    return name


def template(app: str, cpu: str = "100m", memory: str = "64Mi") -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {
            "containers": [{"name": app, "image": "nginx", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]
        },
    }


async def pods(api: client.ApiClient, ns: str, app: str) -> list[dict[str, Any]]:
    body = await raw_json(
        client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"app={app}", _preload_content=False)
    )
    items: list[dict[str, Any]] = body["items"]
    return items


def running(pod: dict[str, Any]) -> bool:
    status = pod.get("status", {})
    return bool(
        status.get("phase") == "Running"
        and status.get("podIP")
        and pod["spec"].get("nodeName")
        and "deletionTimestamp" not in pod["metadata"]
    )


async def all_running(api: client.ApiClient, ns: str, app: str, count: int, timeout: float) -> list[dict[str, Any]]:
    async def probe() -> list[dict[str, Any]] | None:
        items = await pods(api, ns, app)
        return items if len(items) == count and all(map(running, items)) else None

    return await eventually(probe, timeout, f"{count} pods app={app} Running in {ns}", interval=0.25)


def explain(sandbox: Sandbox, ns: str, pod: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{sandbox.ports['scheduler']}/debug/explain/{ns}/{pod}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        body: dict[str, Any] = json.load(resp)
    return body


async def test_a_deployment_of_20_replicas_is_scheduled_by_crane_and_runs(
    sandbox: Sandbox, api: client.ApiClient, ns: str
) -> None:
    assert sandbox.kube_scheduler is None  # replace mode: crane-scheduler is the only scheduler
    spec = {"replicas": 20, "selector": {"matchLabels": {"app": "web"}}, "template": template("web")}
    await client.AppsV1Api(api).create_namespaced_deployment(ns, {"metadata": {"name": "web"}, "spec": spec})
    items = await all_running(api, ns, "web", 20, timeout=120)
    assert {p["spec"]["schedulerName"] for p in items} == {"default-scheduler"}
    for p in items:  # crane-scheduler made each decision and can explain it
        decision = await asyncio.to_thread(explain, sandbox, ns, p["metadata"]["name"])
        assert decision["result"].get("node") == p["spec"]["nodeName"], decision
    assert len({p["status"]["podIP"] for p in items}) == 20
    assert len({p["spec"]["nodeName"] for p in items}) > 1


async def test_a_pod_naming_crane_scheduler_is_placed_in_replace_mode_too(
    sandbox: Sandbox, api: client.ApiClient, ns: str
) -> None:
    """A manifest written for crane-scheduler beside kube-scheduler must not stay Pending without an event."""
    body = template("named")
    body["metadata"]["name"] = "named"
    body["spec"]["schedulerName"] = "crane-scheduler"
    await client.CoreV1Api(api).create_namespaced_pod(ns, body)
    [placed] = await all_running(api, ns, "named", 1, timeout=60)
    decision = await asyncio.to_thread(explain, sandbox, ns, "named")
    assert decision["result"].get("node") == placed["spec"]["nodeName"]


async def test_the_sandbox_becomes_load_aware_every_node_annotated(sandbox: Sandbox) -> None:
    assert await sandbox.wait_load_aware(timeout=120)


async def test_scaling_down_deletes_pods_cleanly(sandbox: Sandbox, api: client.ApiClient, ns: str) -> None:
    apps = client.AppsV1Api(api)
    spec = {"replicas": 8, "selector": {"matchLabels": {"app": "shrink"}}, "template": template("shrink")}
    await apps.create_namespaced_deployment(ns, {"metadata": {"name": "shrink"}, "spec": spec})
    await all_running(api, ns, "shrink", 8, timeout=90)
    await apps.patch_namespaced_deployment_scale("shrink", ns, {"spec": {"replicas": 3}})
    # Without a kubelet confirming, deleted pods would stay Terminating forever.
    kept = await all_running(api, ns, "shrink", 3, timeout=60)
    assert sandbox.state is not None

    def loaded() -> set[str]:
        assert sandbox.state is not None
        return {p.name for p in sandbox.state.pods.values() if p.name.startswith(f"{ns}/")}

    expected = {f"{ns}/{p['metadata']['name']}" for p in kept}

    async def fleet_follows() -> bool:
        return loaded() == expected

    await eventually(fleet_follows, 30, "the simulated fleet to drop the deleted pods' load", interval=0.25)


async def test_a_statefulset_runs_in_order(api: client.ApiClient, ns: str) -> None:
    spec = {
        "replicas": 3,
        "serviceName": "db",
        "selector": {"matchLabels": {"app": "db"}},
        "template": template("db", cpu="200m", memory="256Mi"),
    }
    await client.AppsV1Api(api).create_namespaced_stateful_set(ns, {"metadata": {"name": "db"}, "spec": spec})
    items = await all_running(api, ns, "db", 3, timeout=120)
    assert sorted(p["metadata"]["name"] for p in items) == ["db-0", "db-1", "db-2"]


async def test_a_daemonset_runs_one_pod_per_node(api: client.ApiClient, ns: str) -> None:
    spec = {"selector": {"matchLabels": {"app": "agent"}}, "template": template("agent", cpu="50m")}
    await client.AppsV1Api(api).create_namespaced_daemon_set(ns, {"metadata": {"name": "agent"}, "spec": spec})
    items = await all_running(api, ns, "agent", NODES, timeout=90)
    assert len({p["spec"]["nodeName"] for p in items}) == NODES


async def test_a_job_completes(api: client.ApiClient, ns: str) -> None:
    spec = {
        "completions": 3,
        "parallelism": 3,
        "template": template("batch") | {"spec": {**template("batch")["spec"], "restartPolicy": "Never"}},
    }
    batch = client.BatchV1Api(api)
    await batch.create_namespaced_job(ns, {"metadata": {"name": "batch"}, "spec": spec})

    async def complete() -> dict[str, Any] | None:
        job = await raw_json(batch.read_namespaced_job_status("batch", ns, _preload_content=False))
        conditions = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions") or []}
        return job if conditions.get("Complete") == "True" else None

    job = await eventually(complete, 120, "Job batch Complete", interval=0.25)
    assert job["status"]["succeeded"] == 3


async def claims(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    body = await raw_json(client.ResourceV1Api(api).list_namespaced_resource_claim(ns, _preload_content=False))
    items: list[dict[str, Any]] = body["items"]
    return items


def devices_of(items: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of every allocated result of ``items`` (ResourceClaims)."""
    return [
        (r["driver"], r["pool"], r["device"])
        for c in items
        for r in ((c.get("status", {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    ]


async def test_a_deployment_with_a_claim_template_runs_where_the_gpus_are_and_reuses_freed_ones(
    api: client.ApiClient, ns: str
) -> None:
    """One GPU per replica from a ResourceClaimTemplate: the replicas run on the three nodes with GPUs, never on
    the one without; the replica beyond the six GPUs stays Pending. Scaling down frees the claims (the
    resourceclaim controller deletes a gone pod's template claims), and scaling up again reuses the GPUs."""
    template_claim = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}}
    await client.ResourceV1Api(api).create_namespaced_resource_claim_template(
        ns, {"metadata": {"name": "one-gpu"}, "spec": {"spec": template_claim}}
    )
    pod = template("trainer")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    gpus = GPUS * (NODES - 1)
    apps = client.AppsV1Api(api)
    spec = {"replicas": gpus + 1, "selector": {"matchLabels": {"app": "trainer"}}, "template": pod}
    await apps.create_namespaced_deployment(ns, {"metadata": {"name": "trainer"}, "spec": spec})

    async def placed() -> list[dict[str, Any]] | None:
        items = await pods(api, ns, "trainer")
        if len(items) != gpus + 1 or sum(map(running, items)) != gpus:
            return None
        pending = [p for p in items if not p["spec"].get("nodeName")]
        return items if len(pending) == 1 else None

    items = await eventually(placed, 120, f"{gpus} trainers Running and one Pending", interval=0.25)
    nodes = [p["spec"]["nodeName"] for p in items if p["spec"].get("nodeName")]
    assert NO_GPU not in nodes and len(set(nodes)) == NODES - 1
    allocated = devices_of(await claims(api, ns))
    assert len(allocated) == gpus and len(set(allocated)) == gpus, allocated
    assert {pool for _, pool, _ in allocated} == set(nodes) and {d for d, _, _ in allocated} == {DRIVER}

    await apps.patch_namespaced_deployment_scale("trainer", ns, {"spec": {"replicas": 2}})

    async def freed() -> list[dict[str, Any]] | None:
        items = await claims(api, ns)
        return items if len(items) == 2 and len(devices_of(items)) == 2 else None

    kept = devices_of(await eventually(freed, 60, "the gone replicas' claims deleted", interval=0.25))
    await apps.patch_namespaced_deployment_scale("trainer", ns, {"spec": {"replicas": gpus}})
    await all_running(api, ns, "trainer", gpus, timeout=120)
    again = devices_of(await claims(api, ns))
    assert sorted(again) == sorted(allocated), "every GPU in use again, each once"
    assert set(kept) <= set(again)


async def test_the_descheduler_relieves_a_hot_node_and_the_scheduler_keeps_the_replacement_off_it(
    sandbox: Sandbox, api: client.ApiClient, ns: str
) -> None:
    """The loop closed with the real parts: a pod that is not recreated (``hog``) makes a node hot through its
    ``sandbox.crane.io/usage``; the annotator publishes it, the descheduler evicts the Deployment's pod there
    (Eviction API, Event), kube-controller-manager recreates it, and crane-scheduler's Dynamic filter keeps the
    replacement off the node, which stays hot (the hog is spared: no controller would recreate it)."""
    v1, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    # BestEffort (no requests) and using half a core: the first victim among the node's priority-0 pods, which the
    # module's earlier tests left there too
    moved = template("moved")
    moved["metadata"]["annotations"] = {"sandbox.crane.io/usage": "cpu=500m"}
    del moved["spec"]["containers"][0]["resources"]
    spec = {"replicas": 1, "selector": {"matchLabels": {"app": "moved"}}, "template": moved}
    await apps.create_namespaced_deployment(ns, {"metadata": {"name": "moved"}, "spec": spec})
    [first] = await all_running(api, ns, "moved", 1, timeout=90)
    hot = first["spec"]["nodeName"]
    hog = template("hog") | {"metadata": {"name": "hog", "annotations": {"sandbox.crane.io/usage": "cpu=6"}}}
    hog["spec"]["nodeName"] = hot
    await v1.create_namespaced_pod(ns, hog)
    try:

        async def relieved() -> list[dict[str, Any]] | None:
            items = [p for p in await pods(api, ns, "moved") if running(p)]
            return items if len(items) == 1 and items[0]["spec"]["nodeName"] != hot else None

        # debounce (3 rounds of 5 s), the pod's minimum age (20 s)
        replaced = await eventually(relieved, 150, f"the replica off the hot node {hot}", interval=0.5)

        async def explained() -> list[dict[str, Any]]:
            events = await raw_json(
                v1.list_namespaced_event(ns, field_selector="reason=LoadAwareDescheduled", _preload_content=False)
            )
            return list(events["items"])

        items = await eventually(explained, 30, "the evictions' Events", interval=0.25)
        assert [e["involvedObject"]["name"] for e in items] == [first["metadata"]["name"]]
        assert f"evicted from node {hot}: " in items[0]["message"]
        assert replaced[0]["metadata"]["name"] != first["metadata"]["name"]  # a new pod, placed elsewhere
        hog_now = await raw_json(v1.read_namespaced_pod("hog", ns, _preload_content=False))
        assert running(hog_now) and hog_now["spec"]["nodeName"] == hot
    finally:
        await v1.delete_namespaced_pod("hog", ns)


async def test_cranectl_nodes_shows_the_annotated_real_load(sandbox: Sandbox) -> None:
    """The user's view of the sandbox: every node with a usage from the annotator, its base load (uneven)."""
    assert sandbox.cluster is not None and sandbox.state is not None
    argv = [
        sys.executable,
        "-m",
        "cranectl",
        "nodes",
        "--kubeconfig",
        str(sandbox.cluster.kubeconfig_path),
        "--policy",
        str(sandbox.policy_path),
    ]

    async def annotated() -> dict[str, str] | None:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        rows = {line.split()[0]: line.split()[1] for line in out.decode().splitlines()[1:] if line.startswith("node-")}
        return rows if len(rows) == NODES and "-" not in rows.values() else None

    state = sandbox.state

    def shown(name: str, text: str) -> bool:
        expected = state.usage(name)[0]  # base load plus the Running pods' usage
        return float(text.rstrip("!?")) == pytest.approx(expected, abs=0.02)

    rows = await eventually(annotated, 60, "cranectl nodes to show every node's cpu_usage_avg_5m", interval=0.25)
    # the average follows the pods the module's earlier tests started and stopped: poll until it has caught up
    deadline = time.monotonic() + 90
    while not all(shown(name, text) for name, text in rows.items()) and time.monotonic() < deadline:
        await asyncio.sleep(1)
        rows = await annotated() or rows
    for name, text in rows.items():
        assert shown(name, text), (name, text, state.usage(name)[0])
    assert len({text for text in rows.values()}) == NODES  # uneven: every node its own level


async def test_node_lifecycle_controller_keeps_healthy_nodes_untainted(sandbox: Sandbox, api: client.ApiClient) -> None:
    """Past the grace period since the nodes registered, every node is still Ready and untainted: KWOK renews the
    Leases the node lifecycle controller reads (without them it would mark the nodes unreachable and taint them).
    Last in the module, so the other tests' time counts toward the nodes' age."""
    v1 = client.CoreV1Api(api)
    names = {f"node-{i:04d}" for i in range(1, NODES + 1)}
    while True:
        nodes = await raw_json(v1.list_node(_preload_content=False))
        ours = [n for n in nodes["items"] if n["metadata"]["name"] in names]
        assert len(ours) == NODES
        bad = {n["metadata"]["name"]: n["spec"].get("taints") for n in ours if not node_is_ready(n)}
        assert not bad, f"nodes tainted or not Ready: {bad}"
        leases = await raw_json(
            client.CoordinationV1Api(api).list_namespaced_lease("kube-node-lease", _preload_content=False)
        )
        assert names <= {item["metadata"]["name"] for item in leases["items"]}
        registered = max(datetime.fromisoformat(n["metadata"]["creationTimestamp"]).timestamp() for n in ours)
        if time.time() > registered + GRACE + 10:
            return
        await asyncio.sleep(1)


async def test_the_load_taint_keeps_pods_off_a_hot_node_but_a_tolerating_daemonset_still_runs_there(
    sandbox: Sandbox, api: client.ApiClient, ns: str
) -> None:
    """The annotator's crane.io/load-hot taint on the real parts: the policy file gains ``spec.loadTaint`` (reloaded
    like a ConfigMap update) with a threshold every node is above and a floor that keeps all but one untainted, so
    exactly the hottest node is tainted (and an Event says so). kube-controller-manager's DaemonSet controller adds
    tolerations for ``node.kubernetes.io/*`` taints only: a DaemonSet that does not tolerate ours gets no pod on the
    tainted node (the controller does not create it), one that tolerates it (what the README tells operators to add)
    runs there, placed by crane-scheduler. Removing the section lifts the taint."""
    original = sandbox.policy_path.read_text()
    policy = yaml.safe_load(original)
    policy["spec"]["loadTaint"] = {
        "hotRounds": 1,
        "thresholds": {"cpu_usage_avg_5m": 0.0001},
        "minUntaintedNodes": NODES - 1,
    }
    v1, apps = client.CoreV1Api(api), client.AppsV1Api(api)

    async def tainted() -> list[str]:
        nodes = await raw_json(v1.list_node(_preload_content=False))
        return [
            n["metadata"]["name"]
            for n in nodes["items"]
            if any(t["key"] == "crane.io/load-hot" for t in n["spec"].get("taints") or [])
        ]

    _swap(sandbox.policy_path, yaml.safe_dump(policy))
    try:
        [hot] = await eventually(tainted, 60, "the hottest node tainted", interval=0.5)

        async def added() -> list[dict[str, Any]]:
            events = await raw_json(
                client.EventsV1Api(api).list_namespaced_event(
                    "default", field_selector=f"regarding.name={hot},reason=LoadTaintAdded", _preload_content=False
                )
            )
            return list(events["items"])

        [event] = await eventually(added, 30, "the LoadTaintAdded Event", interval=0.25)
        assert event["regarding"]["kind"] == "Node" and "above 0.0001" in event["note"]
        tolerant = template("tolerant", cpu="10m")
        tolerant["spec"]["tolerations"] = [{"key": "crane.io/load-hot", "operator": "Exists", "effect": "NoSchedule"}]
        for app, tmpl in (("tolerant", tolerant), ("plain", template("plain", cpu="10m"))):
            spec = {"selector": {"matchLabels": {"app": app}}, "template": tmpl}
            await apps.create_namespaced_daemon_set(ns, {"metadata": {"name": app}, "spec": spec})
        everywhere = await all_running(api, ns, "tolerant", NODES, timeout=90)
        assert hot in {p["spec"]["nodeName"] for p in everywhere}

        async def plain_settled() -> dict[str, Any] | None:
            ds = await raw_json(apps.read_namespaced_daemon_set("plain", ns, _preload_content=False))
            status = ds.get("status") or {}
            done = status.get("observedGeneration") == ds["metadata"]["generation"]
            return status if done and status.get("numberReady") == status.get("desiredNumberScheduled") else None

        status = await eventually(plain_settled, 90, "the plain DaemonSet settled", interval=0.5)
        assert status["desiredNumberScheduled"] == NODES - 1, status
        assert hot not in {p["spec"]["nodeName"] for p in await pods(api, ns, "plain")}
    finally:
        _swap(sandbox.policy_path, original)
    await eventually(lambda: _none(tainted), 60, "the taint lifted once spec.loadTaint is gone", interval=0.5)


def _swap(path: Path, text: str) -> None:
    """Replace a file as a ConfigMap update does (a new inode), so readers see all of it or none."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


async def _none(probe: Callable[[], Awaitable[list[str]]]) -> bool:
    return not await probe()
