"""Prometheus HTTP API client for instant queries, shared by every service that reads metrics.

Thin on purpose: it returns the series as sent (labels and value strings) plus what the backend said about the
answer (``warnings``, ``infos``, VictoriaMetrics' ``isPartial``); matching series to nodes and deciding what a
partial answer may change are the caller's. Retries cover what a retry can fix (timeouts, connection errors,
5xx, 429, Prometheus' own ``timeout`` error); a PromQL error (4xx ``bad_data``) fails at once.

Everything that reaches a managed or proxied Prometheus-compatible backend is in ``PrometheusSettings``
(``crane_shared.settings``): a path prefix in the URL (``/prometheus``, ``/select/0/prometheus``), a bearer
token or a basic-auth password read from files, client certificates, a custom CA, extra headers (plain ones and
secret ones from a file), the tenant header, extra query parameters, the partial-response switches, and the
proxy from the environment. Every file is re-read when it changes, so rotated secrets and certificates are
picked up without a restart; no secret is ever logged (``describe`` says which credentials are in use, never
their values).
"""

from __future__ import annotations

import base64
import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import aiohttp

from crane_shared.retry import Backoff, retry
from crane_shared.settings import PrometheusSettings, add_prometheus_flags, prometheus_settings

# The settings section lives with the others in crane_shared.settings; named here too, so a service that queries
# metrics finds flags, settings and client in one import.
__all__ = [
    "PrometheusClient",
    "PrometheusError",
    "PrometheusSettings",
    "QueryClient",
    "QueryResult",
    "Series",
    "add_prometheus_flags",
    "is_partial",
    "prometheus_settings",
]

ErrorKind = Literal["timeout", "connection", "http", "query", "bad_response"]
_RETRYABLE: frozenset[ErrorKind] = frozenset({"timeout", "connection", "http"})

TENANT_HEADER = "X-Scope-OrgID"
QUERY_ANNOTATION_PREFIXES = ("PromQL warning:", "PromQL info:")
"""Prometheus' own query annotations (e.g. a rate over a non-counter): about the query, not about missing data"""


@dataclass(frozen=True)
class Series:
    """One sample of an instant query: its labels and the raw value string Prometheus sent."""

    labels: Mapping[str, str]
    value: str


class PrometheusError(Exception):
    """A query failed after its retries; ``kind`` labels the error metric, ``attempts`` counts the requests."""

    def __init__(self, kind: ErrorKind, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.attempts = attempts


@dataclass(frozen=True)
class QueryResult:
    series: list[Series]
    attempts: int
    warnings: tuple[str, ...] = ()
    infos: tuple[str, ...] = ()
    partial: bool = False
    """the backend said some of the data may be missing: VictoriaMetrics ``isPartial``, or a warning that is not
    one of PromQL's own annotations (Thanos with ``partial_response``: a store did not answer)"""


class QueryClient(Protocol):
    async def query(self, promql: str) -> QueryResult: ...


def is_partial(body: dict[str, Any], warnings: tuple[str, ...]) -> bool:
    """VictoriaMetrics flags partial data with ``isPartial`` and no warning; Thanos (and Prometheus reading remote
    storage) with a warning. PromQL's own annotations (``PromQL warning: ...``) say nothing about missing data."""
    if body.get("isPartial") is True:
        return True
    return any(not w.startswith(QUERY_ANNOTATION_PREFIXES) for w in warnings)


def _read(path: str) -> str:
    """Credential files are read for every request (a few per round): a rotated Secret is picked up at once."""
    return Path(path).read_text()


def _files_version(*paths: str) -> tuple[tuple[int, int, int], ...]:
    """Identity of the TLS files, to rebuild the context (and its pooled connections) only when they change;
    a rotated Secret is a new file behind a symlink swap, which ``stat`` follows."""
    out = []
    for path in paths:
        st = os.stat(path)
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _loopback(url: str) -> bool:
    """As Go's ProxyFromEnvironment: a loopback Prometheus is never reached through a proxy."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_header_lines(text: str, source: str) -> dict[str, str]:
    """``Name: value`` lines (blank lines and ``#`` comments skipped); a line without a colon is refused naming
    its line number, never its content (it may be a secret)."""
    headers: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise ValueError(f"{source}: line {number} is not 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


class PrometheusClient:
    def __init__(self, settings: PrometheusSettings) -> None:
        self.settings = settings
        self._endpoint = settings.url.rstrip("/") + "/api/v1/query"
        self._session: aiohttp.ClientSession | None = None
        self._tls: tuple[tuple[tuple[int, int, int], ...], ssl.SSLContext] | None = None
        self._params = dict(settings.query_params)
        if settings.deny_partial_response:
            # Thanos and VictoriaMetrics each read their own; Prometheus ignores both.
            self._params |= {"partial_response": "false", "deny_partial_response": "1"}

    def describe(self) -> dict[str, object]:
        """What the log says about the connection: which credentials are in use, never their values."""
        s = self.settings
        auth = "bearer-token-file" if s.bearer_token_file else "basic" if s.username is not None else "none"
        return {
            "auth": auth,
            "client_certificate": s.client_cert_file is not None,
            "tenant": s.tenant,
            "headers": sorted(name for name, _ in s.headers),
            "headers_file": s.headers_file is not None,
            "query_params": sorted(self._params),
            "proxy_from_environment": s.proxy_from_environment,
        }

    def _ssl(self) -> ssl.SSLContext | bool:
        """The TLS settings of a request; rebuilt when the CA or the client certificate files change."""
        s = self.settings
        if s.insecure_skip_verify and s.client_cert_file is None:
            return False
        files = tuple(f for f in (s.ca_file, s.client_cert_file, s.client_key_file) if f)
        if not files:
            return True
        version = _files_version(*files)
        if self._tls is None or self._tls[0] != version:
            context = ssl.create_default_context(cafile=s.ca_file)
            if s.insecure_skip_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if s.client_cert_file:
                context.load_cert_chain(s.client_cert_file, s.client_key_file)
            self._tls = (version, context)
        return self._tls[1]

    def _headers(self) -> dict[str, str]:
        """Plain headers, the tenant, secret headers and credentials, the files read again when they change."""
        s = self.settings
        headers = dict(s.headers)
        if s.tenant:
            headers[TENANT_HEADER] = s.tenant
        if s.headers_file:
            headers |= parse_header_lines(_read(s.headers_file), "--prometheus-headers-file")
        if s.bearer_token_file:
            headers["Authorization"] = "Bearer " + _read(s.bearer_token_file).strip()
        elif s.username is not None:
            password = _read(s.password_file).strip() if s.password_file else ""
            basic = base64.b64encode(f"{s.username}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
        return headers

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=16)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout),
                trust_env=self.settings.proxy_from_environment and not _loopback(self._endpoint),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def query(self, promql: str) -> QueryResult:
        """One instant query, retried on transient failures; raises ``PrometheusError`` when all attempts fail."""
        await self.start()
        attempts = 0

        async def once() -> QueryResult:
            nonlocal attempts
            attempts += 1
            try:
                return await self._once(promql)
            except PrometheusError as err:
                err.attempts = attempts
                raise

        result = await retry(
            once,
            attempts=self.settings.retries + 1,
            backoff=Backoff(
                initial=self.settings.backoff, maximum=max(self.settings.backoff, self.settings.backoff_max)
            ),
            retryable=lambda err: isinstance(err, PrometheusError) and err.kind in _RETRYABLE,
        )
        return QueryResult(result.series, attempts, result.warnings, result.infos, result.partial)

    async def _once(self, promql: str) -> QueryResult:
        assert self._session is not None
        # Prometheus' own evaluation deadline a little under ours, so a slow query reports "timeout", not a hang.
        params = {**self._params, "query": promql, "timeout": f"{max(100, int(self.settings.timeout * 900))}ms"}
        try:
            headers, tls = self._headers(), self._ssl()
        except (OSError, ValueError, ssl.SSLError) as err:
            # a credential file missing or unreadable (a Secret not mounted yet): the message names the file
            raise PrometheusError("connection", f"credentials: {err}") from err
        try:
            async with self._session.get(self._endpoint, params=params, headers=headers, ssl=tls) as resp:
                status = resp.status
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    body = None
        except TimeoutError as err:
            raise PrometheusError("timeout", f"no answer within {self.settings.timeout}s") from err
        except aiohttp.ClientError as err:
            raise PrometheusError("connection", f"{type(err).__name__}: {err}") from err
        except OSError as err:
            raise PrometheusError("connection", str(err)) from err
        return _parse(status, body)


def _parse(status: int, body: Any) -> QueryResult:
    if isinstance(body, dict) and body.get("status") == "error":
        kind: ErrorKind = "timeout" if body.get("errorType") == "timeout" else "query"
        if status >= 500 and kind == "query":
            kind = "http"
        raise PrometheusError(kind, f"{body.get('errorType')}: {body.get('error')}")
    if status == 429 or status >= 500:
        raise PrometheusError("http", f"HTTP {status}")
    if status != 200:
        raise PrometheusError("query", f"HTTP {status}")
    try:
        data = body["data"]
        if data["resultType"] != "vector":
            raise PrometheusError("query", f"result type {data['resultType']!r}, expected an instant vector")
        result = data["result"]
        if not isinstance(result, list):
            raise PrometheusError("bad_response", f"data.result: expected a list, got {type(result).__name__}")
        series = [_series(i, item) for i, item in enumerate(result)]
        warnings, infos = _strings(body, "warnings"), _strings(body, "infos")
    except (KeyError, IndexError, TypeError) as err:
        raise PrometheusError("bad_response", f"unexpected response shape: {err!r}") from err
    return QueryResult(series, 1, warnings, infos, is_partial(body, warnings))


def _strings(body: dict[str, Any], key: str) -> tuple[str, ...]:
    value = body.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PrometheusError("bad_response", f"{key}: expected a list of strings, got {value!r:.120}")
    return tuple(value)


def _series(index: int, item: Any) -> Series:
    """One vector sample, its types checked: labels are strings, the value is ``[time, "string"]``. Prometheus
    never sends anything else, so a sample that does comes from a broken endpoint: the whole answer is refused
    (``bad_response``) rather than half-trusted."""
    metric, value = item["metric"], item["value"]
    if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise PrometheusError("bad_response", f"result[{index}].metric: labels must be strings, got {metric!r:.120}")
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str):
        raise PrometheusError("bad_response", f'result[{index}].value: expected [time, "number"], got {value!r:.80}')
    return Series(metric, value[1])
