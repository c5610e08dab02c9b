"""Query parameters of the HTTP surfaces: anything malformed or unknown is a 400 naming the parameter, never a 500."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from crane_scheduler import explain
from crane_scheduler.explain import DecisionLog


@pytest.mark.parametrize(
    ("query", "status", "named"),
    [
        ("?limit=abc", 400, "limit"),
        ("?limit=-1", 400, "limit"),
        ("?limit=99999999999999999999", 400, "limit"),
        ("?limt=5", 400, "limt"),
        ("?limit=1&limit=2", 400, "limit"),
        ("?limit=5", 404, "no recent scheduling decision"),  # valid: the pod has no decision kept
        ("", 404, "no recent scheduling decision"),
    ],
)
async def test_explain_validates_every_query_parameter(query: str, status: int, named: str) -> None:
    app = web.Application()
    explain.add_routes(app, DecisionLog(), lambda profile: [])
    async with TestClient(TestServer(app)) as client:
        resp = await client.get(f"/debug/explain/ns/pod{query}")
        assert resp.status == status
        assert named in await resp.text()
