"""The bounded buffer between the watch and Redis: order, drop-oldest, and what counts as settled."""

from __future__ import annotations

from crane_event_recorder.buffer import RecordBuffer
from crane_shared.bindings import BindingRecord


def rec(i: int) -> BindingRecord:
    return BindingRecord(uid=f"u{i}", namespace="ns", name=f"p{i}", node="n", bound_at=float(i), scheduler="s")


def uids(batch: list[BindingRecord]) -> list[str]:
    return [r.uid for r in batch]


def test_records_come_out_in_the_order_they_went_in() -> None:
    buf = RecordBuffer(10)
    for i in range(5):
        buf.push(rec(i))
    assert uids(buf.take(3)) == ["u0", "u1", "u2"]
    assert uids(buf.take(10)) == ["u3", "u4"]


def test_full_buffer_drops_the_oldest_and_counts_it() -> None:
    buf = RecordBuffer(3)
    dropped = [buf.push(rec(i)) for i in range(5)]
    assert dropped == [0, 0, 0, 1, 1]
    assert buf.dropped == 2
    assert uids(buf.take(10)) == ["u2", "u3", "u4"]


def test_a_failed_batch_goes_back_in_front_of_newer_records() -> None:
    buf = RecordBuffer(10)
    for i in range(4):
        buf.push(rec(i))
    batch = buf.take(2)
    buf.push(rec(4))
    assert buf.depth == 5  # in flight still counts: it is not in Redis yet
    buf.give_back(batch)
    assert uids(buf.take(10)) == ["u0", "u1", "u2", "u3", "u4"]


def test_giving_back_into_a_full_buffer_drops_the_oldest() -> None:
    buf = RecordBuffer(3)
    for i in range(3):
        buf.push(rec(i))
    batch = buf.take(2)
    buf.push(rec(3))
    buf.push(rec(4))
    assert buf.give_back(batch) == 2
    assert uids(buf.take(10)) == ["u2", "u3", "u4"]


def test_settled_counts_written_and_dropped_records() -> None:
    buf = RecordBuffer(2)
    for i in range(3):
        buf.push(rec(i))  # u0 dropped
    assert (buf.pushed, buf.settled) == (3, 1)
    batch = buf.take(1)
    assert buf.settled == 1
    buf.done(batch)
    assert buf.settled == 2
    assert buf.not_empty.is_set()
    buf.done(buf.take(5))
    assert buf.settled == 3 and not buf.not_empty.is_set() and buf.depth == 0
