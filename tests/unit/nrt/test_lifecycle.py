"""Reserve, Unreserve, PreBind, restarts and the NRT watch: the zone accounting a user relies on."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import numpy as np
import pytest
from kubernetes_asyncio import client as kube_client

from crane_scheduler.framework import Code, CycleState
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.noderesourcetopology.model import ANNOTATION_RESULT
from crane_scheduler.plugins.noderesourcetopology.plugin import (
    FAILED_TO_GET_NRT,
    INSUFFICIENT_NUMA,
)
from crane_scheduler.podinfo import parse_pod
from tests.support.nrt import NOW, Setup, cpus, guaranteed, nrt


def two_zone_node(s: Setup, name: str = "n1") -> None:
    s.topology(nrt(name, [("node0", "4"), ("node1", "4")]))


def place(s: Setup, raw: dict[str, Any], node: str) -> CycleState:
    state, rejected = s.filter(raw)
    assert node not in rejected, rejected
    assert s.reserve(state, raw, node).success
    return state


def test_assumed_results_keep_two_pods_off_the_same_zone() -> None:
    s = Setup("n1")
    two_zone_node(s)
    a, b, c = guaranteed("4", name="a"), guaranteed("4", name="b"), guaranteed("4", name="c")
    assert s.result(place(s, a, "n1")) == [("node0", cpus(4))]
    assert s.result(place(s, b, "n1")) == [("node1", cpus(4))]
    _, rejected = s.filter(c)
    assert rejected == {"n1": INSUFFICIENT_NUMA}


def test_unreserve_gives_the_zone_back() -> None:
    s = Setup("n1")
    s.topology(nrt("n1", [("node0", "4")]))
    a = guaranteed("4", name="a")
    state = place(s, a, "n1")
    assert s.filter(guaranteed("4", name="b"))[1] == {"n1": INSUFFICIENT_NUMA}
    s.plugin.unreserve(state, parse_pod(a), "n1")
    s.table.forget(a["metadata"]["uid"])
    assert s.filter(guaranteed("4", name="b"))[1] == {}


def test_deleting_a_bound_pod_frees_its_zone() -> None:
    s = Setup("n1")
    s.topology(nrt("n1", [("node0", "4")]))
    bound = s.bind(guaranteed("4", name="a", result=[("node0", cpus(4))]), "n1")
    assert s.filter(guaranteed("1"))[1] == {"n1": INSUFFICIENT_NUMA}
    s.table.remove_pod(bound.uid)
    assert s.filter(guaranteed("1"))[1] == {}


def test_results_on_pods_survive_a_restart() -> None:
    """A new scheduler process rebuilds the zone usage from the bound pods' annotations."""
    first = Setup("n1")
    two_zone_node(first)
    pod = guaranteed("4", name="a")
    state = place(first, pod, "n1")
    pod["metadata"]["annotations"] = {
        ANNOTATION_RESULT: '[{"name":"node0","type":"Node","resources":{"capacity":{"cpu":"4"}}}]'
    }
    assert state["NodeResourceTopologyMatch.result"][1][0].zone == "node0"

    restarted = Setup("n1")
    two_zone_node(restarted)
    restarted.bind(pod, "n1")  # the informer's initial list
    second = guaranteed("4", name="b")
    assert restarted.result(place(restarted, second, "n1")) == [("node1", cpus(4))]
    assert restarted.filter(guaranteed("1", name="c"))[1] == {"n1": INSUFFICIENT_NUMA}


def test_nrt_arriving_after_the_node_and_node_rows_reused() -> None:
    s = Setup("n1")
    assert s.filter(guaranteed("1"))[1] == {"n1": FAILED_TO_GET_NRT}
    s.topology(nrt("n1", [("node0", "4")]))
    assert s.filter(guaranteed("1"))[1] == {}
    s.table.remove_node("n1")
    s.add_node("n2")  # reuses n1's row; it has no NRT
    assert s.filter(guaranteed("1"))[1] == {"n2": FAILED_TO_GET_NRT}
    s.plugin.delete_topology("n1")
    s.topology(nrt("n2", [("node0", "4")]))
    assert s.filter(guaranteed("1"))[1] == {}


def test_many_nodes_grow_the_zone_tensors() -> None:
    s = Setup()
    for i in range(150):
        s.add_node(f"n{i}")
        s.topology(nrt(f"n{i}", [(f"node{z}", "2") for z in range(i % 5)]))
    state, rejected = s.filter(guaranteed("2"))
    assert set(rejected) == {f"n{i}" for i in range(0, 150, 5)}  # zero zones: nowhere to go
    rows = np.array([s.table.rows["n1"], s.table.rows["n4"]])
    assert s.plugin.score(state, parse_pod(guaranteed("2")), s.table, rows).tolist() == [100, 100]


def test_assumed_results_expire_after_the_ttl() -> None:
    s = Setup("n1")
    s.topology(nrt("n1", [("node0", "4")]))
    place(s, guaranteed("4", name="a"), "n1")
    s.now = NOW + s.plugin.usage.ttl + 1
    assert s.filter(guaranteed("4", name="b"))[1] == {}


def test_cycle_states_are_independent() -> None:
    """Upstream's Clone returned the same state: a second pass overwrote the first one's results."""
    s = Setup("n1")
    two_zone_node(s)
    first, _ = s.filter(guaranteed("4"))
    copy = dict(first)
    s.bind(guaranteed("4", name="x", result=[("node0", cpus(4)), ("node1", cpus(1))]), "n1")
    second, rejected = s.filter(guaranteed("4"))
    assert rejected == {"n1": INSUFFICIENT_NUMA}
    assert copy["NodeResourceTopologyMatch.zones"] is first["NodeResourceTopologyMatch.zones"]
    assert first["NodeResourceTopologyMatch.zones"][s.table.rows["n1"]] == 1  # untouched by the second pass
    assert second["NodeResourceTopologyMatch.zones"][s.table.rows["n1"]] == 0


@pytest.mark.parametrize(
    ("annotation", "value", "message"),
    [
        ("topology.crane.io/topology-awareness", "yes", "must be true or false"),
        ("topology.crane.io/cpu-policy", "pinned", "must be one of"),
    ],
)
def test_unreadable_pod_annotations_are_refused_with_their_name(annotation: str, value: str, message: str) -> None:
    s = Setup("n1")
    raw = guaranteed("2")
    raw["metadata"]["annotations"] = {annotation: value}
    res = s.plugin.pre_filter({}, parse_pod(raw), s.table)
    assert res.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert annotation in res.status.message and message in res.status.message


def test_malformed_nrt_leaves_the_node_without_one() -> None:
    s = Setup("n1")
    bad = nrt("n1", [("node0", "4")])
    bad["craneManagerPolicy"]["cpuManagerPolicy"] = "static"
    s.topology(bad)
    assert s.filter(guaranteed("1"))[1] == {"n1": FAILED_TO_GET_NRT}


def test_malformed_result_annotation_is_skipped_and_counted_as_nothing() -> None:
    s = Setup("n1")
    s.topology(nrt("n1", [("node0", "4")]))
    raw = guaranteed("4", name="a")
    raw["metadata"]["annotations"] = {ANNOTATION_RESULT: "{not json"}
    s.bind(raw, "n1")
    assert s.filter(guaranteed("4"))[1] == {}


def test_rejections_are_counted() -> None:
    s = Setup("n1", "n2")
    s.topology(nrt("n2", [("node0", "1")]))
    before = (
        s.plugin.metrics.rejections.labels(FAILED_TO_GET_NRT)._value.get(),
        s.plugin.metrics.rejections.labels(INSUFFICIENT_NUMA)._value.get(),
    )
    s.filter(guaranteed("2"))
    after = (
        s.plugin.metrics.rejections.labels(FAILED_TO_GET_NRT)._value.get(),
        s.plugin.metrics.rejections.labels(INSUFFICIENT_NUMA)._value.get(),
    )
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


# ---------------------------------------------------------------------------------------------- PreBind


class FakeResponse:
    def __init__(self, status: int, body: Any = None) -> None:
        self.status, self.reason = status, "OK" if status < 300 else "Err"
        self.headers: dict[str, str] = {}
        self._body = json.dumps(body if body is not None else {}).encode()

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


class FakeCore:
    calls: ClassVar[list[tuple[str, str, dict[str, Any], dict[str, Any]]]] = []
    status = 200
    timeout = False

    def __init__(self, api: Any) -> None:
        pass

    async def patch_namespaced_pod(self, name: str, ns: str, body: dict[str, Any], **kw: Any) -> FakeResponse:
        FakeCore.calls.append((name, ns, body, kw))
        if FakeCore.timeout:
            raise TimeoutError
        return FakeResponse(FakeCore.status)


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch) -> type[FakeCore]:
    FakeCore.calls, FakeCore.status, FakeCore.timeout = [], 200, False
    monkeypatch.setattr(kube_client, "CoreV1Api", FakeCore)
    return FakeCore


def with_api(s: Setup) -> None:
    s.handle.api = object()


async def test_prebind_writes_the_result_with_a_merge_patch(core: type[FakeCore]) -> None:
    s = Setup("n1")
    with_api(s)
    s.plugin.replace_topologies([nrt("n1", [("node0", "4"), ("node1", "8")])])
    raw = guaranteed("2", name="web")
    state = place(s, raw, "n1")
    placed = s.plugin.metrics.placements.labels("SingleNUMANodePodLevel")._value.get()
    assert (await s.plugin.pre_bind(state, parse_pod(raw), "n1")).success
    name, ns, body, kw = core.calls[0]
    assert (name, ns) == ("web", "ns")
    assert body == {
        "metadata": {
            "uid": raw["metadata"]["uid"],
            "annotations": {ANNOTATION_RESULT: '[{"name":"node1","type":"Node","resources":{"capacity":{"cpu":"2"}}}]'},
        }
    }
    assert kw["_content_type"] == "application/merge-patch+json" and kw["_request_timeout"] > 0
    assert s.plugin.metrics.placements.labels("SingleNUMANodePodLevel")._value.get() == placed + 1
    assert s.plugin.explain_pod(raw["metadata"]["uid"], "n1") == {
        "numaZones": [{"name": "node1", "capacity": {"cpu": "2"}}],
    }
    assert s.plugin.explain_pod(raw["metadata"]["uid"], "n2") == {}


@pytest.mark.parametrize(("status", "timeout"), [(404, False), (500, False), (200, True)])
async def test_prebind_failures_are_errors(core: type[FakeCore], status: int, timeout: bool) -> None:
    core.status, core.timeout = status, timeout
    s = Setup("n1")
    with_api(s)
    s.plugin.replace_topologies([nrt("n1", [("node0", "4")])])
    raw = guaranteed("2")
    state = place(s, raw, "n1")
    result = await s.plugin.pre_bind(state, parse_pod(raw), "n1")
    assert result.code is Code.ERROR and ANNOTATION_RESULT in result.message


async def test_prebind_clears_a_stale_result_when_placing_without_one(core: type[FakeCore]) -> None:
    """Upstream kept a result left by an earlier attempt (its bind failed): it was counted and pinned."""
    s = Setup("n1")
    with_api(s)
    s.plugin.replace_topologies([nrt("n1", [("node0", "4")], cpu_policy="None")])
    raw = guaranteed("2", result=[("node0", cpus(2))])
    state = place(s, raw, "n1")
    assert (await s.plugin.pre_bind(state, parse_pod(raw), "n1")).success
    assert core.calls[0][2]["metadata"]["annotations"] == {ANNOTATION_RESULT: None}
    core.calls.clear()
    plain = guaranteed("2")
    assert (await s.plugin.pre_bind(place(s, plain, "n1"), parse_pod(plain), "n1")).success
    assert core.calls == []  # nothing to write, nothing to clear: no API call


# ---------------------------------------------------------------------------------------------- the NRT watch


class FakeCustomObjects:
    crd_installed = False
    items: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, api: Any) -> None:
        pass

    async def list_cluster_custom_object(self, group: str, version: str, plural: str, **kw: Any) -> Any:
        assert (group, version, plural) == ("topology.crane.io", "v1alpha1", "noderesourcetopologies")
        if not FakeCustomObjects.crd_installed:
            return FakeResponse(404, {"kind": "Status", "code": 404})
        if kw.get("watch"):
            return FakeWatch()
        return FakeResponse(200, {"items": FakeCustomObjects.items, "metadata": {"resourceVersion": "7"}})


class FakeWatch:
    status, reason = 200, "OK"

    @property
    def content(self) -> Any:
        async def lines() -> Any:
            await asyncio.Event().wait()  # no changes until the test ends
            yield b""

        return lines()

    def release(self) -> None:
        pass


async def wait_until(condition: Any) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_missing_crd_does_not_hold_up_start_and_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_client, "CustomObjectsApi", FakeCustomObjects)
    FakeCustomObjects.crd_installed, FakeCustomObjects.items = False, [nrt("n1", [("node0", "4")])]
    s = Setup("n1")
    with_api(s)
    stopping = asyncio.Event()
    task = asyncio.create_task(s.plugin.run(stopping))  # the scheduler starts without waiting for it
    try:
        await wait_until(lambda: "CRD" in s.plugin.sync_problem)
        status = s.plugin.pre_filter({}, parse_pod(guaranteed("2")), s.table).status
        assert status.code is Code.ERROR and "noderesourcetopologies.topology.crane.io" in status.message
        assert s.plugin.pre_filter({}, parse_pod(guaranteed("1500m")), s.table).status.success  # not a target
        FakeCustomObjects.crd_installed = True
        await wait_until(lambda: s.plugin.synced)
        assert s.filter(guaranteed("2"))[1] == {}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_table_hooks_do_not_fire_for_other_tables() -> None:
    other = NodeTable()
    assert other.pod_added == [] and other.pod_removed == []


def test_explain_shows_the_zones_chosen() -> None:
    from crane_scheduler.algorithm import ScheduleResult
    from crane_scheduler.explain import Decision, render
    from cranectl.__main__ import render_explain
    from tests.support.nrt import decide

    s = Setup("a", "b")
    s.topology(nrt("a", [("node0", "2"), ("node1", "2")]))
    s.topology(nrt("b", [("node0", "1"), ("node1", "4")]))
    raw = guaranteed("4", name="web")
    result, state = decide(s, raw)
    assert isinstance(result, ScheduleResult) and result.node == "b"
    pod = parse_pod(raw)
    assert s.plugin.reserve(state, pod, "b").success
    decision = Decision.from_state(pod, NOW, s.table, state, "b", "")
    body = render(decision, [s.plugin])
    assert body["result"] == {"node": "b", "numaZones": [{"name": "node1", "capacity": {"cpu": "4"}}]}
    assert body["nodes"][1]["filter"] == {"plugin": "NodeResourceTopologyMatch", "reason": INSUFFICIENT_NUMA}
    assert "NUMA zones: node1 (cpu=4)" in render_explain(body)


def test_nrt_object_gauge_follows_adds_changes_and_deletes() -> None:

    s = Setup("n1", "n2")
    s.topology(nrt("n1", [("node0", "4")]))
    s.topology(nrt("n2", [("node0", "4")]))
    assert (
        s.plugin.metrics.topologies.labels("Static")._value.get(),
        s.plugin.metrics.topologies.labels("None")._value.get(),
    ) == (2, 0)
    s.topology(nrt("n2", [("node0", "4")], cpu_policy="None"))
    assert (
        s.plugin.metrics.topologies.labels("Static")._value.get(),
        s.plugin.metrics.topologies.labels("None")._value.get(),
    ) == (1, 1)
    s.plugin.delete_topology("n1")
    assert (
        s.plugin.metrics.topologies.labels("Static")._value.get(),
        s.plugin.metrics.topologies.labels("None")._value.get(),
    ) == (0, 1)


def test_a_bind_answered_already_bound_keeps_the_zone_taken() -> None:
    """The bind's 409 (bound already, by an earlier try whose reply was lost): the assumption is forgotten with the
    plugins' Reserve state kept, so the zone stays taken until the informer brings the bound pod."""
    s = Setup("n1")
    s.topology(nrt("n1", [("node0", "4")]))
    a = guaranteed("4", name="a")
    place(s, a, "n1")
    s.table.forget(a["metadata"]["uid"], unreserved=False)
    assert s.filter(guaranteed("4", name="b"))[1] == {"n1": INSUFFICIENT_NUMA}


def test_a_node_removed_and_added_again_gets_the_usage_that_changed_meanwhile() -> None:
    s = Setup("n1")
    s.topology(nrt("n1", [("node0", "4")]))
    assert s.filter(guaranteed("4"))[1] == {}
    s.table.remove_node("n1")
    s.bind(guaranteed("4", name="a", result=[("node0", cpus(4))]), "n1")  # the informer, while n1 is gone
    s.add_node("n1")
    assert s.filter(guaranteed("4", name="b"))[1] == {"n1": INSUFFICIENT_NUMA}


@pytest.mark.parametrize("quantity", ["1e9999999", "99999999999999999999Gi"])
def test_a_quantity_out_of_range_is_a_malformed_nrt_not_a_crash(quantity: str) -> None:
    s = Setup("n1")
    s.topology(nrt("n1", [("node0", quantity)]))
    assert s.filter(guaranteed("1"))[1] == {"n1": FAILED_TO_GET_NRT}
