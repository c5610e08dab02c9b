"""The CustomResourceDefinitions the product ships (``deploy/crds/``, the chart's ``crds/``), installed in the
sandbox and the test cluster: NodeResourceTopology (NUMA placement) and PodGroup (gangs)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_shared.kube import raw_json

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"
NRT_CRD = CRDS / "topology.crane.io_noderesourcetopologies.yaml"
PODGROUP_CRD = CRDS / "scheduling.x-k8s.io_podgroups.yaml"
TIMEOUT = 10.0


async def install_crd(api: client.ApiClient, path: Path, timeout: float = 30.0) -> None:
    """Create the CRD in ``path`` (kept if present) and wait until it is Established."""
    body = yaml.safe_load(await asyncio.to_thread(path.read_text))
    await install_crd_body(api, body, timeout)


async def install_crd_body(api: client.ApiClient, body: dict[str, Any], timeout: float = 30.0) -> None:
    """Create the CRD ``body`` (kept if present) and wait until it is Established."""
    ext = client.ApiextensionsV1Api(api)
    try:
        await raw_json(ext.create_custom_resource_definition(body, _preload_content=False, _request_timeout=TIMEOUT))
    except ApiException as err:
        if err.status != 409:
            raise
    name = body["metadata"]["name"]
    deadline = time.monotonic() + timeout
    while True:
        crd = await raw_json(
            ext.read_custom_resource_definition(name, _preload_content=False, _request_timeout=TIMEOUT)
        )
        conditions = crd.get("status", {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s: {json.dumps(conditions)}")
        await asyncio.sleep(0.2)


async def install_crds(api: client.ApiClient) -> None:
    """Every CRD the product ships."""
    await asyncio.gather(install_crd(api, NRT_CRD), install_crd(api, PODGROUP_CRD))
