"""The annotator process keeps running, unready, while the node list answers 503, and becomes ready after.

The process is the real ``crane-annotator``; the API server is ``tests.fakeapi`` answering the node list with
503s first (as an API server does while it restarts). Before the one informer, an error body was read as a node
list, raised KeyError and ended the process, leader and standby alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp

from tests.fakeapi import FakeApiServer, Status, fake_api, item

from .conftest import eventually


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def readyz(port: int) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as resp:
        return resp.status


async def ready(port: int) -> bool:
    try:
        return await readyz(port) == 200
    except aiohttp.ClientConnectionError:
        return False


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
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "crane_annotator",
            "--kubeconfig",
            str(kubeconfig),
            "--listen-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--lease-namespace",
            "test",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await server.wait_for(lists=3, timeout=30)
            assert process.returncode is None
            await server.wait_for(lists=4, watches=1, timeout=30)  # listed after the 503s, and watching
            assert process.returncode is None
            await eventually(lambda: ready(port), timeout=30, what="/readyz answering 200")
            restarts = 'crane_annotator_node_watch_restarts_total{reason="error"}'
            assert await metric(port, restarts) == 3
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), 30)
    assert code == 0
