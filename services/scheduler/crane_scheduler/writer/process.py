"""The writer process: sends the scheduler's API writes (binds, events, pod-status patches) on its own connections.

Why a process: the scheduler is one Python thread, and per pod it makes two HTTPS requests (the bind and the
``Scheduled`` event). Their client side (aiohttp, TLS records, socket sends, responses) was about half of its CPU
(py-spy, ``bench/scheduler/RESULTS.md``), all of it serialised with the decisions. Here it runs beside them, on
another core, fed by msgpack over a pipe (``protocol``): a request costs the scheduler one small pack and a share
of one pipe write per event-loop turn.

Safety (leadership): a request carries its term and the instant its term may end (``deadline``, monotonic); it is
refused once the deadline has passed or the term was ended (``END_TERM``), checked again after its rate-limiter
token, right before it goes out; ``END_TERM`` and ``CANCEL`` also cancel what is waiting for a token or a
connection. The process gets SIGKILL when the scheduler dies (``PR_SET_PDEATHSIG``) and exits when its stdin
closes, after finishing what it has started.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import os
import signal
import sys
import time
from typing import Any, BinaryIO

import aiohttp
import msgpack
from kubernetes_asyncio import client

from crane_scheduler.writer.protocol import CANCEL, END_TERM, REFUSED, REQUEST, UNSENT, Connection
from crane_shared.kube import KubeSettings, TokenBucket, api_client_from_dict, make_api_client
from crane_shared.logs import configure_logging, get_logger

log = get_logger("crane.scheduler.writer")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ERROR_TEXT_LIMIT = 2048
REPLY_DELAY = 0.002
"""seconds a reply may wait for others before the pipe write that wakes the scheduler"""


def die_with_parent(parent: int) -> None:
    """SIGKILL when the scheduler dies, however it dies; exit at once if it is gone already."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


async def api_client(conn: Connection) -> client.ApiClient:
    if conn.kubeconfig_dict is not None:
        return await api_client_from_dict(
            conn.kubeconfig_dict, qps=0, request_timeout=conn.request_timeout, connections=conn.connections
        )
    settings = KubeSettings(kubeconfig=conn.kubeconfig, context=conn.context, request_timeout=conn.request_timeout)
    return await make_api_client(settings, connections=conn.connections)


class Writer:
    """Requests in, replies out; one asyncio task per request in flight."""

    def __init__(self, api: client.ApiClient, conn: Connection, out: asyncio.WriteTransport) -> None:
        self.api = api
        rest = api.rest_client
        self.session: aiohttp.ClientSession = rest.pool_manager
        self.host = api.configuration.host.rstrip("/")
        self.extra: dict[str, Any] = {}
        if rest.server_hostname:
            self.extra["server_hostname"] = rest.server_hostname
        if rest.proxy:
            self.extra["proxy"] = rest.proxy
        self.bucket = TokenBucket(conn.qps, conn.burst)
        self.timeout = aiohttp.ClientTimeout(total=conn.request_timeout)
        self.out = out
        self.replies: list[bytes] = []
        self.flush_timer: asyncio.TimerHandle | None = None
        self.packer = msgpack.Packer()
        self.tasks: dict[int, tuple[asyncio.Task[None], int]] = {}
        self.ended: set[int] = set()

    def receive(self, message: Any) -> None:
        kind = message[0]
        if kind == REQUEST:
            _, rid, method, path, body, content_type, term, deadline = message
            task = asyncio.create_task(self.send(rid, method, path, body, content_type, term, deadline))
            self.tasks[rid] = (task, term)
            task.add_done_callback(functools.partial(self._done, rid))
        elif kind == CANCEL:
            found = self.tasks.get(message[1])
            if found is not None:
                found[0].cancel()
        elif kind == END_TERM:
            term = message[1]
            self.ended.add(term)
            for task, of in list(self.tasks.values()):
                if of == term:
                    task.cancel()

    def _done(self, rid: int, _task: asyncio.Task[None]) -> None:
        self.tasks.pop(rid, None)

    def _refusal(self, term: int, deadline: float) -> str | None:
        if term and term in self.ended:
            return "leadership term ended"
        if time.monotonic() >= deadline:
            return "leadership term deadline passed"
        return None

    async def send(
        self, rid: int, method: str, path: str, body: Any, content_type: str, term: int, deadline: float
    ) -> None:
        try:
            refusal = self._refusal(term, deadline)
            if refusal is None:
                await self.bucket.acquire()
                refusal = self._refusal(term, deadline)
            if refusal is not None:
                self.reply(rid, REFUSED, refusal)
                return
            headers = {"Content-Type": content_type, "Accept": "application/json"}
            await self.api.update_params_for_auth(headers, [], ["BearerToken"])
            async with self.session.request(
                method, self.host + path, data=json.dumps(body), headers=headers, timeout=self.timeout, **self.extra
            ) as resp:
                data = await resp.read()
                ok = 200 <= resp.status <= 299
                self.reply(rid, resp.status, "" if ok else data[:ERROR_TEXT_LIMIT].decode(errors="replace"))
        except asyncio.CancelledError:
            self.reply(rid, REFUSED, "cancelled")
        except Exception as err:  # timeouts, resets, refused connections: the caller decides what to retry
            self.reply(rid, UNSENT, repr(err))

    def reply(self, rid: int, status: int, text: str) -> None:
        if not self.replies:  # one pipe write (one wake-up of the scheduler) per REPLY_DELAY, however many replies
            self.flush_timer = asyncio.get_running_loop().call_later(REPLY_DELAY, self.flush)
        self.replies.append(self.packer.pack((rid, status, text)))

    def flush(self) -> None:
        if self.flush_timer is not None:
            self.flush_timer.cancel()
            self.flush_timer = None
        data, self.replies = b"".join(self.replies), []
        if data and not self.out.is_closing():
            self.out.write(data)

    async def finish(self) -> None:
        """stdin closed: let what is in flight complete (each bounded by the request timeout)."""
        while self.tasks:
            await asyncio.gather(*(t for t, _ in list(self.tasks.values())), return_exceptions=True)
        self.flush()


async def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, stdout)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    writer: Writer | None = None
    api: client.ApiClient | None = None
    try:
        while chunk := await reader.read(1 << 16):
            unpacker.feed(chunk)
            for message in unpacker:
                if writer is None:  # the first object: the connection
                    conn = Connection.from_wire(message)
                    api = await api_client(conn)
                    writer = Writer(api, conn, out)
                else:
                    writer.receive(message)
        if writer is not None:
            await writer.finish()
    finally:
        if api is not None:
            await api.close()
        with contextlib.suppress(Exception):
            out.close()


def main() -> int:
    """``python -m crane_scheduler.writer PARENT_PID LOG_LEVEL LOG_FORMAT``: started by ``client.ApiWriter``."""
    parent, level, fmt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    die_with_parent(parent)
    configure_logging(level, fmt)
    # The protocol owns the original stdout; anything printed by a library goes to stderr, the scheduler's log.
    protocol_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the scheduler decides when this process ends (stdin closed)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    asyncio.run(serve(sys.stdin.buffer, protocol_out))
    return 0
