"""The annotator process keeps running while the node list answers 503, and becomes ready after.

The process is the real ``crane-annotator``. The API server is ``tests.support.fakeapi`` answering the node list with
503s first (as an API server does while it restarts), or the real API server behind a proxy that does the same.
Before the one informer, an error body was read as a node list, raised KeyError and ended the process, leader
and standby alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
from pathlib import Path

import aiohttp
from aiohttp import web

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import free_port, service_argv
from tests.support.fakeapi import FakeApiServer, Status, fake_api, item
from tests.support.waiting import eventually


async def start_annotator(kubeconfig: Path, port: int, *flags: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *service_argv("crane_annotator", kubeconfig, port, *flags),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def stop(process: asyncio.subprocess.Process) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(process.wait(), 30)


async def readyz(port: int) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as resp:
        return resp.status


async def ready(port: int) -> bool:
    try:
        return await readyz(port) == 200
    except aiohttp.ClientConnectionError:
        return False


async def ready_after_three_failed_lists(port: int) -> None:
    await eventually(lambda: ready(port), timeout=30, what="/readyz answering 200")
    assert await metric(port, 'crane_annotator_node_watch_restarts_total{reason="error"}') == 3


async def metric(port: int, name: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_the_annotator_keeps_running_while_the_node_list_answers_503(tmp_path: Path) -> None:
    server = FakeApiServer(lists=[Status(503, "ServiceUnavailable")] * 3, objects=[item("n1", "5")], rv="5")
    async with fake_api(server):
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps(server.kubeconfig))
        port = free_port()
        process = await start_annotator(kubeconfig, port, "--lease-namespace", "test")
        try:
            await server.wait_for(lists=3, timeout=30)
            assert process.returncode is None
            await server.wait_for(lists=4, watches=1, timeout=30)  # listed after the 503s, and watching
            assert process.returncode is None
            await ready_after_three_failed_lists(port)
        finally:
            code = await stop(process)
    assert code == 0


class FailingNodeListProxy:
    """Plain-HTTP proxy on loopback to the real API server that answers the first ``failures`` node lists with
    503 (as the API server does while it restarts) and forwards everything else, watches streamed."""

    def __init__(self, cluster: LocalCluster, failures: int) -> None:
        self.cluster = cluster
        self.failures = failures
        self.node_lists = 0
        self.forwarded_node_lists = 0
        self._session: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        is_node_list = request.path == "/api/v1/nodes" and request.query.get("watch", "").lower() not in ("true", "1")
        if is_node_list:
            self.node_lists += 1
            if self.node_lists <= self.failures:
                body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503}
                return web.json_response(body | {"reason": "ServiceUnavailable", "metadata": {}}, status=503)
            self.forwarded_node_lists += 1
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(
            request.method, self.cluster.api_url + request.path_qs, headers=headers, data=await request.read()
        ) as upstream:
            resp = web.StreamResponse(status=upstream.status, headers={"Content-Type": upstream.content_type})
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def __aenter__(self) -> str:
        assert self.cluster.pki is not None
        ssl_context = ssl.create_default_context(cafile=str(self.cluster.pki.ca_cert))
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        # the annotator's node watch ends only when the API server ends it: stopping cancels it after a second
        # instead of aiohttp's default 60 s grace
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
        assert self._session is not None
        await self._session.close()


async def test_behind_a_proxy_to_the_real_api_server_503s_on_the_node_list_do_not_end_the_annotator(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    proxy = FailingNodeListProxy(cluster, failures=3)
    async with proxy as url:
        config = cluster.kubeconfig_dict()
        config["clusters"][0]["cluster"] = {"server": url}
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps(config))
        port = free_port()
        # A standby (its Lease namespace does not exist): this is about the node list, which every replica runs.
        process = await start_annotator(kubeconfig, port, "--lease-namespace", "no-such-namespace")
        try:
            await eventually(lambda: proxy.forwarded_node_lists >= 1, timeout=30, what="a node list after the 503s")
            assert process.returncode is None and proxy.node_lists == 4
            await ready_after_three_failed_lists(port)
        finally:
            code = await stop(process)
    assert code == 0
