"""When the garbage collector runs: never inside a decision, the old generation not by allocation count."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from crane_scheduler.scheduler import OLD_GENERATION_THRESHOLD, tune_collector
from tests.unit.scheduler.builders import node, pod
from tests.unit.scheduler.test_scheduler_cycle import Clock, FakeBinder, make, step


@pytest.fixture
def collector() -> Iterator[None]:
    """Restores the process-wide collector settings a test changes."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    if enabled:
        gc.enable()


async def test_a_decision_runs_with_the_collector_paused_and_resumes_it_after(collector: None) -> None:
    binder, clock = FakeBinder(), Clock()
    s = make(binder, clock)
    s.on_node(node("n1"))
    s.on_pod(pod("p"))
    seen: list[bool] = []
    decide = s.algorithm.schedule

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return decide(*args, **kwargs)

    s.algorithm.schedule = spy  # type: ignore[method-assign]
    gc.enable()
    await step(s)
    assert seen == [False], "no collection can start inside the decision"
    assert gc.isenabled(), "collections resume right after it"
    binder.gate.set()
    await s.drain()


async def test_a_failing_decision_still_resumes_the_collector(collector: None) -> None:
    binder, clock = FakeBinder(), Clock()
    s = make(binder, clock)
    s.on_node(node("n1"))
    s.on_pod(pod("p"))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("plugin bug")

    s.algorithm.schedule = broken  # type: ignore[method-assign]
    gc.enable()
    await step(s)
    assert gc.isenabled()
    assert s.queue.backoff_len == 1, "the error is an ordinary failed attempt"


def test_after_sync_the_old_generation_is_left_to_the_idle_collection(collector: None) -> None:
    young, middle, _ = gc.get_threshold()
    tune_collector()
    assert gc.get_threshold() == (young, middle, OLD_GENERATION_THRESHOLD)
    assert gc.get_freeze_count() > 0, "the synced caches are frozen"
