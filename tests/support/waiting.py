"""Waiting for state outside the test's control (a child process, a server, the cluster): the one poller."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(
    check: Callable[[], Awaitable[T | None]],
    timeout: float = ...,
    what: str = ...,
    alive: Callable[[], object] | None = ...,
    *,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T | None],
    timeout: float = ...,
    what: str = ...,
    alive: Callable[[], object] | None = ...,
    *,
    interval: float = ...,
) -> T: ...


async def eventually(
    check: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "",
    alive: Callable[[], object] | None = None,
    *,
    interval: float = 0.05,
) -> Any:
    """Call ``check()`` (sync, or returning an awaitable) until its value is truthy and return that value.

    ``alive`` (optional) is called first on every try and raises when a process the wait depends on has died,
    so a crash fails at once instead of at the deadline. Fails naming ``what`` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        if alive is not None:
            alive()
        last = check()
        if asyncio.iscoroutine(last) or isinstance(last, asyncio.Future):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            name = what or getattr(check, "__name__", "condition")
            raise AssertionError(f"{name} not reached within {timeout:g}s; last: {last!r}")
        await asyncio.sleep(interval)
