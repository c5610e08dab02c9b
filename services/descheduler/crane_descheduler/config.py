"""Command line (every flag also as a ``CRANE_*`` variable) and the validated settings it produces.

Two policy files: the scheduler's ``DynamicSchedulerPolicy`` (``--policy``, the same ConfigMap the scheduler and
the extender mount: its predicate thresholds are the descheduler's default high thresholds and its Dynamic filter
judges targets) and the descheduler's own (``--descheduler-policy``, optional); optionally the scheduler's own
configuration (``--scheduler-config``), whose profiles judge the targets. A bad file refuses to start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from crane_shared.prometheus import PrometheusSettings
from crane_shared.settings import (
    CommonSettings,
    EnvArgumentParser,
    LeaseConfig,
    add_lease_flags,
    add_legacy_zone_flag,
    add_prometheus_flags,
    common_settings,
    lease_config,
    positive_duration,
    prometheus_settings,
    service_parser,
)

DEFAULT_PORT = 8084


@dataclass(frozen=True)
class DeschedulerConfig:
    common: CommonSettings
    lease: LeaseConfig
    prometheus: PrometheusSettings
    scheduler_policy: str | None
    policy: str | None
    interval: float
    usage_window: float
    dry_run: bool
    legacy_zone: ZoneInfo
    estimate_window: float = 300.0
    scheduler_config: str | None = None


def build_parser() -> EnvArgumentParser:
    parser = service_parser(
        "crane-descheduler",
        "Evicts pods from nodes whose measured load stays above the scheduler policy's thresholds, "
        "through the Eviction API, when another node passes the scheduler's filter for them. Only the Lease "
        "holder evicts.",
        default_port=DEFAULT_PORT,
    )
    p = parser.add_argument_group("policy")
    p.add_argument(
        "--policy",
        env="CRANE_POLICY",
        default=None,
        help="the scheduler's DynamicSchedulerPolicy file (default: the shipped upstream default policy)",
    )
    p.add_argument(
        "--scheduler-config",
        env="CRANE_SCHEDULER_CONFIG",
        default=None,
        help="crane-scheduler's KubeSchedulerConfiguration file: targets are judged, and a drain's replacements "
        "placed, by its profiles (plugins, weights, args), Dynamic with --policy (default: the default profile)",
    )
    p.add_argument(
        "--descheduler-policy",
        env="CRANE_DESCHEDULER_POLICY",
        default=None,
        help="LoadAwareDeschedulerPolicy file: pools, debounce, evictable pods, budgets (default: built in)",
    )
    d = parser.add_argument_group("descheduling")
    d.add_argument(
        "--interval",
        env="CRANE_DESCHEDULING_INTERVAL",
        type=positive_duration,
        default=60.0,
        help="time between rounds (each round is one debounce step)",
    )
    d.add_argument(
        "--dry-run",
        env="CRANE_DRY_RUN",
        action="store_true",
        help="plan, log and count evictions, evict nothing and write nothing",
    )
    add_prometheus_flags(parser)
    d.add_argument(
        "--estimate-window",
        env="CRANE_ESTIMATE_WINDOW",
        type=positive_duration,
        default=300.0,
        help="the averaging window of the node metrics (the scheduler's Dynamic estimate.window): how long an "
        "evicted pod's usage still weighs in a node's average, so a relieved node is not relieved again for it",
    )
    d.add_argument(
        "--usage-window",
        env="CRANE_USAGE_WINDOW",
        type=positive_duration,
        default=300.0,
        help="window of the per-pod CPU rate (container_cpu_usage_seconds_total)",
    )
    add_legacy_zone_flag(d)
    add_lease_flags(parser, default_name="crane-descheduler")
    return parser


def parse_config(argv: Sequence[str] | None = None) -> DeschedulerConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        lease = lease_config(args)
    except ValueError as err:
        parser.error(str(err))
    return DeschedulerConfig(
        common=common_settings(args),
        lease=lease,
        prometheus=prometheus_settings(args),
        scheduler_policy=args.policy or None,
        policy=args.descheduler_policy or None,
        interval=args.interval,
        usage_window=args.usage_window,
        estimate_window=args.estimate_window,
        dry_run=args.dry_run,
        legacy_zone=args.legacy_zone,
        scheduler_config=args.scheduler_config or None,
    )
