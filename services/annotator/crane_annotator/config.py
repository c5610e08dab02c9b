"""Command line (every flag also as a ``CRANE_*`` variable) and the validated settings it produces.

A bad policy file, duration or option refuses to start with a message naming it, rather than running with a
surprise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from crane_annotator.patches import Stamp
from crane_shared.annotations import TimestampStyle
from crane_shared.policy import DynamicSchedulerPolicy, PolicyError, policy_or_default
from crane_shared.settings import (
    CommonSettings,
    EnvArgumentParser,
    LeaseConfig,
    PrometheusSettings,
    RedisSettings,
    add_lease_flags,
    add_legacy_zone_flag,
    add_prometheus_flags,
    common_settings,
    lease_config,
    non_negative_duration,
    positive_duration,
    positive_int,
    prometheus_settings,
    redis_settings,
    service_parser,
)

DEFAULT_PORT = 8082


@dataclass(frozen=True)
class AnnotatorConfig:
    common: CommonSettings
    redis: RedisSettings
    lease: LeaseConfig
    policy: DynamicSchedulerPolicy
    policy_source: str
    policy_path: str | None
    prometheus: PrometheusSettings
    instance_label: str
    node_selector: str | None
    hot_value_interval: float
    hot_value_debounce: float
    hot_value_max_age: float
    patch_concurrency: int
    retry_base: float
    stamp: Stamp
    load_taint_interval: float = 15.0


def build_parser() -> EnvArgumentParser:
    parser = service_parser(
        "crane-annotator",
        "Annotates nodes with their load from Prometheus and their hot value from Redis, for the crane "
        "load-aware scheduler. Only the Lease holder writes.",
        default_port=DEFAULT_PORT,
        redis=True,
    )
    p = parser.add_argument_group("policy")
    p.add_argument(
        "--policy",
        env="CRANE_POLICY",
        default=None,
        help="DynamicSchedulerPolicy file (default: the shipped upstream default policy)",
    )
    add_prometheus_flags(parser)
    q = parser.add_argument_group("matching and rounds")
    q.add_argument(
        "--instance-label",
        env="CRANE_INSTANCE_LABEL",
        default="instance",
        help="series label naming the node: its InternalIP, IP:port, hostname or node name",
    )
    q.add_argument(
        "--round-retry-base",
        env="CRANE_ROUND_RETRY_BASE",
        type=positive_duration,
        default=5.0,
        help="after a failed query, retry the metric this soon (doubling up to its sync period)",
    )
    h = parser.add_argument_group("hot value")
    h.add_argument(
        "--hot-value-interval",
        env="CRANE_HOT_VALUE_INTERVAL",
        type=positive_duration,
        default=15.0,
        help="recompute every node's hot value this often, whatever Prometheus does",
    )
    h.add_argument(
        "--hot-value-debounce",
        env="CRANE_HOT_VALUE_DEBOUNCE",
        type=non_negative_duration,
        default=0.25,
        help="after a binding is announced, wait this long to absorb the rest of a burst, then update "
        "the node's hot value",
    )
    h.add_argument(
        "--hot-value-max-age",
        env="CRANE_HOT_VALUE_MAX_AGE",
        type=positive_duration,
        default=240.0,
        help="rewrite an unchanged non-zero hot value once its annotation is this old, if no metric patch "
        "did (below 5m, when readers drop it; above the sync period, so rounds refresh it first)",
    )
    t = parser.add_argument_group("load taint (the policy's spec.loadTaint)")
    t.add_argument(
        "--load-taint-interval",
        env="CRANE_LOAD_TAINT_INTERVAL",
        type=positive_duration,
        default=15.0,
        help="judge the load taint at least this often (and after every metric round): a taint is lifted this "
        "soon after its node's data turns stale",
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
        type=positive_int,
        default=32,
        help="node patches in flight at once (the QPS limit applies on top)",
    )
    w.add_argument(
        "--timestamp-style",
        env="CRANE_TIMESTAMP_STYLE",
        default="rfc3339",
        choices=[s.value for s in TimestampStyle],
        help="rfc3339: real UTC (2023-10-17T15:04:32+00:00); legacy: upstream's wall clock in "
        "--legacy-zone plus a literal Z, for upstream's Go plugin",
    )
    add_legacy_zone_flag(w)
    add_lease_flags(parser, default_name="crane-annotator")
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
    try:
        lease = lease_config(args)
        prometheus = prometheus_settings(args)
    except ValueError as err:
        parser.error(str(err))
    return AnnotatorConfig(
        common=common_settings(args),
        redis=redis_settings(args),
        lease=lease,
        policy=policy,
        policy_source=args.policy or "default",
        policy_path=args.policy or None,
        prometheus=prometheus,
        instance_label=args.instance_label,
        node_selector=args.node_selector or None,
        hot_value_interval=args.hot_value_interval,
        hot_value_debounce=args.hot_value_debounce,
        hot_value_max_age=args.hot_value_max_age,
        patch_concurrency=args.patch_concurrency,
        retry_base=args.round_retry_base,
        stamp=Stamp(TimestampStyle(args.timestamp_style), args.legacy_zone),
        load_taint_interval=args.load_taint_interval,
    )
