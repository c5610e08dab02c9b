"""``start_on_free_ports``: a server that lost its port to another process between ``free_port`` and its bind is
started again on fresh ports; any other failure, or a conflict every time, is raised."""

from __future__ import annotations

import pytest

from crane_sandbox.procs import PORT_ATTEMPTS, StartupError, start_on_free_ports


class Server:
    def __init__(self, *failures: str) -> None:
        self.failures = list(failures)
        self.starts = self.reassigned = 0

    async def start(self) -> None:
        self.starts += 1
        if self.failures:
            raise StartupError(f"etcd exited with 1:\n{self.failures.pop(0)}")

    def reassign(self) -> None:
        self.reassigned += 1


async def test_a_bind_conflict_is_started_again_on_fresh_ports() -> None:
    server = Server("listen tcp 127.0.0.1:42311: bind: address already in use")
    await start_on_free_ports(server.start, server.reassign)
    assert (server.starts, server.reassigned) == (2, 1)


async def test_another_failure_is_raised_at_once() -> None:
    server = Server("open /var/lib/etcd: permission denied")
    with pytest.raises(StartupError, match="permission denied"):
        await start_on_free_ports(server.start, server.reassign)
    assert (server.starts, server.reassigned) == (1, 0)


async def test_a_conflict_every_time_is_raised_after_the_last_attempt() -> None:
    server = Server(*["bind: address already in use"] * PORT_ATTEMPTS)
    with pytest.raises(StartupError, match="address already in use"):
        await start_on_free_ports(server.start, server.reassign)
    assert server.starts == PORT_ATTEMPTS
