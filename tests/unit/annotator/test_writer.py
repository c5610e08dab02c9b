"""The patch queue: one patch per node, joins, urgency, merge-only holds and withdrawal on cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace

from crane_annotator.limiter import PriorityLimiter
from crane_annotator.writer import NodePatcher, Outcome


class FakeSendPatcher(NodePatcher):
    """The real queue and workers; the HTTP request replaced by a record of what would be sent."""

    def __init__(self, qps: float = 0.0, concurrency: int = 4) -> None:
        api = SimpleNamespace(configuration=SimpleNamespace(host="http://127.0.0.1:1"))
        super().__init__(api, PriorityLimiter(qps, 1), concurrency=concurrency)
        self.sent: list[tuple[str, dict[str, str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = asyncio.Event()
        """set when a send has started (and waits at the gate when it is closed)"""

    async def _send(self, node: str, annotations: Mapping[str, str]) -> Outcome:
        self.in_flight.set()
        await self.gate.wait()
        self.sent.append((node, dict(annotations)))
        return "missing" if node.startswith("gone") else "ok"


def hot(node: str) -> dict[str, str]:
    return {"node_hot_value": f"hot-of-{node}"}


async def test_each_node_gets_one_patch_with_the_hot_value_current_when_it_is_sent() -> None:
    patcher = FakeSendPatcher()
    try:
        report = await patcher.patch_many({"a": {"m": "1"}, "gone": {"m": "2"}}, hot=hot)
    finally:
        await patcher.close()
    assert sorted(patcher.sent) == [
        ("a", {"m": "1", "node_hot_value": "hot-of-a"}),
        ("gone", {"m": "2", "node_hot_value": "hot-of-gone"}),
    ]
    assert report.ok == ["a"] and report.missing == ["gone"] and report.merged == []


async def test_an_urgent_submission_joins_the_queued_patch_and_sends_it_first() -> None:
    patcher = FakeSendPatcher(concurrency=1)
    patcher.gate.clear()
    try:
        round_ = asyncio.create_task(patcher.patch_many({f"n{i}": {"m": str(i)} for i in range(20)}, hot=hot))
        await patcher.in_flight.wait()  # n0 is out, the other 19 queued
        urgent = asyncio.create_task(patcher.patch_many({"n19": {}}, hot=hot, urgent=True))
        await asyncio.sleep(0)
        patcher.gate.set()
        report = await urgent
        await round_
    finally:
        await patcher.close()
    nodes = [node for node, _ in patcher.sent]
    assert sorted(nodes) == sorted(f"n{i}" for i in range(20))  # one patch each: n19's hot value rode along
    assert nodes[:2] == ["n0", "n19"]  # and it jumped the queue
    assert report.merged == ["n19"] and report.ok == ["n19"]
    assert dict(patcher.sent)["n19"] == {"m": "19", "node_hot_value": "hot-of-n19"}


async def test_merge_only_joins_a_queued_patch_or_is_held() -> None:
    patcher = FakeSendPatcher(concurrency=1)
    patcher.gate.clear()
    try:
        round_ = asyncio.create_task(patcher.patch_many({"a": {"m": "1"}, "b": {"m": "2"}}, hot=hot))
        await patcher.in_flight.wait()  # a is in flight (stuck at the gate), b queued
        report = await asyncio.wait_for(
            asyncio.gather(
                patcher.patch_many({"a": {}, "b": {}, "c": {}}, hot=hot, urgent=True, merge_only=True),
                _open_gate_soon(patcher),
            ),
            2,
        )
        await round_
    finally:
        await patcher.close()
    held = report[0]
    assert held.held == ["a", "c"] and held.merged == ["b"]
    assert [node for node, _ in patcher.sent] == ["a", "b"]


async def _open_gate_soon(patcher: FakeSendPatcher) -> None:
    await asyncio.sleep(0)  # after the merge-only submission was queued
    patcher.gate.set()


async def test_a_second_patch_for_a_node_in_flight_waits_for_the_first() -> None:
    patcher = FakeSendPatcher(concurrency=4)
    patcher.gate.clear()
    try:
        first = asyncio.create_task(patcher.patch_many({"a": {"m": "1"}}))
        await patcher.in_flight.wait()
        second = asyncio.create_task(patcher.patch_many({"a": {"m": "2"}}))
        for _ in range(10):  # let every idle worker look for work: none may take a's second patch
            await asyncio.sleep(0)
        assert patcher.sent == []
        patcher.gate.set()
        await asyncio.gather(first, second)
    finally:
        await patcher.close()
    assert patcher.sent == [("a", {"m": "1"}), ("a", {"m": "2"})]


async def test_cancelling_the_caller_withdraws_its_queued_patches() -> None:
    patcher = FakeSendPatcher(concurrency=1)
    patcher.gate.clear()
    try:
        round_ = asyncio.create_task(patcher.patch_many({f"n{i}": {"m": "x"} for i in range(5)}))
        await patcher.in_flight.wait()  # n0 in flight, the rest queued
        round_.cancel()
        await asyncio.sleep(0)
        patcher.gate.set()
        for _ in range(10):  # the worker finishes n0 and finds nothing left
            await asyncio.sleep(0)
    finally:
        await patcher.close()
    assert [node for node, _ in patcher.sent] == ["n0"]  # lost the lease: nothing more leaves
