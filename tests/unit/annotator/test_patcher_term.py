"""The annotator's patcher sends no PATCH once the leader's term has ended (checked right before each request)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from crane_annotator.limiter import PriorityLimiter
from crane_annotator.writer import NodePatcher
from crane_shared.leader import Term


async def test_no_patch_leaves_after_the_term_is_lost() -> None:
    patched: list[str] = []

    async def patch(request: web.Request) -> web.Response:
        patched.append(request.match_info["name"])
        return web.json_response({})

    app = web.Application()
    app.router.add_patch("/api/v1/nodes/{name}", patch)
    async with TestServer(app) as server:
        configuration = client.Configuration(host=str(server.make_url("")).rstrip("/"))
        api = client.ApiClient(configuration)
        patcher = NodePatcher(api, PriorityLimiter(0, 10))
        term = Term()
        patcher.may_write = lambda: term.held
        try:
            assert (await patcher.patch_many({"n1": {"a": "1"}})).ok == ["n1"]
            term.lost.set()
            report = await patcher.patch_many({"n1": {"a": "2"}, "n2": {"a": "2"}})
        finally:
            await patcher.close()
            await api.close()
    assert patched == ["n1"]  # nothing reached the API server after the loss
    assert report.ok == [] and sorted(report.failed) == ["n1", "n2"]
