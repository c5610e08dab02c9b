"""Hot-value loops with stand-in Redis and API server: what gets patched, how urgently, and how often."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from crane_annotator.hot import HotValues
from crane_annotator.hotloop import HotValueLoops
from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.writer import HotSupplier, PatchReport
from crane_shared.binding_store import StreamBatch
from crane_shared.bindings import BindingRecord, BindingSchema
from crane_shared.policy import default_policy

M5, M1 = timedelta(minutes=5), timedelta(minutes=1)


class FakeStore:
    schema = BindingSchema()

    def __init__(self) -> None:
        self.counts: dict[str, dict[timedelta, int]] = {}
        self.refreshed: list[list[str]] = []
        self.stream: asyncio.Queue[list[BindingRecord]] = asyncio.Queue()

    async def count_in_windows(
        self, nodes: Sequence[str], windows: Sequence[timedelta], now: float
    ) -> dict[str, dict[timedelta, int]]:
        self.refreshed.append(list(nodes))
        return {n: {w: self.counts.get(n, {}).get(w, 0) for w in windows} for n in nodes}

    async def read_stream(self, last_id: str, block_ms: int | None, count: int) -> StreamBatch:
        try:
            records = await asyncio.wait_for(self.stream.get(), (block_ms or 0) / 1000)
        except TimeoutError:
            return StreamBatch(last_id, ())
        return StreamBatch(f"{time.time()}-0", tuple(records))


class FakeRedis:
    async def xrevrange(self, key: str, count: int) -> list[Any]:
        return []


class RecordingPatcher:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, dict[str, str]], bool]] = []
        self.called = asyncio.Event()

    async def patch_many(
        self, patches: Mapping[str, Mapping[str, str]], *, hot: HotSupplier | None = None, urgent: bool = False
    ) -> PatchReport:
        bodies = {n: {**b, **(hot(n) if hot else {})} for n, b in patches.items()}
        if bodies:
            self.calls.append((bodies, urgent))
            self.called.set()
        return PatchReport(ok=list(bodies))


def make(
    nodes: list[str], max_age: float = 120.0, debounce: float = 0.05
) -> tuple[HotValueLoops, FakeStore, RecordingPatcher, HotValues]:
    store, patcher = FakeStore(), RecordingPatcher()
    hot = HotValues(store, default_policy().hot_value)  # type: ignore[arg-type]
    loops = HotValueLoops(
        hot,
        store,  # type: ignore[arg-type]
        FakeRedis(),  # type: ignore[arg-type]
        lambda: nodes,
        patcher,
        AnnotatorMetrics(CollectorRegistry()),
        debounce=debounce,
        max_age=max_age,
    )
    return loops, store, patcher, hot


def written(patcher: RecordingPatcher, hot: HotValues) -> None:
    """What the real writer's on_sent hook does after a successful patch."""
    for bodies, _ in patcher.calls:
        for node, body in bodies.items():
            hot.mark_written(node, body["node_hot_value"])


async def test_periodic_refresh_patches_new_and_changed_nodes_only_changed_ones_urgently() -> None:
    loops, store, patcher, hot = make(["a", "b", "c"])
    await loops.refresh_all()
    assert [(sorted(b), urgent) for b, urgent in patcher.calls] == [(["a", "b", "c"], True)]
    written(patcher, hot)
    patcher.calls.clear()

    await loops.refresh_all()  # nothing changed, nothing old
    assert patcher.calls == []

    store.counts["b"] = {M5: 10, M1: 0}
    await loops.refresh_all()
    assert [(sorted(b), urgent) for b, urgent in patcher.calls] == [(["b"], True)]
    assert patcher.calls[0][0]["b"]["node_hot_value"].startswith("2,")


async def test_unchanged_values_are_rewritten_once_old_without_priority() -> None:
    loops, _, patcher, hot = make(["a"], max_age=0.0)
    await loops.refresh_all()
    written(patcher, hot)
    patcher.calls.clear()
    await loops.refresh_all()
    assert [(sorted(b), urgent) for b, urgent in patcher.calls] == [(["a"], False)]


async def test_a_burst_on_the_stream_costs_one_recount_and_one_patch_per_node() -> None:
    # A window long enough that a loaded machine still reads the whole burst inside it.
    loops, store, patcher, _ = make(["a", "b"], debounce=0.3)
    follower = asyncio.create_task(loops.follow_stream())
    try:
        store.counts["a"] = {M5: 6, M1: 6}
        burst = [BindingRecord(f"u{i}", "ns", f"p{i}", "a", time.time(), "s") for i in range(6)]
        for record in burst:
            await store.stream.put([record])
        await store.stream.put([BindingRecord("x", "ns", "x", "ghost", time.time(), "s")])  # not a known node
        await asyncio.wait_for(patcher.called.wait(), 2)
        await asyncio.sleep(0.4)  # more than a debounce window: nothing else may follow
    finally:
        follower.cancel()
    assert [(sorted(b), urgent) for b, urgent in patcher.calls] == [(["a"], True)]
    assert patcher.calls[0][0]["a"]["node_hot_value"].startswith("4,")  # floor(6/5) + floor(6/2)
    assert store.refreshed == [["a"]]
