"""The Prometheus client against a local stand-in server: auth, TLS, retries, timeouts, error kinds."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from crane_sandbox.pki import make_pki
from crane_sandbox.procs import free_port
from crane_shared.prometheus import PrometheusClient, PrometheusError, PrometheusSettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

VECTOR = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [
            {"metric": {"__name__": "cpu_usage_avg_5m", "instance": "10.0.0.1:9100"}, "value": [1.0, "63.5"]},
            {"metric": {"instance": "node-2"}, "value": [1.0, "NaN"]},
        ],
    },
}


class Stub:
    """A /api/v1/query endpoint whose behaviour each test sets; it records the requests it got."""

    def __init__(self) -> None:
        self.requests: list[web.Request] = []
        self.handler: Handler = self.ok
        self.release = asyncio.Event()  # set at teardown so hanging handlers end

    async def ok(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(VECTOR)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request)
        return await self.handler(request)


async def serve(stub: Stub, ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/prefix/api/v1/query", stub.dispatch)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
    scheme = "https" if ssl_context else "http"
    return runner, f"{scheme}://127.0.0.1:{port}/prefix/"


@pytest.fixture
async def stub() -> AsyncIterator[tuple[Stub, str]]:
    s = Stub()
    runner, url = await serve(s)
    yield s, url
    s.release.set()
    await runner.cleanup()


async def query(settings: PrometheusSettings, promql: str = "cpu_usage_avg_5m"):
    client = PrometheusClient(settings)
    try:
        return await client.query(promql)
    finally:
        await client.close()


async def test_one_request_returns_every_series_with_raw_values(stub: tuple[Stub, str]) -> None:
    s, url = stub
    result = await query(PrometheusSettings(url))
    assert result.attempts == 1
    assert [(dict(x.labels).get("instance"), x.value) for x in result.series] == [
        ("10.0.0.1:9100", "63.5"),
        ("node-2", "NaN"),
    ]
    assert s.requests[0].query["query"] == "cpu_usage_avg_5m"


async def test_bearer_token_file_is_reread_and_basic_auth_is_sent(stub: tuple[Stub, str], tmp_path: Path) -> None:
    s, url = stub
    token = tmp_path / "token"
    token.write_text("first\n")
    client = PrometheusClient(PrometheusSettings(url, bearer_token_file=str(token)))
    await client.query("m")
    token.write_text("rotated")
    await client.query("m")
    await client.close()
    assert [r.headers["Authorization"] for r in s.requests] == ["Bearer first", "Bearer rotated"]
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    await query(PrometheusSettings(url, username="crane", password_file=str(password)))
    assert s.requests[-1].headers["Authorization"] == "Basic Y3JhbmU6czNjcmV0"  # crane:s3cret


async def test_transient_errors_are_retried_with_backoff(stub: tuple[Stub, str]) -> None:
    s, url = stub
    answers = [
        web.Response(status=503),
        web.json_response({"status": "error", "errorType": "timeout", "error": "query timed out"}, status=503),
    ]

    async def flaky(request: web.Request) -> web.StreamResponse:
        return answers.pop(0) if answers else web.json_response(VECTOR)

    s.handler = flaky
    result = await query(PrometheusSettings(url, retries=2, backoff=0.01))
    assert result.attempts == 3 and len(result.series) == 2


async def test_a_bad_query_is_not_retried(stub: tuple[Stub, str]) -> None:
    s, url = stub

    async def bad(request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "error", "errorType": "bad_data", "error": "parse error"}, status=400)

    s.handler = bad
    with pytest.raises(PrometheusError) as err:
        await query(PrometheusSettings(url, retries=3, backoff=0.01))
    assert (err.value.kind, err.value.attempts, len(s.requests)) == ("query", 1, 1)


async def test_a_hanging_prometheus_costs_at_most_timeout_times_attempts(stub: tuple[Stub, str]) -> None:
    s, url = stub

    async def hang(request: web.Request) -> web.StreamResponse:
        await s.release.wait()
        return web.json_response(VECTOR)

    s.handler = hang
    started = time.monotonic()
    with pytest.raises(PrometheusError) as err:
        await query(PrometheusSettings(url, timeout=0.2, retries=1, backoff=0.05))
    assert err.value.kind == "timeout" and err.value.attempts == 2
    assert time.monotonic() - started < 3  # 2 x 0.2 s + backoff; far below a hang


async def test_nobody_listening_is_a_connection_error() -> None:
    with pytest.raises(PrometheusError) as err:
        await query(PrometheusSettings(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.01))
    assert err.value.kind == "connection" and err.value.attempts == 2


async def test_tls_is_verified_against_the_given_ca(tmp_path: Path) -> None:
    pki = await asyncio.to_thread(make_pki, tmp_path / "pki")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(pki.serving_cert, pki.serving_key)
    s = Stub()
    runner, url = await serve(s, server_ctx)
    try:
        result = await query(PrometheusSettings(url, ca_file=str(pki.ca_cert)))
        assert len(result.series) == 2
        with pytest.raises(PrometheusError) as err:
            await query(PrometheusSettings(url, retries=0))  # system CAs do not know the throwaway CA
        assert err.value.kind == "connection"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"<html>502 Bad Gateway</html>", "unexpected response shape"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}', "value"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}}', "data.result"),
        (
            b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {"instance": "a"},'
            b' "value": [1.0, null]}]}}',
            "result[0].value",
        ),
        (
            b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {"instance": "a"},'
            b' "value": [1.0, "1"]}, {"metric": {"instance": 10}, "value": [1.0, "2"]}]}}',
            "result[1].metric",
        ),
        (
            b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {"instance": "a"},'
            b' "value": [1.0, 3.5]}]}}',
            "result[0].value",
        ),
    ],
)
async def test_garbage_and_wrong_json_types_are_a_bad_response_never_retried(
    stub: tuple[Stub, str], body: bytes, names: str
) -> None:
    server, url = stub

    async def garbage(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    server.handler = garbage
    client = PrometheusClient(PrometheusSettings(url, retries=2, backoff=0.01))
    try:
        with pytest.raises(PrometheusError) as err:
            await client.query("cpu_usage_avg_5m")
    finally:
        await client.close()
    assert err.value.kind == "bad_response"
    assert names in str(err.value)
    assert len(server.requests) == 1
