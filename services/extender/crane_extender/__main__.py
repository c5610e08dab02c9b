"""``crane-scheduler-extender`` (``python -m crane_extender``): the Dynamic policy as a scheduler extender for
the stock kube-scheduler.

One process, one port (default 8888): ``POST /extender/filter``, ``POST /extender/prioritize``, and the usual
``/healthz``, ``/readyz`` (node cache synced, with ``--node-cache``) and ``/metrics``. ``--node-cache`` watches
nodes so kube-scheduler can send only names (``nodeCacheCapable: true``); ``--redis-url`` follows the
event-recorder's binding stream so bursts spread before the annotator's hot value catches up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import sys
from collections.abc import Coroutine, Sequence
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from kubernetes_asyncio import client

from crane_extender.recent import RecentBindings, follow_bindings
from crane_extender.server import DEFAULT_MAX_REQUEST_BYTES, Extender, ExtenderMetrics, make_app
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingSchema
from crane_shared.informer import Informer
from crane_shared.kube import make_api_client
from crane_shared.loadaware.dynamic import DynamicArgs, EstimateArgs, binding_horizon
from crane_shared.logs import configure_logging, get_logger
from crane_shared.policy import PolicyError, policy_or_default
from crane_shared.redisconn import redacted, redis_from_args
from crane_shared.service import Access, ServiceRuntime, client_certificate_required, concurrency_limit, server_tls
from crane_shared.settings import (
    EnvArgumentParser,
    add_common_flags,
    add_redis_flags,
    common_settings,
    positive_int,
)

log = get_logger("crane.extender")

URL_PATH = "/extender"


def _names(text: str) -> frozenset[str]:
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def build_parser() -> EnvArgumentParser:
    parser = EnvArgumentParser(prog="crane-scheduler-extender", description=__doc__)
    p = parser.add_argument_group("policy")
    p.add_argument(
        "--policy",
        env="CRANE_POLICY",
        default=None,
        help="DynamicSchedulerPolicy file (upstream format); upstream's default policy without it",
    )
    p.add_argument(
        "--stale",
        env="CRANE_STALE",
        choices=["fail-open", "fail-closed"],
        default="fail-open",
        help="nodes without fresh load data pass the filter (upstream) or fail it",
    )
    p.add_argument(
        "--legacy-zone",
        env="CRANE_LEGACY_ZONE",
        default="Asia/Shanghai",
        help="zone of legacy timestamps (local wall clock with a bare 'Z', as upstream writes them)",
    )
    p.add_argument(
        "--no-estimate",
        env="CRANE_NO_ESTIMATE",
        action="store_true",
        help="do not add the estimated usage of recently bound pods (needs --redis-url anyway)",
    )
    e = parser.add_argument_group("extender")
    e.add_argument(
        "--node-cache",
        env="CRANE_EXTENDER_NODE_CACHE",
        action="store_true",
        help="watch nodes, so kube-scheduler may send only node names (nodeCacheCapable: true)",
    )
    e.add_argument(
        "--binding-schedulers",
        env="CRANE_EXTENDER_BINDING_SCHEDULERS",
        type=_names,
        default=None,
        help="comma-separated scheduler names whose bindings count as recent (default: all, as the "
        "annotator's hot value)",
    )
    e.add_argument(
        "--max-request-bytes",
        env="CRANE_EXTENDER_MAX_REQUEST_BYTES",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="largest request body accepted (Nodes mode: ~8 KB/node)",
    )
    e.add_argument(
        "--max-concurrent-requests",
        env="CRANE_EXTENDER_MAX_CONCURRENT_REQUESTS",
        type=positive_int,
        default=16,
        help="filter/prioritize requests handled at once; more wait their turn (bounds memory: each may "
        "carry every node)",
    )
    t = parser.add_argument_group("TLS (kube-scheduler's extender enableHTTPS / tlsConfig)")
    t.add_argument(
        "--tls-cert-file",
        env="CRANE_EXTENDER_TLS_CERT_FILE",
        default=None,
        help="serving certificate (PEM); with --tls-private-key-file the extender serves HTTPS only",
    )
    t.add_argument("--tls-private-key-file", env="CRANE_EXTENDER_TLS_PRIVATE_KEY_FILE", default=None)
    t.add_argument(
        "--client-ca-file",
        env="CRANE_EXTENDER_CLIENT_CA_FILE",
        default=None,
        help="require a client certificate signed by this CA on the extender's routes (the certFile/keyFile of the "
        "extender's tlsConfig); /healthz, /readyz and /metrics are reached without one",
    )
    add_common_flags(parser, default_port=8888)
    add_redis_flags(parser)
    # Redis is optional here: without it the extender decides on annotations only.
    parser.set_defaults(redis_url=os.environ.get("CRANE_REDIS_URL"))
    return parser


def dynamic_args(ns: argparse.Namespace) -> DynamicArgs:
    """The policy and its options from flags; raises PolicyError / ValueError with a message for the operator."""
    policy = policy_or_default(ns.policy)
    try:
        zone = ZoneInfo(ns.legacy_zone)
    except (ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"--legacy-zone {ns.legacy_zone!r}: unknown time zone") from err
    return DynamicArgs(policy, legacy_zone=zone, stale=ns.stale, estimate=EstimateArgs(enabled=not ns.no_estimate))


def tls_context(ns: argparse.Namespace) -> ssl.SSLContext | None:
    """HTTPS when a certificate is given; raises ValueError naming the flag when the TLS flags do not fit."""
    if bool(ns.tls_cert_file) != bool(ns.tls_private_key_file):
        raise ValueError("--tls-cert-file and --tls-private-key-file go together")
    if ns.client_ca_file and not ns.tls_cert_file:
        raise ValueError(
            "--client-ca-file needs --tls-cert-file and --tls-private-key-file (client certificates "
            "are only checked over TLS)"
        )
    if not ns.tls_cert_file:
        return None
    try:
        return server_tls(ns.tls_cert_file, ns.tls_private_key_file, ns.client_ca_file)
    except (OSError, ssl.SSLError) as err:
        raise ValueError(f"--tls-cert-file/--tls-private-key-file/--client-ca-file: {err}") from err


async def serve(ns: argparse.Namespace, args: DynamicArgs, tls: ssl.SSLContext | None = None) -> int:
    settings = common_settings(ns)
    runtime = ServiceRuntime("crane-extender", settings.listen_host, settings.listen_port)
    runtime.configure_access(Access(settings.metrics_access), Access(settings.debug_access), settings.kube)
    runtime.ssl_context = tls
    metrics = ExtenderMetrics.create(runtime.registry)
    workers: list[Coroutine[Any, Any, None]] = []
    closers: list[Any] = []

    informer = None
    if ns.node_cache:
        api = await make_api_client(settings.kube)
        closers.append(api.close)
        informer = Informer("nodes", client.CoreV1Api(api).list_node)
        runtime.add_readiness_check("node-cache", informer.synced.is_set)
        workers.append(informer.run(runtime.stopping))

    recent = None
    if ns.redis_url:
        redis = redis_from_args(ns)
        closers.append(redis.aclose)
        recent = RecentBindings(binding_horizon(args), schedulers=ns.binding_schedulers)
        store = BindingStore(redis, BindingSchema(ns.redis_prefix))
        workers.append(
            follow_bindings(
                store, recent, runtime.stopping, on_record=lambda result: metrics.bindings.labels(result).inc()
            )
        )

    extender = Extender(args, informer=informer, recent=recent, metrics=metrics, max_request_bytes=ns.max_request_bytes)
    app = make_app(extender)
    if ns.client_ca_file:  # the extender's routes only: probes and metrics are reached without one
        app.middlewares.append(client_certificate_required)
    app.middlewares.append(concurrency_limit(ns.max_concurrent_requests))
    runtime.app.add_subapp(URL_PATH, app)
    log.info(
        "extender starting",
        url_path=URL_PATH,
        node_cache=bool(ns.node_cache),
        binding_stream=redacted(ns.redis_url) if ns.redis_url else None,
        stale=args.stale,
        estimate=args.estimate.enabled,
    )
    try:
        return await runtime.run(*workers)
    finally:
        for close in reversed(closers):
            await close()


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    configure_logging(ns.log_level, ns.log_format)
    try:
        args = dynamic_args(ns)
        tls = tls_context(ns)
    except (PolicyError, ValueError) as err:
        print(f"crane extender: {err}", file=sys.stderr)
        return 2
    return asyncio.run(serve(ns, args, tls))


if __name__ == "__main__":
    sys.exit(main())
