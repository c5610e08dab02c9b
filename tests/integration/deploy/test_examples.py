"""What the README tells a newcomer to run, run as they would in the sandbox: the banner's line to paste, then
``kubectl apply -f`` of every manifest in deploy/examples/ (the README's), each checked for the effect the README
claims; and the traps the README warns about (a gang that cannot fit, a batch pod with cpu requests).

One sandbox for the module, as the README's DRA run starts it (``--nodes 4 --devices gpu=2 --node-devices
node-0004=gpu=0``) with nodes of 6 cores (a gang member of 4 cores fits a node alone). Late in CI's order: kubectl
is one of the tools scripts/setup builds last.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from crane_sandbox.cluster import REPO_ROOT
from crane_sandbox.devices import DRIVER
from crane_sandbox.fleet import make_fleet
from crane_sandbox.kubebin import kubectl_binary
from crane_sandbox.sandbox import Sandbox, env_line
from crane_shared.kube import raw_json
from tests.support.sandboxes import admin_api, ready_namespace
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

EXAMPLES = REPO_ROOT / "deploy" / "examples"
NO_GPU = "node-0004"


@pytest.fixture(scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    fleet = make_fleet(4, cpu_cores=6, instance_styles=("ip:port", "ip", "name"))
    sb = Sandbox(fleet=fleet, devices=2, node_devices={NO_GPU: 0})
    sb.kubectl, _ = await asyncio.gather(asyncio.to_thread(kubectl_binary), sb.start())
    try:
        yield sb
    finally:
        await sb.stop()


@pytest.fixture(scope="module")
async def api(sandbox: Sandbox) -> AsyncIterator[client.ApiClient]:
    async for api in admin_api(sandbox):
        yield api


def shell(sandbox: Sandbox, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` in a fresh bash after the banner's line, with the PATH of a machine that has none of the
    project's tools on it."""
    assert sandbox.cluster is not None
    line = env_line(sandbox.cluster.kubeconfig_path, sandbox.kubectl)
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(
        ["bash", "-c", f"{line}\n{command}"], env=env, capture_output=True, text=True, timeout=120, check=False
    )


async def kubectl(sandbox: Sandbox, *args: str) -> str:
    done = await asyncio.to_thread(shell, sandbox, " ".join(["kubectl", *args]))
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
async def ns(api: client.ApiClient, request: pytest.FixtureRequest) -> str:
    return await ready_namespace(api, str(request.node.name))


async def pods(api: client.ApiClient, ns: str, selector: str = "") -> list[dict[str, Any]]:
    body = await raw_json(
        client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector, _preload_content=False)
    )
    return list(body["items"])


async def events(api: client.ApiClient, ns: str, reason: str) -> list[dict[str, Any]]:
    body = await raw_json(
        client.EventsV1Api(api).list_namespaced_event(ns, field_selector=f"reason={reason}", _preload_content=False)
    )
    return list(body["items"])


def bound(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in items if p["spec"].get("nodeName")]


def test_the_banners_line_puts_kubectl_and_cranectl_on_path(sandbox: Sandbox) -> None:
    assert sandbox.cluster is not None
    line = env_line(sandbox.cluster.kubeconfig_path, sandbox.kubectl)
    assert f"  {line}" in sandbox.describe().splitlines()  # the banner prints it as is
    done = shell(
        sandbox,
        "command -v kubectl cranectl python && kubectl get nodes -o name && "
        f"cranectl nodes --policy {sandbox.policy_path} >/dev/null && python -c 'import crane_sandbox'",
    )
    assert done.returncode == 0, done.stderr
    kubectl_path, cranectl_path, python_path, *nodes = done.stdout.split()
    assert kubectl_path == str(sandbox.kubectl) and Path(cranectl_path).parent == Path(python_path).parent
    assert sorted(nodes) == [f"node/node-000{i}" for i in range(1, 5)]


async def test_the_dra_example_gives_each_trainer_its_own_gpu_and_leaves_the_seventh_pending(
    sandbox: Sandbox, api: client.ApiClient, ns: str
) -> None:
    await kubectl(sandbox, "apply", "-n", ns, "-f", str(EXAMPLES / "trainer.yaml"))

    async def six_running() -> list[dict[str, Any]] | None:
        items = bound(await pods(api, ns, "app=trainer"))
        return items if len(items) == 6 and all(p["status"].get("phase") == "Running" for p in items) else None

    items = await eventually(six_running, 120, "6 trainers Running", interval=0.25)
    assert NO_GPU not in {p["spec"]["nodeName"] for p in items}
    claims = await raw_json(client.ResourceV1Api(api).list_namespaced_resource_claim(ns, _preload_content=False))
    devices = {
        (r["driver"], r["pool"], r["device"])
        for c in claims["items"]
        for r in (c.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", [])
    }
    assert len(devices) == 6 and {d for d, _, _ in devices} == {DRIVER}  # six GPUs, each once
    await kubectl(sandbox, "scale", "-n", ns, "deployment", "trainer", "--replicas=7")

    async def told() -> list[dict[str, Any]]:
        return [e for e in await events(api, ns, "FailedScheduling") if "cannot allocate all claims" in e["note"]]

    await eventually(told, 60, "the seventh trainer's FailedScheduling", interval=0.25)
    assert len(bound(await pods(api, ns, "app=trainer"))) == 6
    # the GPUs back for the next example: the resourceclaim controller deletes the claims of the pods gone
    await kubectl(sandbox, "delete", "-n", ns, "-f", str(EXAMPLES / "trainer.yaml"), "--wait=true")
    await eventually(lambda: _no_claims(api, ns), 60, "the trainers' claims deleted", interval=0.25)


async def _no_claims(api: client.ApiClient, ns: str) -> bool:
    claims = await raw_json(client.ResourceV1Api(api).list_namespaced_resource_claim(ns, _preload_content=False))
    return not claims["items"]


async def test_the_extended_resource_example_gets_a_whole_gpu_and_never_the_tainted_spare(
    sandbox: Sandbox, api: client.ApiClient, ns: str
) -> None:
    await kubectl(sandbox, "apply", "-n", ns, "-f", str(EXAMPLES / "gpu-extended.yaml"))

    async def running() -> dict[str, Any] | None:
        one = next((p for p in await pods(api, ns) if p["metadata"]["name"] == "gpu-one"), None)
        return one if one and one["status"].get("phase") == "Running" else None

    one = await eventually(running, 120, "gpu-one Running", interval=0.25)
    assert one["spec"]["nodeName"] != NO_GPU
    status = one["status"]["extendedResourceClaimStatus"]
    assert status["requestMappings"] == [
        {"containerName": "main", "requestName": "container-0-request-1", "resourceName": "example.com/gpu"}
    ]
    claim = await raw_json(
        client.ResourceV1Api(api).read_namespaced_resource_claim(
            status["resourceClaimName"], ns, _preload_content=False
        )
    )
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) in {
        (one["spec"]["nodeName"], "gpu-0"),
        (one["spec"]["nodeName"], "gpu-1"),
    }

    async def told() -> list[dict[str, Any]]:
        return [e for e in await events(api, ns, "FailedScheduling") if e["regarding"]["name"] == "gpu-three"]

    [event, *_] = await eventually(told, 60, "gpu-three's FailedScheduling", interval=0.25)
    assert "cannot allocate all claims" in event["note"]  # node-0001's third whole GPU is the tainted spare
    assert not bound([p for p in await pods(api, ns) if p["metadata"]["name"] == "gpu-three"])
    await kubectl(sandbox, "delete", "-n", ns, "-f", str(EXAMPLES / "gpu-extended.yaml"), "--wait=true")


async def test_the_gang_example_is_placed_whole(sandbox: Sandbox, api: client.ApiClient, ns: str) -> None:
    await kubectl(sandbox, "apply", "-n", ns, "-f", str(EXAMPLES / "gang-job.yaml"))

    async def placed() -> dict[str, Any] | None:
        group = await raw_json(
            client.CustomObjectsApi(api).get_namespaced_custom_object(
                "scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", "train", _preload_content=False
            )
        )
        status = group.get("status") or {}
        # the phase moves on once KWOK reports the bound pods Running (a status write of its own, a moment later)
        return group if status.get("scheduled") == 3 and status.get("phase") in ("Running", "Finished") else None

    await eventually(placed, 60, "PodGroup train: 3 scheduled and running", interval=0.25)
    assert len(bound(await pods(api, ns, "scheduling.x-k8s.io/pod-group=train"))) == 3


async def test_a_pod_group_that_cannot_fit_gets_no_member_bound(
    sandbox: Sandbox, api: client.ApiClient, ns: str
) -> None:
    """4 members of 4 cores on 3 nodes of 6: one member per node, so the fourth never fits. Placed one pod at a
    time (a profile without Coscheduling) three would be bound; the sandbox's profile binds none."""
    custom = client.CustomObjectsApi(api)
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "big"}}
    await custom.create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", {**group, "spec": {"minMember": 4}}
    )
    three = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-0001", "node-0002", "node-0003"]}
    for i in range(4):
        await client.CoreV1Api(api).create_namespaced_pod(
            ns,
            {
                "metadata": {"name": f"big-{i}", "labels": {"scheduling.x-k8s.io/pod-group": "big"}},
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [three]}]
                            }
                        }
                    },
                    "containers": [{"name": "w", "image": "busybox", "resources": {"requests": {"cpu": "4"}}}],
                },
            },
        )

    async def decided() -> str | None:
        if bound(await pods(api, ns)):
            return "a member was bound"
        notes = [e["note"] for e in await events(api, ns, "FailedScheduling")]
        return "rejected" if any(f"PodGroup {ns}/big gets rejected due to" in n for n in notes) else None

    assert await eventually(decided, 60, "the group's fate", interval=0.25) == "rejected"
    assert bound(await pods(api, ns)) == []


async def test_the_batch_example_runs_on_the_loan(sandbox: Sandbox, api: client.ApiClient, ns: str) -> None:
    """The Job of batch-job.yaml (6 pods of 2 batch cores and 4 GiB) is placed by crane-scheduler on what the
    annotator lends (the sandbox's policy has spec.reclaim) and completes."""
    await kubectl(sandbox, "apply", "-n", ns, "-f", str(EXAMPLES / "batch-job.yaml"))
    batch = client.BatchV1Api(api)

    async def complete() -> dict[str, Any] | None:
        job = await raw_json(batch.read_namespaced_job_status("batch-crunch", ns, _preload_content=False))
        return job if (job.get("status") or {}).get("succeeded") == 6 else None

    await eventually(complete, 180, "Job batch-crunch: 6 succeeded", interval=0.5)
    scheduled = await events(api, ns, "Scheduled")
    assert {e["reportingController"] for e in scheduled} == {"crane-scheduler"}


async def test_a_batch_pod_that_requests_cpu_is_refused_naming_the_field(
    sandbox: Sandbox, api: client.ApiClient, ns: str
) -> None:
    asks = {"crane.io/batch-cpu": "1000", "crane.io/batch-memory": "1Gi"}
    resources = {"requests": {**asks, "cpu": "500m"}, "limits": asks}
    await client.CoreV1Api(api).create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "burstable"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}]},
        },
    )

    async def decided() -> str | None:
        if bound(await pods(api, ns)):
            return "bound"
        refused = [e for e in await events(api, ns, "FailedScheduling") if "batch pod sets" in e["note"]]
        return refused[0]["note"] if refused else None

    note = await eventually(decided, 60, "the batch pod's fate", interval=0.25)
    assert "batch pod sets spec.containers[0].resources.requests.cpu" in note
