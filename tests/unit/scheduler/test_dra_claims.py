"""The devices held in a cycle (``ClaimTracker.allocated``): the lister's claims counted incrementally, assumed
versions in place of the lister's, pending allocations on top; the same answer as counting every claim afresh."""

from __future__ import annotations

import copy
from typing import Any

from crane_scheduler.listers import Listers
from crane_scheduler.plugins.dynamicresources.allocator import allocated_devices
from crane_scheduler.plugins.dynamicresources.claims import ClaimTracker, claim_key
from tests.support.dra import DRIVER, claim, exactly


def held(name: str, *devices: str, rv: int = 1) -> dict[str, Any]:
    c = claim(name, exactly("gpu", "gpu"))
    c["metadata"]["resourceVersion"] = str(rv)
    results = [{"request": "gpu", "driver": DRIVER, "pool": "n", "device": d} for d in devices]
    if results:
        c["status"] = {"allocation": {"devices": {"results": results}}}
    return c


def gpu(name: str) -> tuple[str, str, str]:
    return (DRIVER, "n", name)


def test_claims_changed_deleted_and_added_between_cycles_are_counted_afresh() -> None:
    tracker = ClaimTracker()
    store = {claim_key(c): c for c in (held("a", "g0"), held("b", "g1"), held("c"))}
    first = tracker.allocated(store)
    assert gpu("g0") in first and gpu("g1") in first and gpu("g2") not in first
    store["default/a"] = held("a", rv=2)  # deallocated: a new object
    del store["default/b"]
    store["default/d"] = held("d", "g2")
    second = tracker.allocated(store)
    assert [gpu(d) in second for d in ("g0", "g1", "g2")] == [False, False, True]
    assert tracker.index.counts == {gpu("g2"): 1}


def test_an_assumed_version_replaces_the_listers_and_pending_allocations_count() -> None:
    tracker = ClaimTracker()
    store = {"default/a": held("a", "g0"), "default/b": held("b")}
    tracker.assume(held("a", rv=5))  # PreBind deallocated a; the informer has not caught up
    tracker.assume(held("b", "g1", rv=5))  # and allocated b
    tracker.signal_pending(held("p", "g2"))
    devices = tracker.allocated(store)
    assert [gpu(d) in devices for d in ("g0", "g1", "g2")] == [False, True, True]
    store["default/a"] = held("a", "g0", rv=6)  # the informer's newer version wins again
    assert gpu("g0") in tracker.allocated(store)


def test_a_device_held_by_two_claims_stays_held_when_one_is_replaced() -> None:
    tracker = ClaimTracker()
    store = {"default/a": held("a", "g0"), "default/b": held("b", "g0")}
    tracker.assume(held("a", rv=5))
    assert gpu("g0") in tracker.allocated(store)


def test_the_same_answer_as_counting_every_claim() -> None:
    tracker = ClaimTracker()
    store = {f"default/c{i}": held(f"c{i}", f"g{i % 7}") for i in range(20)}
    for step in range(10):
        store[f"default/c{step}"] = held(f"c{step}", *([f"g{step + 10}"] if step % 2 else []), rv=2)
        expected = allocated_devices(list(copy.deepcopy(store).values()))
        devices = tracker.allocated(store)
        assert {gpu(f"g{i}") for i in range(30) if gpu(f"g{i}") in devices} == expected


def test_with_the_listers_changed_keys_only_those_claims_are_read_and_the_answer_is_the_same() -> None:
    changed: set[str] = set()
    tracker = ClaimTracker(changed)
    store = {f"default/c{i}": held(f"c{i}", f"g{i % 7}") for i in range(20)}
    tracker.allocated(store)  # the first cycle reads them all
    for step in range(10):
        key = f"default/c{step}"
        if step % 3 == 2:
            del store[key]
        else:
            store[key] = held(f"c{step}", *([f"g{step + 10}"] if step % 2 else []), rv=2)
        changed.add(key)
        expected = allocated_devices(list(copy.deepcopy(store).values()))
        devices = tracker.allocated(store)
        assert {gpu(f"g{i}") for i in range(30) if gpu(f"g{i}") in devices} == expected
        assert not changed


def test_the_held_log_follows_the_listers_claims_and_the_assumed_and_pending_ones() -> None:
    tracker = ClaimTracker()
    store = {"default/a": held("a", "g0"), "default/b": held("b", "g1")}
    log = tracker.held.log

    def net(since: int) -> dict[tuple[str, str, str], int]:  # a re-read claim may log a device out and in again
        out: dict[tuple[str, str, str], int] = {}
        for device, step in log[since:]:
            out[device] = out.get(device, 0) + step
        return {d: n for d, n in out.items() if n}

    tracker.allocated(store)
    assert net(0) == {gpu("g0"): 1, gpu("g1"): 1}
    mark = len(log)
    store["default/b"] = held("b", "g1", "g2", rv=2)  # g1 stays held: only g2 changes
    store["default/c"] = held("c", "g0")  # g0 held twice: no change
    tracker.allocated(store)
    assert net(mark) == {gpu("g2"): 1}
    mark = len(log)
    del store["default/a"]
    store["default/b"] = held("b", rv=3)
    tracker.allocated(store)
    assert net(mark) == {gpu("g1"): -1, gpu("g2"): -1}
    mark = len(log)
    tracker.assume(held("c", rv=5))  # PreBind deallocated c
    tracker.signal_pending(held("p", "g3"))
    tracker.signal_pending(held("q", "g0"))  # held by c in the lister, which the assumed version frees
    cycle = tracker.allocated(store)
    assert net(mark) == {gpu("g3"): 1}
    assert [d for d in map(gpu, ("g0", "g1", "g3")) if d in cycle] == [gpu("g0"), gpu("g3")]
    mark = len(log)
    tracker.remove_pending(str(held("q")["metadata"].get("uid", "")))  # its binding cycle ended
    store["default/c"] = held("c", rv=6)  # the informer caught up with the assumed version
    tracker.allocated(store)
    assert net(mark) == {gpu("g0"): -1} and not tracker.assumed


def test_the_listers_name_each_changed_claim_to_every_reader() -> None:
    listers = Listers()
    first, second = listers.changed_keys("resourceclaims"), listers.changed_keys("resourceclaims")
    listers.apply("resourceclaims", "ADDED", held("a"))
    listers.apply("resourceclaims", "MODIFIED", held("b", "g0"))
    listers.apply("resourceslices", "ADDED", {"metadata": {"name": "s"}})
    assert first == second == {"default/a", "default/b"}
    first.clear()
    listers.apply("resourceclaims", "DELETED", held("a"))
    assert (first, second) == ({"default/a"}, {"default/a", "default/b"})
