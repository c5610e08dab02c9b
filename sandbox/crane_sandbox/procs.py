"""Child processes of the local cluster: start with a log file, wait until ready, stop without leaks.

Every server the sandbox and the tests run (etcd, kube-apiserver, redis-server, prometheus, our services) is a
``ManagedProcess``. Logs go to one file per process inside the run directory, so a failed test can be debugged
after the fact; ``tail()`` is attached to every readiness timeout. Each child dies with the process that started
it (``die_with_parent``), so a SIGTERMed or SIGKILLed pytest or sandbox leaves no server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on loopback a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def service_argv(module: str, kubeconfig: Path, port: int, *args: str) -> list[str]:
    """The command line of one of our services (``python -m <module>``) as the sandbox, the benches and the tests
    run it: this interpreter, the given kubeconfig, the HTTP surface on loopback ``port``."""
    return [
        sys.executable,
        "-m",
        module,
        "--kubeconfig",
        str(kubeconfig),
        "--listen-address",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies (Linux ``PR_SET_PDEATHSIG``): no
    orphaned servers when the parent is killed without running its cleanup (SIGTERM's default action, kill -9).

    The kernel sends the signal when the *thread* that forked the child exits, so children are started from the
    event loop's thread (asyncio does). libc is loaded here, before the fork: the hook itself only calls."""
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def hook() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the hook ran: nobody will reap us
            os._exit(1)

    return hook


BIND_CONFLICT = "address already in use"
PORT_ATTEMPTS = 3


class StartupError(RuntimeError):
    """A child process did not become ready; the message carries the end of its log."""


class PortConflict(StartupError):
    """The child process exited on a bind conflict ("address already in use", in what it logged this start)."""


class Server:
    """A component with ``start()`` and ``stop()``, usable as ``async with``: stopped however the block ends."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


@dataclass
class ManagedProcess:
    """One child process with its own log file. Not restarted automatically: tests kill and restart on purpose."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    proc: asyncio.subprocess.Process | None = field(default=None, init=False)
    _log_start: int = field(default=0, init=False)
    """where this start's output begins in the log (the log is appended to, start after start)"""

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {})}
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            log.flush()
            self._log_start = log.tell()
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # our own process group: a kill reaches its children too
                preexec_fn=die_with_parent(),  # and it dies with us, even when we get no chance to stop it
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; always reaps the process."""
        if not self.running:
            return
        assert self.proc is not None
        self._signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            await self.kill()

    async def kill(self) -> None:
        """SIGKILL the whole process group (what ``kill -9`` does to a crashed service)."""
        if not self.running:
            return
        assert self.proc is not None
        self._signal(signal.SIGKILL)
        await self.proc.wait()

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def _since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    async def wait_ready(
        self, probe: Callable[[], Awaitable[bool]], timeout: float = 30.0, interval: float = 0.05
    ) -> None:
        """Poll ``probe`` until it returns True; fail fast if the process exits first."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                failure = PortConflict if BIND_CONFLICT in self._since_start() else StartupError
                raise failure(f"{self.name} exited with {self.proc and self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(Exception):
                if await probe():
                    return
            if time.monotonic() > deadline:
                raise StartupError(f"{self.name} not ready after {timeout:.0f}s:\n{self.tail()}")
            await asyncio.sleep(interval)


async def start_on_free_ports(start: Callable[[], Awaitable[None]], reassign: Callable[[], None] | None) -> None:
    """``start`` a server on ports ``free_port`` picked a moment before it; another process may have taken one in
    between (the kernel hands out the ephemeral ports of outgoing connections from the same range, and parallel
    test workers start servers too): when the server exited on a bind conflict (``PortConflict``: nothing of it
    left running), ``reassign`` fresh ports and start it again, up to ``PORT_ATTEMPTS`` times. ``reassign`` None:
    its ports are promised (a restart, or clients configured before it starts), so it fails instead."""
    for attempt in range(PORT_ATTEMPTS):
        try:
            await start()
            return
        except PortConflict:
            if reassign is None or attempt == PORT_ATTEMPTS - 1:
                raise
            reassign()


async def tcp_open(host: str, port: int) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
