"""Kubernetes client construction: kubeconfig or in-cluster config, with client-side QPS/burst like client-go.

kubernetes-asyncio has no client-side rate limiter; without one a burst of binds or patches can swamp the API
server (and the API server's priority-and-fairness will answer 429s). ``make_api_client`` wraps the REST client
with a token bucket so every request, including watches being (re)opened, takes a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
    "KubeSettings",
    "TokenBucket",
    "api_client_from_dict",
    "make_api_client",
    "micro_time",
    "raw_json",
    "skip_per_request_env_lookups",
]


@dataclass(frozen=True)
class KubeSettings:
    kubeconfig: str | None = None
    context: str | None = None
    qps: float = 50.0
    burst: int = 100


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


def skip_per_request_env_lookups(api: client.ApiClient) -> bool:
    """Switch off aiohttp's per-request proxy and ``.netrc`` lookups when their answer cannot change.

    kubernetes-asyncio opens its session with ``trust_env=True``, so every request looks up ``~/.netrc`` and the
    proxy variables in a thread-pool hop: about half the CPU of a small PATCH or bind. When no proxy applies to
    the API server and there is no netrc file, the lookups are answered once, here; otherwise nothing changes.
    Returns True when they were switched off."""
    with contextlib.suppress(LookupError):
        aiohttp.helpers.get_env_proxy_for_url(URL(api.configuration.host))
        return False  # a proxy applies: keep aiohttp's handling
    if aiohttp.helpers.netrc_from_env() is not None:
        return False
    api.rest_client.pool_manager._trust_env = False  # no public setter; aiohttp reads it per request
    return True


def _finish(api: client.ApiClient, bucket: TokenBucket) -> client.ApiClient:
    skip_per_request_env_lookups(api)
    rest = api.rest_client
    original = rest.request

    async def request(*args: Any, **kwargs: Any) -> Any:
        await bucket.acquire()
        return await original(*args, **kwargs)

    rest.request = request
    return api


async def make_api_client(settings: KubeSettings) -> client.ApiClient:
    """An ApiClient from the kubeconfig when given, else from the in-cluster service account."""
    configuration = client.Configuration()
    if settings.kubeconfig:
        await config.load_kube_config(
            config_file=settings.kubeconfig, context=settings.context, client_configuration=configuration
        )
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, settings.burst)
    return _finish(client.ApiClient(configuration=configuration), TokenBucket(settings.qps, settings.burst))


async def api_client_from_dict(config_dict: dict[str, Any], qps: float = 0, burst: int = 100) -> client.ApiClient:
    """An ApiClient from an in-memory kubeconfig (tests, sandbox)."""
    configuration = client.Configuration()
    await config.load_kube_config_from_dict(config_dict=config_dict, client_configuration=configuration)
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, burst)
    return _finish(client.ApiClient(configuration=configuration), TokenBucket(qps, burst))


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
