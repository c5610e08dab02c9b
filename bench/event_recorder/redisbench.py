"""``redis-benchmark`` ZADD against the same Redis: the ceiling a single-command writer could reach."""

from __future__ import annotations

import asyncio
import re
import shutil
import sys


async def zadd_rate(port: int, requests: int, *, pipeline: int = 1, clients: int = 50) -> float:
    """ZADD requests per second as redis-benchmark reports them (database 0, its own key). Tried twice: one CI run
    saw it exit at once with no output at all (not reproduced since, in hundreds of runs); the first failure is
    printed, so a second one in a row is not hidden."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise RuntimeError("redis-benchmark not found: install the Debian package redis-tools")
    failure = ""
    for _ in range(2):
        rate, failure = await _run(binary, port, requests, pipeline, clients)
        if rate is not None:
            return rate
        print(f"  {failure}; once more", file=sys.stderr)
    raise RuntimeError(failure)


async def _run(binary: str, port: int, requests: int, pipeline: int, clients: int) -> tuple[float | None, str]:
    proc = await asyncio.create_subprocess_exec(
        binary,
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-t",
        "zadd",
        "-n",
        str(requests),
        "-r",
        "1000000",
        "-P",
        str(pipeline),
        "-c",
        str(clients),
        "-q",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace").replace("\r", "\n")
    # a tiny run (the CI's smoke size) can end within the tool's clock resolution: it then reports "inf"
    rates = re.findall(r"ZADD: (inf|[\d.]+) requests per second", text)
    if proc.returncode != 0 or not rates:
        return None, f"redis-benchmark failed (exit status {proc.returncode}): {text[-400:]!r}"
    return float(rates[-1]), ""
