"""Kubernetes client construction: kubeconfig or in-cluster config, with client-side QPS/burst like client-go.

kubernetes-asyncio has no client-side rate limiter; without one a burst of binds or patches can swamp the API
server (and the API server's priority-and-fairness will answer 429s). ``make_api_client`` wraps the REST client
with a token bucket so every request, including watches being (re)opened, takes a token.

kubernetes-asyncio sends no timeout unless a call passes ``_request_timeout``, so a blackholed connection would
hang a call for minutes. The same wrapper gives every request that passes none a default one (``request_timeout``,
as client-go's ``rest.Config.Timeout``): the whole exchange for ordinary requests; for watches, which stream by
design, the connect time plus a read gap of the watch's own ``timeoutSeconds`` and the default (a watch opened
without ``timeoutSeconds`` gets the connect timeout only: the API server closes it within its
``min-request-timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.helpers
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from yarl import URL

from crane_shared.events import micro_time

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT",
    "ApiCallError",
    "KubeSettings",
    "TokenBucket",
    "api_client_from_dict",
    "api_failure",
    "default_timeout",
    "make_api_client",
    "micro_time",
    "raw_json",
    "served_versions",
    "skip_per_request_env_lookups",
]


@dataclass(frozen=True)
class KubeSettings:
    kubeconfig: str | None = None
    context: str | None = None
    qps: float = 50.0
    burst: int = 100
    request_timeout: float = 30.0  # seconds; the default for calls that pass no ``_request_timeout``


DEFAULT_REQUEST_TIMEOUT = KubeSettings.request_timeout


class TokenBucket:
    """Token bucket limiter: ``burst`` tokens, refilled at ``qps`` per second; qps <= 0 disables it."""

    def __init__(self, qps: float, burst: int, clock: Any = time.monotonic) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._clock = clock
        self._last = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now

    async def acquire(self) -> None:
        if self.qps <= 0:
            return
        async with self._lock:  # FIFO: waiters are served in arrival order
            self._refill()
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.qps)
                self._refill()
            self._tokens -= 1

    def refund(self) -> None:
        """Give back the token of a request that was not sent after all (it was refused once it had its token), as
        client-go's limiter cancels the reservation of a request whose context ends while it waits: a backlog of
        requests that will be refused must not take the tokens of those that can still go out."""
        if self.qps > 0:
            self._tokens = min(float(self.burst), self._tokens + 1)


def env_proxy(url: str) -> str | None:
    """The proxy the environment (``HTTPS_PROXY``/``HTTP_PROXY``, less ``NO_PROXY``) gives ``url``, as aiohttp
    resolves it for a session with ``trust_env``; None when none applies."""
    with contextlib.suppress(LookupError):
        proxy, _ = aiohttp.helpers.get_env_proxy_for_url(URL(url))
        return str(proxy)
    return None


def skip_per_request_env_lookups(api: client.ApiClient) -> bool:
    """Switch off aiohttp's per-request proxy and ``.netrc`` lookups when their answer cannot change.

    kubernetes-asyncio opens its session with ``trust_env=True``, so every request looks up ``~/.netrc`` and the
    proxy variables in a thread-pool hop: about half the CPU of a small PATCH or bind. When no proxy applies to
    the API server and there is no netrc file, the lookups are answered once, here; otherwise nothing changes.
    Returns True when they were switched off."""
    if env_proxy(api.configuration.host) is not None:
        return False  # a proxy applies: keep aiohttp's handling
    if aiohttp.helpers.netrc_from_env() is not None:
        return False
    api.rest_client.pool_manager._trust_env = False  # no public setter; aiohttp reads it per request
    return True


def default_timeout(query_params: Any, timeout: float) -> aiohttp.ClientTimeout:
    """The timeout a request gets when its call passed none (see the module docstring)."""
    params = dict(query_params or [])
    if str(params.get("watch", "")).lower() not in ("true", "1"):
        return aiohttp.ClientTimeout(total=timeout)
    server_side = params.get("timeoutSeconds")
    sock_read = float(server_side) + timeout if server_side else None
    return aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=timeout, sock_read=sock_read)


def _finish(api: client.ApiClient, bucket: TokenBucket, request_timeout: float) -> client.ApiClient:
    skip_per_request_env_lookups(api)
    rest = api.rest_client
    original = rest.request

    async def request(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("_request_timeout") and request_timeout > 0:
            kwargs["_request_timeout"] = default_timeout(kwargs.get("query_params"), request_timeout)
        await bucket.acquire()
        return await original(*args, **kwargs)

    rest.request = request
    return api


async def make_api_client(settings: KubeSettings, *, request_timeout: float | None = None) -> client.ApiClient:
    """An ApiClient from the kubeconfig when given, else from the in-cluster service account. Each call makes a
    new client: its own connection pool and rate limiter. ``request_timeout`` overrides the settings' default."""
    configuration = client.Configuration()
    if settings.kubeconfig:
        await config.load_kube_config(
            config_file=settings.kubeconfig, context=settings.context, client_configuration=configuration
        )
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, settings.burst)
    timeout = settings.request_timeout if request_timeout is None else request_timeout
    return _finish(client.ApiClient(configuration=configuration), TokenBucket(settings.qps, settings.burst), timeout)


async def api_client_from_dict(
    config_dict: dict[str, Any], qps: float = 0, burst: int = 100, request_timeout: float = DEFAULT_REQUEST_TIMEOUT
) -> client.ApiClient:
    """An ApiClient from an in-memory kubeconfig (tests, sandbox)."""
    configuration = client.Configuration()
    await config.load_kube_config_from_dict(config_dict=config_dict, client_configuration=configuration)
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, burst)
    return _finish(client.ApiClient(configuration=configuration), TokenBucket(qps, burst), request_timeout)


async def raw_json(call: Awaitable[Any]) -> Any:
    """Await a client call made with ``_preload_content=False`` and decode its JSON body.

    kubernetes-asyncio skips its status check for such calls, so a 404 or 409 would otherwise look like
    success: this raises ``ApiException`` for any non-2xx status, as a preloaded call would."""
    resp = await call
    data = await resp.read()
    if not 200 <= resp.status <= 299:
        err = ApiException(status=resp.status, reason=resp.reason)
        err.body, err.headers = data.decode(errors="replace"), resp.headers
        raise err
    return json.loads(data) if data else None


async def served_versions(api: client.ApiClient, group: str) -> frozenset[str]:
    """The versions of API group ``group`` the server serves, from discovery (``GET /apis``); empty when the group
    is not served. How a component that supports several Kubernetes releases picks the API shape to speak (e.g.
    ``scheduling.k8s.io``: 1.35's ``v1alpha1`` Workloads or 1.37's ``v1beta1`` PodGroups)."""
    found = await raw_json(client.ApisApi(api).get_api_versions(_preload_content=False))
    for entry in (found or {}).get("groups") or ():
        if entry.get("name") == group:
            return frozenset(str(v.get("version", "")) for v in entry.get("versions") or ())
    return frozenset()


class ApiCallError(ApiException):
    """A failed API call that names itself: the verb, the object (``"pod ns/name"``) and the HTTP status
    (``None``: no answer came, a transport error). Its ``str`` is one line with the three and the server's message:
    an ``ApiException``'s repr is ``ApiException()`` and its str spans lines of headers, so a log line with either
    said neither which write failed nor how."""

    def __init__(self, verb: str, obj: str, status: int | None, text: str = "") -> None:
        super().__init__(status=status, reason=text[:300])
        self.verb, self.object, self.text = verb, obj, text
        self.body = text.encode()

    def __str__(self) -> str:
        answer = "no answer" if self.status is None else f"HTTP {self.status}"
        return f"{self.verb} {self.object}: {answer}: {self.text[:300]}"

    @classmethod
    def of(cls, verb: str, obj: str, err: BaseException) -> ApiCallError:
        """``err`` (raised by the call ``verb`` of ``obj``) as an ``ApiCallError``: itself if it is one; the
        server's own message where it answered with a ``Status``; the exception's repr when no answer came."""
        if isinstance(err, ApiCallError):
            return err
        if isinstance(err, ApiException):
            return cls(verb, obj, err.status, _server_message(err))
        return cls(verb, obj, None, repr(err))

    def log_fields(self) -> dict[str, Any]:
        return {"verb": self.verb, "object": self.object, "status": self.status, "error": self.text[:300]}


def api_failure(verb: str, obj: str, err: BaseException) -> dict[str, Any]:
    """The fields of a log line about a failed API call (``verb`` of ``obj``, e.g. ``"update"``, ``"lease
    ns/name"``): the verb, the object, the HTTP status (``None``: no answer) and the error in one line. An
    ``ApiCallError`` names its own call."""
    return ApiCallError.of(verb, obj, err).log_fields()


def _server_message(err: ApiException) -> str:
    """The ``message`` of the ``Status`` the server answered with, else the reason phrase."""
    body = err.body.decode(errors="replace") if isinstance(err.body, bytes) else str(err.body or "")
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        message = json.loads(body).get("message")
        if message:
            return str(message)[:300]
    return str(err.reason or body or "")[:300]


def tls_context(configuration: client.Configuration) -> ssl.SSLContext | None:
    """The TLS settings of a kubernetes-asyncio ``Configuration`` as its own REST client derives them (CA, client
    certificate, ``insecure-skip-tls-verify``, strict X.509 checks), for the clients that speak HTTP themselves
    (the annotator's patcher, the scheduler's API writer); ``None`` for a plain-HTTP server."""
    if not configuration.host.startswith("https"):
        return None
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context
