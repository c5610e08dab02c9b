"""Thanos Query over an HA pair of Prometheus replicas with sidecars, for the tests and the benchmarks.

Thanos is built from its pinned Go module by ``scripts/tools thanos`` (cached; the first call builds it: minutes).
Each replica is a ``PrometheusServer`` with ``external_labels: {replica: <name>}`` and a ``thanos sidecar`` that
serves its TSDB over gRPC; ``thanos query`` fans a PromQL query out to the sidecars and deduplicates the pair on
the ``replica`` label. With ``partial_response`` on (Thanos' default), a replica whose sidecar cannot reach its
Prometheus turns into a ``warnings`` entry next to the data of the other: the partial answer the annotator must
handle."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import aiohttp

from crane_sandbox.cluster import REPO_ROOT
from crane_sandbox.procs import ManagedProcess, Server, free_port

REPLICA_LABEL = "replica"


@functools.cache
def thanos_binary() -> str:
    """thanos built from its Go module by scripts/tools (cached; the first call builds it)."""
    out = subprocess.run(
        [str(REPO_ROOT / "scripts" / "tools"), "thanos"], check=True, capture_output=True, text=True, timeout=3600
    )
    return out.stdout.strip()


async def _ready(url: str) -> bool:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/-/ready") as resp:
        return resp.status == 200


class Sidecar(Server):
    """``thanos sidecar`` in front of one Prometheus (its URL and its TSDB directory)."""

    def __init__(self, run_dir: Path, name: str, prometheus_url: str, tsdb: Path, heartbeat: str = "30s") -> None:
        """``heartbeat``: how often the sidecar checks its Prometheus (``--prometheus.get_config_interval``, also
        its retry interval while waiting for it at start). A sidecar whose check fails turns not ready and Query
        stops asking it (Thanos 0.35+); until then Query asks it and gets errors: partial answers."""
        self.grpc_port, self.http_port = free_port(), free_port()
        self.process = ManagedProcess(
            f"thanos-sidecar-{name}",
            [
                thanos_binary(),
                "sidecar",
                f"--prometheus.url={prometheus_url}",
                f"--tsdb.path={tsdb}",
                f"--grpc-address=127.0.0.1:{self.grpc_port}",
                f"--http-address=127.0.0.1:{self.http_port}",
                f"--prometheus.get_config_interval={heartbeat}",
                "--log.level=warn",
            ],
            run_dir / f"thanos-sidecar-{name}.log",
        )

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    async def start(self) -> None:
        await self.process.start()
        await self.process.wait_ready(lambda: _ready(f"http://127.0.0.1:{self.http_port}"), timeout=60)

    async def stop(self) -> None:
        await self.process.stop()


class Query(Server):
    """``thanos query`` over ``endpoints`` (sidecars' gRPC addresses), deduplicating on ``replica``."""

    def __init__(self, run_dir: Path, endpoints: list[str]) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.process = ManagedProcess(
            "thanos-query",
            [
                thanos_binary(),
                "query",
                f"--http-address=127.0.0.1:{self.http_port}",
                f"--grpc-address=127.0.0.1:{self.grpc_port}",
                f"--query.replica-label={REPLICA_LABEL}",
                *(f"--endpoint={e}" for e in endpoints),
                "--log.level=warn",
            ],
            run_dir / "thanos-query.log",
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    async def start(self) -> None:
        await self.process.start()
        await self.process.wait_ready(lambda: _ready(self.url), timeout=60)

    async def stop(self) -> None:
        await self.process.stop()
