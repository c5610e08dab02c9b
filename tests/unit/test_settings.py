"""The shared settings convention: converters written once, and the redis, prometheus and lease sections."""

from __future__ import annotations

import argparse
import socket
import time

import pytest
import redis.exceptions

from crane_shared.redisconn import SentinelTarget, make_redis, parse_sentinel_url
from crane_shared.settings import (
    EnvArgumentParser,
    PrometheusSettings,
    RedisSettings,
    add_lease_flags,
    add_prometheus_flags,
    add_redis_flags,
    duration,
    lease_config,
    non_negative_int,
    positive_duration,
    positive_int,
    prometheus_settings,
    redis_settings,
    time_zone,
)


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15.0), ("250ms", 0.25), ("1m30s", 90.0), ("2.5", 2.5)])
def test_durations_are_go_durations_or_plain_seconds(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize(
    ("convert", "text"),
    [(duration, "1d"), (positive_duration, "0s"), (positive_int, "0"), (non_negative_int, "-1"), (time_zone, "X/Y")],
)
def test_bad_values_are_refused_with_a_reason(convert: object, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r".+"):
        convert(text)  # type: ignore[operator]


def parser() -> EnvArgumentParser:
    p = EnvArgumentParser(prog="t")
    add_redis_flags(p)
    add_lease_flags(p, default_name="t-lease")
    return p


def test_the_lease_section_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRANE_LEASE_DURATION", "30s")
    lease = lease_config(parser().parse_args(["--renew-deadline", "20s", "--identity", "me"]))
    assert (lease.name, lease.identity, lease.lease_duration, lease.renew_deadline) == ("t-lease", "me", 30, 20)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["--renew-deadline", "20s"], "--renew-deadline"), (["--lease-retry-period", "12s"], "--lease-retry-period")],
)
def test_lease_timing_that_cannot_work_is_refused_naming_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ValueError, match=flag):
        lease_config(parser().parse_args(argv))


async def test_one_redis_entry_point_from_the_redis_section() -> None:
    section = redis_settings(parser().parse_args(["--redis-url", "redis://127.0.0.1:1/3", "--redis-prefix", "x"]))
    assert section == RedisSettings("redis://127.0.0.1:1/3", None, None, "x")
    client = make_redis(section)
    try:
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["db"], kwargs["port"], kwargs["socket_timeout"]) == (3, 1, 5.0)
    finally:
        await client.aclose()


async def test_a_redis_that_refuses_connections_fails_the_call_at_once() -> None:
    """The services' client retries nothing inside a call (their loops retry, count and log): a bare
    ``redis.asyncio.Redis`` would retry ten times, ~4 s of backoff against a refused port, hidden in one call."""
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        client = make_redis(f"redis://127.0.0.1:{port}/0")
        try:
            start = time.monotonic()
            with pytest.raises(redis.exceptions.ConnectionError):
                await client.ping()
            assert time.monotonic() - start < 1.5
        finally:
            await client.aclose()


def test_kube_api_timeout_sets_the_default_request_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from crane_shared.settings import common_settings, service_parser

    p = service_parser("t", "test", default_port=1)
    assert common_settings(p.parse_args([])).kube.request_timeout == 30.0
    assert common_settings(p.parse_args(["--kube-api-timeout", "2500ms"])).kube.request_timeout == 2.5
    monkeypatch.setenv("CRANE_KUBE_API_TIMEOUT", "1m")
    assert common_settings(service_parser("t", "test", default_port=1).parse_args([])).kube.request_timeout == 60.0
    with pytest.raises(SystemExit):
        p.parse_args(["--kube-api-timeout", "0s"])


def prometheus_parser() -> EnvArgumentParser:
    p = EnvArgumentParser(prog="t")
    add_prometheus_flags(p)
    return p


def test_the_prometheus_section_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRANE_PROMETHEUS_HEADERS", "X-Team: scheduling\nX-Env: prod\n")
    monkeypatch.setenv("CRANE_PROMETHEUS_NO_PROXY_FROM_ENVIRONMENT", "true")
    monkeypatch.setenv("CRANE_PROMETHEUS_LATENCY_OFFSET", "30s")
    args = prometheus_parser().parse_args(
        [
            "--prometheus-url=http://vmselect:8481/select/0/prometheus",
            "--prometheus-header=X-Extra: 1",
            "--prometheus-query-param=dedup=true",
            "--prometheus-tenant=t1",
            "--prometheus-partial-response=accept",
            "--prometheus-deny-partial-response",
        ]
    )
    section = prometheus_settings(args)
    assert section.headers == (("X-Team", "scheduling"), ("X-Env", "prod"), ("X-Extra", "1"))
    assert section.query_params == (("dedup", "true"),)
    assert (section.tenant, section.partial_response, section.deny_partial_response) == ("t1", "accept", True)
    assert (section.latency_offset, section.proxy_from_environment) == (30.0, False)
    monkeypatch.delenv("CRANE_PROMETHEUS_HEADERS")
    monkeypatch.delenv("CRANE_PROMETHEUS_NO_PROXY_FROM_ENVIRONMENT")
    monkeypatch.delenv("CRANE_PROMETHEUS_LATENCY_OFFSET")
    assert prometheus_settings(prometheus_parser().parse_args([])) == PrometheusSettings("http://127.0.0.1:9090")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--prometheus-url=https://user:pw@prom"], "--prometheus-url"),
        (["--prometheus-url=prom:9090"], "--prometheus-url"),
        (["--prometheus-url=http://prom/?x=1"], "--prometheus-url"),
        (["--prometheus-bearer-token-file=t", "--prometheus-username=u"], "--prometheus-bearer-token-file"),
        (["--prometheus-password-file=p"], "--prometheus-password-file"),
        (["--prometheus-client-key-file=k"], "--prometheus-client-key-file"),
        (["--prometheus-header=Authorization: Bearer x"], "Authorization"),
        (["--prometheus-header=X-Scope-OrgID: a", "--prometheus-tenant=b"], "--prometheus-tenant"),
    ],
)
def test_prometheus_settings_that_cannot_work_are_refused_naming_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ValueError, match=flag) as err:
        prometheus_settings(prometheus_parser().parse_args(argv))
    assert "pw" not in str(err.value) and "Bearer x" not in str(err.value)


def test_a_malformed_header_or_query_parameter_is_refused_at_parse_time() -> None:
    for argv in (["--prometheus-header=no-colon"], ["--prometheus-query-param=novalue"]):
        with pytest.raises(SystemExit):
            prometheus_parser().parse_args(argv)


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database() -> None:
    assert parse_sentinel_url("redis+sentinel://s1:26379,s2:26380,[fd00::1]:26379/crane/2") == SentinelTarget(
        (("s1", 26379), ("s2", 26380), ("fd00::1", 26379)), "crane", 2
    )
    assert parse_sentinel_url("redis+sentinel://s1/crane") == SentinelTarget((("s1", 26379),), "crane", 0)


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("redis+sentinel://s1:26379", "master name"),
        ("redis+sentinel://s1:x/crane", "host:port"),
        ("redis+sentinel://s1/crane/zero", "master name"),
        ("redis+sentinel://:pw@s1/crane", "--redis-password-file"),
    ],
)
def test_a_bad_sentinel_url_is_refused_naming_the_part(url: str, names: str) -> None:
    with pytest.raises(ValueError, match=names) as err:
        parse_sentinel_url(url)
    assert "pw" not in str(err.value)


async def test_a_sentinel_url_gives_a_client_of_the_current_primary() -> None:
    client = make_redis(RedisSettings("redis+sentinel://127.0.0.1:1,127.0.0.1:2/crane/4"))
    try:
        pool = client.connection_pool
        assert pool.service_name == "crane" and pool.connection_kwargs["db"] == 4  # type: ignore[attr-defined]
        assert pool.connection_kwargs["socket_timeout"] == 5.0
    finally:
        await client.aclose()


def test_empty_prometheus_variables_are_unset_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """docker-compose passes variables the shell does not set as empty strings."""
    for name in ("TENANT", "HEADERS", "QUERY_PARAMS", "BEARER_TOKEN_FILE", "USERNAME", "PASSWORD_FILE", "CA_FILE",
                 "CLIENT_CERT_FILE", "CLIENT_KEY_FILE", "HEADERS_FILE"):  # fmt: skip
        monkeypatch.setenv(f"CRANE_PROMETHEUS_{name}", "")
    monkeypatch.setenv("CRANE_PROMETHEUS_DENY_PARTIAL_RESPONSE", "false")
    assert prometheus_settings(prometheus_parser().parse_args([])) == PrometheusSettings("http://127.0.0.1:9090")
