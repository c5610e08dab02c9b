"""The recorder assembled from its parts, independent of how clients are built (tests inject their own).

    Events --(shared informer)--> Follower --> Ingest (parse) --> RecordBuffer --> Writer --> BindingStore (Redis)
                                                                         Trimmer --^

One ``Follower`` per scope (all namespaces, or each configured namespace), one writer, one trimmer: each a
worker with ``run(stopping)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol

from crane_event_recorder.buffer import RecordBuffer
from crane_event_recorder.follower import Follower
from crane_event_recorder.ingest import Ingest
from crane_event_recorder.metrics import RecorderMetrics
from crane_event_recorder.settings import RecorderSettings
from crane_event_recorder.trimmer import Trimmable, Trimmer
from crane_event_recorder.writer import BindingSink, Writer
from crane_shared.informer import ListFn
from crane_shared.retry import Backoff
from crane_shared.worker import Worker

__all__ = ["Recorder", "Store"]


class Store(BindingSink, Trimmable, Protocol):
    """What the recorder needs of ``crane_shared.binding_store.BindingStore``."""


class Recorder:
    def __init__(
        self,
        store: Store,
        scopes: Mapping[str, ListFn],
        metrics: RecorderMetrics,
        settings: RecorderSettings,
        *,
        redis_server_id: Callable[[], Awaitable[str]] | None = None,
        follower_backoff: Callable[[], Backoff] = Backoff,
    ) -> None:
        """``scopes``: name -> list function of the Events to follow (see ``source.event_list_function``)."""
        self.settings = settings
        self.metrics = metrics
        self.buffer = RecordBuffer(settings.buffer_size)
        metrics.buffer_depth.set_function(lambda: self.buffer.depth)
        self.ingest = Ingest(self.buffer, metrics, settings.retention, settings.reporting_controllers)
        self.followers = [
            Follower(
                name,
                list_fn,
                self.ingest,
                metrics,
                field_selector=settings.field_selector,
                page_size=settings.list_page_size,
                watch_timeout=settings.watch_timeout,
                backoff=follower_backoff(),
            )
            for name, list_fn in scopes.items()
        ]
        self.writer = Writer(
            store,
            self.buffer,
            metrics,
            batch_size=settings.batch_size,
            stream_maxlen=settings.stream_maxlen,
            backoff=Backoff(),
            server_id=redis_server_id,
            server_check_interval=settings.redis_check_interval,
            on_records_lost=self.relist,
        )
        self.trimmer = Trimmer(store, retention=settings.retention, interval=settings.trim_interval, metrics=metrics)

    def relist(self, reason: str) -> None:
        for follower in self.followers:
            follower.request_relist(reason)

    def ready(self) -> bool:
        """True once every source's first list is in Redis (the readiness check)."""
        settled = self.buffer.settled
        return all(f.first_list_position is not None and settled >= f.first_list_position for f in self.followers)

    def parts(self) -> list[Worker]:
        return [*self.followers, self.writer, self.trimmer]

    def workers(self, stopping: asyncio.Event) -> list[Coroutine[Any, Any, None]]:
        """Every part's ``run(stopping)``, for the service runtime to supervise."""
        return [part.run(stopping) for part in self.parts()]
