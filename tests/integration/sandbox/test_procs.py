"""A server started by ``ManagedProcess`` dies with the process that started it, also when that process is
SIGTERMed or SIGKILLed and runs none of its cleanup (what happens to pytest killed by CI's timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

STARTER = """
import asyncio, sys
from pathlib import Path
from crane_sandbox.procs import ManagedProcess

async def main() -> None:
    server = ManagedProcess("server", ["sleep", "600"], Path(sys.argv[1]))
    await server.start()
    print(server.pid, flush=True)
    await asyncio.Event().wait()  # until killed; never stops the server itself

asyncio.run(main())
"""


async def _exited(pid: int, timeout: float) -> bool:
    """Wait for ``pid`` (not our child) to exit, through a pidfd: readable once the process has terminated."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_reader(fd, done.set)
    try:
        await asyncio.wait_for(done.wait(), timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
async def test_the_server_dies_when_the_process_that_started_it_is_killed(sig: signal.Signals, tmp_path: Path) -> None:
    starter = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STARTER, str(tmp_path / "server.log"), stdout=asyncio.subprocess.PIPE
    )
    assert starter.stdout is not None
    server = int((await asyncio.wait_for(starter.stdout.readline(), 30)).decode())
    try:
        assert not await _exited(server, 0.2), "the server did not start"
        starter.send_signal(sig)
        await asyncio.wait_for(starter.wait(), 10)
        assert await _exited(server, 10), f"the server (pid {server}) outlived its parent killed with {sig.name}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


async def test_a_server_whose_port_was_taken_meanwhile_starts_on_fresh_ports(tmp_path: Path) -> None:
    """``free_port`` picks a port free a moment before the server binds it; another process may take it in
    between (CI once lost a run to etcd's "bind: address already in use"). The server starts again on fresh
    ports; the process holding the port keeps it."""
    from crane_sandbox.cluster import Etcd

    (tmp_path / "logs").mkdir()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: as an outgoing connection's ephemeral port holds it
        port = taken.getsockname()[1]
        etcd = Etcd(tmp_path, port=port)
        try:
            await etcd.start()
            assert etcd.port != port and "address already in use" in (tmp_path / "logs" / "etcd.log").read_text()
        finally:
            await etcd.stop()


async def test_a_bind_conflict_is_told_apart_only_from_what_this_start_logged(tmp_path: Path) -> None:
    """The log is appended to, start after start: a conflict an earlier start logged does not make a later,
    different failure a conflict (which would start the server again instead of reporting it)."""
    from crane_sandbox.procs import ManagedProcess, PortConflict, StartupError, tcp_open

    log = tmp_path / "server.log"
    conflict = ManagedProcess("server", ["sh", "-c", "echo 'bind: address already in use'; exit 1"], log)
    await conflict.start()
    with pytest.raises(PortConflict):
        await conflict.wait_ready(lambda: tcp_open("127.0.0.1", 1), timeout=10)
    other = ManagedProcess("server", ["sh", "-c", "echo 'open /data: permission denied'; exit 1"], log)
    await other.start()
    with pytest.raises(StartupError) as failed:
        await other.wait_ready(lambda: tcp_open("127.0.0.1", 1), timeout=10)
    assert not isinstance(failed.value, PortConflict)
