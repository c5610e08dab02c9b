"""DRA on the real API server for the scheduler's tests: device classes and slices created, claims read, a pod
naming a claim."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from tests.support.dra import device_class
from tests.support.scheduler_cluster import pod, read_object


async def read_claim(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    v1 = client.ResourceV1Api(kube)
    return await read_object(v1.read_namespaced_resource_claim(name, namespace, _preload_content=False))


async def devices(
    kube: client.ApiClient, driver: str, classes: list[dict[str, Any]], slices: list[dict[str, Any]]
) -> None:
    v1 = client.ResourceV1Api(kube)
    for c in classes:
        await v1.create_device_class(c)
    for s in slices:
        await v1.create_resource_slice({**s, "spec": {**s["spec"], "driver": driver}})


def gpu_class(name: str, driver: str) -> dict[str, Any]:
    return device_class(name, f'device.driver == "{driver}"')


def claim_pod(name: str, scheduler: str, claim_name: str) -> dict[str, Any]:
    return pod(name, scheduler, spec={"resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}]})
