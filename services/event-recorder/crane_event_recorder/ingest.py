"""Events in, buffered binding records out: the synchronous step between the watch and the buffer.

Synchronous on purpose: a watch line becomes a queued record without an ``await``, so the watch never waits for
Redis and the order of records is the order of events.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from crane_event_recorder.buffer import RecordBuffer
from crane_event_recorder.metrics import RecorderMetrics
from crane_event_recorder.parse import Malformed, parse_event
from crane_shared.logs import LogOnce, get_logger

__all__ = ["DEFAULT_REPORTING_CONTROLLERS", "Ingest"]

# Whose Scheduled events are believed: anyone allowed to create Events could otherwise forge bindings and steer
# placement through the hot value. kube-scheduler reports as its profile's schedulerName.
DEFAULT_REPORTING_CONTROLLERS = ("default-scheduler", "crane-scheduler")

log = get_logger("crane.event_recorder.ingest")


class Ingest:
    def __init__(
        self,
        buffer: RecordBuffer,
        metrics: RecorderMetrics,
        retention: float = float("inf"),
        reporting_controllers: tuple[str, ...] = DEFAULT_REPORTING_CONTROLLERS,
    ) -> None:
        self.buffer = buffer
        self._metrics = metrics
        self._retention = retention
        self._reporters = frozenset(reporting_controllers)
        self._log_once = LogOnce(log)

    def accept(self, obj: Mapping[str, Any]) -> None:
        """Parse one Event object and queue its binding; malformed ones are counted and logged once per kind."""
        self._metrics.events_seen.inc()
        now = time.time()
        result = parse_event(obj, now=now)
        if result is None:
            return
        if isinstance(result, Malformed):
            self._metrics.malformed.labels(result.reason).inc()
            metadata = obj.get("metadata") or {}
            self._log_once.warning(
                result.reason,
                "skipping malformed Scheduled event",
                detail=result.detail,
                namespace=metadata.get("namespace"),
                name=metadata.get("name"),
            )
            return
        if result.scheduler not in self._reporters:
            self._metrics.untrusted.inc()
            self._log_once.warning(
                "untrusted",
                "skipping Scheduled event from a reporting controller not configured",
                reporting_controller=result.scheduler,
                namespace=result.namespace,
                name=result.name,
            )
            return
        if result.bound_at < now - self._retention:
            # Outside every window and trimmed at once anyway; events live for an hour, so every re-list
            # would otherwise write (and notify) them again.
            self._metrics.expired.inc()
            return
        dropped = self.buffer.push(result)
        if dropped:
            self._metrics.buffer_dropped.inc(dropped)
