"""The writer's ReportGate: reports yield to binds waiting for a connection, in order, and a cancelled report
passes its place on (nothing stays blocked, nothing is dropped)."""

from __future__ import annotations

import asyncio

from crane_scheduler.writer.http import Endpoint, HttpPool
from crane_scheduler.writer.process import ReportGate


def _gate(limit: int) -> tuple[HttpPool, ReportGate]:
    binds = HttpPool(Endpoint("127.0.0.1", 1, "127.0.0.1:1"), size=1, timeout=1)
    return binds, ReportGate(binds, limit)


async def _enter(gate: ReportGate, order: list[int], i: int, leave: asyncio.Event) -> None:
    async with gate:
        order.append(i)
        await leave.wait()


async def test_reports_are_not_limited_while_no_bind_waits() -> None:
    _, gate = _gate(1)
    leave = asyncio.Event()
    order: list[int] = []
    tasks = [asyncio.create_task(_enter(gate, order, i, leave)) for i in range(5)]
    await asyncio.sleep(0)
    assert order == [0, 1, 2, 3, 4] and gate.in_flight == 5
    leave.set()
    await asyncio.gather(*tasks)
    assert gate.in_flight == 0


async def test_while_binds_wait_at_most_the_limit_in_flight_in_order_then_all_when_they_stop() -> None:
    binds, gate = _gate(2)
    binds.queued = 3
    leave = asyncio.Event()
    order: list[int] = []
    tasks = [asyncio.create_task(_enter(gate, order, i, leave)) for i in range(5)]
    await asyncio.sleep(0)
    assert order == [0, 1] and gate.in_flight == 2
    binds.queued = 0
    binds.on_unqueued()  # what HttpPool calls when its last waiting request got a slot
    await asyncio.sleep(0)
    assert order == [0, 1, 2, 3, 4] and gate.in_flight == 5
    leave.set()
    await asyncio.gather(*tasks)
    assert gate.in_flight == 0


async def test_a_report_leaving_admits_the_next_and_a_cancelled_waiter_passes_its_turn_on() -> None:
    binds, gate = _gate(1)
    binds.queued = 1
    leaves = [asyncio.Event() for _ in range(3)]
    order: list[int] = []
    tasks = [asyncio.create_task(_enter(gate, order, i, leaves[i])) for i in range(3)]
    await asyncio.sleep(0)
    assert order == [0]
    tasks[1].cancel()  # waiting, cancelled (its term ended): must not keep a place
    leaves[0].set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert order == [0, 2] and gate.in_flight == 1
    leaves[2].set()
    await asyncio.gather(tasks[0], tasks[2])
    assert gate.in_flight == 0 and tasks[1].cancelled()
