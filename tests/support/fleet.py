"""A simulated fleet scraped by a real Prometheus: the one way tests start the two together."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from crane_sandbox.exporter import FleetExporter
from crane_sandbox.fleet import FleetState
from crane_sandbox.prometheus import PrometheusServer


@asynccontextmanager
async def scraped_fleet(
    run_dir: Path, state: FleetState, *, shard_size: int = 4, data_dir: Path | None = None
) -> AsyncIterator[tuple[FleetExporter, PrometheusServer]]:
    """The fleet's node-exporter shards served, and a Prometheus with crane's fast recording rules scraping them
    (over the history in ``data_dir`` when given); both stopped afterwards, however the block ends."""
    exporter = FleetExporter(state, shard_size=shard_size)
    await exporter.start()
    prometheus = PrometheusServer(run_dir, exporter.targets(), rules="fast", data_dir=data_dir)
    try:
        await prometheus.start()
        yield exporter, prometheus
    finally:
        await prometheus.stop()
        await exporter.stop()
