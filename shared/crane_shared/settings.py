"""The one settings convention: flags with environment-variable equivalents, parsed into grouped sections.

Every flag can be set as ``--flag`` or through its ``CRANE_*`` variable; ``--help`` shows both and the default.
argparse does the parsing; this module adds the environment fallback, the sections every service shares
(``CommonSettings`` with its ``KubeSettings``, ``RedisSettings``, ``LeaseConfig``, ``PrometheusSettings``), each
with its ``add_*_flags`` and its constructor from the parsed arguments, and the argument converters (durations,
positive numbers, time zones), written once. A service adds its own group and dataclass the same way; a bad
value is refused at start with a message naming the flag.
"""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from crane_shared.annotations import DEFAULT_LEGACY_ZONE
from crane_shared.durations import DurationError, parse_duration
from crane_shared.kube import KubeSettings
from crane_shared.leader import LeaseConfig
from crane_shared.prometheus import PrometheusSettings

__all__ = [
    "CommonSettings",
    "EnvArgumentParser",
    "LeaseConfig",
    "RedisSettings",
    "add_common_flags",
    "add_lease_flags",
    "add_legacy_zone_flag",
    "add_prometheus_flags",
    "add_redis_flags",
    "common_settings",
    "duration",
    "lease_config",
    "non_negative_duration",
    "non_negative_int",
    "positive_duration",
    "positive_int",
    "prometheus_settings",
    "redis_settings",
    "service_parser",
    "time_zone",
]


# --- converters (argparse ``type=``) ---------------------------------------------------------------------------


def duration(text: str) -> float:
    """A Go duration (``15s``, ``250ms``, ``1h30m``) or plain seconds, as seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text).total_seconds()
    except DurationError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive_duration(text: str) -> float:
    value = duration(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def non_negative_duration(text: str) -> float:
    value = duration(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def time_zone(text: str) -> ZoneInfo:
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown time zone {text!r}") from None


class EnvArgumentParser(argparse.ArgumentParser):
    """ArgumentParser whose ``add_argument(..., env="CRANE_X")`` falls back to that environment variable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, env: str | None = None, **kwargs: Any) -> argparse.Action:
        return super().add_argument(*args, **_env_fallback(env, kwargs))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        """Groups accept ``env=`` as well (argparse groups have their own ``add_argument``)."""
        group = super().add_argument_group(*args, **kwargs)
        group_add = group.add_argument

        def add_argument(*a: Any, env: str | None = None, **kw: Any) -> argparse.Action:
            return group_add(*a, **_env_fallback(env, kw))

        group.add_argument = add_argument  # type: ignore[method-assign]
        return group


def _env_fallback(env: str | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    if env is not None:
        kwargs["help"] = f"{kwargs.get('help', '')} [env {env}]".strip()
        if env in os.environ:
            raw = os.environ[env]
            if kwargs.get("action") == "store_true":
                kwargs["default"] = raw.lower() in {"1", "true", "yes", "on"}
            else:
                conv = kwargs.get("type", str)
                try:
                    kwargs["default"] = conv(raw)
                except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
                    raise SystemExit(f"environment variable {env}={raw!r}: {err}") from err
            kwargs.pop("required", None)
    return kwargs


@dataclass(frozen=True)
class CommonSettings:
    kube: KubeSettings
    listen_host: str
    listen_port: int
    log_level: str
    log_format: str
    metrics_access: str = "any"  # crane_shared.service.Access values
    debug_access: str = "loopback"


def service_parser(prog: str, description: str, *, default_port: int, redis: bool = False) -> EnvArgumentParser:
    """A service's parser with the common section (and the Redis one when it uses Redis) already in it."""
    parser = EnvArgumentParser(prog=prog, description=description)
    add_common_flags(parser, default_port=default_port)
    if redis:
        add_redis_flags(parser)
    return parser


def add_common_flags(parser: EnvArgumentParser, *, default_port: int) -> None:
    """Flags every service has: Kubernetes client, HTTP listener, logging."""
    g = parser.add_argument_group("kubernetes client")
    g.add_argument(
        "--kubeconfig",
        env="KUBECONFIG",
        default=None,
        help="kubeconfig file; without it the in-cluster service account is used",
    )
    g.add_argument("--kube-context", env="CRANE_KUBE_CONTEXT", default=None, help="kubeconfig context")
    g.add_argument(
        "--kube-api-qps",
        env="CRANE_KUBE_API_QPS",
        type=float,
        default=50.0,
        help="client-side request rate limit (<= 0 disables)",
    )
    g.add_argument(
        "--kube-api-burst", env="CRANE_KUBE_API_BURST", type=int, default=100, help="client-side burst above the QPS"
    )
    g.add_argument(
        "--kube-api-timeout",
        env="CRANE_KUBE_API_TIMEOUT",
        type=positive_duration,
        default="30s",
        help="timeout of every API request that sets none of its own (Go duration); a watch gets it as connect "
        "timeout plus read gap beyond its server-side timeout. The Lease has its own: half the renew deadline",
    )
    h = parser.add_argument_group("serving and logging")
    h.add_argument(
        "--listen-address",
        env="CRANE_LISTEN_ADDRESS",
        default="0.0.0.0",
        help="address of the /healthz, /readyz and /metrics server",
    )
    h.add_argument("--port", env="CRANE_PORT", type=int, default=default_port, help="port of that server")
    h.add_argument(
        "--metrics-access",
        env="CRANE_METRICS_ACCESS",
        default="any",
        choices=["any", "loopback", "delegated"],
        help="who may read /metrics: anyone who reaches the port (the chart's NetworkPolicy limits that to "
        "Prometheus), loopback clients only, or callers whose token the API server authenticates and authorizes "
        "for 'get' on the path (TokenReview + SubjectAccessReview, as kube-scheduler's secure port)",
    )
    h.add_argument(
        "--debug-access",
        env="CRANE_DEBUG_ACCESS",
        default="loopback",
        choices=["any", "loopback", "delegated"],
        help="who may read /debug/*: by default only loopback clients (kubectl port-forward)",
    )
    h.add_argument("--log-level", env="CRANE_LOG_LEVEL", default="info", choices=["debug", "info", "warning", "error"])
    h.add_argument("--log-format", env="CRANE_LOG_FORMAT", default="text", choices=["text", "json"])


def common_settings(args: argparse.Namespace) -> CommonSettings:
    return CommonSettings(
        kube=KubeSettings(
            args.kubeconfig, args.kube_context, args.kube_api_qps, args.kube_api_burst, args.kube_api_timeout
        ),
        listen_host=args.listen_address,
        listen_port=args.port,
        log_level=args.log_level,
        log_format=args.log_format,
        metrics_access=args.metrics_access,
        debug_access=args.debug_access,
    )


@dataclass(frozen=True)
class RedisSettings:
    url: str = "redis://127.0.0.1:6379/0"
    password_file: str | None = None
    ca_file: str | None = None
    prefix: str = "crane"


def redis_settings(args: argparse.Namespace) -> RedisSettings:
    return RedisSettings(args.redis_url, args.redis_password_file, args.redis_ca_file, args.redis_prefix)


def add_redis_flags(parser: EnvArgumentParser) -> None:
    g = parser.add_argument_group("redis")
    g.add_argument(
        "--redis-url",
        env="CRANE_REDIS_URL",
        default="redis://127.0.0.1:6379/0",
        help="redis:// or rediss:// (TLS) URL; put the password in --redis-password-file, not here",
    )
    g.add_argument(
        "--redis-password-file",
        env="CRANE_REDIS_PASSWORD_FILE",
        default=None,
        help="file holding the Redis password (e.g. a mounted Secret)",
    )
    g.add_argument(
        "--redis-ca-file",
        env="CRANE_REDIS_CA_FILE",
        default=None,
        help="CA bundle to verify a rediss:// server (system CAs otherwise)",
    )
    g.add_argument(
        "--redis-prefix",
        env="CRANE_REDIS_PREFIX",
        default="crane",
        help="prefix of every Redis key, to share one Redis between installations",
    )


def add_legacy_zone_flag(group: Any) -> None:
    """``--legacy-zone``: the zone of upstream's legacy timestamps (wall clock plus a bare ``Z``).

    ``--legacy-timezone``/``CRANE_LEGACY_TIMEZONE`` (the annotator's former names) are accepted as well."""
    group.add_argument(
        "--legacy-zone",
        "--legacy-timezone",
        dest="legacy_zone",
        env="CRANE_LEGACY_ZONE",
        type=time_zone,
        default=os.environ.get("CRANE_LEGACY_TIMEZONE", DEFAULT_LEGACY_ZONE.key),
        help="zone of legacy timestamps: upstream's wall clock with a bare 'Z' (upstream's TZ)",
    )


def add_lease_flags(parser: EnvArgumentParser, *, default_name: str) -> None:
    """Leader election through a Lease: where it is, who we are, and its timing."""
    g = parser.add_argument_group("leader election")
    g.add_argument(
        "--lease-namespace",
        env="CRANE_LEASE_NAMESPACE",
        default=os.environ.get("POD_NAMESPACE", "crane-system"),
        help="namespace of the Lease (default: $POD_NAMESPACE, else crane-system)",
    )
    g.add_argument(
        "--lease-name", env="CRANE_LEASE_NAME", default=default_name, help="Lease name; give each deployment its own"
    )
    g.add_argument(
        "--identity", env="CRANE_IDENTITY", default=None, help="holder identity (default: hostname + random suffix)"
    )
    g.add_argument(
        "--lease-duration",
        env="CRANE_LEASE_DURATION",
        type=positive_duration,
        default=15.0,
        help="a standby takes over this long after the leader stopped renewing",
    )
    g.add_argument(
        "--renew-deadline",
        env="CRANE_RENEW_DEADLINE",
        type=positive_duration,
        default=10.0,
        help="the leader stops writing when it could not renew for this long",
    )
    g.add_argument(
        "--lease-retry-period",
        env="CRANE_LEASE_RETRY_PERIOD",
        type=positive_duration,
        default=2.0,
        help="interval between Lease attempts",
    )


def lease_config(args: argparse.Namespace) -> LeaseConfig:
    """The Lease section; raises ``ValueError`` naming the flags when the timing cannot work."""
    if not args.renew_deadline < args.lease_duration:
        raise ValueError("--renew-deadline must be shorter than --lease-duration")
    if not args.lease_retry_period < args.renew_deadline:
        raise ValueError("--lease-retry-period must be shorter than --renew-deadline")
    return LeaseConfig(
        namespace=args.lease_namespace,
        name=args.lease_name,
        identity=args.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.lease_retry_period,
    )


def add_prometheus_flags(parser: EnvArgumentParser) -> Any:
    """The Prometheus client's flags (``crane_shared.prometheus``); returns the group for a service's own flags."""
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
        type=positive_duration,
        default=10.0,
        help="timeout of one query (Go duration or seconds)",
    )
    q.add_argument(
        "--prometheus-retries",
        env="CRANE_PROMETHEUS_RETRIES",
        type=non_negative_int,
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
    return q


def prometheus_settings(args: argparse.Namespace) -> PrometheusSettings:
    return PrometheusSettings(
        url=args.prometheus_url,
        timeout=args.prometheus_timeout,
        retries=args.prometheus_retries,
        ca_file=args.prometheus_ca_file,
        insecure_skip_verify=args.prometheus_insecure_skip_verify,
        bearer_token_file=args.prometheus_bearer_token_file,
        username=args.prometheus_username,
        password_file=args.prometheus_password_file,
    )
