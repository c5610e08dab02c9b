"""Structured logging (structlog over the standard library), as text for people or JSON for collectors.

``LogOnce`` keeps a loop that skips bad input from flooding the log: the first occurrence of each kind is logged,
later ones are only counted (by the caller's metric).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access",):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return logger


class LogOnce:
    """Log the first occurrence of each kind of problem; the caller's metric counts every occurrence."""

    def __init__(self, logger: structlog.stdlib.BoundLogger) -> None:
        self._logger = logger
        self._seen: set[str] = set()

    def warning(self, kind: str, event: str, **fields: Any) -> None:
        if kind in self._seen:
            return
        self._seen.add(kind)
        self._logger.warning(event, kind=kind, note="further occurrences are only counted", **fields)
