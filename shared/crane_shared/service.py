"""The service runtime every process shares: health, readiness, metrics, signals and graceful shutdown.

Modelled on aiohttp's own application structure: one ``web.Application`` that services extend with routes, plus
a supervisor that runs the service's long-lived tasks. ``/healthz`` says the process and its event loop are alive;
``/readyz`` runs every registered readiness check (caches synced, dependencies reachable) and reports the
leadership state; ``/metrics`` serves prometheus-client's registry. SIGTERM sets ``stopping``; workers finish
in-flight writes, then the supervisor cancels what is left after a grace period.

``/metrics`` and ``/debug/*`` are guarded (``--metrics-access``, ``--debug-access``): ``loopback`` serves them
only to clients on the pod's loopback (kubectl port-forward, a sidecar), ``delegated`` to callers whose bearer
token the API server authenticates (TokenReview) and authorizes for ``get`` on the path (SubjectAccessReview),
as kube-scheduler's secure port does, ``any`` to everyone. /healthz and /readyz stay open for the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import signal
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from enum import StrEnum
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from crane_shared.kube import KubeSettings, make_api_client, raw_json
from crane_shared.logs import LogOnce, get_logger
from crane_shared.worker import Worker

ReadinessCheck = Callable[[], Awaitable[bool] | bool]

log = get_logger("crane.service")


def query_params(request: web.Request, allowed: frozenset[str] | set[str] = frozenset()) -> dict[str, str]:
    """The request's query parameters, refused with 400 naming the parameter when unknown or repeated (a typo
    must not be silently ignored)."""
    params: dict[str, str] = {}
    for key, value in request.query.items():
        if key not in allowed:
            raise web.HTTPBadRequest(text=f"unknown query parameter {key!r}; allowed: {sorted(allowed) or 'none'}")
        if key in params:
            raise web.HTTPBadRequest(text=f"query parameter {key!r} given more than once")
        params[key] = value
    return params


def query_int(params: dict[str, str], name: str, default: int, *, minimum: int = 0, maximum: int = 10_000) -> int:
    """An integer query parameter in [minimum, maximum]; anything else is a 400 naming the parameter."""
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"query parameter {name!r} must be an integer, got {text[:40]!r}") from None
    if not minimum <= value <= maximum:
        raise web.HTTPBadRequest(text=f"query parameter {name!r} must be in [{minimum}, {maximum}], got {value}")
    return value


def server_tls(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ssl.SSLContext:
    """A serving TLS context (TLS 1.2+). With ``client_ca_file`` a client certificate is verified against that CA
    when one is presented (a certificate it did not sign fails the handshake); the routes that need one say so with
    ``client_certificate_required`` (kube-scheduler's extender ``tlsConfig`` sends one; the kubelet's probes and
    Prometheus do not, and must still reach ``/healthz``, ``/readyz`` and ``/metrics``)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(cafile=client_ca_file)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


@web.middleware
async def client_certificate_required(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp middleware: 403 unless the client presented a certificate the server's ``client_ca_file`` signed
    (``server_tls`` verified it in the handshake)."""
    transport = request.transport
    if transport is None or not transport.get_extra_info("peercert"):
        raise web.HTTPForbidden(text="a client certificate signed by the server's --client-ca-file is required")
    return await handler(request)


def concurrency_limit(limit: int) -> Any:
    """aiohttp middleware: at most ``limit`` requests handled at once; the rest wait their turn (their bodies are
    not read yet, so waiting costs a socket, not memory)."""
    if limit < 1:
        raise ValueError(f"the concurrency limit must be >= 1, got {limit}")
    slots = asyncio.Semaphore(limit)

    @web.middleware
    async def bounded(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
        async with slots:
            return await handler(request)

    return bounded


class Access(StrEnum):
    ANY = "any"
    LOOPBACK = "loopback"
    DELEGATED = "delegated"


def is_loopback(peer: str | None) -> bool:
    try:
        return peer is not None and ipaddress.ip_address(peer.split("%")[0]).is_loopback
    except ValueError:
        return False


class DelegatedAuth:
    """Kubernetes delegated authentication and authorization of a bearer token for a non-resource path, with
    answers cached for ``ttl`` seconds (kube's delegating authenticator caches 10 s) keyed by a token hash."""

    def __init__(self, api: client.ApiClient, ttl: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self._api = api
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[tuple[str, str], tuple[float, int]] = {}

    async def check(self, token: str, path: str) -> int:
        """200 when allowed, 401 when the token is not authenticated, 403 when not authorized."""
        key = (hashlib.sha256(token.encode()).hexdigest(), path)
        hit = self._cache.get(key)
        now = self._clock()
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        review = await raw_json(
            client.AuthenticationV1Api(self._api).create_token_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
                _preload_content=False,
            )
        )
        status = (review or {}).get("status") or {}
        verdict = 401
        if status.get("authenticated"):
            user = status.get("user") or {}
            spec: dict[str, Any] = {
                "user": user.get("username"),
                "groups": user.get("groups"),
                "uid": user.get("uid"),
                "extra": user.get("extra"),
                "nonResourceAttributes": {"path": path, "verb": "get"},
            }
            sar = await raw_json(
                client.AuthorizationV1Api(self._api).create_subject_access_review(
                    {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
                    _preload_content=False,
                )
            )
            verdict = 200 if ((sar or {}).get("status") or {}).get("allowed") else 403
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key] = (now, verdict)
        return verdict


class ServiceRuntime:
    def __init__(
        self, name: str, host: str = "0.0.0.0", port: int = 8080, registry: CollectorRegistry = REGISTRY
    ) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.registry = registry
        self.stopping = asyncio.Event()
        self.leadership = "not-applicable"
        self.ssl_context: ssl.SSLContext | None = None  # serve HTTPS when set (``server_tls``)
        self.access: dict[str, Access] = {"/metrics": Access.ANY, "/debug": Access.LOOPBACK}
        self._kube: KubeSettings | None = None
        self._auth_api: client.ApiClient | None = None
        self._auth: DelegatedAuth | None = None
        self._access_log = LogOnce(log)
        self._checks: dict[str, ReadinessCheck] = {}
        self._runner: web.AppRunner | None = None
        self.app = web.Application(middlewares=[self._guard])
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)

    def configure_access(self, metrics: Access, debug: Access, kube: KubeSettings | None = None) -> None:
        """Who may read /metrics and /debug/*; ``kube`` is needed for ``delegated`` (its own API client)."""
        if Access.DELEGATED in (metrics, debug) and kube is None:
            raise ValueError("delegated access needs the Kubernetes client settings")
        self.access = {"/metrics": metrics, "/debug": debug}
        self._kube = kube

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        path = request.path
        mode = next((m for p, m in self.access.items() if path == p or path.startswith(p + "/")), Access.ANY)
        if mode is Access.LOOPBACK and not is_loopback(request.remote):
            raise web.HTTPForbidden(
                text=f"{path} is served to loopback clients only (see --metrics-access/--debug-access)"
            )
        if mode is Access.DELEGATED:
            header = request.headers.get("Authorization", "")
            token = header[7:].strip() if header[:7].lower() == "bearer " else ""
            if not token:
                raise web.HTTPUnauthorized(text="a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
            try:
                verdict = await self._delegated().check(token, path)
            except Exception as err:  # the API server is unreachable: fail closed, without a stack trace
                self._access_log.warning("delegated-auth", "delegated authentication failed", error=repr(err))
                raise web.HTTPServiceUnavailable(text="cannot check the token now") from None
            if verdict == 401:
                raise web.HTTPUnauthorized(text="token not authenticated", headers={"WWW-Authenticate": "Bearer"})
            if verdict == 403:
                raise web.HTTPForbidden(text=f"not allowed to get {path}")
        return await handler(request)

    def _delegated(self) -> DelegatedAuth:
        if self._auth is None:
            raise RuntimeError("delegated access is configured but its API client is not open yet")
        return self._auth

    def add_readiness_check(self, name: str, check: ReadinessCheck) -> None:
        self._checks[name] = check

    async def readiness(self) -> dict[str, bool]:
        results: dict[str, bool] = {}
        for name, check in self._checks.items():
            try:
                value = check()
                results[name] = bool(await value) if isinstance(value, Awaitable) else bool(value)
            except Exception:
                results[name] = False
        return results

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "service": self.name})

    async def _readyz(self, request: web.Request) -> web.Response:
        checks = await self.readiness()
        ready = all(checks.values()) and not self.stopping.is_set()
        body = {"ready": ready, "checks": checks, "leadership": self.leadership}
        return web.json_response(body, status=200 if ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start_http(self) -> None:
        if Access.DELEGATED in self.access.values() and self._auth is None:
            assert self._kube is not None
            self._auth_api = await make_api_client(self._kube)
            self._auth = DelegatedAuth(self._auth_api)
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        await site.start()
        if self.port == 0:  # tests ask for any free port
            server = site._server
            assert server is not None and hasattr(server, "sockets")
            self.port = server.sockets[0].getsockname()[1]
        scheme = "https" if self.ssl_context else "http"
        log.info("serving", service=self.name, address=f"{scheme}://{self.host}:{self.port}")

    async def stop_http(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._auth_api is not None:
            await self._auth_api.close()
            self._auth_api, self._auth = None, None

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)

    async def run_workers(self, *workers: Worker, grace: float = 10.0) -> int:
        """``run`` for objects keeping the worker contract: each one's ``run(self.stopping)``."""
        return await self.run(*(worker.run(self.stopping) for worker in workers), grace=grace)

    async def run(self, *workers: Coroutine[Any, Any, None], grace: float = 10.0) -> int:
        """Serve HTTP and run ``workers`` until SIGTERM or until one of them fails; returns the exit code.

        Workers watch ``self.stopping`` to finish in-flight work; those still running ``grace`` seconds after
        the stop are cancelled.
        """
        self.install_signal_handlers()
        await self.start_http()
        tasks = [asyncio.create_task(w, name=getattr(w, "__name__", "worker")) for w in workers]
        stop_wait = asyncio.create_task(self.stopping.wait())
        exit_code = 0
        try:
            done, _ = await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stop_wait and not task.cancelled() and task.exception() is not None:
                    log.error("worker failed", worker=task.get_name(), exc_info=task.exception())
                    exit_code = 1
            self.stopping.set()
            log.info("stopping", service=self.name)
            pending = [t for t in tasks if not t.done()]
            if pending:
                _, still = await asyncio.wait(pending, timeout=grace)
                for task in still:
                    task.cancel()
                for task in still:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        finally:
            stop_wait.cancel()
            await self.stop_http()
        return exit_code


async def until_stopped(work: Coroutine[Any, Any, None], stopping: asyncio.Event) -> None:
    """``work``, then the stop. For a loop that may end early with nothing to do (a scheduler plugin with nothing
    to watch): under ``ServiceRuntime.run`` a worker that returns stops the service. A failure still does."""
    await work
    await stopping.wait()
