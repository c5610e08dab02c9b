"""Memory and pauses of the scheduler process: the cache keeps no ``managedFields``; the garbage collector never
runs inside a decision and does not collect the old generation by allocation count."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from crane_scheduler.framework import SUCCESS, CycleState, Status
from crane_scheduler.podinfo import PodInfo, parse_pod
from crane_scheduler.scheduler import OLD_GENERATION_THRESHOLD, Scheduler, tune_collector
from tests.support.scheduler import node, pod, scheduler_with, step

MANAGED = [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]


class InstantBinder:
    name = "DefaultBinder"

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        return SUCCESS


def scheduler() -> Scheduler:
    return scheduler_with(InstantBinder(), lambda: 1000.0)


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
    s = scheduler()
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
    await s.drain()


async def test_a_failing_decision_still_resumes_the_collector(collector: None) -> None:
    s = scheduler()
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


def test_pods_and_nodes_are_kept_without_managed_fields() -> None:
    s = scheduler()
    raw_node = node("n1")
    raw_node["metadata"]["managedFields"] = list(MANAGED)
    s.cache.node_event("ADDED", raw_node, None)
    pending, placed = pod("pending"), pod("placed")
    placed["spec"]["nodeName"] = "n1"
    for raw in (pending, placed):
        raw["metadata"]["managedFields"] = list(MANAGED)
        s.cache.pod_event("ADDED", raw, None)
    assert "managedFields" not in s.pending[parse_pod(pending).uid].raw["metadata"]
    record = s.table.pods[parse_pod(placed).uid]
    assert record.pod is not None and "managedFields" not in record.pod.raw["metadata"]
    stored = s.table.nodes[s.table.rows["n1"]]
    assert stored is not None and "managedFields" not in stored.raw["metadata"]
    assert "managedFields" not in pending["metadata"], "trimmed in place: the informer's copy is the same object"
