"""The one way to a Redis client: URL, password from a file (never logged), TLS verified, bounded timeouts.

A plain Redis is ``redis://`` (``rediss://`` with TLS). A Redis with Sentinel high availability is
``redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/<master name>[/<db>]``
(``rediss+sentinel://`` when the primary and replicas serve TLS): the client asks the sentinels for the current
primary on every new connection, so after a failover (the old primary dead, or demoted and answering
``READONLY``) its next command goes to the promoted replica. The sentinels' own password, when they have one,
comes from ``--redis-sentinel-password-file``; the primary's from ``--redis-password-file``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel

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
    sentinel_password_file = None
    if isinstance(target, RedisSettings):
        url, password_file, ca_file = target.url, target.password_file, target.ca_file
        sentinel_password_file = target.sentinel_password_file
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
    tls = url.startswith(("rediss://", "rediss+sentinel://"))
    if tls and ca_file:
        kwargs["ssl_ca_certs"] = ca_file
    if url.startswith(("redis+sentinel://", "rediss+sentinel://")):
        return _sentinel_client(parse_sentinel_url(url), kwargs, tls, sentinel_password_file)
    client: aioredis.Redis = aioredis.from_url(url, **kwargs)
    return client


@dataclass(frozen=True)
class SentinelTarget:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0


def parse_sentinel_url(url: str) -> SentinelTarget:
    """``redis+sentinel://host:port[,host:port...]/<master>[/<db>]``; a bad URL is refused naming the part."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ValueError("--redis-url: no credentials in a sentinel URL; use --redis-password-file and "
                         "--redis-sentinel-password-file")  # fmt: skip
    addresses = []
    for item in parts.netloc.split(","):
        host, colon, port = item.rpartition(":")
        if not colon:
            host, port = item, "26379"
        if not host or not port.isdigit():
            raise ValueError(f"--redis-url: sentinel address {item!r} is not host:port")
        addresses.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"--redis-url: expected redis+sentinel://host:port,.../<master name>[/<db>], got path "
                         f"{parts.path!r}")  # fmt: skip
    return SentinelTarget(tuple(addresses), path[0], int(path[1]) if len(path) == 2 else 0)


def _sentinel_client(
    target: SentinelTarget, kwargs: dict[str, Any], tls: bool, sentinel_password_file: str | None
) -> aioredis.Redis:
    """The primary of ``target.master`` as the sentinels name it now (asked again on every new connection)."""
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": kwargs["socket_timeout"],
        "socket_connect_timeout": kwargs["socket_connect_timeout"],
    }
    if sentinel_password_file:
        sentinel_kwargs["password"] = Path(sentinel_password_file).read_text().strip()
    if tls:
        kwargs = {**kwargs, "ssl": True}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=sentinel_kwargs, db=target.db, **kwargs
    )
    client: aioredis.Redis = sentinel.master_for(target.master)
    return client
