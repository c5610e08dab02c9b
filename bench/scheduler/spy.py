"""Where crane-scheduler's CPU goes during a benchmark run: py-spy attached to the child process.

``--py-spy`` on ``bench.scheduler`` / ``bench.scheduler.workloads`` samples the running scheduler (``py-spy record
--format raw``, the collapsed stacks of the active threads) from its start to the last bind and prints the share
of samples per part of the pipeline: the decision, the binding cycle, the event writer, the informers, TLS
handshakes, socket I/O. Import-time samples (the process's start) are left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path

# (part, frame prefixes that put a sample there): the first part (in this order) with a frame in the stack wins
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("TLS handshake / connect", ("SSLObject.do_handshake", "SSLProtocol.connection_made", "_sock_connect")),
    ("decision (Algorithm.schedule)", ("Algorithm.schedule",)),
    ("assume + Reserve", ("SchedulingCycle._assume_and_bind",)),
    ("binding cycle (bind request)", ("SchedulingCycle._binding_cycle",)),
    ("event writer (Scheduled events)", ("Reporter._worker",)),
    ("informers (watch decode, cache, pod index)", ("Informer.",)),
    ("API writer pipe (pack, flush, replies)", ("ApiWriter.",)),
    ("request bodies written (socket send)", ("ClientRequest.write_bytes",)),
    ("responses read (socket receive, TLS)", ("_SelectorSocketTransport._read_ready",)),
)


class Spy:
    """``py-spy record`` on one process until ``stop``."""

    def __init__(self, proc: asyncio.subprocess.Process, out: Path) -> None:
        self.proc, self.out = proc, out

    @classmethod
    async def attach(cls, pid: int, out: Path, rate: int = 200) -> Spy | None:
        exe = _py_spy()
        if exe is None:
            print("  --py-spy: py-spy is not installed (pip install py-spy)", file=sys.stderr)
            return None
        argv = [exe, "record", "-p", str(pid), "-o", str(out), "-f", "raw", "-r", str(rate), "--nonblocking"]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        return cls(proc, out)

    async def stop(self) -> dict[str, float]:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        return breakdown(self.out)


def _py_spy() -> str | None:
    """The py-spy next to this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def breakdown(path: Path) -> dict[str, float]:
    """Share of samples per part (``PARTS``, plus "other"), import-time samples left out."""
    counts: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return {}
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = [f.split(" (")[0] for f in stack.split(";")]
        if any("_find_and_load" in f for f in frames):
            continue
        total += int(n)
        part = next(
            (name for name, prefixes in PARTS if any(f.startswith(prefixes) for f in frames)),
            "other (event loop, timers, ...)",
        )
        counts[part] += int(n)
    return (
        {part: counts[part] / total for part in [p for p, _ in PARTS] + ["other (event loop, timers, ...)"]}
        if total
        else {}
    )


def render(shares: dict[str, float]) -> str:
    return "\n".join(f"    {share * 100:5.1f}%  {part}" for part, share in shares.items())
