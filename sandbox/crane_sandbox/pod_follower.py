"""Kubernetes side of the simulated fleet: create the Node objects, and feed bound pods into ``FleetState``.

Thin adapters over kubernetes_asyncio; all decisions (what a pod weighs, what a node object looks like) live in
``crane_sandbox.fleet``. Pods are read as plain JSON dicts rather than client models: deserialising tens of
thousands of pods into models costs seconds of CPU and buys nothing here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from crane_sandbox.fleet import BoundPod, FleetState, SimNode, node_manifest, node_status, pod_uid
from crane_shared.kube import raw_json

log = logging.getLogger(__name__)


class PodFollower:
    """List all pods, then watch from the list's resourceVersion; keeps ``state`` in step with bound pods.

    A 410 (resourceVersion too old, expired continue token) re-lists at once; any other failure backs off
    exponentially and retries. ``run`` never returns and never raises, except when cancelled. ``synced`` is set
    after every successful list, so callers can wait for the first one.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        state: FleetState,
        *,
        watch_timeout: int = 300,
        page_size: int = 500,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.v1 = client.CoreV1Api(api_client)
        self.state = state
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="pod-follower")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        backoff = self.backoff_initial
        while True:
            try:
                rv = await self._list()
                self.synced.set()
                backoff = self.backoff_initial
                while True:
                    rv = await self._watch(rv)
            except ApiException as e:
                if e.status == 410:
                    log.info("pod watch expired (%s); re-listing", e.reason)
                    continue
                log.warning("pod follower: API error %s %s; retrying in %.1fs", e.status, e.reason, backoff)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("pod follower: %r; retrying in %.1fs", e, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.backoff_max)

    async def _list(self) -> str:
        """All pods, page by page (one snapshot), replacing the state's pods; returns the resourceVersion."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await raw_json(
                self.v1.list_pod_for_all_namespaces(
                    limit=self.page_size, _continue=token, _preload_content=False, _request_timeout=60
                )
            )
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        for bound in self.state.resync(items):
            _warn_annotation(bound)
        return str(meta["resourceVersion"])

    async def _watch(self, rv: str) -> str:
        """One watch request until the server ends it; returns the resourceVersion to continue from."""
        # return_type "object" keeps events as dicts (no model deserialisation).
        async with watch.Watch(return_type="object") as w:
            stream = w.stream(
                self.v1.list_pod_for_all_namespaces,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout,
                _request_timeout=self.watch_timeout + 30,
            )
            async for event in stream:
                kind, obj = event["type"], event["raw_object"]
                if kind in ("ADDED", "MODIFIED"):
                    bound = self.state.on_pod(obj)
                    if bound is not None:
                        _warn_annotation(bound)
                elif kind == "DELETED":
                    self.state.remove_pod(pod_uid(obj))
            return str(w.resource_version or rv)


def _warn_annotation(bound: BoundPod) -> None:
    if bound.annotation_error:
        log.warning("pod %s: %s; using the default usage", bound.name, bound.annotation_error)


async def create_nodes(api_client: client.ApiClient, nodes: Sequence[SimNode], concurrency: int = 16) -> None:
    """Create (or update) the Node objects of a simulated fleet and mark them Ready with their capacity.

    Idempotent: an existing node gets its labels and status refreshed, so a sandbox can be restarted on the same
    etcd. Status is a subresource, hence the separate PATCH.
    """
    v1 = client.CoreV1Api(api_client)
    gate = asyncio.Semaphore(concurrency)

    async def one(node: SimNode) -> None:
        manifest = node_manifest(node)
        async with gate:
            try:
                await raw_json(v1.create_node(manifest, _preload_content=False))
            except ApiException as e:
                if e.status != 409:
                    raise
                labels = {"metadata": {"labels": manifest["metadata"]["labels"]}}
                await raw_json(v1.patch_node(node.name, labels, _preload_content=False))
            await raw_json(v1.patch_node_status(node.name, node_status(node, time.time()), _preload_content=False))
            # The TaintNodesByCondition admission plugin taints every new node not-ready; without a node
            # lifecycle controller nothing would ever remove it, and every scheduler would refuse the node.
            untaint = {"spec": {"taints": None}}
            await raw_json(
                v1.patch_node(node.name, untaint, _preload_content=False, _content_type="application/merge-patch+json")
            )

    async with asyncio.TaskGroup() as group:
        for node in nodes:
            group.create_task(one(node))
