"""``crane-annotator``: node load from Prometheus and hot values from Redis, as node annotations.

Reading order: ``config`` (flags) -> ``app`` (process) -> ``annotator`` (assembly) -> ``rounds`` and
``hotloop`` (the loops) -> the pure pieces they call: ``schedule``, ``matching``, ``values``, ``patches``,
``hot``, ``debounce``; adapters at the edges: ``crane_shared.prometheus``, ``nodes``, ``writer`` (+ ``limiter``),
Redis via ``crane_shared.binding_store``; ``metrics`` and ``debug`` for operators.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from crane_annotator.app import run
from crane_annotator.config import parse_config
from crane_shared.logs import configure_logging


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    configure_logging(config.common.log_level, config.common.log_format)
    return asyncio.run(run(config))


if __name__ == "__main__":
    sys.exit(main())
