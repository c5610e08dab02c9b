"""The nodes of the cluster, kept current by the shared informer: addresses for matching, our annotations for ages.

Reads raw JSON instead of kubernetes-asyncio models: deserialising thousands of ``V1Node`` objects per round
(every patch we send comes back as a watch event) would cost more than the round itself. Only what the
annotator needs is kept per node: its addresses and the decoded timestamps and values of the annotation keys
we write, so annotation age can be reported from what the API server holds, by leader and standby alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from kubernetes_asyncio import client

from crane_annotator.matching import NodeAddresses
from crane_annotator.reclaim import Resources
from crane_shared.annotations import DEFAULT_LEGACY_ZONE, AnnotationError, decode
from crane_shared.batch import BATCH_CPU, BATCH_MEMORY
from crane_shared.informer import Informer
from crane_shared.loadtaintpolicy import OPT_OUT_KEY
from crane_shared.logs import get_logger
from crane_shared.quantity import quantity
from crane_shared.reclaimpolicy import OVERRIDE_KEY
from crane_shared.retry import Backoff

log = get_logger("crane.annotator.nodes")

WATCH_SECONDS = 300
LIST_PAGE = 500


@dataclass(frozen=True)
class NodeInfo:
    addresses: NodeAddresses
    stamps: Mapping[str, float]
    """annotation key -> its timestamp (unix seconds), for the keys we write that decode"""
    values: Mapping[str, float]
    """annotation key -> its value, same keys"""
    capacity: Resources | None = None
    """status.capacity cpu (cores) and memory (bytes); None when either is missing or unreadable"""
    allocatable: Resources | None = None
    batch: tuple[int, int] | None = None
    """status.allocatable ``crane.io/batch-cpu`` (millicores), ``crane.io/batch-memory`` (bytes) when published"""
    reclaim_override: str | None = None
    """the ``crane.io/batch-reclaim`` annotation as written"""
    texts: Mapping[str, str] = field(default_factory=dict)
    """the load annotations as written (the keys ``NodeCache`` was given as ``texts``): what the load taint reads"""
    taints: tuple[Mapping[str, Any], ...] = ()
    """``spec.taints`` as the API server holds them"""
    unschedulable: bool = False
    """``spec.unschedulable`` (cordoned)"""
    uid: str = ""
    resource_version: str = ""
    taint_opt_out: bool = False
    """the ``crane.io/load-taint: "off"`` annotation"""


def node_info(
    obj: Mapping[str, Any],
    keys: Collection[str],
    legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE,
    texts: Collection[str] = (),
) -> NodeInfo:
    """Pick out of a Node object what the annotator needs; annotations that do not decode are left out."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    addresses = status.get("addresses") or []
    ips = tuple(a["address"] for a in addresses if a.get("type") == "InternalIP" and a.get("address"))
    hosts = tuple(a["address"] for a in addresses if a.get("type") == "Hostname" and a.get("address"))
    stamps: dict[str, float] = {}
    values: dict[str, float] = {}
    annotations = meta.get("annotations") or {}
    for key, text in annotations.items():
        if key in keys:
            with contextlib.suppress(AnnotationError):
                values[key], stamps[key] = _decode(text, legacy_zone)
    allocatable = status.get("allocatable") or {}
    return NodeInfo(
        NodeAddresses(meta["name"], ips, hosts),
        stamps,
        values,
        _resources(status.get("capacity")),
        _resources(allocatable),
        _published(allocatable),
        annotations.get(OVERRIDE_KEY),
        {key: annotations[key] for key in texts if key in annotations} if texts else {},
        tuple(t for t in spec.get("taints") or () if isinstance(t, dict)),
        bool(spec.get("unschedulable")),
        str(meta.get("uid") or ""),
        str(meta.get("resourceVersion") or ""),
        str(annotations.get(OPT_OUT_KEY, "")).strip().lower() == "off",
    )


def _resources(raw: Mapping[str, Any] | None) -> Resources | None:
    """cpu (cores) and memory (bytes) of a resource list; None when either is missing or unreadable."""
    try:
        return Resources(quantity((raw or {})["cpu"], milli=True) / 1000, float(quantity((raw or {})["memory"])))
    except (KeyError, TypeError, ValueError):
        return None


def _published(allocatable: Mapping[str, Any]) -> tuple[int, int] | None:
    if BATCH_CPU not in allocatable and BATCH_MEMORY not in allocatable:
        return None
    try:
        return quantity(allocatable.get(BATCH_CPU, 0)), quantity(allocatable.get(BATCH_MEMORY, 0))
    except (TypeError, ValueError):
        return None


def _decode(text: str, legacy_zone: ZoneInfo) -> tuple[float, float]:
    """(value, unix timestamp) of an annotation. Every round brings back one watch event per node with all our
    annotations, so the form we write (``0.12345,2023-10-17T15:04:32+00:00``) takes a C-speed path; anything
    else goes through the full decoder (legacy zones, other offsets, validation)."""
    value, _, stamp = text.partition(",")
    if stamp.endswith("+00:00") and len(stamp) == 25:
        try:
            number = float(value)
            at = datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            pass
        else:
            if math.isfinite(number) and number >= 0 and "_" not in value:
                return number, at
    sample = decode(text, legacy_zone)
    return sample.value, sample.timestamp.timestamp()


class NodeCache:
    """The annotator's view of the nodes, kept by the shared informer; ``synced`` is set after the first full list.

    Only ``NodeInfo`` is kept per node, not the Node objects. A failing list (503 while the API server restarts,
    429, 403 while RBAC is being fixed) keeps the previous view and is retried with backoff; it never ends the
    process, on the leader or the standby.
    """

    def __init__(
        self,
        api: client.ApiClient,
        keys: Collection[str],
        legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE,
        selector: str | None = None,
        *,
        texts: Collection[str] = (),
        on_restart: Callable[[str], None] = lambda reason: None,
        backoff: Backoff | None = None,
    ) -> None:
        self._keys = frozenset(keys)
        self._texts = frozenset(texts)
        self._legacy_zone = legacy_zone
        self.nodes: dict[str, NodeInfo] = {}
        self.informer = Informer(
            "nodes",
            client.CoreV1Api(api).list_node,
            self._on_event,
            label_selector=selector or None,
            page_size=LIST_PAGE,
            watch_timeout=WATCH_SECONDS,
            on_replace=self._on_list,
            on_restart=on_restart,
            keep_cache=False,
            backoff=backoff,
        )
        self.synced = self.informer.synced

    def _info(self, obj: Mapping[str, Any]) -> NodeInfo:
        return node_info(obj, self._keys, self._legacy_zone, self._texts)

    def _on_list(self, items: list[dict[str, Any]]) -> None:
        fresh: dict[str, NodeInfo] = {}
        for item in items:
            try:
                info = self._info(item)
            except (KeyError, TypeError) as err:  # a node without a name: skip it, keep the rest
                log.warning("node skipped", error=repr(err))
                continue
            fresh[info.addresses.name] = info
        self.nodes = fresh

    def _on_event(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if kind == "DELETED":
            self.nodes.pop(str((obj.get("metadata") or {}).get("name")), None)
        else:
            info = self._info(obj)
            self.nodes[info.addresses.name] = info

    async def run(self, stopping: asyncio.Event) -> None:
        """List, then watch until ``stopping``; never raises."""
        await self.informer.run(stopping)
