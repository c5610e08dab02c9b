"""Tests against a whole sandbox (``crane_sandbox.sandbox.Sandbox``, one per module): its admin client and a
namespace per test in which pods can be created."""

from __future__ import annotations

from collections.abc import AsyncIterator

from kubernetes_asyncio import client

from crane_sandbox.sandbox import Sandbox
from crane_shared.kube import api_client_from_dict
from tests.support.waiting import eventually


async def admin_api(sandbox: Sandbox) -> AsyncIterator[client.ApiClient]:
    """The sandbox's admin client, closed after (the body of a module fixture)."""
    assert sandbox.cluster is not None
    api = await api_client_from_dict(sandbox.cluster.kubeconfig_dict())
    yield api
    await api.close()


async def ready_namespace(api: client.ApiClient, test_name: str) -> str:
    """A fresh namespace named after the test whose ``default`` ServiceAccount exists (the admission plugin refuses
    pods before)."""
    name = test_name.removeprefix("test_").replace("_", "-")[:50].strip("-")
    v1 = client.CoreV1Api(api)
    await v1.create_namespace({"metadata": {"name": name}})

    async def has_account() -> bool:
        accounts = await v1.list_namespaced_service_account(name)
        return any(a.metadata.name == "default" for a in accounts.items)

    await eventually(has_account, 30, f"ServiceAccount {name}/default", interval=0.25)
    return name
