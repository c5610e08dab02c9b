"""The writer's HTTP/1.1 client: a fixed pool of keep-alive connections, one request at a time on each.

Why not aiohttp's ``ClientSession``: per request it builds a ``ClientRequest`` (URL, multidict headers, cookie
jar, tracing, timer context) and a ``ClientResponse`` with a stream reader; with bodies of a few hundred bytes
that was most of the writer's CPU (py-spy, ``bench.scheduler.writer_cost``). Here a request is one bytes object
(head + body) written on a connection's transport, and the response is parsed by ``httptools`` (llhttp, the
parser of Node.js; chunked bodies included), keeping the body only when the status is an error (``text``), or
always when the caller asks for the object the API server answered (``keep``).

Every request has a timeout covering the wait for a connection, the connect (TLS handshake) and the exchange; a
connection whose exchange did not finish (timeout, cancellation, transport error, a response without request) is
closed, never reused. A connection the server ends (``Connection: close``, idle timeout) is dropped from the pool.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import httptools

ERROR_TEXT_LIMIT = 2048


class HttpError(Exception):
    """The exchange failed below HTTP: closed connection, malformed response."""


class Refused(Exception):
    """``request``'s last check said no: nothing was sent."""


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is: ``host``/``port`` to connect to, ``authority`` for the Host header, TLS (None:
    plain HTTP) and the name the certificate must carry when it is not ``host`` (kubeconfig ``tls-server-name``)."""

    host: str
    port: int
    authority: str
    ssl: ssl.SSLContext | None = None
    server_hostname: str | None = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection; ``exchange`` sends a request and waits for its whole response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.status = 0
        self.text = bytearray()
        self.reusable = False
        self.lost = False
        self.keep = False  # this exchange keeps a 2xx body too, whole

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's are no subclass)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(HttpError(f"malformed response: {err}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(HttpError(f"connection closed by the server{f': {exc!r}' if exc else ''}"))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.keep and 200 <= self.status <= 299:
            self.text += body
        elif not 200 <= self.status <= 299 and len(self.text) < ERROR_TEXT_LIMIT:
            self.text += body[: ERROR_TEXT_LIMIT - len(self.text)]

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None:  # a response nobody asked for (e.g. 408 before an idle close): unusable
            self.close()
            return
        self.reusable = self.parser.should_keep_alive()
        if not waiter.done():
            waiter.set_result((self.status, bytes(self.text)))

    def _fail(self, err: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(err)

    async def exchange(self, request: bytes, keep: bool = False) -> tuple[int, bytes]:
        assert self.transport is not None
        if self.lost:
            raise HttpError("connection closed by the server")
        self.status, self.reusable, self.keep = 0, False, keep
        self.text.clear()
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        status, text = await waiter
        return status, text

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class HttpPool:
    """At most ``size`` requests in flight, on at most ``size`` connections kept open between requests."""

    def __init__(self, endpoint: Endpoint, size: int, timeout: float, accept: str = "application/json") -> None:
        self.endpoint = endpoint
        self.accept = accept
        self.timeout = timeout
        self._slots = asyncio.Semaphore(max(1, size))
        self._idle: list[_Connection] = []
        self.connects = 0
        """connections opened (TLS handshakes) so far"""
        self.queued = 0
        """requests waiting for a free slot (every connection busy)"""
        self.on_unqueued: Callable[[], None] = lambda: None
        """called when the last request waiting for a slot got one"""

    def head(self, method: str, path: str, accept: str | None = None) -> bytes:
        """The request line and the headers every request of this pool carries (the rest: per request);
        ``accept``: instead of the pool's."""
        accept = accept or self.accept
        return f"{method} {path} HTTP/1.1\r\nHost: {self.endpoint.authority}\r\nAccept: {accept}\r\n".encode()

    async def request(
        self, head: bytes, body: bytes, check: Callable[[], str | None] = lambda: None, keep: bool = False
    ) -> tuple[int, bytes]:
        """``head``: request line and headers (without the blank line and Content-Length); returns (status,
        error text: the body's first bytes when the status is not 2xx, else empty; with ``keep``, a 2xx body
        whole). ``check`` is asked once a connection is ready, right before the request is written: a reason
        raises ``Refused`` (e.g. the leadership deadline passed while the request waited for a connection)."""
        request = b"%bContent-Length: %d\r\n\r\n%b" % (head, len(body), body)
        async with asyncio.timeout(self.timeout):
            await self._slot()
            try:
                conn = self._take() or await self._connect()
                refusal = check()
                if refusal is not None:
                    self._idle.append(conn)
                    raise Refused(refusal)
                try:
                    status, text = await conn.exchange(request, keep)
                except BaseException:
                    conn.close()
                    raise
                if conn.reusable and not conn.lost:
                    self._idle.append(conn)
                else:
                    conn.close()
                return status, text
            finally:
                self._slots.release()

    async def _slot(self) -> None:
        if not self._slots.locked():
            await self._slots.acquire()
            return
        self.queued += 1
        try:
            await self._slots.acquire()
        finally:
            self.queued -= 1
            if not self.queued:
                self.on_unqueued()

    def _take(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost:
                return conn
        return None

    async def _connect(self) -> _Connection:
        ep = self.endpoint
        _, conn = await asyncio.get_running_loop().create_connection(
            _Connection,
            ep.host,
            ep.port,
            ssl=ep.ssl,
            server_hostname=(ep.server_hostname or ep.host) if ep.ssl is not None else None,
        )
        self.connects += 1
        return conn

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
