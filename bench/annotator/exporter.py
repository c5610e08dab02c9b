"""The simulated fleet's node-exporter series, served from a process of its own.

Rendering thousands of nodes per scrape costs CPU; in the benchmark's process it would be measured as if it were
the annotator's. ``python -m bench.annotator.exporter --nodes N --port P`` serves the same fleet the benchmark
creates (``bench.annotator.stack.fleet``) until killed.
"""

from __future__ import annotations

import argparse
import asyncio

from bench.annotator.stack import fleet
from crane_sandbox.exporter import FleetExporter
from crane_sandbox.fleet import FleetState


async def serve(nodes: int, port: int, shard_size: int) -> None:
    exporter = FleetExporter(FleetState(fleet(nodes)), port=port, shard_size=shard_size)
    await exporter.start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--shard-size", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(serve(args.nodes, args.port, args.shard_size))


if __name__ == "__main__":
    main()
