"""Command line (every flag also as a ``CRANE_*`` variable) and the validated settings it produces.

A bad policy file, duration or option refuses to start with a message naming it, rather than running with a
surprise.
"""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from crane_annotator.patches import Stamp
from crane_annotator.prometheus import PrometheusSettings
from crane_shared.annotations import TimestampStyle
from crane_shared.durations import DurationError, parse_duration
from crane_shared.policy import DynamicSchedulerPolicy, PolicyError, policy_or_default
from crane_shared.settings import CommonSettings, EnvArgumentParser, add_common_flags, add_redis_flags, common_settings

DEFAULT_PORT = 8082


def _seconds(text: str) -> float:
    """A Go duration (``15s``, ``250ms``, ``1m``) or plain seconds, as seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text).total_seconds()
    except DurationError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _positive(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class AnnotatorConfig:
    common: CommonSettings
    policy: DynamicSchedulerPolicy
    policy_source: str
    prometheus: PrometheusSettings
    instance_label: str
    node_selector: str | None
    redis_url: str
    redis_password_file: str | None
    redis_ca_file: str | None
    redis_prefix: str
    lease_namespace: str
    lease_name: str
    identity: str
    lease_duration: float
    renew_deadline: float
    retry_period: float
    hot_value_interval: float
    hot_value_debounce: float
    hot_value_max_age: float
    patch_concurrency: int
    retry_base: float
    stamp: Stamp


def build_parser() -> EnvArgumentParser:
    parser = EnvArgumentParser(
        prog="crane-annotator",
        description="Annotates nodes with their load from Prometheus and their hot value from Redis, for the "
        "crane load-aware scheduler. Only the Lease holder writes.",
    )
    add_common_flags(parser, default_port=DEFAULT_PORT)
    add_redis_flags(parser)
    p = parser.add_argument_group("policy")
    p.add_argument(
        "--policy",
        env="CRANE_POLICY",
        default=None,
        help="DynamicSchedulerPolicy file (default: the shipped upstream default policy)",
    )
    q = parser.add_argument_group("prometheus")
    q.add_argument(
        "--prometheus-url",
        env="CRANE_PROMETHEUS_URL",
        default="http://127.0.0.1:9090",
        help="base URL of the Prometheus HTTP API (http:// or https://, may carry a path prefix)",
    )
    q.add_argument(
        "--prometheus-timeout",
        env="CRANE_PROMETHEUS_TIMEOUT",
        type=_positive,
        default=10.0,
        help="timeout of one query (Go duration or seconds)",
    )
    q.add_argument(
        "--prometheus-retries",
        env="CRANE_PROMETHEUS_RETRIES",
        type=int,
        default=2,
        help="retries of a failed query within a round, with exponential backoff",
    )
    q.add_argument(
        "--prometheus-ca-file",
        env="CRANE_PROMETHEUS_CA_FILE",
        default=None,
        help="CA bundle to verify an https:// Prometheus (system CAs otherwise)",
    )
    q.add_argument(
        "--prometheus-insecure-skip-verify",
        env="CRANE_PROMETHEUS_INSECURE_SKIP_VERIFY",
        action="store_true",
        help="do not verify the Prometheus TLS certificate (testing only)",
    )
    q.add_argument(
        "--prometheus-bearer-token-file",
        env="CRANE_PROMETHEUS_BEARER_TOKEN_FILE",
        default=None,
        help="file with a bearer token, re-read on every query (rotated tokens are picked up)",
    )
    q.add_argument("--prometheus-username", env="CRANE_PROMETHEUS_USERNAME", default=None, help="basic-auth user name")
    q.add_argument(
        "--prometheus-password-file",
        env="CRANE_PROMETHEUS_PASSWORD_FILE",
        default=None,
        help="file with the basic-auth password",
    )
    q.add_argument(
        "--instance-label",
        env="CRANE_INSTANCE_LABEL",
        default="instance",
        help="series label naming the node: its InternalIP, IP:port, hostname or node name",
    )
    q.add_argument(
        "--round-retry-base",
        env="CRANE_ROUND_RETRY_BASE",
        type=_positive,
        default=5.0,
        help="after a failed query, retry the metric this soon (doubling up to its sync period)",
    )
    h = parser.add_argument_group("hot value")
    h.add_argument(
        "--hot-value-interval",
        env="CRANE_HOT_VALUE_INTERVAL",
        type=_positive,
        default=15.0,
        help="recompute every node's hot value this often, whatever Prometheus does",
    )
    h.add_argument(
        "--hot-value-debounce",
        env="CRANE_HOT_VALUE_DEBOUNCE",
        type=_seconds,
        default=0.25,
        help="after a binding is announced, wait this long to absorb the rest of a burst, then update "
        "the node's hot value",
    )
    h.add_argument(
        "--hot-value-max-age",
        env="CRANE_HOT_VALUE_MAX_AGE",
        type=_positive,
        default=240.0,
        help="rewrite an unchanged non-zero hot value once its annotation is this old, if no metric patch "
        "did (below 5m, when readers drop it; above the sync period, so rounds refresh it first)",
    )
    w = parser.add_argument_group("writing")
    w.add_argument(
        "--node-selector",
        env="CRANE_NODE_SELECTOR",
        default=None,
        help="label selector of the nodes to annotate, e.g. 'node-role.kubernetes.io/worker' (all nodes)",
    )
    w.add_argument(
        "--patch-concurrency",
        env="CRANE_PATCH_CONCURRENCY",
        type=int,
        default=32,
        help="node patches in flight at once (the QPS limit applies on top)",
    )
    w.add_argument(
        "--timestamp-style",
        env="CRANE_TIMESTAMP_STYLE",
        default="rfc3339",
        choices=[s.value for s in TimestampStyle],
        help="rfc3339: real UTC (2023-10-17T15:04:32+00:00); legacy: upstream's wall clock in "
        "--legacy-timezone plus a literal Z, for upstream's Go plugin",
    )
    w.add_argument(
        "--legacy-timezone",
        env="CRANE_LEGACY_TIMEZONE",
        default="Asia/Shanghai",
        help="zone of legacy timestamps (upstream's TZ)",
    )
    le = parser.add_argument_group("leader election")
    le.add_argument(
        "--lease-namespace",
        env="CRANE_LEASE_NAMESPACE",
        default=os.environ.get("POD_NAMESPACE", "crane-system"),
        help="namespace of the Lease (default: $POD_NAMESPACE, else crane-system)",
    )
    le.add_argument(
        "--lease-name",
        env="CRANE_LEASE_NAME",
        default="crane-annotator",
        help="Lease name; give each deployment its own",
    )
    le.add_argument(
        "--identity", env="CRANE_IDENTITY", default=None, help="holder identity (default: hostname + random suffix)"
    )
    le.add_argument(
        "--lease-duration",
        env="CRANE_LEASE_DURATION",
        type=_positive,
        default=15.0,
        help="a standby takes over this long after the leader stopped renewing",
    )
    le.add_argument(
        "--renew-deadline",
        env="CRANE_RENEW_DEADLINE",
        type=_positive,
        default=10.0,
        help="the leader stops writing when it could not renew for this long",
    )
    le.add_argument(
        "--lease-retry-period",
        env="CRANE_LEASE_RETRY_PERIOD",
        type=_positive,
        default=2.0,
        help="interval between Lease attempts",
    )
    return parser


def parse_config(argv: Sequence[str] | None = None) -> AnnotatorConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        policy = policy_or_default(args.policy)
    except PolicyError as err:
        parser.exit(2, f"crane-annotator: refusing to start, bad policy:\n{err}\n")
    if not policy.sync_policy:
        parser.exit(2, "crane-annotator: the policy has no syncPolicy: nothing to annotate\n")
    if not args.renew_deadline < args.lease_duration:
        parser.error("--renew-deadline must be shorter than --lease-duration")
    if args.patch_concurrency < 1 or args.prometheus_retries < 0 or args.hot_value_debounce < 0:
        parser.error("--patch-concurrency must be >= 1, --prometheus-retries and --hot-value-debounce >= 0")
    try:
        zone = ZoneInfo(args.legacy_timezone)
    except (ZoneInfoNotFoundError, ValueError):
        parser.error(f"--legacy-timezone: unknown zone {args.legacy_timezone!r}")
    return AnnotatorConfig(
        common=common_settings(args),
        policy=policy,
        policy_source=args.policy or "default",
        prometheus=PrometheusSettings(
            url=args.prometheus_url,
            timeout=args.prometheus_timeout,
            retries=args.prometheus_retries,
            ca_file=args.prometheus_ca_file,
            insecure_skip_verify=args.prometheus_insecure_skip_verify,
            bearer_token_file=args.prometheus_bearer_token_file,
            username=args.prometheus_username,
            password_file=args.prometheus_password_file,
        ),
        instance_label=args.instance_label,
        node_selector=args.node_selector or None,
        redis_url=args.redis_url,
        redis_password_file=args.redis_password_file,
        redis_ca_file=args.redis_ca_file,
        redis_prefix=args.redis_prefix,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        identity=args.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.lease_retry_period,
        hot_value_interval=args.hot_value_interval,
        hot_value_debounce=args.hot_value_debounce,
        hot_value_max_age=args.hot_value_max_age,
        patch_concurrency=args.patch_concurrency,
        retry_base=args.round_retry_base,
        stamp=Stamp(TimestampStyle(args.timestamp_style), zone),
    )
