"""VictoriaMetrics single-node and vmalert from Debian's ``victoria-metrics`` package: a second real metrics
backend for the tests and the benchmarks.

``VictoriaMetrics`` scrapes the same exporter targets as a ``PrometheusServer`` (its own ``-promscrape.config``,
timestamps honoured), takes history through its JSON import API (what ``promtool`` backfill is to Prometheus),
and answers the Prometheus query API at ``/api/v1/query`` and under the ``/prometheus`` prefix. Single-node VM
does not evaluate recording rules: ``Vmalert`` evaluates crane's rule files against it and writes the results
back over remote write, as a VictoriaMetrics installation does."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import aiohttp
import yaml

from crane_sandbox.procs import ManagedProcess, Server, free_port
from crane_sandbox.prometheus import SeriesHistory

VM_BIN = "/usr/bin/victoria-metrics"
VMALERT_BIN = "/usr/bin/vmalert"


def scrape_config(targets: Sequence[tuple[str, str]], scrape_interval: str = "1s") -> dict[str, object]:
    """The scrape part of ``crane_sandbox.prometheus.render_config`` for VM's promscrape: the same targets, each
    shard its own ``instance``, the exporter's labels and timestamps kept."""
    groups = [
        {"targets": [address], "labels": {"__metrics_path__": path, "instance": f"{address}{path}"}}
        for address, path in targets
    ]
    return {
        "global": {"scrape_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "fleet",
                "honor_labels": True,
                "honor_timestamps": True,
                "scrape_timeout": scrape_interval,
                "static_configs": groups,
            }
        ],
    }


def import_lines(series: Iterable[SeriesHistory]) -> str:
    """History as VictoriaMetrics' ``/api/v1/import`` JSON lines (timestamps in milliseconds)."""
    lines = []
    for name, labels, samples in series:
        ordered = sorted(samples)
        lines.append(
            json.dumps(
                {
                    "metric": {"__name__": name, **labels},
                    "values": [v for _, v in ordered],
                    "timestamps": [int(t * 1000) for t, _ in ordered],
                }
            )
        )
    return "\n".join(lines) + "\n"


class VictoriaMetrics(Server):
    """One single-node VictoriaMetrics on a free loopback port."""

    def __init__(
        self,
        run_dir: Path,
        targets: Sequence[tuple[str, str]],
        *,
        latency_offset: str = "30s",
        scrape_interval: str = "1s",
        name: str = "vm",
    ) -> None:
        self.run_dir = run_dir
        self.scrape_interval = scrape_interval
        self.port = free_port()
        self.config_path = run_dir / f"{name}-scrape.yml"
        self.targets = list(targets)
        self.process = ManagedProcess(
            name=name,
            argv=[
                VM_BIN,
                f"-storageDataPath={run_dir / f'{name}-data'}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-promscrape.config={self.config_path}",
                f"-search.latencyOffset={latency_offset}",
                "-search.disableCache",  # history is imported after start: no stale rollup cache
                "-loggerLevel=WARN",
            ],
            log_path=run_dir / f"{name}.log",
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = scrape_config(self.targets, self.scrape_interval)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        await self.process.start()
        await self.process.wait_ready(self._ready, timeout=30)

    async def _ready(self) -> bool:
        async with aiohttp.ClientSession() as session, session.get(f"{self.url}/health") as resp:
            return resp.status == 200

    async def import_history(self, series: Iterable[SeriesHistory]) -> None:
        body = import_lines(series).encode()
        async with aiohttp.ClientSession() as session, session.post(f"{self.url}/api/v1/import", data=body) as resp:
            if resp.status != 204:
                raise RuntimeError(f"VictoriaMetrics import: HTTP {resp.status} {await resp.text()}")

    async def stop(self) -> None:
        await self.process.stop()


class Vmalert(Server):
    """vmalert evaluating ``rules`` against ``datasource`` and writing the results back to it."""

    def __init__(self, run_dir: Path, datasource: str, rules: Path, *, interval: str = "1s") -> None:
        self.port = free_port()
        self.process = ManagedProcess(
            name="vmalert",
            argv=[
                VMALERT_BIN,
                f"-rule={rules}",
                f"-datasource.url={datasource}",
                f"-remoteWrite.url={datasource}",
                "-remoteWrite.flushInterval=500ms",
                f"-evaluationInterval={interval}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                "-loggerLevel=WARN",
            ],
            log_path=run_dir / "vmalert.log",
        )

    async def start(self) -> None:
        await self.process.start()
        await self.process.wait_ready(self._ready, timeout=30)

    async def _ready(self) -> bool:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{self.port}/health") as resp:
            return resp.status == 200

    async def stop(self) -> None:
        await self.process.stop()


async def check_rules(rules: Path, log_dir: Path) -> tuple[bool, str]:
    """``vmalert -dryRun``: (ok, output), offline validation of a rules file as vmalert parses it."""
    proc = ManagedProcess("vmalert-check", [VMALERT_BIN, "-dryRun", f"-rule={rules}"], log_dir / "vmalert-check.log")
    await proc.start()
    assert proc.proc is not None
    code = await proc.proc.wait()
    return code == 0, proc.tail()
