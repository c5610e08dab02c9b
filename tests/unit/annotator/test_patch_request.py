"""What a node patch looks like on the wire: merge patch, metadata-only answer, token, connection reuse."""

from __future__ import annotations

import json

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from crane_annotator.limiter import PriorityLimiter
from crane_annotator.writer import NodePatcher

BIG = json.dumps({"metadata": {"name": "n"}, "status": {"images": ["x" * 100] * 2000}})
"""a Node as large as a real one with many images: its body arrives in several reads"""


async def test_patches_reuse_one_connection_and_ask_for_metadata_only() -> None:
    seen: list[dict[str, str]] = []
    peers: set[object] = set()

    async def patch(request: web.Request) -> web.Response:
        seen.append(
            {
                "node": request.match_info["name"],
                "type": request.headers["Content-Type"],
                "accept": request.headers["Accept"],
                "auth": request.headers.get("Authorization", ""),
                "body": await request.text(),
            }
        )
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        return web.Response(text=BIG, content_type="application/json")

    app = web.Application()
    app.router.add_patch("/api/v1/nodes/{name}", patch)
    async with TestServer(app) as server:
        configuration = client.Configuration(host=str(server.make_url("")).rstrip("/"))
        configuration.api_key["BearerToken"] = "secret"
        configuration.api_key_prefix["BearerToken"] = "Bearer"
        api = client.ApiClient(configuration)
        patcher = NodePatcher(api, PriorityLimiter(0, 10), concurrency=1)
        try:
            report = await patcher.patch_many({f"node/{i}": {"k": str(i)} for i in range(20)})
            configuration.api_key["BearerToken"] = "rotated"
            await patcher.patch_many({"last": {"k": "x"}})
        finally:
            await patcher.close()
            await api.close()
    assert len(report.ok) == 20
    assert len(peers) == 1  # every response read in full: the connection was kept, no new TLS handshakes
    assert seen[0] == {
        "node": "node/0",  # the name quoted in the path, decoded by the server
        "type": "application/merge-patch+json",
        "accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json",
        "auth": "Bearer secret",
        "body": '{"metadata":{"annotations":{"k":"0"}}}',
    }
    assert seen[-1]["auth"] == "Bearer rotated"


async def test_a_refused_patch_is_logged_with_the_node_the_verb_and_the_status() -> None:
    async def forbidden(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 403, "message": "nodes is forbidden"}, status=403)

    app = web.Application()
    app.router.add_patch("/api/v1/nodes/{name}", forbidden)
    async with TestServer(app) as server:
        api = client.ApiClient(client.Configuration(host=str(server.make_url("")).rstrip("/")))
        patcher = NodePatcher(api, PriorityLimiter(0, 10), concurrency=1)
        try:
            with capture_logs() as logs:
                report = await patcher.patch_many({"n1": {"k": "v"}})
        finally:
            await patcher.close()
            await api.close()
    assert report.failed
    [failed] = [e for e in logs if e["event"] == "node patch failed"]
    assert (failed["verb"], failed["object"], failed["status"]) == ("PATCH", "node n1", 403)
    assert "nodes is forbidden" in failed["error"]
