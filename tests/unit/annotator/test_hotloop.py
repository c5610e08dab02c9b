"""Hot-value loops with stand-in Redis and API server: what gets patched, how urgently, and how often."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from crane_annotator.hot import HotValues
from crane_annotator.hotloop import HotValueLoops
from crane_annotator.metrics import AnnotatorMetrics
from crane_shared.binding_store import StreamBatch
from crane_shared.bindings import BindingRecord, BindingSchema
from crane_shared.policy import default_policy
from tests.support.annotator import RecordingPatcher


class FakeStore:
    """The binding stream and the binding times per node, as Redis holds them."""

    schema = BindingSchema()

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.refreshed: list[list[str]] = []
        self.stream: asyncio.Queue[list[BindingRecord]] = asyncio.Queue()
        self.reads = 0  # read_stream calls started
        self.delivered = 0  # stream entries handed to the reader

    async def recent(self, nodes: Sequence[str], since: float) -> dict[str, list[float]]:
        self.refreshed.append(list(nodes))
        return {n: sorted(t for t in self.times.get(n, []) if t > since) for n in nodes}

    async def read_stream(self, last_id: str, block_ms: int | None, count: int) -> StreamBatch:
        self.reads += 1
        try:
            records = await asyncio.wait_for(self.stream.get(), (block_ms or 0) / 1000)
        except TimeoutError:
            return StreamBatch(last_id, ())
        self.delivered += 1
        return StreamBatch(f"{time.time()}-0", tuple(records))


class ManualClock:
    """A monotonic clock that moves only when the test says, so a debounce window does not depend on load."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.001)


class FakeRedis:
    async def xrevrange(self, key: str, count: int) -> list[Any]:
        return []


def make(
    nodes: list[str],
    max_age: float = 240.0,
    debounce: float = 0.05,
    settled: asyncio.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[HotValueLoops, FakeStore, RecordingPatcher, HotValues]:
    store, patcher = FakeStore(), RecordingPatcher()
    hot = HotValues(store, default_policy().hot_value)
    loops = HotValueLoops(
        hot,
        store,  # type: ignore[arg-type]
        FakeRedis(),  # type: ignore[arg-type]
        lambda: nodes,
        patcher,
        AnnotatorMetrics(CollectorRegistry()),
        settled=settled,
        debounce=debounce,
        max_age=max_age,
        clock=clock,
    )
    return loops, store, patcher, hot


def written(patcher: RecordingPatcher, hot: HotValues) -> None:
    """What the real writer's on_sent hook does after a successful patch."""
    for bodies, _ in patcher.calls:
        for node, body in bodies.items():
            hot.mark_written(node, body["node_hot_value"])


def hot_of(body: Mapping[str, str]) -> int:
    return int(body["node_hot_value"].split(",")[0])


async def test_with_no_bindings_the_periodic_pass_patches_nothing() -> None:
    loops, _, patcher, _ = make(["a", "b", "c"])
    for _ in range(3):
        await loops.refresh_all()
    assert patcher.calls == []  # 0, missing and stale all read as 0: nothing a scheduler would read changes


async def test_periodic_pass_patches_changed_nodes_urgently_and_only_once() -> None:
    loops, store, patcher, hot = make(["a", "b", "c"])
    now = time.time()
    store.times["b"] = [now - 10] * 10  # floor(10/5) + floor(10/2) = 7
    await loops.refresh_all()
    assert [(sorted(b), urgent) for b, urgent in patcher.calls] == [(["b"], True)]
    assert hot_of(patcher.calls[0][0]["b"]) == 7
    written(patcher, hot)
    patcher.calls.clear()
    await loops.refresh_all()  # nothing changed, nothing old
    assert patcher.calls == []


async def test_an_unchanged_non_zero_value_is_rewritten_when_old_without_priority() -> None:
    loops, store, patcher, hot = make(["a"], max_age=0.001)
    store.times["a"] = [time.time() - 10] * 5
    await loops.refresh_all()
    written(patcher, hot)
    patcher.calls.clear()
    await asyncio.sleep(0.01)
    await loops.refresh_all()
    assert [(sorted(b), urgent) for b, urgent in patcher.calls] == [(["a"], False)]


def test_a_max_age_the_scheduler_would_not_honour_is_refused() -> None:
    with pytest.raises(ValueError, match="hot-value-max-age"):
        make(["a"], max_age=300.0)


async def test_a_change_joins_the_metric_patch_queued_for_the_node() -> None:
    loops, store, patcher, _ = make(["a", "b"])
    patcher.queued = {"a"}
    now = time.time()
    store.times = {"a": [now] * 2, "b": [now] * 2}
    await loops.refresh_all()
    assert patcher.joined == ["a"]
    assert loops._metrics.patches.labels("hot_value", "ok")._value.get() == 1  # b alone; a rode on its patch


async def test_before_the_first_round_ends_hot_patches_only_join_queued_round_patches() -> None:
    settled = asyncio.Event()
    loops, store, patcher, hot = make(["a", "b", "c"], settled=settled)
    patcher.queued = {"a"}  # the round has queued a's patch; b's was sent already, c is not in the round
    now = time.time()
    store.times = {n: [now] * 2 for n in ("a", "b", "c")}
    stopping = asyncio.Event()
    periodic = asyncio.create_task(loops.periodic(stopping))
    try:
        await loops.refresh_all()  # e.g. a stream flush during the round
        assert patcher.joined == ["a"] and patcher.calls == [({"a": patcher.calls[0][0]["a"]}, True)]
        await asyncio.sleep(0.05)
        assert len(store.refreshed) == 1  # the periodic pass waits for the round, however long it takes
        written(patcher, hot)  # the round's patch for a went, with a's new value
        patcher.calls.clear()
        patcher.called.clear()
        patcher.queued = set()
        settled.set()
        await asyncio.wait_for(patcher.called.wait(), 30)  # a bound for a failure only: not a speed test
        await asyncio.sleep(0)
    finally:
        stopping.set()
        await asyncio.wait_for(periodic, 5)
    assert [(sorted(b), urgent) for b, urgent in patcher.calls] == [(["b", "c"], True)]


async def test_a_burst_on_the_stream_costs_one_recount_and_one_patch_per_node() -> None:
    # The window is measured on a clock the test moves: on the real one, a loaded machine that took longer than
    # the window to read the burst split it in two (two recounts, two patches) and the test failed under load.
    clock = ManualClock()
    loops, store, patcher, _ = make(["a", "b"], debounce=0.3, clock=clock)
    stopping = asyncio.Event()
    follower = asyncio.create_task(loops.follow_stream(stopping))
    try:
        now = time.time()
        store.times["a"] = [now] * 6
        burst = [BindingRecord(f"u{i}", "ns", f"p{i}", "a", now, "s") for i in range(6)]
        for record in burst:
            await store.stream.put([record])
        await store.stream.put([BindingRecord("x", "ns", "x", "ghost", now, "s")])  # not a known node
        await wait_until(lambda: store.delivered == 7)  # the whole burst read, one entry at a time
        assert patcher.calls == []  # still inside the window
        clock.now += 0.3  # the window closes
        await asyncio.wait_for(patcher.called.wait(), 10)
        reads = store.reads
        clock.now += 10  # long past any further window the burst could have opened...
        await store.stream.put([])  # ...and the follower wakes up to look
        await wait_until(lambda: store.reads > reads)
        await asyncio.gather(*loops._flushes)
    finally:
        stopping.set()
        await asyncio.wait_for(follower, 5)
    assert [(sorted(b), urgent) for b, urgent in patcher.calls] == [(["a"], True)]
    assert hot_of(patcher.calls[0][0]["a"]) == 4  # floor(6/5) + floor(6/2)
    assert store.refreshed == [["a"]]


async def test_the_value_falls_when_a_binding_leaves_its_window_not_on_the_next_tick() -> None:
    loops, store, patcher, hot = make(["a"])
    stopping = asyncio.Event()
    follower = asyncio.create_task(loops.follow_falls(stopping))  # nothing to wait for yet: it must be woken up
    try:
        await asyncio.sleep(0.01)
        now = time.time()
        # Two bindings in the last minute: 1m/2 gives 1. The older leaves the 1m window 0.3 s from now.
        store.times["a"] = [now - 59.7, now - 30]
        await loops.refresh_all()
        written(patcher, hot)
        assert hot_of(patcher.calls[0][0]["a"]) == 1
        patcher.calls.clear()
        patcher.called.clear()
        await asyncio.wait_for(patcher.called.wait(), 30)  # a bound for a failure only: not a speed test
        fell_at = time.time()
    finally:
        stopping.set()
        await asyncio.wait_for(follower, 5)
    assert hot_of(patcher.calls[0][0]["a"]) == 0 and patcher.calls[0][1] is True
    # not before the binding left its window; after it, well before the 15 s periodic pass this follower saves
    # (5 s of it left for a loaded machine: the follower was woken at the fall, or never)
    assert now + 0.3 <= fell_at < now + 0.3 + 10


async def test_the_loops_return_when_stopping_is_set_wherever_they_wait() -> None:
    """The worker contract: the pass still waiting for the first round, the stream follower blocked on Redis and
    the fall follower with no fall to wait for all return once ``stopping`` is set; no flush outlives them."""
    loops, store, _, _ = make(["a"], settled=asyncio.Event())
    stopping = asyncio.Event()
    worker = asyncio.create_task(loops.run(stopping))
    await wait_until(lambda: store.reads > 0)
    stopping.set()
    await asyncio.wait_for(worker, 5)
    assert worker.exception() is None and not loops._flushes
    assert store.refreshed == []  # the periodic pass never ran: the first round had not ended
