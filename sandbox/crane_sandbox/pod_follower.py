"""Kubernetes side of the simulated fleet: create the Node objects, and feed Running pods into ``FleetState``.

Thin adapters; all decisions (what a pod weighs, what a node object looks like) live in ``crane_sandbox.fleet``.
Pods are followed with the one shared informer (``crane_shared.informer``), as plain JSON dicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_sandbox.fleet import BoundPod, FleetState, SimNode, node_manifest, node_status, pod_uid
from crane_shared.informer import EventType, Informer, Obj
from crane_shared.kube import raw_json

log = logging.getLogger(__name__)


class InformerTask:
    """One informer run as a task of the sandbox's loop: ``start`` (again after ``stop``) and ``stop``."""

    informer: Informer
    task_name: str

    def __init__(self) -> None:
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._stopping.clear()
            self._task = asyncio.create_task(self.informer.run(self._stopping), name=self.task_name)
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._stopping.set()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class PodFollower(InformerTask):
    """Keeps ``state`` in step with the pods that run on its nodes (all namespaces), through an ``Informer``.

    The informer reports a re-list as ADDED/MODIFIED/DELETED differences, so pods deleted while the watch was
    down disappear from the state too. ``synced`` is set after the first full list.
    """

    task_name = "pod-follower"

    def __init__(self, api_client: client.ApiClient, state: FleetState) -> None:
        self.state = state
        # Only Running pods load a node; a pod leaving that phase is reported as DELETED by the watch.
        self.informer = Informer(
            "sandbox-pods",
            client.CoreV1Api(api_client).list_pod_for_all_namespaces,
            handler=self._on_event,
            field_selector="status.phase=Running",
        )
        super().__init__()

    @property
    def synced(self) -> asyncio.Event:
        return self.informer.synced

    def _on_event(self, kind: EventType, new: Obj, old: Obj | None) -> None:
        if kind == "DELETED":
            self.state.remove_pod(pod_uid(new))
            return
        bound = self.state.on_pod(new)
        if bound is not None:
            _warn_annotation(bound)


def _warn_annotation(bound: BoundPod) -> None:
    if bound.annotation_error:
        log.warning("pod %s: %s; using the default usage", bound.name, bound.annotation_error)


async def create_nodes(
    api_client: client.ApiClient, nodes: Sequence[SimNode], concurrency: int = 16, *, kwok: bool = False
) -> None:
    """Create (or update) the Node objects of a simulated fleet with their capacity and addresses.

    With ``kwok``, the nodes carry KWOK's annotation and KWOK turns them Ready (and the node lifecycle controller
    lifts the not-ready taint). Without it (a bare cluster with no kubelet and no controllers, as most integration
    tests use), the nodes are marked Ready here and the taint the TaintNodesByCondition admission plugin puts on
    every new node is removed, since nothing else would. Idempotent: an existing node gets its labels and status
    refreshed, so a sandbox can be restarted on the same etcd.
    """
    from crane_sandbox.kwok import MANAGED_ANNOTATION, MANAGED_VALUE

    v1 = client.CoreV1Api(api_client)
    gate = asyncio.Semaphore(concurrency)

    async def one(node: SimNode) -> None:
        manifest = node_manifest(node)
        if kwok:
            manifest["metadata"]["annotations"] = {MANAGED_ANNOTATION: MANAGED_VALUE}
        status = node_status(node, time.time(), ready=not kwok)
        async with gate:
            try:
                # Created with its status, as a kubelet registers its node: KWOK's node-initialize stage must
                # see the addresses from the first event, or it fills in its own InternalIP, and a patch it
                # computed before ours landed would replace ours (the node then matches no series).
                await raw_json(v1.create_node({**manifest, **status}, _preload_content=False, _request_timeout=30))
            except ApiException as e:
                if e.status != 409:
                    raise
                meta = {k: v for k, v in manifest["metadata"].items() if k in ("labels", "annotations")}
                await raw_json(
                    v1.patch_node(node.name, {"metadata": meta}, _preload_content=False, _request_timeout=30)
                )
            await raw_json(v1.patch_node_status(node.name, status, _preload_content=False, _request_timeout=30))
            if not kwok:
                untaint = {"spec": {"taints": None}}
                await raw_json(
                    v1.patch_node(
                        node.name,
                        untaint,
                        _preload_content=False,
                        _content_type="application/merge-patch+json",
                        _request_timeout=30,
                    )
                )

    async with asyncio.TaskGroup() as group:
        for node in nodes:
            group.create_task(one(node))
