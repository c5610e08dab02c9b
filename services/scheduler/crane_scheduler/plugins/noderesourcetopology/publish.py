"""Write NRT objects as crane-agent does: create, or JSON-merge-patch an existing one (``zones`` replaced whole).

For simulated nodes (the sandbox calls it with ``agent.build_topology`` per node) and tests. Every call is
status-checked and has a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_scheduler.plugins.noderesourcetopology.model import GROUP, PLURAL, VERSION
from crane_shared.kube import raw_json

TIMEOUT = 10.0


async def publish_topology(api: client.ApiClient, obj: Mapping[str, Any]) -> None:
    crd = client.CustomObjectsApi(api)
    name = obj["metadata"]["name"]
    try:
        await raw_json(
            crd.create_cluster_custom_object(
                GROUP, VERSION, PLURAL, dict(obj), _preload_content=False, _request_timeout=TIMEOUT
            )
        )
    except ApiException as err:
        if err.status != 409:
            raise
        patch = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        await raw_json(
            crd.patch_cluster_custom_object(
                GROUP,
                VERSION,
                PLURAL,
                name,
                patch,
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=TIMEOUT,
            )
        )


async def publish_topologies(api: client.ApiClient, objs: Iterable[Mapping[str, Any]], concurrency: int = 16) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(obj: Mapping[str, Any]) -> None:
        async with gate:
            await publish_topology(api, obj)

    async with asyncio.TaskGroup() as group:
        for obj in objs:
            group.create_task(one(obj))
