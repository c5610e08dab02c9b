"""A pod's one Scheduled event survives transient API failures (an API server restart, 503): it is retried."""

from __future__ import annotations

import asyncio

from crane_scheduler import reporting
from crane_scheduler.reporting import Reporter
from tests.support.scheduler import FakeWriter


async def test_scheduled_event_is_retried_through_503s_and_written_once() -> None:
    fake = FakeWriter(answers=[503, 503, 201])
    reporter = Reporter(fake.as_writer(), None, "test")
    stopping = asyncio.Event()
    run = asyncio.create_task(reporter.run(stopping))
    try:
        reporter.scheduled("ns", "p", "uid-1", "n1", "crane-scheduler")
        await asyncio.wait_for(reporter.drain(), 30)
    finally:
        stopping.set()
        reporter.close()
        await run
    assert fake.answers == [], fake.answers
    assert fake.writes == ["POST /apis/events.k8s.io/v1/namespaces/ns/events"] * 3
    assert {b["metadata"]["name"] for b in fake.bodies} == {reporting.scheduled_event_name("p", "uid-1")}
