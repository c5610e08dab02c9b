"""A pod's one Scheduled event survives transient API failures (an API server restart, 503): it is retried."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from crane_scheduler import reporting
from crane_scheduler.reporting import Reporter
from tests.support.scheduler import api_writer


async def test_scheduled_event_is_retried_through_503s_and_written_once() -> None:
    answers = [503, 503, 201]
    created: list[str] = []

    async def create(request: web.Request) -> web.Response:
        status = answers.pop(0)
        if status == 201:
            created.append((await request.json())["metadata"]["name"])
        return web.json_response({"kind": "Status", "code": status}, status=status)

    app = web.Application()
    app.router.add_post("/apis/events.k8s.io/v1/namespaces/{ns}/events", create)
    async with TestServer(app) as server, api_writer(str(server.make_url(""))) as writer:
        reporter = Reporter(writer, None, "test")
        stopping = asyncio.Event()
        run = asyncio.create_task(reporter.run(stopping))
        try:
            reporter.scheduled("ns", "p", "uid-1", "n1", "crane-scheduler")
            await asyncio.wait_for(reporter.drain(), 30)
        finally:
            stopping.set()
            reporter.close()
            await run
    assert answers == [], answers
    assert created == [reporting.scheduled_event_name("p", "uid-1")]
