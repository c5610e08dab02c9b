"""``cranectl withdraw-batch``: take back every node's batch loan, for when no annotator is left to do it.

The annotator withdraws its loan itself when ``spec.reclaim`` is removed or its inputs go stale; once it is
uninstalled, nobody would, and batch pods would keep landing on capacity nobody measures. This command (the Helm
chart's pre-delete hook runs it; run it by hand after removing the annotator any other way) does what the annotator
does, node by node, with the same patches (``crane_shared.batch``): ``crane.io/batch-cpu``/``crane.io/batch-memory``
set to 0 in node status, then removed from it, then the batch annotations removed. Batch pods already running are
left alone. Needs nodes list and patch, and nodes/status patch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from crane_shared.batch import WITHDRAW_REMOVE, WITHDRAW_TO_ZERO, batch_annotations, lent, removed_annotations
from crane_shared.kube import raw_json

MERGE_PATCH = "application/merge-patch+json"
TIMEOUT = 30


def describe(name: str, resources: Mapping[str, str], keys: list[str]) -> str:
    parts = []
    if resources:
        parts.append(" ".join(f"{r}={v}" for r, v in sorted(resources.items())) + " set to 0, then removed")
    if keys:
        parts.append("annotations removed: " + ", ".join(keys))
    return f"{name}: " + "; ".join(parts)


async def withdraw(api: client.ApiClient, *, dry_run: bool = False) -> tuple[list[str], list[str]]:
    """(lines for the user, the nodes whose withdrawal failed)."""
    v1 = client.CoreV1Api(api)
    nodes = await raw_json(v1.list_node(_preload_content=False, _request_timeout=TIMEOUT))
    lines: list[str] = []
    failed: list[str] = []
    for node in nodes.get("items") or ():
        name = node["metadata"]["name"]
        resources = lent(node.get("status"))
        keys = batch_annotations(node["metadata"].get("annotations"))
        if not resources and not keys:
            continue
        steps: list[Any] = []
        if resources:
            steps += [(v1.patch_node_status, WITHDRAW_TO_ZERO), (v1.patch_node_status, WITHDRAW_REMOVE)]
        if keys:
            steps.append((v1.patch_node, removed_annotations(keys)))
        try:
            for call, body in [] if dry_run else steps:
                await raw_json(
                    call(name, body, _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=TIMEOUT)
                )
        except (client.ApiException, TimeoutError, OSError) as err:
            failed.append(name)
            lines.append(f"{name}: not withdrawn: {getattr(err, 'status', '') or ''} {err}".strip())
            continue
        lines.append(describe(name, resources, keys) + (" (dry run)" if dry_run else ""))
    if not lines:
        lines.append("no node carries a batch loan (crane.io/batch-* resources or annotations)")
    return lines, failed


def run(kubeconfig: str | None, dry_run: bool) -> int:
    from crane_shared.kube import KubeSettings, make_api_client

    async def go() -> tuple[list[str], list[str]]:
        api = await make_api_client(KubeSettings(kubeconfig=kubeconfig))
        try:
            return await withdraw(api, dry_run=dry_run)
        finally:
            await api.close()

    lines, failed = asyncio.run(go())
    print("\n".join(lines))
    return 1 if failed else 0
