"""``cranectl snapshot`` under the chart's opt-in read-only account (``snapshot.rbac.enabled``) on the real API
server, as the README says to run it: a kubeconfig whose user is a ``tokenFile`` holding a TokenRequest token of
``<release>-snapshot``. Every list the snapshot makes is allowed (a missing rule is a 403 and the command fails
naming the resource), and the account can do nothing else: no Secret, no ConfigMap, no get, no write."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.rbac import service_identity
from crane_shared.kube import api_client_from_dict


async def snapshot(kubeconfig: Path, out: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cranectl",
        "snapshot",
        "--kubeconfig",
        str(kubeconfig),
        "-o",
        str(out),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    said, _ = await asyncio.wait_for(proc.communicate(), 120)
    return int(proc.returncode or 0), said.decode()


async def refused(call: object) -> int:
    with pytest.raises(ApiException) as err:
        await call  # type: ignore[misc]
    return int(err.value.status)


async def test_cranectl_snapshot_runs_under_the_charts_read_only_account_which_may_do_nothing_else(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    account = await service_identity(cluster, "snapshot")
    token = tmp_path / "snapshot.token"
    token.write_text(account.token)
    config = account.kubeconfig_dict()
    config["users"][0]["user"] = {"tokenFile": str(token)}  # the README's recipe: the token in a file, not inline
    kubeconfig = tmp_path / "snapshot.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    v1 = client.CoreV1Api(kube)
    pod = {
        "metadata": {"name": "waiting"},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox"}]},
    }
    await v1.create_namespaced_pod(namespace, pod)

    rc, said = await snapshot(kubeconfig, tmp_path / "snap.json")
    assert rc == 0, said
    taken = json.loads((tmp_path / "snap.json").read_text())
    assert any(
        o["kind"] == "Pod" and o["metadata"]["namespace"] == namespace and o["metadata"]["name"] == "waiting"
        for o in taken["objects"]
    )
    assert any(o["kind"] == "Namespace" and o["metadata"]["name"] == namespace for o in taken["objects"])
    # an API group the server does not serve is a 404 for this account too (granted, then not found), never a 403
    rc, said = await snapshot(cluster.kubeconfig_path, tmp_path / "admin.json")
    assert rc == 0, said
    assert taken["notServed"] == json.loads((tmp_path / "admin.json").read_text())["notServed"]

    api = await api_client_from_dict(account.kubeconfig_dict())
    try:
        own = client.CoreV1Api(api)
        assert await refused(own.list_namespaced_secret(namespace)) == 403
        assert await refused(own.list_namespaced_config_map(namespace)) == 403
        assert await refused(own.read_namespaced_pod("waiting", namespace)) == 403  # list only, not get
        assert await refused(own.create_namespaced_pod(namespace, {**pod, "metadata": {"name": "mine"}})) == 403
        assert await refused(own.delete_namespaced_pod("waiting", namespace)) == 403
        assert await refused(own.list_pod_for_all_namespaces(watch=True, timeout_seconds=1)) == 403
    finally:
        await api.close()
