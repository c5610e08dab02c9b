"""The Prometheus client against a local stand-in server: auth, TLS, headers, proxies, retries, partial answers."""

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
from tests.support.promauth import client_certificate

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


async def test_headers_tenant_secret_headers_and_query_params_reach_the_server(
    stub: tuple[Stub, str], tmp_path: Path
) -> None:
    s, url = stub
    secret = tmp_path / "headers"
    secret.write_text("# gateway key\nX-Api-Key: first\n\n")
    settings = PrometheusSettings(
        url,
        headers=(("X-Team", "scheduling"),),
        headers_file=str(secret),
        tenant="team-a|team-b",
        query_params=(("dedup", "true"), ("replicaLabels[]", "replica")),
        deny_partial_response=True,
    )
    client = PrometheusClient(settings)
    try:
        await client.query("m")
        secret.write_text("X-Api-Key: rotated\n")
        await client.query("m")
    finally:
        await client.close()
    first = s.requests[0]
    assert first.headers["X-Team"] == "scheduling" and first.headers["X-Scope-OrgID"] == "team-a|team-b"
    assert [r.headers["X-Api-Key"] for r in s.requests] == ["first", "rotated"]
    assert first.path == "/prefix/api/v1/query"
    assert {k: first.query[k] for k in ("dedup", "replicaLabels[]", "partial_response", "deny_partial_response")} == {
        "dedup": "true",
        "replicaLabels[]": "replica",
        "partial_response": "false",
        "deny_partial_response": "1",
    }
    assert "partial_response" not in (await _one_request(url, s)).query  # only when asked for


async def _one_request(url: str, s: Stub) -> web.Request:
    await query(PrometheusSettings(url))
    return s.requests[-1]


async def test_a_client_certificate_is_presented_when_the_server_requires_one(tmp_path: Path) -> None:
    pki = await asyncio.to_thread(make_pki, tmp_path / "pki")
    cert, key = await asyncio.to_thread(client_certificate, pki, tmp_path / "client", "crane-annotator")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca_cert))
    server_ctx.load_cert_chain(pki.serving_cert, pki.serving_key)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    s = Stub()
    runner, url = await serve(s, server_ctx)
    try:
        settings = PrometheusSettings(
            url, ca_file=str(pki.ca_cert), client_cert_file=str(cert), client_key_file=str(key)
        )
        assert len((await query(settings)).series) == 2
        with pytest.raises(PrometheusError) as err:
            await query(PrometheusSettings(url, ca_file=str(pki.ca_cert), retries=0))
        assert err.value.kind == "connection"
    finally:
        await runner.cleanup()


async def test_the_proxy_from_the_environment_is_used_unless_disabled(
    stub: tuple[Stub, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s, proxy = stub  # the stub answers proxied requests too: they carry the absolute URL
    monkeypatch.setenv("HTTP_PROXY", proxy.removesuffix("/prefix/"))
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    result = await query(PrometheusSettings("http://prometheus.invalid:9090/prefix", retries=0))
    assert len(result.series) == 2
    assert s.requests[-1].headers["Host"] == "prometheus.invalid:9090"
    with pytest.raises(PrometheusError) as err:
        await query(
            PrometheusSettings("http://prometheus.invalid:9090/prefix", retries=0, proxy_from_environment=False)
        )
    assert err.value.kind == "connection"
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")  # nobody there
    assert len((await query(PrometheusSettings(proxy, retries=0))).series) == 2  # loopback: direct


@pytest.mark.parametrize(
    ("extra", "partial"),
    [
        ({}, False),
        ({"isPartial": False}, False),
        ({"isPartial": True}, True),  # VictoriaMetrics cluster: no warning at all
        ({"warnings": ["No StoreAPIs matched for this query"]}, True),  # Thanos, partial_response on
        ({"warnings": ['PromQL warning: metric might not be a counter, name does not end in _total: "m"']}, False),
        ({"infos": ['PromQL info: metric might not be a counter: "m"']}, False),
    ],
)
async def test_partial_answers_are_told_apart_from_query_annotations(
    stub: tuple[Stub, str], extra: dict[str, object], partial: bool
) -> None:
    s, url = stub

    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response(VECTOR | extra)

    s.handler = answer
    result = await query(PrometheusSettings(url))
    assert result.partial is partial and len(result.series) == 2
    assert result.warnings == tuple(extra.get("warnings", ()))  # type: ignore[arg-type]
    assert result.infos == tuple(extra.get("infos", ()))  # type: ignore[arg-type]


async def test_a_missing_credential_file_is_a_connection_error_naming_the_file(
    stub: tuple[Stub, str], tmp_path: Path
) -> None:
    _, url = stub
    with pytest.raises(PrometheusError) as err:
        await query(PrometheusSettings(url, bearer_token_file=str(tmp_path / "not-mounted-yet"), retries=0))
    assert err.value.kind == "connection" and "not-mounted-yet" in str(err.value)


def test_the_description_names_credentials_never_their_values(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret")
    client = PrometheusClient(
        PrometheusSettings(
            "https://prom:9090/select/0/prometheus",
            username="crane",
            password_file=str(password),
            headers_file=str(password),
            tenant="a",
        )
    )
    described = client.describe()
    assert described["auth"] == "basic" and described["tenant"] == "a" and described["headers_file"] is True
    assert "s3cret" not in repr(described) and "s3cret" not in repr(client.settings)
