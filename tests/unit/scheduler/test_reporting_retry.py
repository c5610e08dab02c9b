"""A pod's one Scheduled event survives transient API failures (an API server restart, 503): it is retried."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from structlog.testing import capture_logs

from crane_scheduler.podinfo import parse_pod
from crane_scheduler.reporting import Reporter
from crane_scheduler.writer import Reply
from crane_scheduler.writer.protocol import NOT_BOUND, REFUSED, UNSENT
from crane_shared.events import scheduled_event_name
from tests.support.scheduler import FakeWriter
from tests.support.scheduler import pod as pod_of


@contextlib.asynccontextmanager
async def running(fake: FakeWriter) -> AsyncIterator[Reporter]:
    """A reporter writing to ``fake`` while the block runs; its queue is drained before the block ends."""
    reporter = Reporter(fake.as_writer(), None, "test")
    stopping = asyncio.Event()
    run = asyncio.create_task(reporter.run(stopping))
    try:
        yield reporter
        await asyncio.wait_for(reporter.drain(), 30)
    finally:
        stopping.set()
        reporter.close()
        await run


async def test_scheduled_event_is_retried_through_503s_and_written_once() -> None:
    fake = FakeWriter(answers=[503, 503, 201])
    async with running(fake) as reporter:
        reporter.scheduled("ns", "p", "uid-1", "n1", "crane-scheduler")
    assert fake.answers == [], fake.answers
    assert fake.writes == ["POST /apis/events.k8s.io/v1/namespaces/ns/events"] * 3
    assert {b["metadata"]["name"] for b in fake.bodies} == {scheduled_event_name("p", "uid-1")}


async def test_scheduled_event_is_retried_through_a_restarted_api_servers_403s() -> None:
    """A kube-apiserver just restarted answers 403 until its RBAC caches have synced: the one Scheduled event of a
    bind that happened is retried through it, not dropped (nothing would write it again while the term holds)."""
    fake = FakeWriter(answers=[403, 401, 201])
    async with running(fake) as reporter:
        reporter.scheduled("ns", "p", "uid-1", "n1", "crane-scheduler")
    assert fake.answers == [] and len(fake.writes) == 3


async def test_a_failed_report_is_logged_naming_the_pod_the_write_and_the_status() -> None:
    """The namespace is being deleted: the API server refuses the event (403). The warning says which pod, which
    write and what status, not ``error=ApiException()``."""
    fake = FakeWriter(answers=[403, 403])
    pod = parse_pod(pod_of("web"))
    with capture_logs() as logs:
        async with running(fake) as reporter:
            assert reporter.failed(pod, "0/1 nodes are available", "Unschedulable", "crane-scheduler")
    failed = [e for e in logs if e["event"] == "report failed"]
    assert [(e["report"], e["pod"], e["verb"], e["status"]) for e in failed] == [
        ("failed", "ns/web", "POST", 403),
        ("condition", "ns/web", "PATCH", 403),
    ]
    assert failed[0]["object"].startswith("/apis/events.k8s.io/v1/namespaces/ns/events/web.")
    assert failed[1]["object"] == "/api/v1/namespaces/ns/pods/web/status"


def test_an_event_that_rode_with_a_bind_falls_back_to_the_ensure_path_when_its_write_failed() -> None:
    """``Reporter.with_bind``: the writer process wrote the event (201: counted), found it written (409), or the
    bind failed (``NOT_BOUND``: nothing to report); any other answer (a 503, ``UNSENT`` from a dead process) makes
    sure the bound pod has its event the reporter's own way (``already_bound``: read the pod, write with retries)."""
    reporter = Reporter(FakeWriter().as_writer(), None, "test")
    pod = parse_pod(pod_of("p"))
    for reply in (Reply(201), Reply(409), Reply(REFUSED, NOT_BOUND), Reply(404)):
        report = reporter.with_bind("crane-scheduler", pod)
        assert report is not None and report.scheduler == "crane-scheduler" and report.instance == "test"
        report.done(reply)
    assert reporter.backlog == 0
    reports = reporter.metrics.reports
    assert reports.labels("scheduled", "ok")._value.get() == 1
    assert reports.labels("scheduled", "exists")._value.get() == 1
    for reply in (Reply(503), Reply(UNSENT, "the API writer process exited")):
        report = reporter.with_bind("crane-scheduler", pod)
        assert report is not None
        report.done(reply)
    assert reporter.backlog == 2  # two "ensure" jobs: the pod is read, and its event written if it is bound
    assert reports.labels("scheduled", "error")._value.get() == 2
    assert Reporter(None, None, "test").with_bind("crane-scheduler", pod) is None  # no writer: the reporter writes
