"""The pods bound to nodes, kept current by the shared informer: which node each runs on, whether it is batch, and
its requests; what the reclaimable-capacity round needs besides Prometheus.

Only bound pods that have not finished are listed (field selector), and only a small record is kept per pod (not
the object), so tens of thousands of pods cost little. Run only while the policy has a ``reclaim`` section.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from kubernetes_asyncio import client

from crane_annotator.reclaim import NodePod, Resources
from crane_shared.batch import is_batch
from crane_shared.informer import Informer
from crane_shared.logs import LogOnce, get_logger
from crane_shared.podresources import CPU, MEMORY, pod_requests_of
from crane_shared.retry import Backoff

log = get_logger("crane.annotator.pods")

WATCH_SECONDS = 300
LIST_PAGE = 500
BOUND_AND_NOT_DONE = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


def node_pod(obj: Mapping[str, Any]) -> tuple[str, NodePod] | None:
    """(node, record) of a bound pod; None when it is not bound or has finished."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    requests = pod_requests_of(obj, use_status=True)  # what it holds on the node, resizing in place or not
    key = f"{meta['namespace']}/{meta['name']}"
    resources = Resources(requests.get(CPU, 0) / 1000, float(requests.get(MEMORY, 0)))
    return node, NodePod(key, is_batch(spec), resources, started_at((obj.get("status") or {}).get("startTime")))


def started_at(value: object) -> float | None:
    """``status.startTime`` as epoch seconds; None when absent or not a timestamp (the usage then counts in full)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class PodCache:
    """``by_node``: node -> {pod key: record}. A pod that cannot be read (a malformed quantity) is skipped, counted
    and logged once; the rest of the list is kept."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        on_restart: Callable[[str], None] = lambda reason: None,
        on_skipped: Callable[[], None] = lambda: None,
        backoff: Backoff | None = None,
    ) -> None:
        self.by_node: dict[str, dict[str, NodePod]] = {}
        self._where: dict[str, str] = {}
        self._on_skipped = on_skipped
        self._log_once = LogOnce(log)
        self.informer = Informer(
            "pods",
            client.CoreV1Api(api).list_pod_for_all_namespaces,
            self._on_event,
            field_selector=BOUND_AND_NOT_DONE,
            page_size=LIST_PAGE,
            watch_timeout=WATCH_SECONDS,
            on_replace=self._on_list,
            on_restart=on_restart,
            keep_cache=False,
            backoff=backoff,
        )
        self.synced = self.informer.synced

    def _read(self, obj: Mapping[str, Any]) -> tuple[str, NodePod] | None:
        try:
            return node_pod(obj)
        except (KeyError, TypeError, ValueError) as err:
            meta = obj.get("metadata") or {}
            self._on_skipped()
            self._log_once.warning(
                f"pod-skipped-{type(err).__name__}",
                "pod skipped: unreadable",
                pod=f"{meta.get('namespace')}/{meta.get('name')}",
                error=str(err),
            )
            return None

    def _on_list(self, items: list[dict[str, Any]]) -> None:
        by_node: dict[str, dict[str, NodePod]] = {}
        where: dict[str, str] = {}
        for item in items:
            read = self._read(item)
            if read is not None:
                node, pod = read
                by_node.setdefault(node, {})[pod.key] = pod
                where[pod.key] = node
        self.by_node, self._where = by_node, where

    def _on_event(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        self._forget(key)
        if kind == "DELETED":
            return
        read = self._read(obj)
        if read is not None:
            node, pod = read
            self.by_node.setdefault(node, {})[pod.key] = pod
            self._where[pod.key] = node

    def _forget(self, key: str) -> None:
        node = self._where.pop(key, None)
        if node is None:
            return
        pods = self.by_node.get(node)
        if pods is not None:
            pods.pop(key, None)
            if not pods:
                del self.by_node[node]

    async def run(self, stopping: asyncio.Event) -> None:
        """List, then watch until ``stopping``; never raises."""
        await self.informer.run(stopping)
