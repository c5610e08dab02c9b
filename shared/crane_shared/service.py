"""The service runtime every process shares: health, readiness, metrics, signals and graceful shutdown.

Modelled on aiohttp's own application structure: one ``web.Application`` that services extend with routes, plus
a supervisor that runs the service's long-lived tasks. ``/healthz`` says the process and its event loop are alive;
``/readyz`` runs every registered readiness check (caches synced, dependencies reachable) and reports the
leadership state; ``/metrics`` serves prometheus-client's registry. SIGTERM sets ``stopping``; workers finish
in-flight writes, then the supervisor cancels what is left after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from crane_shared.logs import get_logger
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
    """A serving TLS context (TLS 1.2+). With ``client_ca_file`` every client must present a certificate signed
    by that CA (client-certificate authentication, as kube-scheduler's extender ``tlsConfig`` can send)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(cafile=client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


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
        self._checks: dict[str, ReadinessCheck] = {}
        self._runner: web.AppRunner | None = None
        self.app = web.Application()
        self.app.router.add_get("/healthz", self._healthz)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/metrics", self._metrics)

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
