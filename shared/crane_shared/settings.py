"""Command-line flags with environment-variable equivalents, the way operators configure containers.

Every flag can be set as ``--flag`` or through its ``CRANE_*`` variable; ``--help`` shows both and the default.
argparse does the parsing; this module only adds the environment fallback and the flags every service shares.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from crane_shared.kube import KubeSettings


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
    h = parser.add_argument_group("serving and logging")
    h.add_argument(
        "--listen-address",
        env="CRANE_LISTEN_ADDRESS",
        default="0.0.0.0",
        help="address of the /healthz, /readyz and /metrics server",
    )
    h.add_argument("--port", env="CRANE_PORT", type=int, default=default_port, help="port of that server")
    h.add_argument("--log-level", env="CRANE_LOG_LEVEL", default="info", choices=["debug", "info", "warning", "error"])
    h.add_argument("--log-format", env="CRANE_LOG_FORMAT", default="text", choices=["text", "json"])


def common_settings(args: argparse.Namespace) -> CommonSettings:
    return CommonSettings(
        kube=KubeSettings(args.kubeconfig, args.kube_context, args.kube_api_qps, args.kube_api_burst),
        listen_host=args.listen_address,
        listen_port=args.port,
        log_level=args.log_level,
        log_format=args.log_format,
    )


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
