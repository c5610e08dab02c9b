"""Gangs on the real API server: PodGroups (Coscheduling) and their members, the profile that enables them."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from crane_scheduler.simulate import POD_GROUP_LABEL, POD_GROUP_RESOURCE
from crane_shared.kube import raw_json
from tests.support.scheduler_cluster import pod

GROUP, VERSION, PLURAL = POD_GROUP_RESOURCE

COSCHEDULING = {
    "plugins": {
        "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
        "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
    }
}


async def create_group(kube: client.ApiClient, namespace: str, name: str, min_member: int, **spec: Any) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member, **spec},
    }
    await raw_json(
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, _preload_content=False
        )
    )


async def read_group(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await raw_json(
        client.CustomObjectsApi(kube).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, _preload_content=False
        )
    )
    return found


def members(group: str, scheduler: str, count: int, cpu: str = "1") -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        body = pod(f"{group}-{i}", scheduler, cpu=cpu)
        body["metadata"]["labels"] = {POD_GROUP_LABEL: group}
        out.append(body)
    return out
