"""Helpers of the fault suite: the fault table's rows, the API server behind a proxy or restarted, and an HTTP
proxy that answers 429/503 (Toxiproxy works on TCP and cannot make status codes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import free_port
from crane_sandbox.rbac import ServiceIdentity

REPORT_ENV = "CRANE_FAULT_REPORT"


FAULT_ROWS = "fault_rows"
"""The ``user_properties`` name under which a fault test's teardown report carries its rows to the table of
faults survived (tests/conftest.py prints it at the end of the run)."""


COLLECTIONS = frozenset({"events", "nodes", "pods", "leases"})  # a GET ending in one of these lists it


@dataclass
class FaultRow:
    """One line of the fault table: what was injected and what came out of it, audited from the API/Redis."""

    fault: str
    created: int = 0  # pods (or bindings, or rounds) the test created during the fault
    bound: int = 0  # of those, bound (or recorded, or patched) once
    doubled: int = 0  # bound/recorded twice, or written by two leaders at once
    lost: int = 0  # never bound/recorded
    recovery: float | None = None  # seconds from the end of the fault to the state being whole again
    note: str = ""


@dataclass
class FaultReport:
    rows: list[FaultRow] = field(default_factory=list)

    def row(self, fault: str) -> FaultRow:
        r = FaultRow(fault)
        self.rows.append(r)
        return r


FAULT_COLUMNS = ("fault", "created", "bound", "doubled", "lost", "recovery s", "result")


def fault_table(rows: list[dict[str, object]]) -> str:
    """The table of faults survived: one line per row, FAILED where its test failed, then the rows' notes."""
    lines = [
        (
            str(r["fault"]),
            str(r["created"]),
            str(r["bound"]),
            str(r["doubled"]),
            str(r["lost"]),
            "-" if r["recovery"] is None else f"{r['recovery']:.2f}",
            "ok" if r["outcome"] == "passed" else "FAILED",
        )
        for r in rows
    ]
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(FAULT_COLUMNS)]

    def fmt(cells: tuple[str, ...]) -> str:
        return " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [fmt(FAULT_COLUMNS), "-+-".join("-" * w for w in widths), *(fmt(line) for line in lines)]
    notes = [f"  {r['fault']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(out + (["", "notes:", *notes] if notes else []))


def api_host_port(cluster: LocalCluster) -> str:
    assert cluster.apiserver is not None
    return f"127.0.0.1:{cluster.apiserver.port}"


def kubeconfig_via(
    cluster: LocalCluster, server: str, path: Path | None = None, *, account: ServiceIdentity | None = None
) -> dict[str, Any]:
    """The kubeconfig of ``account`` (default: the admin) with its server replaced (a proxy); written to ``path``
    (mode 0600) when given."""
    config = cluster.kubeconfig_dict(account.token, account.user) if account else cluster.kubeconfig_dict()
    config["clusters"][0]["cluster"]["server"] = server
    if server.startswith("http://"):
        del config["clusters"][0]["cluster"]["certificate-authority"]
    if path is not None:
        path.write_text(json.dumps(config))
        path.chmod(0o600)
    return config


async def restart_apiserver(cluster: LocalCluster, down_for: float = 0.0) -> None:
    """Stop the real kube-apiserver (SIGTERM) and start it again on the same port; etcd keeps the state."""
    apiserver = cluster.apiserver
    assert apiserver is not None
    await apiserver.stop()
    if down_for:
        await asyncio.sleep(down_for)
    await apiserver.start()


class StatusProxy:
    """A plain-HTTP reverse proxy to the API server that can answer 429 or 503 instead of forwarding.

    ``fail(status, match, count)`` answers the next ``count`` requests that ``match`` with ``status`` (and
    ``Retry-After: 1`` as the API server's priority-and-fairness does); everything else is forwarded, watches
    streamed. ``seen`` counts requests per kind (list, watch, other) and ``opened`` lists and watches per resource
    path, to catch tight retry loops (a client with many informers reopens each after a restart, a tight loop
    reopens one many times)."""

    def __init__(self, cluster: LocalCluster) -> None:
        assert cluster.pki is not None
        self._upstream = cluster.api_url
        self._ssl = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._rules: list[tuple[int, Callable[[web.Request], bool], list[int]]] = []
        self.seen: dict[str, int] = {"list": 0, "watch": 0, "other": 0}
        self.opened: Counter[str] = Counter()
        self.injected: dict[int, int] = {}
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @staticmethod
    def kind(request: web.Request) -> str:
        if request.method != "GET":
            return "other"
        if request.query.get("watch", "").lower() in ("true", "1"):
            return "watch"
        return "list" if request.path.rstrip("/").rsplit("/", 1)[-1] in COLLECTIONS else "other"

    def fail(self, status: int, match: Callable[[web.Request], bool], count: int) -> None:
        self._rules.append((status, match, [count]))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        kind = self.kind(request)
        self.seen[kind] += 1
        if kind != "other":
            self.opened[request.path] += 1
        for status, match, left in self._rules:
            if left[0] > 0 and match(request):
                left[0] -= 1
                self.injected[status] = self.injected.get(status, 0) + 1
                body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status}
                return web.json_response(body, status=status, headers={"Retry-After": "1"})
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(
            request.method,
            self._upstream + request.path_qs,
            headers=headers,
            data=await request.read() if request.can_read_body else None,
            ssl=self._ssl,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        ) as upstream:
            resp = web.StreamResponse(status=upstream.status)
            if "Content-Type" in upstream.headers:
                resp.content_type = upstream.headers["Content-Type"].split(";")[0]
            await resp.prepare(request)
            with contextlib.suppress(ConnectionResetError):  # the client closed its watch
                async for chunk in upstream.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
            return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._session = aiohttp.ClientSession()
        # a watch streamed through the proxy ends only when the API server ends it: stopping cancels it after a
        # second instead of aiohttp's default 60 s grace
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
