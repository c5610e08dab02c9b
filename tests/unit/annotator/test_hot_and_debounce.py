"""Hot values: upstream's formula over binding times, when the value falls, which nodes need a patch, and
per-node debounce."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from crane_annotator.debounce import Debouncer
from crane_annotator.hot import (
    FALL_LAG,
    Hot,
    HotValues,
    counts_in_windows,
    hot_action,
    hot_actions,
    next_fall,
    read_value,
)
from crane_annotator.patches import Stamp, hot_value_annotation
from crane_shared.annotations import TimestampStyle, decode
from crane_shared.hotvalue import hot_value, windows
from crane_shared.policy import HotValuePolicy, default_policy

M5, M1 = timedelta(minutes=5), timedelta(minutes=1)


class FakeTimes:
    """Binding times per node, as the Redis sorted sets hold them."""

    def __init__(self, times: dict[str, list[float]]) -> None:
        self.times = times
        self.calls: list[tuple[list[str], float]] = []

    async def recent(self, nodes: Sequence[str], since: float) -> dict[str, list[float]]:
        self.calls.append((list(nodes), since))
        return {n: sorted(t for t in self.times.get(n, []) if t > since) for n in nodes}


RULES = default_policy().hot_value  # 5m / 5 and 1m / 2


async def test_refresh_applies_upstream_formula_in_one_call() -> None:
    now = 1000.0
    times = FakeTimes({"a": [now - 200] * 6 + [now - 10] * 5, "b": [now - 100] * 4 + [now - 1]})
    hot = HotValues(times, RULES, clock=lambda: now)
    fresh = await hot.refresh(["a", "b", "c"])
    # floor(11 / 5) + floor(5 / 2) = 4; floor(5 / 5) + floor(1 / 2) = 1
    assert {n: h.value for n, h in fresh.items()} == {"a": 4, "b": 1, "c": 0}
    assert fresh["a"].counts == {M5: 11, M1: 5}
    assert times.calls == [(["a", "b", "c"], now - 300)]  # one read covering the longest window
    assert hot.annotation("a") == {"node_hot_value": "4,1970-01-01T00:16:40+00:00"}
    assert hot.annotation("unknown") == {}


def test_counts_are_strictly_after_the_window_start_and_include_later_times() -> None:
    times = [40.0, 40.5, 99.0, 100.0, 130.0]
    assert counts_in_windows(times, [M1], now=100.0) == {M1: 4}  # 40.0 is exactly 60 s old: out
    assert counts_in_windows(times, [M1, M5], now=160.0) == {M1: 1, M5: 5}


def test_next_fall_is_when_the_oldest_binding_that_matters_leaves_its_window() -> None:
    now = 1000.0
    # 1m rule, 5 bindings: 5 // 2 = 2. One leaving keeps it (4 // 2 = 2); it falls when the second oldest
    # (5 mod 2 + 1 = 2nd) leaves (3 // 2 = 1), at that binding's time + 60 s.
    minute = [now - 50, now - 40, now - 30, now - 20, now - 10]
    assert next_fall(minute, [HotValuePolicy(M1, 2)], now) == now - 40 + 60
    # Fewer bindings than the count: the rule adds nothing and cannot fall.
    assert next_fall([now - 10], [HotValuePolicy(M1, 2)], now) is None
    # Two rules: the earlier of their falls. 5m/5 with 6 bindings falls when 2 have left.
    times = [now - 290, now - 280, now - 200, now - 100, now - 50, now - 5]
    assert next_fall(times, RULES, now) == min(now - 280 + 300, now - 50 + 60)
    # Bindings older than a window do not count for it.
    assert next_fall([now - 70, now - 65, now - 5], [HotValuePolicy(M1, 2)], now) is None


def test_next_fall_matches_a_brute_force_recount() -> None:
    now = 5000.0
    times = sorted(now - (i * 37 % 290) - 0.25 for i in range(23))
    value_now = hot_value(counts_in_windows(times, windows(RULES), now), RULES)
    fall = next_fall(times, RULES, now)
    assert fall is not None
    before = hot_value(counts_in_windows(times, windows(RULES), fall - 0.01), RULES)
    after = hot_value(counts_in_windows(times, windows(RULES), fall), RULES)
    assert before == value_now and after < value_now


def test_the_scheduler_reads_a_fresh_value_and_nothing_from_a_stale_or_missing_one() -> None:
    assert read_value((3, 100.0), now=399.9) == 3
    assert read_value((3, 100.0), now=400.0) == 0  # fresh while now < ts + 5m, as upstream
    assert read_value(None, now=0.0) == 0


def test_a_node_needs_a_hot_patch_only_when_the_value_read_would_change_or_go_stale() -> None:
    max_age = 240.0
    # Unchanged 0: never, however old or missing (0, stale and missing read the same).
    assert hot_action(0, (0, 0.0), now=10_000.0, max_age=max_age) is None
    assert hot_action(0, None, now=10_000.0, max_age=max_age) is None
    # A changed value, up or down: at once.
    assert hot_action(2, (1, 100.0), now=101.0, max_age=max_age) == "change"
    assert hot_action(0, (1, 100.0), now=101.0, max_age=max_age) == "change"
    assert hot_action(1, None, now=101.0, max_age=max_age) == "change"
    # A non-zero value that went stale reads as 0: a change.
    assert hot_action(2, (2, 100.0), now=400.0, max_age=max_age) == "change"
    # An unchanged non-zero value: rewritten at max_age, before the scheduler drops it.
    assert hot_action(2, (2, 100.0), now=339.0, max_age=max_age) is None
    assert hot_action(2, (2, 100.0), now=340.0, max_age=max_age) == "refresh"


def test_hot_actions_lists_only_the_nodes_that_need_a_patch() -> None:
    computed = {n: Hot(v, 100.0, {}) for n, v in {"new0": 0, "new1": 1, "same": 1, "changed": 3, "old": 2}.items()}
    written = {"same": (1, 90.0), "changed": (2, 99.0), "old": (2, 100.0 - 240.0)}
    assert hot_actions(computed, written, now=100.0, max_age=240.0) == {
        "changed": "change",
        "new1": "change",
        "old": "refresh",
    }


async def test_falls_are_scheduled_from_the_counts_and_taken_once() -> None:
    now = [1000.0]
    times = FakeTimes({"a": [950.0, 960.0], "b": [990.0, 995.0], "c": [999.0]})
    hot = HotValues(times, [HotValuePolicy(M1, 2)], clock=lambda: now[0])
    await hot.refresh(["a", "b", "c"])
    assert hot.next_fall_at() == pytest.approx(1010.0 + FALL_LAG)  # a's oldest binding leaves at 950 + 60
    assert hot.take_falls(1009.0) == []
    assert hot.take_falls(1010.0 + FALL_LAG) == ["a"]
    assert hot.take_falls(1010.0 + FALL_LAG) == []  # taken: not again until recounted
    assert hot.next_fall_at() == pytest.approx(1050.0 + FALL_LAG)  # b's
    now[0] = 1011.0
    fresh = await hot.refresh(["a"])
    assert fresh["a"].value == 0 and fresh["a"].next_fall is None
    hot.forget(["a"])  # b and c deleted
    assert hot.next_fall_at() is None


def test_mark_written_remembers_what_the_node_holds() -> None:
    hot = HotValues(FakeTimes({}), RULES)
    hot.mark_written("a", "3,1970-01-01T00:16:40+00:00")
    hot.mark_written("b", "garbage")
    assert hot.written == {"a": (3, 1000.0)}


@pytest.mark.parametrize("style", list(TimestampStyle))
@pytest.mark.parametrize("now", [1000.0, 1000.9999999, 1_700_000_000.5, 1_700_000_000.9999996])
async def test_our_own_annotation_is_remembered_as_decoding_it_would(style: TimestampStyle, now: float) -> None:
    stamp = Stamp(style, ZoneInfo("Asia/Shanghai"))
    hot = HotValues(FakeTimes({"a": [now - 10] * 2, "b": [now - 10] * 7}), RULES, stamp, clock=lambda: now)
    await hot.refresh(["a", "b"])
    at = datetime.fromtimestamp(now, UTC)
    assert hot.annotation("b") == hot_value_annotation(4, at, stamp)  # floor(7 / 5) + floor(7 / 2)
    text = hot.annotation("a")["node_hot_value"]
    assert text == hot_value_annotation(1, at, stamp)["node_hot_value"]
    assert hot.annotation("a")["node_hot_value"] is text  # encoded once per count
    hot.mark_written("a", text)
    sample = decode(text, stamp.legacy_zone)
    assert hot.written["a"] == (int(sample.value), sample.timestamp.timestamp()) == (1, hot.written["a"][1])


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


async def test_a_round_recounts_only_the_nodes_the_loops_have_not_counted_lately() -> None:
    now = [1000.0]
    times = FakeTimes({"a": [990.0] * 2})
    hot = HotValues(times, RULES, clock=lambda: now[0])
    assert set(await hot.refresh_stale(["a", "b"], older_than=30)) == {"a", "b"}  # nothing counted yet: all
    now[0] = 1020.0
    await hot.refresh(["b"])  # the loops counted b at 1020
    now[0] = 1040.0
    assert set(await hot.refresh_stale(["a", "b", "c"], older_than=30)) == {"a", "c"}  # a: 40 s old; c: new
    assert await hot.refresh_stale(["a", "b", "c"], older_than=30) == {}
    assert [nodes for nodes, _ in times.calls] == [["a", "b"], ["b"], ["a", "c"]]


async def test_a_refresh_that_read_before_a_newer_count_leaves_that_count_alone() -> None:
    """The periodic pass read node x before a binding; the binding's flush counted it since (1, a fall planned).
    The periodic pass finishing later must not put its older 0 back, nor drop the planned fall."""
    import asyncio

    from crane_annotator.hot import HotValues
    from crane_shared.policy import HotValuePolicy

    held = asyncio.Event()

    class Source:
        def __init__(self) -> None:
            self.times: list[float] = []
            self.calls = 0

        async def recent(self, nodes: Sequence[str], since: float) -> dict[str, list[float]]:
            answer = {n: [t for t in self.times if t > since] for n in nodes}  # Redis answered now
            self.calls += 1
            if self.calls == 1:
                await held.wait()  # the periodic pass's answer still on its way
            return answer

    clock = [1000.0]
    source = Source()
    hot = HotValues(source, [HotValuePolicy(timedelta(minutes=1), 1)], clock=lambda: clock[0])
    periodic = asyncio.create_task(hot.refresh(["x"]))
    await asyncio.sleep(0)  # it has read: no binding yet
    source.times.append(1000.2)
    clock[0] = 1000.5
    assert (await hot.refresh(["x"]))["x"].value == 1
    fall = hot.next_fall_at()
    assert fall is not None
    held.set()
    assert await periodic == {}  # its count is older than the one stored: not stored, not to be written
    assert hot.latest["x"].value == 1 and hot.next_fall_at() == fall
