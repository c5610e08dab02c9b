"""``crane-event-recorder``: parse flags, configure logging, run the service until SIGTERM."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from crane_event_recorder.app import serve
from crane_event_recorder.settings import parse_settings
from crane_shared.logs import configure_logging


def main(argv: Sequence[str] | None = None) -> int:
    common, redis, settings = parse_settings(argv)
    configure_logging(common.log_level, common.log_format)
    return asyncio.run(serve(common, redis, settings))


if __name__ == "__main__":
    sys.exit(main())
