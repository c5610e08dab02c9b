"""One of our services run as a child process with its real command line, and readers of its HTTP endpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from crane_sandbox.procs import ManagedProcess, free_port

FAST_LEASE = ("--lease-duration", "4s", "--renew-deadline", "3s", "--lease-retry-period", "0.5s")
"""A service's lease flags for fault tests: a lost lease shows within seconds."""


class ServiceProc:
    """``argv`` (built by the caller around ``self.port``) as a ``ManagedProcess`` logging to ``log``."""

    def __init__(self, name: str, log_dir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log_dir / f"{name}-{self.port}.log"
        self.process: ManagedProcess | None = None

    def launch(self, argv: list[str]) -> None:
        self.process = ManagedProcess(self.name, argv, self._log)

    async def start(self) -> None:
        assert self.process is not None, "launch(argv) first"
        await self.process.start()
        await self.process.wait_ready(self._healthy, timeout=30)

    async def _healthy(self) -> bool:
        return (await self.get("/healthz"))[0] == 200

    async def get(self, path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, keyed by (name, sorted labels)."""
        _, text = await self.get("/metrics")
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    async def metric(self, name: str, **labels: str) -> float | None:
        return (await self.metrics()).get((name, tuple(sorted(labels.items()))))

    async def leadership(self) -> str:
        _, body = await self.get("/readyz")
        return str(body.get("leadership")) if isinstance(body, dict) else "unknown"

    async def leadership_or_unreachable(self) -> str:
        """``leadership``, or "unreachable" while its HTTP server does not answer (killed, blackholed machine)."""
        try:
            return await self.leadership()
        except (aiohttp.ClientError, OSError):
            return "unreachable"

    async def saw_other_holder(self) -> float:
        """Lease attempts that found another holder's lease: a standby reaching the API server and seeing the
        leader (``crane_leader_election_attempts_total{result="held_by_other"}``)."""
        return await self.metric("crane_leader_election_attempts_total", result="held_by_other") or 0.0

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()
