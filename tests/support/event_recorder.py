"""Stand-ins for the event-recorder's unit tests: metrics with readable counts, a Redis binding store in memory,
Scheduled events and binding records."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from crane_event_recorder.metrics import RecorderMetrics
from crane_shared.bindings import BindingRecord
from crane_shared.events import micro_time


class Metrics(RecorderMetrics):
    """RecorderMetrics with a reader for tests."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        super().__init__(self.registry)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(f"crane_event_recorder_{name}", labels) or 0.0


class FakeStore:
    """Idempotent by UID like the real store; ``fail`` makes writes raise (Redis down)."""

    def __init__(self) -> None:
        self.records: dict[str, BindingRecord] = {}
        self.order: list[str] = []
        self.fail: Exception | None = None
        self.attempts = 0
        self.server = "run-1"
        self.id_checks = 0

    async def record(self, records: Sequence[BindingRecord], stream_maxlen: int) -> list[bool]:
        self.attempts += 1
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        added = []
        for r in records:
            new = r.uid not in self.records
            if new:
                self.records[r.uid] = r
                self.order.append(r.uid)
            added.append(new)
        return added

    async def trim(self, before: float) -> int:
        old = [uid for uid, r in self.records.items() if r.bound_at < before]
        for uid in old:
            del self.records[uid]
        return len(old)

    async def server_id(self) -> str:
        self.id_checks += 1
        if self.fail is not None:
            raise self.fail
        return self.server


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``condition`` until true; fail with a clear message at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.001)


def rec(i: int, node: str = "n1") -> BindingRecord:
    return BindingRecord(
        uid=f"u{i}", namespace="ns", name=f"p{i}", node=node, bound_at=1000.0 + i, scheduler="crane-scheduler"
    )


RECENT_AGE = 120.0
"""Age of a fresh test event: inside every retention the tests use (the default is 360 s)."""


def scheduled(i: int, node: str = "n1", ns: str = "ns", rv: int | None = None) -> dict[str, Any]:
    """An events.k8s.io/v1 Scheduled event for pod p<i> (uid u<i>) as the API server returns it.

    Its time is taken now, not at import: a timestamp frozen at collection ages with every test that runs before
    this one, and after a few minutes of integration tests the "recent" events were outside the retention.
    """
    return {
        "metadata": {"name": f"p{i}.ev", "namespace": ns, "resourceVersion": str(rv or i)},
        "eventTime": micro_time(time.time() - RECENT_AGE + i),
        "reportingController": "crane-scheduler",
        "reason": "Scheduled",
        "type": "Normal",
        "note": f"Successfully assigned {ns}/p{i} to {node}",
        "regarding": {"kind": "Pod", "namespace": ns, "name": f"p{i}", "uid": f"u{i}"},
    }


EVENTS_PATH = "/apis/events.k8s.io/v1/events"
