"""Prometheus HTTP API client for instant queries: bounded timeouts, retries with backoff, TLS and auth.

Shared by the annotator (node usage) and the descheduler (per-pod usage); the flags are
``crane_shared.settings.add_prometheus_flags``.

Thin on purpose: it returns the series as sent (labels and value strings); matching and conversion are pure
functions elsewhere. Retries cover what a retry can fix (timeouts, connection errors, 5xx, 429, Prometheus'
own ``timeout`` error); a PromQL error (4xx ``bad_data``) fails at once. A bearer token file is re-read on every
request so a rotated token or password is picked up without a restart.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp

from crane_shared.retry import Backoff, retry

ErrorKind = Literal["timeout", "connection", "http", "query", "bad_response"]
_RETRYABLE: frozenset[ErrorKind] = frozenset({"timeout", "connection", "http"})


@dataclass(frozen=True)
class Series:
    """One sample of an instant query: its labels and the raw value string Prometheus sent."""

    labels: Mapping[str, str]
    value: str


@dataclass(frozen=True)
class PrometheusSettings:
    url: str
    timeout: float = 10.0
    retries: int = 2
    backoff: float = 0.5
    backoff_max: float = 5.0
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    bearer_token_file: str | None = None
    username: str | None = None
    password_file: str | None = None


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


class QueryClient(Protocol):
    async def query(self, promql: str) -> QueryResult: ...


class PrometheusClient:
    def __init__(self, settings: PrometheusSettings) -> None:
        self.settings = settings
        self._endpoint = settings.url.rstrip("/") + "/api/v1/query"
        self._session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        if self.settings.insecure_skip_verify:
            return False
        if self.settings.ca_file:
            return ssl.create_default_context(cafile=self.settings.ca_file)
        return True

    def _headers(self) -> dict[str, str]:
        """Credentials, read from their files for every request so rotated secrets are picked up."""
        if self.settings.bearer_token_file:
            token = Path(self.settings.bearer_token_file).read_text().strip()
            return {"Authorization": f"Bearer {token}"}
        if self.settings.username is not None:
            password = ""
            if self.settings.password_file:
                password = Path(self.settings.password_file).read_text().strip()
            basic = base64.b64encode(f"{self.settings.username}:{password}".encode()).decode()
            return {"Authorization": f"Basic {basic}"}
        return {}

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl(), limit=16)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def query(self, promql: str) -> QueryResult:
        """One instant query, retried on transient failures; raises ``PrometheusError`` when all attempts fail."""
        await self.start()
        attempts = 0

        async def once() -> list[Series]:
            nonlocal attempts
            attempts += 1
            try:
                return await self._once(promql)
            except PrometheusError as err:
                err.attempts = attempts
                raise

        series = await retry(
            once,
            attempts=self.settings.retries + 1,
            backoff=Backoff(
                initial=self.settings.backoff, maximum=max(self.settings.backoff, self.settings.backoff_max)
            ),
            retryable=lambda err: isinstance(err, PrometheusError) and err.kind in _RETRYABLE,
        )
        return QueryResult(series, attempts)

    async def _once(self, promql: str) -> list[Series]:
        assert self._session is not None
        # Prometheus' own evaluation deadline a little under ours, so a slow query reports "timeout", not a hang.
        params = {"query": promql, "timeout": f"{max(100, int(self.settings.timeout * 900))}ms"}
        try:
            async with self._session.get(self._endpoint, params=params, headers=self._headers()) as resp:
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


def _parse(status: int, body: Any) -> list[Series]:
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
        return [_series(i, item) for i, item in enumerate(result)]
    except (KeyError, IndexError, TypeError) as err:
        raise PrometheusError("bad_response", f"unexpected response shape: {err!r}") from err


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
