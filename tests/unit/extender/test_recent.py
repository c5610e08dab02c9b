"""Recent bindings from the event-recorder's stream: joined with pod sizes, counted once, forgotten in time."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from crane_extender.protocol import PodView
from crane_extender.recent import RecentBindings, follow_bindings
from crane_shared.binding_store import SkippedEntry, StreamBatch
from crane_shared.bindings import BindingRecord
from crane_shared.loadaware.dynamic import DynamicArgs, EstimateArgs, RecentBinding, binding_horizon
from crane_shared.policy import default_policy

T = 1_800_000_000.0


def record(uid: str, node: str = "n1", at: float = T, scheduler: str = "default-scheduler") -> BindingRecord:
    return BindingRecord(uid, "ns", f"pod-{uid}", node, at, scheduler)


def sized(uid: str, cpu: float = 2, memory: float = 4e9) -> PodView:
    return PodView(uid, "ns", f"pod-{uid}", False, cpu, memory)


def test_the_binding_horizon_covers_the_longest_hot_value_range_and_estimate_window() -> None:
    assert binding_horizon(DynamicArgs(default_policy())) == timedelta(minutes=5)
    longer = EstimateArgs(windows={"cpu_usage_max_avg_1h": timedelta(minutes=20)})
    assert binding_horizon(DynamicArgs(default_policy(), estimate=longer)) == timedelta(minutes=20)


def test_a_binding_carries_the_size_of_the_pod_seen_in_its_request() -> None:
    recent = RecentBindings(timedelta(minutes=5))
    recent.remember(sized("u1", cpu=2, memory=4e9))
    assert recent.add(record("u1"), now=T + 1)
    assert recent.add(record("u2"), now=T + 1)  # never seen: counts, without a size
    assert recent.for_node("n1", now=T + 1) == (RecentBinding("n1", T, 2, 4e9), RecentBinding("n1", T, 0, 0))
    assert recent.for_node("n2", now=T + 1) == ()


def test_a_binding_counts_once_per_pod() -> None:
    recent = RecentBindings(timedelta(minutes=5))
    assert recent.add(record("u1"), now=T)
    assert not recent.add(record("u1"), now=T + 1)
    assert len(recent.for_node("n1", now=T + 1)) == 1


def test_bindings_older_than_the_retention_are_ignored_and_forgotten() -> None:
    recent = RecentBindings(timedelta(minutes=5))
    assert not recent.add(record("old", at=T - 301), now=T)
    assert recent.add(record("u1", at=T), now=T)
    assert recent.for_node("n1", now=T + 299) != ()
    assert recent.for_node("n1", now=T + 300) == ()
    assert recent.prune(now=T + 300) == 1
    assert len(recent) == 0 and list(recent.nodes()) == []


def test_only_the_chosen_schedulers_bindings_count_when_restricted() -> None:
    recent = RecentBindings(timedelta(minutes=5), schedulers=frozenset({"default-scheduler"}))
    assert recent.add(record("u1"), now=T)
    assert not recent.add(record("u2", scheduler="other"), now=T)


def test_memory_is_bounded_keeping_the_newest() -> None:
    recent = RecentBindings(timedelta(minutes=5), max_pods=10)
    for i in range(25):
        recent.remember(sized(f"u{i}"))
        recent.add(record(f"u{i}", at=T + i), now=T + 30)
    recent.prune(now=T + 30)
    kept = recent.for_node("n1", now=T + 30)
    assert len(kept) <= 10
    assert max(b.bound_at for b in kept) == T + 24


class FakeStore:
    """read_stream like BindingStore: batches in order, then blocks; can fail first."""

    def __init__(self, batches: list[StreamBatch], failures: int = 0) -> None:
        self.batches = batches
        self.failures = failures
        self.calls: list[str] = []

    async def read_stream(self, last_id: str, block_ms: int | None, count: int) -> StreamBatch:
        self.calls.append(last_id)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("redis down")
        if self.batches:
            return self.batches.pop(0)
        await asyncio.sleep((block_ms or 0) / 1000)
        return StreamBatch(last_id, ())


async def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_follow_reads_from_the_oldest_entry_survives_errors_and_stops() -> None:
    now = time.time()
    store = FakeStore(
        [
            StreamBatch("1-0", (record("u1", at=now),), (SkippedEntry("0-9", "bad"),)),
            StreamBatch("2-0", (record("u2", node="n2", at=now),)),
        ],
        failures=2,
    )
    recent = RecentBindings(timedelta(minutes=5))
    stopping = asyncio.Event()
    results: list[str] = []
    task = asyncio.create_task(
        follow_bindings(
            store,
            recent,
            stopping,
            block_ms=20,
            on_record=results.append,
        )
    )
    await wait_for(lambda: recent.for_node("n2", time.time()) != ())
    assert recent.for_node("n1", time.time()) != ()
    assert store.calls[0] == "0" and "1-0" in store.calls  # resumes after the last entry read
    assert results.count("stream-error") == 2 and "undecodable" in results
    stopping.set()
    await asyncio.wait_for(task, 2)
