"""Toxiproxy (Shopify's TCP fault proxy) for the fault suite: the server, built from its pinned Go module by
``scripts/build-toxiproxy``, and a small client for its HTTP API on loopback.

A proxy sits between a service and one upstream (API server, Redis, Prometheus); faults are toxics on it:
``blackhole`` (data stops, the connection stays open: no reset, as a dead peer or a dropped route looks),
``latency``, ``reset`` (connections closed), ``down`` (the proxy refuses connections, as a stopped server).
"""

from __future__ import annotations

import asyncio
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from crane_sandbox.procs import ManagedProcess, Server, free_port, tcp_open

REPO_ROOT = Path(__file__).resolve().parents[2]


class ToxiproxyError(RuntimeError):
    pass


def ensure_toxiproxy() -> Path:
    """The toxiproxy-server binary, built once into ``~/.cache/crane-tools`` (blocking: run it in a thread)."""
    script = REPO_ROOT / "scripts" / "build-toxiproxy"
    done = subprocess.run([str(script)], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise ToxiproxyError(f"{script} failed: {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class Proxy:
    """One proxy: ``listen`` is where the service connects instead of ``upstream``."""

    server: Toxiproxy
    name: str
    listen_port: int
    upstream: str

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    async def add_toxic(self, kind: str, attributes: dict[str, Any], *, stream: str = "downstream") -> str:
        name = f"{kind}_{stream}"
        body = {"name": name, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes}
        await self.server.call("POST", f"/proxies/{self.name}/toxics", body)
        return name

    async def blackhole(self) -> None:
        """Stop all data both ways but keep every connection open (Toxiproxy's ``timeout`` toxic with 0)."""
        await self.add_toxic("timeout", {"timeout": 0}, stream="upstream")
        await self.add_toxic("timeout", {"timeout": 0}, stream="downstream")

    async def latency(self, ms: int, jitter_ms: int = 0) -> None:
        await self.add_toxic("latency", {"latency": ms, "jitter": jitter_ms})

    async def reset_connections(self) -> None:
        """Close every open connection with a RST (``reset_peer``); new ones get reset too until ``heal``."""
        await self.add_toxic("reset_peer", {"timeout": 0}, stream="upstream")

    async def down(self) -> None:
        """Refuse new connections and close open ones, as a stopped server."""
        await self.server.call("POST", f"/proxies/{self.name}", {"enabled": False})

    async def heal(self) -> None:
        """Remove every toxic and enable the proxy again."""
        proxy = await self.server.call("GET", f"/proxies/{self.name}")
        for toxic in proxy.get("toxics") or []:
            await self.server.call("DELETE", f"/proxies/{self.name}/toxics/{toxic['name']}")
        await self.server.call("POST", f"/proxies/{self.name}", {"enabled": True})


@dataclass
class Toxiproxy(Server):
    """A toxiproxy-server on loopback (API on ``port``) and its proxies."""

    log_file: Path
    binary: Path | None = None
    port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None
    _session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self.binary is None:
            self.binary = await asyncio.to_thread(ensure_toxiproxy)
        self.process = ManagedProcess(
            "toxiproxy", [str(self.binary), "-host", "127.0.0.1", "-port", str(self.port)], self.log_file
        )
        await self.process.start()
        await self.process.wait_ready(lambda: tcp_open("127.0.0.1", self.port), timeout=20)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self.process is not None:
            await self.process.stop()

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        assert self._session is not None, "toxiproxy not started"
        url = f"http://127.0.0.1:{self.port}{path}"
        async with self._session.request(method, url, json=body) as resp:
            text = await resp.text()
            if resp.status >= 300:
                raise ToxiproxyError(f"{method} {path}: HTTP {resp.status}: {text[:300]}")
            return await resp.json(content_type=None) if text else None

    async def proxy(self, name: str, upstream: str) -> Proxy:
        """A new proxy to ``upstream`` (host:port) on a free loopback port."""
        port = free_port()
        body = {"name": name, "listen": f"127.0.0.1:{port}", "upstream": upstream, "enabled": True}
        await self.call("POST", "/proxies", body)
        return Proxy(self, name, port, upstream)

    async def delete(self, proxy: Proxy) -> None:
        await self.call("DELETE", f"/proxies/{proxy.name}")
