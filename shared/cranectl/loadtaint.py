"""``cranectl load-taint clear``: lift every ``crane.io/load-hot`` taint, for an uninstall (the chart's pre-delete
hook runs it) or by hand after switching the feature off with the annotator gone.

With the annotator still running, its leader would taint a hot node again, so the command can first stop it:
``--stop-annotator NS/DEPLOYMENT`` scales the Deployment to zero, and ``--lease NS/NAME`` waits until the annotator's
Lease is free (released on shutdown, or expired): the writers' own fence, after which no annotator writes. Each node
is then patched with its taints less ours, its resourceVersion as a precondition (a 409 re-reads the node and
tries again), so a taint someone else adds meanwhile is never lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_shared.kube import raw_json
from crane_shared.loadtaintpolicy import is_ours, without_taint

REQUEST_TIMEOUT = 30
ATTEMPTS = 5


def lease_free(lease: Mapping[str, Any], now: datetime) -> bool:
    """No holder, or the holder's last renewal older than its lease duration."""
    spec = lease.get("spec") or {}
    if not spec.get("holderIdentity"):
        return True
    renewed = spec.get("renewTime") or spec.get("acquireTime")
    if not renewed:
        return True
    at = datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
    return (now - at).total_seconds() > float(spec.get("leaseDurationSeconds") or 0)


def split(ref: str, what: str) -> tuple[str, str]:
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name:
        raise ValueError(f"{what}: expected NAMESPACE/NAME, got {ref!r}")
    return namespace, name


async def stop_annotator(api: client.ApiClient, namespace: str, name: str) -> None:
    """Scale the annotator's Deployment to zero (its scale subresource: no other field touched)."""
    body = {"spec": {"replicas": 0}}
    await raw_json(
        client.AppsV1Api(api).patch_namespaced_deployment_scale(
            name,
            namespace,
            body,
            _content_type="application/merge-patch+json",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
    )


async def wait_for_free_lease(
    api: client.ApiClient,
    namespace: str,
    name: str,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Poll the Lease until it is free (``lease_free``) or ``timeout`` passes; a Lease that does not exist is
    free (no annotator ever led)."""
    deadline = clock() + timeout
    api_ = client.CoordinationV1Api(api)
    while True:
        try:
            lease = await raw_json(
                api_.read_namespaced_lease(name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
            )
        except ApiException as err:
            if err.status == 404:
                return True
            raise
        if lease_free(lease, datetime.now(UTC)):
            return True
        if clock() >= deadline:
            return False
        await asyncio.sleep(1.0)


async def clear_taints(api: client.ApiClient, selector: str | None = None) -> list[str]:
    """Lift ours from every node that carries it; returns the nodes changed."""
    v1 = client.CoreV1Api(api)
    listed = await raw_json(
        v1.list_node(label_selector=selector or "", _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
    )
    cleared = []
    for node in listed.get("items") or []:
        name = node["metadata"]["name"]
        for _ in range(ATTEMPTS):
            taints = (node.get("spec") or {}).get("taints") or []
            if not any(is_ours(t) for t in taints):
                break
            body = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": without_taint(taints)},
            }
            try:
                await raw_json(
                    v1.patch_node(
                        name,
                        body,
                        _content_type="application/merge-patch+json",
                        _preload_content=False,
                        _request_timeout=REQUEST_TIMEOUT,
                    )
                )
                cleared.append(name)
                break
            except ApiException as err:
                if err.status == 404:
                    break
                if err.status != 409:
                    raise
                node = await raw_json(v1.read_node(name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))
        else:
            raise RuntimeError(f"node {name}: the taint could not be lifted after {ATTEMPTS} conflicting updates")
    return cleared
