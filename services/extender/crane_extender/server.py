"""HTTP side of the extender: thin aiohttp handlers around ``protocol``, mountable on any ServiceRuntime app.

``runtime.app.add_subapp("/extender", make_app(extender))`` serves ``POST /extender/filter`` and
``POST /extender/prioritize`` next to the runtime's /healthz, /readyz and /metrics. Every answer is HTTP 200 with
a body kube-scheduler can decode: a malformed request or an internal failure becomes ``Error`` (filter) or an
empty priority list (prioritize), is counted, and is logged once per kind, never a 500 with a stack trace.

Request bodies are read from the stream with our own limit, not aiohttp's ``client_max_size`` (1 MiB by default
and set by whichever app is mounted on top): without a node cache a request carries every candidate node object,
about 20 MB for 5000 nodes. A body above ``PARSE_OFF_LOOP_BYTES`` is decoded in a worker thread
(``asyncio.to_thread``), so health probes, scrapes and small requests keep being served meanwhile; the decisions
themselves run on the loop (they read the node cache the informer updates there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from crane_extender.memo import LoadMemo
from crane_extender.protocol import (
    Decide,
    ExtenderArgs,
    MalformedRequest,
    NodeView,
    filter_error,
    filter_nodes,
    filter_verdicts,
    node_view,
    parse_args,
    prioritize_nodes,
    prioritize_verdicts,
)
from crane_extender.recent import RecentBindings
from crane_shared.informer import Informer
from crane_shared.loadaware.dynamic import DynamicArgs, RecentBinding
from crane_shared.logs import LogOnce, get_logger
from crane_shared.metrics import MetricSet

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "EXTENDER", "Extender", "ExtenderMetrics", "make_app"]

log = get_logger("crane.extender")

Verb = Literal["filter", "prioritize"]
DEFAULT_MAX_REQUEST_BYTES = 256 * 1024 * 1024
PARSE_OFF_LOOP_BYTES = 256 * 1024
"""bodies larger than this are decoded off the event loop (a few hundred nodes in Nodes mode)"""
EXTENDER: web.AppKey[Extender] = web.AppKey("extender")


class Unavailable(Exception):
    """The request is valid but cannot be answered right now (node cache not synced, no cache at all)."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class ExtenderMetrics(MetricSet):
    """The extender's metrics, registered in the registry it is given; nothing at import time."""

    prefix = "crane_extender_"

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.requests: Counter = self.counter(
            "requests_total",
            "Extender requests by verb and result (ok, malformed, unavailable, error; bind and preempt: not-served)",
            ["verb", "result"],
        )
        self.duration: Histogram = self.histogram(
            "request_duration_seconds",
            "Extender request handling time, body read to response",
            ["verb"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.malformed: Counter = self.counter(
            "malformed_requests_total",
            "Requests answered with Error because they are not ExtenderArgs, by kind",
            ["kind"],
        )
        self.verdicts: Counter = self.counter(
            "filter_nodes_total", "Nodes judged by the filter verb, by verdict (passed, failed, unknown)", ["verdict"]
        )
        self.bindings: Counter = self.counter(
            "binding_records_total",
            "Binding-stream records, by what became of them (counted, ignored, undecodable, stream-error)",
            ["result"],
        )
        # the same counter as the Dynamic plugin's crane_scheduler_dynamic_malformed_annotations
        self.malformed_annotations: Counter = self.counter(
            "malformed_annotations",
            "Load annotations that could not be decoded, by metric (once per annotation change per node)",
            ["metric"],
        )

        # the same counter as the Dynamic plugin's crane_scheduler_dynamic_batch_usage_ignored
        self.batch_usage_ignored: Counter = self.counter(
            "batch_usage_ignored",
            "Batch-usage annotations found stale: regular pods saw the node's whole usage (once per annotation)",
        )

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> ExtenderMetrics:
        """The extender's metrics in ``registry`` (a fresh one when None)."""
        return cls(registry if registry is not None else CollectorRegistry())


class Extender:
    """The extender's state: policy (``args``; assign a new value to reload), node cache, recent bindings.

    ``informer`` is the node informer for nodeCacheCapable mode (None: requests must carry Nodes). ``recent``
    follows the binding stream (None: annotations only).
    """

    def __init__(
        self,
        args: DynamicArgs,
        *,
        informer: Informer | None = None,
        recent: RecentBindings | None = None,
        metrics: ExtenderMetrics | None = None,
        clock: Callable[[], float] = time.time,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        self.args = args
        self.informer = informer
        self.recent = recent
        self.metrics = metrics or ExtenderMetrics.create()
        self.clock = clock
        self.max_request_bytes = max_request_bytes
        self._once = LogOnce(log)
        self._large = asyncio.Semaphore(1)  # bodies past PARSE_OFF_LOOP_BYTES: read and decoded one at a time
        self.memo = LoadMemo(self._malformed_annotations, self._stale_batch)
        self._views: dict[str, tuple[dict[str, Any], NodeView]] = {}

    def _malformed_annotations(self, node: str, metrics: tuple[str, ...]) -> None:
        """The memo's report of a node's undecodable annotations (once per change): counted and logged once per
        metric, as the Dynamic plugin does."""
        for metric in metrics:
            self.metrics.malformed_annotations.labels(metric).inc()
            self._once.warning(
                f"malformed-annotation:{metric}", "malformed load annotation skipped", node=node, metric=metric
            )

    def _stale_batch(self, node: str) -> None:
        self.metrics.batch_usage_ignored.inc()
        self._once.warning("batch-stale", "stale batch-usage annotation: regular pods see the whole usage", node=node)

    def decide(self, now: float) -> Decide:
        """Inputs of the decisions at ``now``; node loads come from the memo while provably unchanged."""
        informer, recent = self.informer, self.recent

        views = self._views

        def resolve(name: str) -> NodeView | None:
            node = informer.cache.get(name) if informer is not None else None
            if node is None:
                return None
            seen = views.get(name)
            if seen is not None and seen[0] is node:  # the informer stores a new object on every change
                return seen[1]
            view = node_view(node)
            if informer is not None and len(views) > 2 * len(informer.cache) + 100:
                views.clear()  # deleted nodes: forget them now and then
            views[name] = (node, view)
            return view

        def recent_of(name: str) -> tuple[RecentBinding, ...]:
            return recent.for_node(name, now) if recent is not None else ()

        version_of = recent.version if recent is not None else _no_version
        retention = recent.retention.total_seconds() if recent is not None else math.inf
        at = datetime.fromtimestamp(now, UTC)
        verdicts = self.memo.loader(self.args, at, recent_of, version_of, retention)
        return Decide(self.args, at, resolve, recent_of, verdict=verdicts)

    def answer(self, verb: Verb, body: bytes | ExtenderArgs | MalformedRequest) -> tuple[Any, str]:
        """The response body for one request (raw, or as ``parse_off_loop`` decoded it) and its result label;
        never raises."""
        try:
            if isinstance(body, MalformedRequest):
                raise body
            req = body if isinstance(body, ExtenderArgs) else parse_args(body)
            self._check_cache(req)
            if self.recent is not None:
                self.recent.remember(req.pod)
            now = self.clock()
            decide = self.decide(now)
            if req.node_names is not None and self.informer is not None:
                # node cache mode: verdicts proven current per node in one tight loop
                versions = self.recent.versions if self.recent is not None else _NO_VERSIONS
                verdicts, unknown = self.memo.cached(
                    req.node_names,
                    self.informer.cache,
                    versions,
                    now,
                    lambda name: decide.verdict_of(name, decide.resolve(name)),
                )
                if verb == "prioritize":
                    return prioritize_verdicts(req, verdicts, self.args), "ok"
                result = filter_verdicts(req, verdicts, unknown, self.args.estimate)
            elif verb == "prioritize":
                return prioritize_nodes(req, decide), "ok"
            else:
                result = filter_nodes(req, decide)
            self._count_verdicts(req, result)
            return result, "ok"
        except MalformedRequest as err:
            self.metrics.malformed.labels(err.kind).inc()
            self._once.warning(f"malformed:{err.kind}", "malformed extender request", verb=verb, error=str(err))
            return self._failure(verb, f"crane extender: malformed {verb} request: {err}"), "malformed"
        except Unavailable as err:
            self._once.warning(
                f"unavailable:{err.kind}", "extender request cannot be answered", verb=verb, error=str(err)
            )
            return self._failure(verb, f"crane extender: {err}"), "unavailable"
        except Exception as err:  # a bug must cost one decision (the scheduler skips us), not a 500
            self._once.warning(f"error:{type(err).__name__}", "extender request failed", verb=verb, exc_info=True)
            return self._failure(verb, f"crane extender: internal error: {type(err).__name__}: {err}"), "error"

    def _check_cache(self, req: ExtenderArgs) -> None:
        if req.nodes is not None:
            return
        if self.informer is None:
            raise Unavailable(
                "no-node-cache",
                "this extender runs without a node cache and needs Nodes: set "
                "nodeCacheCapable: false in the scheduler's extender config, or start the "
                "extender with --node-cache",
            )
        if not self.informer.synced.is_set():
            raise Unavailable("cache-not-synced", "node cache not synced yet")

    def _count_verdicts(self, req: ExtenderArgs, result: dict[str, Any]) -> None:
        failed, unknown = len(result["FailedNodes"]), len(result["FailedAndUnresolvableNodes"])
        verdicts = self.metrics.verdicts
        verdicts.labels("passed").inc(max(0, len(req.names) - failed - unknown))
        verdicts.labels("failed").inc(failed)
        verdicts.labels("unknown").inc(unknown)

    @staticmethod
    def _failure(verb: Verb, message: str) -> Any:
        return filter_error(message) if verb == "filter" else []

    async def handle(self, request: web.Request, verb: Verb) -> web.Response:
        started = time.perf_counter()
        large = request.content_length is None or request.content_length > PARSE_OFF_LOOP_BYTES
        async with self._large if large else contextlib.nullcontext():  # one large body in memory at a time
            try:
                body = await _read_body(request, self.max_request_bytes)
            except _TooLarge as err:
                self.metrics.malformed.labels("too-large").inc()
                self._once.warning("malformed:too-large", "extender request too large", verb=verb, error=str(err))
                result: Any = self._failure(verb, f"crane extender: {err}")
                outcome = "malformed"
            else:
                result, outcome = self.answer(verb, await parse_off_loop(body))
                del body
        response = web.json_response(result, dumps=_dumps)
        self.metrics.requests.labels(verb, outcome).inc()
        self.metrics.duration.labels(verb).observe(time.perf_counter() - started)
        return response


async def parse_off_loop(body: bytes) -> bytes | ExtenderArgs | MalformedRequest:
    """A large body decoded in a worker thread (``parse_args`` is pure); a small one is left to ``answer``, where
    decoding costs less than the thread hop."""
    if len(body) <= PARSE_OFF_LOOP_BYTES:
        return body
    try:
        return await asyncio.to_thread(parse_args, body)
    except MalformedRequest as err:
        return err
    except Exception as err:  # a bug must cost one decision, not a 500 (``answer`` catches it for small bodies)
        return MalformedRequest("unreadable", f"{type(err).__name__}: {err}")


def _no_version(name: str) -> int:
    return 0


_NO_VERSIONS: dict[str, int] = {}


def _dumps(obj: Any) -> str:
    """Compact JSON: without a node cache the filter answer echoes every passing node object."""
    return json.dumps(obj, separators=(",", ":"), check_circular=False)


class _TooLarge(Exception):
    pass


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body, refused past ``limit`` (by its Content-Length before reading any of it)."""
    too_large = f"request body larger than {limit} bytes (--max-request-bytes)"
    if request.content_length is not None and request.content_length > limit:
        raise _TooLarge(too_large)
    body = bytearray()
    async for chunk in request.content.iter_chunked(1 << 20):
        if len(body) + len(chunk) > limit:
            raise _TooLarge(too_large)
        body += chunk
    return bytes(body)


async def _filter(request: web.Request) -> web.Response:
    return await request.app[EXTENDER].handle(request, "filter")


async def _prioritize(request: web.Request) -> web.Response:
    return await request.app[EXTENDER].handle(request, "prioritize")


async def _not_served(request: web.Request) -> web.Response:
    """``bindVerb`` / ``preemptVerb`` configured for this extender: answered with the protocol's ``Error`` (kube-
    scheduler logs it and fails that bind or preemption), saying which setting to remove, rather than a bare 404."""
    verb = request.path.rsplit("/", 1)[-1]
    setting = "bindVerb" if verb == "bind" else "preemptVerb"
    message = f"crane extender: {verb} is not served (it filters and prioritizes only): remove {setting}"
    extender = request.app[EXTENDER]
    extender.metrics.requests.labels(verb, "not-served").inc()
    extender._once.warning(f"not-served:{verb}", "extender verb not served", verb=verb)
    return web.json_response({"Error": message})


def make_app(extender: Extender) -> web.Application:
    """A sub-application with ``POST /filter`` and ``POST /prioritize`` (``/bind`` and ``/preempt`` answer that they
    are not served); mount it under the urlPrefix path."""
    app = web.Application()
    app[EXTENDER] = extender
    app.router.add_post("/filter", _filter)
    app.router.add_post("/prioritize", _prioritize)
    app.router.add_post("/bind", _not_served)
    app.router.add_post("/preempt", _not_served)
    return app
