"""Redis with Sentinel high availability, real: a primary, its replicas and three sentinels (Debian's
``redis-server`` and ``redis-sentinel``), all on loopback, the primary and the sentinels password-protected as a
production setup is. ``kill_primary`` SIGKILLs whichever server is the primary now; the sentinels promote a
replica about a second later (``down-after-milliseconds`` 1000).

With ``proxy`` (the fault suite's ``proxy_to``), each replica reaches the first primary through a Toxiproxy proxy
of its own, so ``hold_replication`` can stop the primary's replication stream while the links stay up: writes
acknowledged by the primary then exist nowhere else, and a kill loses them, as an asynchronous replica's lag
does in production. The sentinels and clients reach every server directly."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

from crane_sandbox.cluster import require
from crane_sandbox.procs import ManagedProcess, free_port, tcp_open
from crane_sandbox.toxiproxy import Proxy
from crane_shared.settings import RedisSettings

MASTER = "crane"
PASSWORD = "primary-s3cret"
SENTINEL_PASSWORD = "sentinel-s3cret"


@dataclass
class SentinelGroup:
    run_dir: Path
    replicas: int = 2
    sentinels: int = 3
    servers: dict[int, ManagedProcess] = field(default_factory=dict)
    """redis-server processes by port"""
    sentinel_ports: list[int] = field(default_factory=list)
    proxy: Callable[[str], Awaitable[Proxy]] | None = None
    """makes a Toxiproxy proxy to an upstream host:port: each replica then replicates through one"""
    replication_links: list[Proxy] = field(default_factory=list)
    _sentinel_procs: list[ManagedProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports) + f"/{MASTER}/0"

    def settings(self, prefix: str = "crane") -> RedisSettings:
        """The Redis section a service gets: the sentinel URL, both passwords from files."""
        secrets = self.run_dir / "secrets"
        secrets.mkdir(parents=True, exist_ok=True)
        (secrets / "password").write_text(PASSWORD + "\n")
        (secrets / "sentinel-password").write_text(SENTINEL_PASSWORD + "\n")
        return RedisSettings(
            self.url,
            password_file=str(secrets / "password"),
            prefix=prefix,
            sentinel_password_file=str(secrets / "sentinel-password"),
        )

    def flags(self) -> list[str]:
        """The same as command-line flags of our services."""
        s = self.settings()
        assert s.password_file and s.sentinel_password_file
        return [
            "--redis-url", s.url, "--redis-password-file", s.password_file,
            "--redis-sentinel-password-file", s.sentinel_password_file,
        ]  # fmt: skip

    async def start(self) -> None:
        primary = free_port()
        await self._server(primary, None)
        for _ in range(self.replicas):
            source = primary
            if self.proxy is not None:
                link = await self.proxy(f"127.0.0.1:{primary}")
                self.replication_links.append(link)
                source = link.listen_port
            await self._server(free_port(), source)
        for i in range(self.sentinels):
            port = free_port()
            conf = self.run_dir / f"sentinel-{i}.conf"  # the sentinel rewrites it: a file of its own
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.run_dir}\nrequirepass {SENTINEL_PASSWORD}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n"
                f"sentinel auth-pass {MASTER} {PASSWORD}\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 10000\n"
            )
            proc = ManagedProcess(f"sentinel-{i}", [require("redis-sentinel", "redis-sentinel"), str(conf)],
                                  self.run_dir / f"sentinel-{i}.log")  # fmt: skip
            await proc.start()
            await proc.wait_ready(functools.partial(tcp_open, "127.0.0.1", port), timeout=10)
            self.sentinel_ports.append(port)
            self._sentinel_procs.append(proc)
        await self.wait_replicas_known()

    async def _server(self, port: int, primary: int | None) -> None:
        data = self.run_dir / f"redis-{port}"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            require("redis-server", "redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(data), "--requirepass", PASSWORD, "--masterauth", PASSWORD,
        ]  # fmt: skip
        if primary is not None:
            argv += ["--replicaof", "127.0.0.1", str(primary)]
        proc = ManagedProcess(f"redis-{port}", argv, self.run_dir / f"redis-{port}.log")
        await proc.start()
        await proc.wait_ready(lambda: tcp_open("127.0.0.1", port), timeout=10)
        self.servers[port] = proc

    async def _ask_sentinel(self, *command: str) -> object:
        for port in self.sentinel_ports:
            client = aioredis.Redis(port=port, password=SENTINEL_PASSWORD, decode_responses=True, socket_timeout=2)
            try:
                answer: object = await client.execute_command(*command)  # type: ignore[no-untyped-call]
                return answer
            except (aioredis.ConnectionError, aioredis.TimeoutError):
                continue
            finally:
                await client.aclose()
        raise RuntimeError("no sentinel answered")

    async def primary_port(self) -> int:
        """The primary's port as the sentinels see it now."""
        answer = await self._ask_sentinel("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        assert isinstance(answer, list | tuple)
        return int(answer[1])

    async def wait_replicas_known(self, timeout: float = 30.0) -> None:
        """Until every sentinel knows the replicas and its peers (a failover needs both)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            replicas = await self._ask_sentinel("SENTINEL", "REPLICAS", MASTER)
            peers = await self._ask_sentinel("SENTINEL", "SENTINELS", MASTER)
            if (
                isinstance(replicas, list)
                and len(replicas) >= self.replicas
                and isinstance(peers, list)
                and (len(peers) >= self.sentinels - 1)
            ):
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"sentinels know {replicas!r} replicas and {peers!r} peers")
            await asyncio.sleep(0.2)

    async def hold_replication(self) -> None:
        """Stop the replication stream to every replica (it stays connected, nothing reaches it): needs
        ``proxy``."""
        assert self.replication_links, "replicas replicate directly: start the group with proxy="
        for link in self.replication_links:
            await link.add_toxic("timeout", {"timeout": 0}, stream="downstream")

    def client_of(self, port: int) -> aioredis.Redis:
        """A client of one server, whatever its role (a replica answers reads)."""
        return aioredis.Redis(port=port, password=PASSWORD, socket_timeout=5)

    async def replica_ports(self) -> list[int]:
        """The replicas' ports as the sentinels see them now."""
        answer = await self._ask_sentinel("SENTINEL", "REPLICAS", MASTER)
        assert isinstance(answer, list)  # redis-py parses each replica's fields into a dict
        return [int(r["port"]) for r in answer]

    async def kill_primary(self) -> int:
        """SIGKILL the current primary (no shutdown, no last sync); returns its port."""
        port = await self.primary_port()
        await self.servers[port].kill()
        return port

    async def stop(self) -> None:
        for proc in [*self._sentinel_procs, *self.servers.values()]:
            await proc.stop()

    async def __aenter__(self) -> SentinelGroup:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
