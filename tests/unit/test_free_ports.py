"""``start_on_free_ports``: a server that lost its port to another process between ``free_port`` and its bind
(``PortConflict``) is started again on fresh ports; any other failure, a conflict every time, or a server whose
port is promised (``reassign`` None) is raised."""

from __future__ import annotations

import pytest

from crane_sandbox.procs import PORT_ATTEMPTS, PortConflict, StartupError, start_on_free_ports


class Server:
    def __init__(self, *failures: StartupError) -> None:
        self.failures = list(failures)
        self.starts = self.reassigned = 0

    async def start(self) -> None:
        self.starts += 1
        if self.failures:
            raise self.failures.pop(0)

    def reassign(self) -> None:
        self.reassigned += 1


CONFLICT = PortConflict("etcd exited with 1:\nlisten tcp 127.0.0.1:42311: bind: address already in use")


async def test_a_bind_conflict_is_started_again_on_fresh_ports() -> None:
    server = Server(CONFLICT)
    await start_on_free_ports(server.start, server.reassign)
    assert (server.starts, server.reassigned) == (2, 1)


async def test_another_failure_is_raised_at_once() -> None:
    server = Server(StartupError("etcd not ready after 20s:\n(an old line: bind: address already in use)"))
    with pytest.raises(StartupError, match="not ready"):
        await start_on_free_ports(server.start, server.reassign)
    assert (server.starts, server.reassigned) == (1, 0)


async def test_a_conflict_every_time_or_on_a_promised_port_is_raised() -> None:
    server = Server(*[CONFLICT] * PORT_ATTEMPTS)
    with pytest.raises(PortConflict):
        await start_on_free_ports(server.start, server.reassign)
    assert server.starts == PORT_ATTEMPTS
    promised = Server(CONFLICT)
    with pytest.raises(PortConflict):
        await start_on_free_ports(promised.start, None)
    assert promised.starts == 1
