"""Hot values: upstream's formula over Redis counts, which nodes need a patch, and per-node debounce."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from crane_annotator.debounce import Debouncer
from crane_annotator.hot import Hot, HotValues, to_write
from crane_shared.policy import default_policy

M5, M1 = timedelta(minutes=5), timedelta(minutes=1)


class FakeStore:
    def __init__(self, counts: dict[str, dict[timedelta, int]]) -> None:
        self.counts = counts
        self.calls: list[tuple[list[str], tuple[timedelta, ...], float]] = []

    async def count_in_windows(
        self, nodes: Sequence[str], windows: Sequence[timedelta], now: float
    ) -> dict[str, dict[timedelta, int]]:
        self.calls.append((list(nodes), tuple(windows), now))
        return {n: {w: self.counts.get(n, {}).get(w, 0) for w in windows} for n in nodes}


async def test_refresh_applies_upstream_formula_in_one_call() -> None:
    store = FakeStore({"a": {M5: 11, M1: 5}, "b": {M5: 4, M1: 1}})
    hot = HotValues(store, default_policy().hot_value, clock=lambda: 1000.0)  # type: ignore[arg-type]
    fresh = await hot.refresh(["a", "b", "c"])
    # default rules: floor(5m / 5) + floor(1m / 2)
    assert {n: h.value for n, h in fresh.items()} == {"a": 2 + 2, "b": 0 + 0, "c": 0}
    assert len(store.calls) == 1 and set(store.calls[0][1]) == {M5, M1}
    assert hot.annotation("a") == {"node_hot_value": "4,1970-01-01T00:16:40+00:00"}
    assert hot.annotation("unknown") == {}


def test_nodes_to_write_are_new_changed_or_old() -> None:
    computed = {n: Hot(v, 100.0, {}) for n, v in {"new": 0, "same": 1, "changed": 3, "old": 0}.items()}
    written = {"same": (1, 90.0), "changed": (2, 99.0), "old": (0, 100.0 - 120.0)}
    assert to_write(computed, written, now=100.0, max_age=120.0) == ["changed", "new", "old"]


def test_mark_written_remembers_what_the_node_holds() -> None:
    hot = HotValues(FakeStore({}), default_policy().hot_value)  # type: ignore[arg-type]
    hot.mark_written("a", "3,1970-01-01T00:16:40+00:00")
    hot.mark_written("b", "garbage")
    assert hot.written == {"a": (3, 1000.0)}


def test_burst_on_one_node_is_flushed_once_after_the_delay() -> None:
    d = Debouncer(0.25)
    d.add(["a"], now=10.0)
    d.add(["a", "a", "b"], now=10.1)
    assert d.take_due(10.2) == []
    assert d.next_deadline() == 10.25
    assert d.take_due(10.25) == ["a"]
    assert d.take_due(10.35) == ["b"]
    assert len(d) == 0 and d.next_deadline() is None


def test_a_steady_stream_cannot_postpone_a_node_forever() -> None:
    d = Debouncer(0.25)
    flushed = []
    for i in range(20):  # a binding every 0.1 s for 2 s
        now = i * 0.1
        d.add(["a"], now)
        flushed += [now for _ in d.take_due(now)]
    # Each window closes 0.25 s after it opened; this loop only looks every 0.1 s, hence up to 0.4 s apart.
    gaps = [b - a for a, b in zip([0.0, *flushed], flushed, strict=False)]
    assert len(flushed) == 5 and max(gaps) <= 0.4 + 1e-9
