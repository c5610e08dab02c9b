"""The one way to a Redis client: URL, password from a file (never logged), TLS verified, bounded timeouts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis

from crane_shared.settings import RedisSettings, redis_settings


def redacted(url: str) -> str:
    """The URL without its password (in the user info or a ``password`` query parameter), for logs."""
    parts = urlsplit(url)
    if parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = f"{parts.username}:***@" if parts.username else ":***@"
        parts = parts._replace(netloc=user + netloc)
    if parts.query:
        query = [(k, "***" if k.lower() in {"password", "token"} else v) for k, v in parse_qsl(parts.query)]
        parts = parts._replace(query=urlencode(query, safe="*"))
    return urlunsplit(parts)


def redis_from_args(args: argparse.Namespace, **extra: Any) -> aioredis.Redis:
    """``make_redis`` from the ``add_redis_flags`` flags (kept for callers that hold the parsed arguments)."""
    return make_redis(redis_settings(args), **extra)


def make_redis(
    target: RedisSettings | str, *, password_file: str | None = None, ca_file: str | None = None, **extra: Any
) -> aioredis.Redis:
    """A client with bounded timeouts so a dead Redis fails fast into the caller's retry loop.

    ``target`` is the Redis section of the settings, or a bare URL (tests, the sandbox)."""
    if isinstance(target, RedisSettings):
        url, password_file, ca_file = target.url, target.password_file, target.ca_file
    else:
        url = target
    kwargs: dict[str, Any] = {
        "socket_timeout": 5.0,
        "socket_connect_timeout": 3.0,
        "health_check_interval": 15,
        **extra,
    }
    if password_file:
        kwargs["password"] = Path(password_file).read_text().strip()
    if url.startswith("rediss://") and ca_file:
        kwargs["ssl_ca_certs"] = ca_file
    client: aioredis.Redis = aioredis.from_url(url, **kwargs)
    return client
