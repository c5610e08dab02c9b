"""One scope of Events flowing into ``Ingest`` through the shared informer.

Every list re-records everything it returns; that is safe because writes are idempotent (a pod UID is recorded
once per node set), and it is what makes the recorder lose nothing: whatever a 410 or a Redis restart may have
missed is still in the API server (events live for an hour, far beyond any hot-value window). A broken watch
resumes from the last resourceVersion seen, which loses nothing either. No Event objects are cached: the
recorder only reacts to them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from crane_event_recorder.ingest import Ingest
from crane_event_recorder.metrics import RecorderMetrics
from crane_shared.informer import Informer, ListFn, Objs
from crane_shared.logs import get_logger
from crane_shared.retry import Backoff

__all__ = ["Follower"]

log = get_logger("crane.event_recorder.follower")


class Follower:
    """Keeps one scope's Events flowing into ``Ingest``; ``run(stopping)`` returns only when ``stopping`` is set."""

    def __init__(
        self,
        name: str,
        list_fn: ListFn,
        ingest: Ingest,
        metrics: RecorderMetrics,
        *,
        field_selector: str | None = "reason=Scheduled",
        page_size: int = 500,
        watch_timeout: float = 300.0,
        backoff: Backoff | None = None,
        liveness: float | None = None,
    ) -> None:
        self.name = name
        self._ingest = ingest
        self._metrics = metrics
        self._relist_reason = ""
        # Buffer position after the first complete list: ready once the buffer has settled up to here.
        self.first_list_position: int | None = None
        self._listed = 0  # events of the list under way, handed over page by page
        self.informer = Informer(
            name,
            list_fn,
            self._on_event,
            field_selector=field_selector or None,
            page_size=page_size,
            watch_timeout=max(1, int(watch_timeout)),
            on_replace=self._on_list,
            on_page=self._on_page,
            on_restart=self._on_restart,
            keep_cache=False,
            drop_managed_fields=True,
            backoff=backoff or Backoff(initial=0.05, maximum=5.0),
            max_backoff=(backoff.maximum if backoff else 5.0),
            liveness=liveness,
        )

    def request_relist(self, reason: str) -> None:
        """Re-list now (e.g. Redis came back empty): the watch is dropped and everything listed again."""
        self._relist_reason = reason
        self.informer.request_relist(reason)

    async def run(self, stopping: asyncio.Event) -> None:
        await self.informer.run(stopping)

    def _on_page(self, items: Objs) -> None:
        """A list's page, accepted as it arrives: a list returns every Scheduled event of the last hour (the API
        server's event TTL), far more than the retention keeps, and is never held whole."""
        accept = self._ingest.accept
        for item in items:
            accept(item)
        self._listed += len(items)

    def _on_list(self, items: Objs) -> None:
        """The list completed (its pages came through ``_on_page``: ``items`` is empty)."""
        self._metrics.lists.inc()
        if self.first_list_position is None:
            self.first_list_position = self._ingest.buffer.pushed
        listed, self._listed = self._listed, 0
        log.info("listed", source=self.name, events=listed, resource_version=self.informer.resource_version)

    def _on_event(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if kind != "DELETED":  # an expired event: the binding it reported stays
            self._ingest.accept(obj)

    def _on_restart(self, reason: str) -> None:
        self._listed = 0  # a list that failed half way is listed again whole
        self._metrics.watch_restarts.labels(self._relist_reason if reason == "requested" else reason).inc()
