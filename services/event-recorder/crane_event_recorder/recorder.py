"""The recorder assembled from its parts, independent of how clients are built (tests inject their own).

    sources --(list, watch)--> Follower --> Ingest (parse) --> RecordBuffer --> Writer --> BindingStore (Redis)
                                                                      trim_forever --^

One ``Follower`` per scope (all namespaces, or each configured namespace), one writer, one trimmer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

from crane_event_recorder.buffer import RecordBuffer
from crane_event_recorder.follower import Follower
from crane_event_recorder.ingest import Ingest
from crane_event_recorder.metrics import RecorderMetrics
from crane_event_recorder.retry import Backoff
from crane_event_recorder.settings import RecorderSettings
from crane_event_recorder.source import EventSource
from crane_event_recorder.trimmer import Trimmable, trim_forever
from crane_event_recorder.writer import BindingSink, Writer

__all__ = ["Recorder", "Store"]


class Store(BindingSink, Trimmable, Protocol):
    """What the recorder needs of ``crane_shared.binding_store.BindingStore``."""


class Recorder:
    def __init__(
        self,
        store: Store,
        sources: Sequence[EventSource],
        metrics: RecorderMetrics,
        settings: RecorderSettings,
        *,
        redis_server_id: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.buffer = RecordBuffer(settings.buffer_size)
        metrics.buffer_depth.set_function(lambda: self.buffer.depth)
        self.ingest = Ingest(self.buffer, metrics, settings.retention, settings.reporting_controllers)
        self.followers = [Follower(source, self.ingest, metrics, Backoff()) for source in sources]
        self._store = store
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

    def relist(self, reason: str) -> None:
        for follower in self.followers:
            follower.request_relist(reason)

    def ready(self) -> bool:
        """True once every source's first list is in Redis (the readiness check)."""
        settled = self.buffer.settled
        return all(f.first_list_position is not None and settled >= f.first_list_position for f in self.followers)

    def workers(self, stopping: asyncio.Event) -> list[Coroutine[Any, Any, None]]:
        return [
            *(follower.run(stopping) for follower in self.followers),
            self.writer.run(stopping),
            trim_forever(
                self._store,
                retention=self.settings.retention,
                interval=self.settings.trim_interval,
                metrics=self.metrics,
                stopping=stopping,
            ),
        ]
