"""Prometheus behind authentication, for the client's auth modes tested for real.

``AuthProxy`` is a small reverse proxy in front of a real Prometheus (or any backend) that enforces one mode the
way managed and gateway setups do: a bearer token, basic auth, a tenant header (Mimir's ``X-Scope-OrgID``, with
its ``/prometheus`` path prefix), or a client certificate (mutual TLS); anything else gets 401 (403 for a wrong
tenant), as those gateways answer. ``client_certificate`` issues a client certificate from the sandbox's
throwaway CA (``crane_sandbox.pki``)."""

from __future__ import annotations

import base64
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiohttp
from aiohttp import web

from crane_sandbox.pki import Pki
from crane_sandbox.procs import free_port

AuthMode = Literal["bearer", "basic", "tenant", "mtls"]


def client_certificate(pki: Pki, directory: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) for ``CN=name`` signed by the sandbox CA, usable for TLS client authentication."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = pki.ca_cert.with_name("ca.key")
    key, csr, cert, ext = (directory / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    ext.write_text("extendedKeyUsage=clientAuth\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    return cert, key


@dataclass
class AuthProxy:
    """Forwards ``<prefix>/api/v1/*`` to ``upstream`` once the request passes ``mode``; records what it saw."""

    upstream: str
    mode: AuthMode
    pki: Pki
    token: str = ""
    username: str = ""
    password: str = ""
    tenant: str = ""
    prefix: str = ""
    port: int = field(default_factory=free_port)
    refused: int = 0
    forwarded: int = 0
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.mode == "mtls" else "http"
        return f"{scheme}://127.0.0.1:{self.port}{self.prefix}"

    def _allowed(self, request: web.Request) -> int:
        """200, or the status a gateway answers."""
        auth = request.headers.get("Authorization", "")
        if self.mode == "bearer":
            return 200 if auth == f"Bearer {self.token}" else 401
        if self.mode == "basic":
            expected = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return 200 if auth == f"Basic {expected}" else 401
        if self.mode == "tenant":
            org = request.headers.get("X-Scope-OrgID")
            return 401 if org is None else 200 if org == self.tenant else 403
        # mtls: the TLS handshake already required a certificate from our CA
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        return 200 if peer else 401

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        self.headers_seen.append(dict(request.headers))
        status = self._allowed(request)
        if status != 200:
            self.refused += 1
            return web.Response(status=status, text="unauthorized\n" if status == 401 else "forbidden\n")
        self.forwarded += 1
        assert self._session is not None
        path = request.path.removeprefix(self.prefix)
        async with self._session.get(self.upstream + path, params=request.query) as resp:
            body = await resp.read()
            return web.Response(status=resp.status, body=body, content_type="application/json")

    async def start(self) -> None:
        ssl_context = None
        if self.mode == "mtls":
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.pki.ca_cert))
            ssl_context.load_cert_chain(self.pki.serving_cert, self.pki.serving_key)
            ssl_context.verify_mode = ssl.CERT_REQUIRED
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        app = web.Application()
        app.router.add_get(self.prefix + "/api/v1/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=ssl_context).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> AuthProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
