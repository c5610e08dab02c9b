"""The nodes of the cluster, kept current by list + watch: addresses for matching, our annotations for ages.

Reads raw JSON instead of kubernetes-asyncio models: deserialising thousands of ``V1Node`` objects per round
(every patch we send comes back as a watch event) would cost more than the round itself. Only what the
annotator needs is kept per node: its addresses and the decoded timestamps and values of the annotation keys
we write, so annotation age can be reported from what the API server holds, by leader and standby alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_annotator.matching import NodeAddresses
from crane_shared.annotations import DEFAULT_LEGACY_ZONE, AnnotationError, decode
from crane_shared.logs import get_logger

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


def node_info(obj: Mapping[str, Any], keys: Collection[str], legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE) -> NodeInfo:
    """Pick out of a Node object what the annotator needs; annotations that do not decode are left out."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    addresses = status.get("addresses") or []
    ips = tuple(a["address"] for a in addresses if a.get("type") == "InternalIP" and a.get("address"))
    hosts = tuple(a["address"] for a in addresses if a.get("type") == "Hostname" and a.get("address"))
    stamps: dict[str, float] = {}
    values: dict[str, float] = {}
    for key, text in (meta.get("annotations") or {}).items():
        if key in keys:
            with contextlib.suppress(AnnotationError):
                values[key], stamps[key] = _decode(text, legacy_zone)
    return NodeInfo(NodeAddresses(meta["name"], ips, hosts), stamps, values)


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
    """List + watch of nodes; ``synced`` is set after the first full list."""

    def __init__(
        self,
        api: client.ApiClient,
        keys: Collection[str],
        legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE,
        selector: str | None = None,
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._selector = {"label_selector": selector} if selector else {}
        self._keys = frozenset(keys)
        self._legacy_zone = legacy_zone
        self.nodes: dict[str, NodeInfo] = {}
        self.synced = asyncio.Event()

    def _upsert(self, obj: Mapping[str, Any]) -> None:
        info = node_info(obj, self._keys, self._legacy_zone)
        self.nodes[info.addresses.name] = info

    def _delete(self, name: str) -> None:
        self.nodes.pop(name, None)

    async def run(self) -> None:
        """List, then watch from the list's resourceVersion; re-list when the watch expires (410). Runs until
        cancelled; API errors are retried with backoff."""
        backoff = 1.0
        while True:
            try:
                version = await self._list()
                self.synced.set()
                backoff = 1.0
                while True:
                    version = await self._watch(version)
            except _Expired:
                continue
            except (ApiException, aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
                if isinstance(err, ApiException) and err.status == 410:
                    continue  # the watch's resourceVersion is too old: list again
                log.warning("node list/watch failed; retrying", error=str(err)[:300], retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _list(self) -> str:
        fresh: dict[str, Mapping[str, Any]] = {}
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": LIST_PAGE, "_preload_content": False, **self._selector}
            if cont:
                kwargs["_continue"] = cont
            resp = await self._core.list_node(**kwargs)
            page = json.loads(await resp.read())
            for item in page.get("items") or []:
                fresh[item["metadata"]["name"]] = item
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                version: str = page["metadata"]["resourceVersion"]
                break
        for name in set(self.nodes) - set(fresh):
            self._delete(name)
        for item in fresh.values():
            self._upsert(item)
        return version

    async def _watch(self, version: str) -> str:
        resp = await self._core.list_node(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            _request_timeout=WATCH_SECONDS + 30,
            **self._selector,
        )
        try:
            while line := await resp.content.readline():
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired
                    raise ValueError(f"watch error: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind in ("ADDED", "MODIFIED"):
                    self._upsert(obj)
                elif kind == "DELETED":
                    self._delete(obj["metadata"]["name"])
        finally:
            resp.release()
        return version


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""
