"""The shared HTTP setup: a bound on requests handled at once."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from crane_shared.service import concurrency_limit


async def test_at_most_limit_requests_are_handled_at_once_the_rest_wait() -> None:
    release, two_running, running, peak = asyncio.Event(), asyncio.Event(), [0], [0]

    async def slow(request: web.Request) -> web.Response:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        if running[0] == 2:
            two_running.set()
        await release.wait()
        running[0] -= 1
        return web.Response(text="ok")

    app = web.Application(middlewares=[concurrency_limit(2)])
    app.router.add_post("/x", slow)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:

        async def call() -> int:
            async with session.post(server.make_url("/x"), data=b"{}") as r:
                return r.status

        calls = [asyncio.create_task(call()) for _ in range(6)]
        await two_running.wait()
        await asyncio.sleep(0.2)  # give the other four every chance to start (they must not)
        assert running[0] == 2
        release.set()
        assert await asyncio.gather(*calls) == [200] * 6
    assert peak[0] == 2
