"""Flags of ``crane-event-recorder`` (each also settable as a ``CRANE_*`` variable) and the settings they make."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from crane_event_recorder.source import EventApi
from crane_shared.policy import PolicyError, policy_or_default
from crane_shared.settings import (
    CommonSettings,
    EnvArgumentParser,
    RedisSettings,
    common_settings,
    non_negative_duration,
    positive_duration,
    positive_int,
    redis_settings,
    service_parser,
)

__all__ = ["DEFAULT_PORT", "RecorderSettings", "build_parser", "parse_settings"]

DEFAULT_PORT = 8091


@dataclass(frozen=True)
class RecorderSettings:
    """Everything the recorder core needs; durations in seconds."""

    event_api: EventApi = EventApi.EVENTS_V1
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    field_selector: str = "reason=Scheduled"
    retention: float = 360.0
    trim_interval: float = 30.0
    stream_maxlen: int = 100_000
    buffer_size: int = 100_000
    batch_size: int = 500
    list_page_size: int = 500
    watch_timeout: float = 300.0
    redis_check_interval: float = 5.0
    reporting_controllers: tuple[str, ...] = ("default-scheduler", "crane-scheduler")


def build_parser() -> EnvArgumentParser:
    parser = service_parser(
        "crane-event-recorder",
        "Record every pod binding reported by a Scheduled event in Redis, exactly once, for the hot value. "
        "Several replicas may run at once: writes are idempotent, no leader is needed.",
        default_port=DEFAULT_PORT,
        redis=True,
    )
    g = parser.add_argument_group("events")
    g.add_argument(
        "--event-api",
        env="CRANE_EVENT_API",
        default=EventApi.EVENTS_V1.value,
        choices=[api.value for api in EventApi],
        help="Event API to list and watch; either one shows events written through both",
    )
    g.add_argument(
        "--namespaces",
        env="CRANE_NAMESPACES",
        default="",
        help="comma-separated namespaces to watch; empty watches all namespaces",
    )
    g.add_argument(
        "--field-selector",
        env="CRANE_EVENT_FIELD_SELECTOR",
        default="reason=Scheduled",
        help="server-side filter of the list and watch; empty sends none (events are filtered here too)",
    )
    g.add_argument(
        "--reporting-controllers",
        env="CRANE_REPORTING_CONTROLLERS",
        default="default-scheduler,crane-scheduler",
        help="comma-separated schedulers (an event's reportingController, or its source component) whose "
        "Scheduled events are recorded; others are counted in untrusted_events and skipped",
    )
    g.add_argument(
        "--list-page-size", env="CRANE_LIST_PAGE_SIZE", type=positive_int, default=500, help="events per list page"
    )
    g.add_argument(
        "--watch-timeout",
        env="CRANE_WATCH_TIMEOUT",
        type=positive_duration,
        default="5m",
        help="server-side watch timeout; each watch lasts a random time between this and twice it",
    )
    r = parser.add_argument_group("recording")
    r.add_argument(
        "--policy",
        env="CRANE_POLICY",
        default=None,
        help="DynamicSchedulerPolicy whose longest hotValue timeRange sets the default retention "
        "(built-in default policy otherwise)",
    )
    r.add_argument(
        "--retention",
        env="CRANE_RETENTION",
        type=positive_duration,
        default=None,
        help="keep binding records this long (Go duration); default: longest hotValue timeRange "
        "plus --retention-margin",
    )
    r.add_argument(
        "--retention-margin",
        env="CRANE_RETENTION_MARGIN",
        type=non_negative_duration,
        default="1m",
        help="added to the longest hotValue timeRange for the default retention",
    )
    r.add_argument(
        "--trim-interval",
        env="CRANE_TRIM_INTERVAL",
        type=positive_duration,
        default="30s",
        help="how often records older than the retention are deleted",
    )
    r.add_argument(
        "--stream-maxlen",
        env="CRANE_STREAM_MAXLEN",
        type=positive_int,
        default=100_000,
        help="approximate cap on the binding notification stream",
    )
    r.add_argument(
        "--buffer-size",
        env="CRANE_BUFFER_SIZE",
        type=positive_int,
        default=100_000,
        help="bindings held in memory while Redis is unavailable; beyond it the oldest are dropped",
    )
    r.add_argument(
        "--batch-size", env="CRANE_BATCH_SIZE", type=positive_int, default=500, help="bindings per Redis round trip"
    )
    r.add_argument(
        "--redis-check-interval",
        env="CRANE_REDIS_CHECK_INTERVAL",
        type=positive_duration,
        default="5s",
        help="how often to check whether Redis restarted (then everything is re-listed)",
    )
    return parser


def parse_settings(argv: Sequence[str] | None = None) -> tuple[CommonSettings, RedisSettings, RecorderSettings]:
    """The common and Redis sections, and the recorder's own settings."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        longest = policy_or_default(args.policy).longest_hot_value_window().total_seconds()
    except PolicyError as err:
        parser.error(str(err))
    retention = args.retention
    if retention is None:
        retention = longest + args.retention_margin
    elif retention < longest:  # the trimmer would delete records the hot value still counts
        parser.error(
            f"--retention {retention:g}s is shorter than the policy's longest hotValue timeRange ({longest:g}s): "
            "records still inside it would be trimmed"
        )
    if retention <= 0:
        parser.error("--retention must be positive (the policy has no hotValue rules: set --retention)")
    if args.watch_timeout < 1:
        parser.error("--watch-timeout must be at least 1s")
    settings = RecorderSettings(
        event_api=EventApi(args.event_api),
        namespaces=tuple(dict.fromkeys(ns.strip() for ns in args.namespaces.split(",") if ns.strip())),
        field_selector=args.field_selector,
        retention=retention,
        trim_interval=args.trim_interval,
        stream_maxlen=args.stream_maxlen,
        buffer_size=args.buffer_size,
        batch_size=args.batch_size,
        list_page_size=args.list_page_size,
        watch_timeout=args.watch_timeout,
        redis_check_interval=args.redis_check_interval,
        reporting_controllers=tuple(
            dict.fromkeys(s.strip() for s in args.reporting_controllers.split(",") if s.strip())
        ),
    )
    if not settings.reporting_controllers:
        parser.error("--reporting-controllers must name at least one scheduler")
    return common_settings(args), redis_settings(args), settings
