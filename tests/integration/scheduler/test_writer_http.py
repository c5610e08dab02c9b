"""The API writer's HTTP/1.1 client against loopback servers: keep-alive reuse, error bodies (also chunked), a
server that closes, one that never answers (the timeout), one that answers garbage; and the bind body template."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from crane_scheduler.writer.http import Endpoint, HttpError, HttpPool
from crane_scheduler.writer.process import bind_request
from tests.support import kubeproto

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[tuple[Endpoint, list[int]]]:
    """A raw TCP server on loopback; yields its endpoint and a list counting the connections it accepted."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Endpoint("127.0.0.1", port, f"127.0.0.1:{port}"), accepted
    finally:
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    if not head:
        return None
    lines = head.decode().split("\r\n")
    length = next(int(v) for k, _, v in (h.partition(": ") for h in lines[1:]) if k.lower() == "content-length")
    return lines[0], await reader.readexactly(length)


def _answers(*responses: bytes) -> Handler:
    """Answer each request on a connection with the next response, then keep the connection open."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for response in responses:
            try:
                if await _read_request(reader) is None:
                    return
            except asyncio.IncompleteReadError:
                return
            writer.write(response)
            await writer.drain()
        await reader.read()

    return handler


CREATED = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def test_requests_reuse_one_keep_alive_connection_and_error_bodies_come_back() -> None:
    not_found = b'HTTP/1.1 404 Not Found\r\nContent-Length: 17\r\n\r\n{"reason":"gone"}'
    async with _server(_answers(*[CREATED] * 19, not_found)) as (endpoint, accepted):
        pool = HttpPool(endpoint, 4, timeout=5)
        replies = [await pool.request(pool.head("POST", f"/x/{i}"), b'{"a":1}') for i in range(20)]
        pool.close()
    assert replies == [(201, b"")] * 19 + [(404, b'{"reason":"gone"}')]
    assert len(accepted) == 1 and pool.connects == 1


async def test_a_request_that_keeps_the_body_gets_a_success_body_whole_and_asks_for_json() -> None:
    body = b'{"metadata":{"resourceVersion":"7"}}' * 100  # past the error text's limit
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    async with _server(_answers(ok, CREATED)) as (endpoint, _):
        pool = HttpPool(endpoint, 1, timeout=5, accept="application/vnd.kubernetes.protobuf")
        head = pool.head("PUT", "/c", "application/json")
        kept = await pool.request(head, b"{}", keep=True)
        dropped = await pool.request(pool.head("PUT", "/c"), b"{}")
        pool.close()
    assert b"Accept: application/json\r\n" in head and kept == (200, body)
    assert dropped == (201, b"")  # the next request on the connection keeps nothing again


async def test_a_chunked_error_body_is_decoded_and_connection_close_is_honoured() -> None:
    chunked = (
        b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    async with _server(_answers(chunked)) as (endpoint, accepted):
        pool = HttpPool(endpoint, 4, timeout=5)
        first = await pool.request(pool.head("PATCH", "/a"), b"{}")
        second = await pool.request(pool.head("PATCH", "/a"), b"{}")
        pool.close()
    assert first == (500, b"hello world") and second == (500, b"hello world")
    assert len(accepted) == 2  # the closed connection was not reused


async def test_a_server_that_never_answers_times_out_and_its_connection_is_closed() -> None:
    closed = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await reader.read()  # returns at EOF: the client closed the connection
        closed.set()

    async with _server(silent) as (endpoint, _):
        pool = HttpPool(endpoint, 4, timeout=0.3)
        with pytest.raises(TimeoutError):
            await pool.request(pool.head("POST", "/slow"), b"{}")
        await asyncio.wait_for(closed.wait(), 5)
        pool.close()


async def test_a_closed_connection_or_a_malformed_response_is_an_http_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)

    async with _server(hang_up) as (endpoint, _):
        pool = HttpPool(endpoint, 1, timeout=5)
        with pytest.raises(HttpError, match="closed"):
            await pool.request(pool.head("POST", "/a"), b"{}")
    async with _server(_answers(b"SMTP ready\r\n\r\n")) as (endpoint, _):
        pool = HttpPool(endpoint, 1, timeout=5)
        with pytest.raises(HttpError, match="malformed"):
            await pool.request(pool.head("POST", "/a"), b"{}")
        # the pool recovers: the next request opens a new connection (answered garbage again here)
        with pytest.raises(HttpError):
            await pool.request(pool.head("POST", "/a"), b"{}")
        assert pool.connects == 2


async def test_at_most_size_requests_are_in_flight() -> None:
    in_flight, peak = [0], [0]

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await _read_request(reader) is not None:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
            await asyncio.sleep(0.02)
            in_flight[0] -= 1
            writer.write(CREATED)
            await writer.drain()

    async with _server(slow) as (endpoint, accepted):
        pool = HttpPool(endpoint, 3, timeout=5)
        replies = await asyncio.gather(*(pool.request(pool.head("POST", "/a"), b"{}") for _ in range(12)))
        pool.close()
    assert replies == [(201, b"")] * 12 and peak[0] == 3 and len(accepted) == 3


def test_the_bind_body_is_the_binding_object_for_any_name() -> None:
    path, body = bind_request("ns", 'we"ird\\name\u00e9' + "x" * 200, "uid-1", "node-1")  # a length over 127
    assert path == '/api/v1/namespaces/ns/pods/we"ird\\name\u00e9' + "x" * 200 + "/binding"
    assert kubeproto.binding(body) == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": 'we"ird\\name\u00e9' + "x" * 200, "namespace": "ns", "uid": "uid-1"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-1"},
    }
