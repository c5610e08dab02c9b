"""DynamicResources' extension points against kube's plugin (``framework/plugins/dynamicresources``): claim
resolution and its messages, per-node verdicts, in-flight allocations, and PreBind's writes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import (
    ArgsError,
    ClusterChange,
    ClusterEvent,
    Code,
    CycleState,
    Diagnosis,
    Handle,
    QueueingHint,
    Status,
)
from crane_scheduler.listers import Listers
from crane_scheduler.plugins.dynamicresources.binding import ApiClaims, Conflict, LazyApiClaims
from crane_scheduler.plugins.dynamicresources.claims import FINALIZER, ClaimError
from crane_scheduler.plugins.dynamicresources.plugin import DynamicResources, new
from crane_scheduler.podinfo import parse_pod
from crane_scheduler.simulate import Simulator
from crane_scheduler.writer.protocol import JSON, REFUSED, Reply
from tests.support.dra import DRIVER, claim, device, device_class, exactly, first_available, resource_slice, sub_request
from tests.support.dra_plugin import GPU, FakeClaims, dra_pod, listers, rejections
from tests.support.scheduler import node, pod, table

SLICES = [resource_slice("s1", [device("gpu-0")], node="n1"), resource_slice("s2", [device("gpu-0")], node="n2")]


def test_a_template_claim_waits_for_the_resourceclaim_controller() -> None:
    plugin = DynamicResources(listers(GPU, *SLICES))
    raw = dra_pod("p", {"name": "gpu", "resourceClaimTemplateName": "tpl"})
    assert plugin.pre_enqueue(parse_pod(raw)) is True
    res = plugin.pre_filter({}, parse_pod(raw), table(node("n1")))
    assert res.status.code is Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert res.status.message == 'pod "ns/p": ResourceClaim not created yet'
    # the controller created the claim, but another pod owns it
    c = claim("p-gpu-x", exactly("gpu", "gpu"), namespace="ns")
    raw = dra_pod(
        "p",
        {"name": "gpu", "resourceClaimTemplateName": "tpl"},
        statuses=[{"name": "gpu", "resourceClaimName": "p-gpu-x"}],
    )
    plugin = DynamicResources(listers(GPU, *SLICES, c))
    res = plugin.pre_filter({}, parse_pod(raw), table(node("n1")))
    assert res.status.message == "ResourceClaim ns/p-gpu-x was not created for Pod ns/p (Pod is not owner)"
    c["metadata"]["ownerReferences"] = [{"uid": raw["metadata"]["uid"], "controller": True, "kind": "Pod", "name": "p"}]
    assert plugin.pre_enqueue(parse_pod(raw)) is False
    assert plugin.pre_filter({}, parse_pod(raw), table(node("n1"))).status.success


def test_missing_claims_and_classes_keep_the_pod_pending_with_kube_messages() -> None:
    raw = dra_pod("p", {"name": "gpu", "resourceClaimName": "shared"})
    plugin = DynamicResources(listers(GPU))
    assert plugin.pre_filter({}, parse_pod(raw), table()).status.message == ('could not find ResourceClaim "ns/shared"')
    plugin = DynamicResources(listers(claim("shared", exactly("gpu", "nope"), namespace="ns")))
    res = plugin.pre_filter({}, parse_pod(raw), table())
    assert (res.status.code, res.status.message) == (
        Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        "request gpu: device class nope does not exist",
    )
    assert plugin.pre_filter({}, parse_pod(pod("plain")), table()).status.code is Code.SKIP


def test_filter_allocates_per_node_and_names_kube_reasons() -> None:
    shared = claim("shared", exactly("gpu", "gpu"), namespace="ns")
    plugin = DynamicResources(listers(GPU, SLICES[0], shared))
    raw = dra_pod("p", {"name": "gpu", "resourceClaimName": "shared"})
    t = table(node("n1"), node("n2"))
    state: CycleState = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {"cannot allocate all claims": ["n2"]}


def test_an_allocated_claim_is_only_available_where_its_node_selector_says() -> None:
    shared = claim("shared", exactly("gpu", "gpu"), namespace="ns")
    shared["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "n2", "device": "gpu-0"}]},
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]
            },
        }
    }
    plugin = DynamicResources(listers(GPU, *SLICES, shared))
    raw = dra_pod("p", {"name": "gpu", "resourceClaimName": "shared"})
    t = table(node("n1"), node("n2"))
    state: CycleState = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {"resourceclaim not available on the node": ["n1"]}


def test_two_pods_in_flight_never_get_the_same_device() -> None:
    a = claim("a", exactly("gpu", "gpu"), namespace="ns")
    b = claim("b", exactly("gpu", "gpu"), namespace="ns")
    plugin = DynamicResources(listers(GPU, SLICES[0], a, b))
    t = table(node("n1"))
    first, second = (
        dra_pod("p1", {"name": "g", "resourceClaimName": "a"}),
        dra_pod("p2", {"name": "g", "resourceClaimName": "b"}),
    )
    s1: CycleState = {}
    assert plugin.pre_filter(s1, parse_pod(first), t).status.success
    assert rejections(plugin, s1, first, t) == {}
    assert plugin.reserve(s1, parse_pod(first), "n1").success
    # the first pod's allocation is in flight: the second finds the device taken, and the first's claim busy
    s2: CycleState = {}
    assert plugin.pre_filter(s2, parse_pod(second), t).status.success
    assert rejections(plugin, s2, second, t) == {"cannot allocate all claims": ["n1"]}
    again = plugin.pre_filter({}, parse_pod(dra_pod("p3", {"name": "g", "resourceClaimName": "a"})), t)
    assert again.status.message == "resource claim ns/a is in the process of being allocated"
    plugin.unreserve(s1, parse_pod(first), "n1")
    s2 = {}
    assert plugin.pre_filter(s2, parse_pod(second), t).status.success
    assert rejections(plugin, s2, second, t) == {}


def _scheduled(plugin: DynamicResources, raw: dict[str, Any]) -> CycleState:
    t = table(node("n1"))
    state: CycleState = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {}
    assert plugin.reserve(state, parse_pod(raw), "n1").success
    return state


def test_pre_bind_writes_finalizer_then_allocation_and_reservation() -> None:
    c = claim("a", exactly("gpu", "gpu"), namespace="ns")
    api = FakeClaims(c)
    objects = listers(GPU, SLICES[0], api.store["a"])
    plugin = DynamicResources(objects, writer=api)
    raw = dra_pod("p1", {"name": "g", "resourceClaimName": "a"})
    state = _scheduled(plugin, raw)
    assert asyncio.run(plugin.pre_bind(state, parse_pod(raw), "n1")).success
    written = api.store["a"]
    assert api.calls == ["update", "status"]
    assert written["metadata"]["finalizers"] == [FINALIZER]
    assert written["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert written["status"]["reservedFor"] == [{"resource": "pods", "name": "p1", "uid": raw["metadata"]["uid"]}]
    # no longer in flight, but assumed: the next pod still cannot have gpu-0 before the informer catches up
    other = dra_pod("p2", {"name": "g", "resourceClaimName": "b"})
    objects.apply("resourceclaims", "ADDED", claim("b", exactly("gpu", "gpu"), namespace="ns"))
    t = table(node("n1"))
    s2: CycleState = {}
    assert plugin.pre_filter(s2, parse_pod(other), t).status.success
    assert rejections(plugin, s2, other, t) == {"cannot allocate all claims": ["n1"]}


def test_pre_bind_retries_a_conflict_and_refuses_a_claim_allocated_meanwhile() -> None:
    c = claim("a", exactly("gpu", "gpu"), namespace="ns")
    api = FakeClaims(c)
    plugin = DynamicResources(listers(GPU, SLICES[0], api.store["a"]), writer=api)
    raw = dra_pod("p1", {"name": "g", "resourceClaimName": "a"})
    state = _scheduled(plugin, raw)
    api.conflicts = 1
    assert asyncio.run(plugin.pre_bind(state, parse_pod(raw), "n1")).success
    assert api.calls == ["update", "get", "update", "status"]

    api = FakeClaims(c)
    plugin = DynamicResources(listers(GPU, SLICES[0], api.store["a"]), writer=api)
    state = _scheduled(plugin, raw)
    api.store["a"]["status"] = {"allocation": {"devices": {"results": []}}}
    api.conflicts = 1
    status = asyncio.run(plugin.pre_bind(state, parse_pod(raw), "n1"))
    assert (status.code, status.message) == (Code.ERROR, "claim ns/a got allocated elsewhere in the meantime")


def test_unreserve_after_pre_bind_takes_the_pod_out_of_reserved_for() -> None:
    c = claim("a", exactly("gpu", "gpu"), namespace="ns")
    api = FakeClaims(c)
    plugin = DynamicResources(listers(GPU, SLICES[0], api.store["a"]), writer=api)
    raw = dra_pod("p1", {"name": "g", "resourceClaimName": "a"})
    state = _scheduled(plugin, raw)

    async def bind_fails_after_pre_bind() -> None:
        assert (await plugin.pre_bind(state, parse_pod(raw), "n1")).success
        plugin.unreserve(state, parse_pod(raw), "n1")
        await plugin.drain()

    asyncio.run(bind_fails_after_pre_bind())
    assert api.calls == ["update", "status", "unreserve"]
    assert api.store["a"]["status"]["reservedFor"] == []


def test_a_written_claim_deleted_since_frees_its_device() -> None:
    c = claim("a", exactly("gpu", "gpu"), namespace="ns")
    api = FakeClaims(c)
    objects = listers(GPU, SLICES[0], api.store["a"], claim("b", exactly("gpu", "gpu"), namespace="ns"))
    plugin = DynamicResources(objects, writer=api)
    raw = dra_pod("p1", {"name": "g", "resourceClaimName": "a"})
    assert asyncio.run(plugin.pre_bind(_scheduled(plugin, raw), parse_pod(raw), "n1")).success
    objects.apply("resourceclaims", "DELETED", api.store["a"])
    _scheduled(plugin, dra_pod("p2", {"name": "g", "resourceClaimName": "b"}))


def test_no_claim_write_once_the_leadership_term_ended() -> None:
    writer = ApiClaims(None, may_write=lambda: False)
    with pytest.raises(ClaimError, match="the leadership term ended"):
        asyncio.run(writer.update(claim("a", exactly("gpu", "gpu"), namespace="ns")))


class _Writer:
    """The API writer's ``write_object`` as the process answers it: ``replies`` in order, each request recorded."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.sent: list[tuple[str, str, Any, Any, str]] = []
        self.term = object()

    async def write_object(self, method: str, path: str, body: Any, term: Any, content_type: str = JSON) -> Reply:
        self.sent.append((method, path, body, term, content_type))
        return self.replies.pop(0)


def test_claim_writes_go_through_the_api_writer_in_its_term_and_answer_the_written_claim() -> None:
    written = {**claim("a", exactly("gpu", "gpu"), namespace="ns"), "status": {"reservedFor": [{"uid": "u"}]}}
    writer = _Writer(Reply(200, json.dumps(written)), Reply(409, "{}"), Reply(REFUSED, "leadership term ended"))
    held = {"term": True}
    handle = Handle(table(), writer=writer, may_bind=lambda: held["term"])  # type: ignore[arg-type]
    claims = LazyApiClaims(handle)
    c = claim("a", exactly("gpu", "gpu"), namespace="ns")
    assert asyncio.run(claims.update_status(c)) == written
    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a"
    assert writer.sent == [("PUT", f"{path}/status", c, writer.term, JSON)]
    with pytest.raises(Conflict):
        asyncio.run(claims.update(c))
    assert writer.sent[-1][:2] == ("PUT", path)
    with pytest.raises(ClaimError, match="unreserve claim ns/a: not sent: leadership term ended"):
        asyncio.run(claims.unreserve(c, "u"))
    held["term"] = False  # the scheduler knows the term ended: nothing reaches the writer
    with pytest.raises(ClaimError, match="the leadership term ended"):
        asyncio.run(claims.deallocate(c))
    assert len(writer.sent) == 3


def _decide(objects: Listers, t: Any, raw: dict[str, Any]) -> Any:
    sim = Simulator(table=t, listers=objects, out_of_tree=False)
    return sim.algorithm.schedule(sim.profiles["crane-scheduler"], parse_pod(raw), {})


def test_a_broken_selector_fails_the_attempt_as_kube_filter_error_does() -> None:
    broken = device_class("gpu", f'device.attributes["{DRIVER}"].missing == 1')
    objects = listers(broken, SLICES[0], claim("a", exactly("gpu", "gpu"), namespace="ns"))
    result = _decide(objects, table(node("n1"), node("n2")), dra_pod("p", {"name": "g", "resourceClaimName": "a"}))
    assert isinstance(result, Status) and result.code is Code.ERROR
    assert result.message == (
        'running "DynamicResources" filter plugin: class gpu: selector #0 on device gpu.example.com/n1/gpu-0: CEL '
        "runtime error: no such key: missing. consider using CEL optional chaining (.? followed by orValue()) or "
        "guarding the check with has() for optional fields"
    )


def test_the_first_available_subrequest_chosen_scores_the_node() -> None:
    a100 = device_class("a100", f'device.attributes["{DRIVER}"].model == "A100"')
    slices = [
        resource_slice("s1", [device("gpu-0", model="H100")], node="n1"),
        resource_slice("s2", [device("gpu-0", model="A100")], node="n2"),
    ]
    wanted = first_available("g", sub_request("a100", "a100"), sub_request("any", "gpu"))
    objects = listers(GPU, a100, *slices, claim("a", wanted, namespace="ns"))
    result = _decide(objects, table(node("n1"), node("n2")), dra_pod("p", {"name": "g", "resourceClaimName": "a"}))
    assert isinstance(result, ScheduleResult) and result.node == "n2"  # 8 - 0 beats 8 - 1 (weight 2, normalised)


def test_claim_events_requeue_the_pods_they_can_help() -> None:
    mine = claim("a", exactly("gpu", "gpu"), namespace="ns")
    other = claim("b", exactly("gpu", "gpu"), namespace="ns")
    plugin = DynamicResources(listers(GPU, SLICES[0], mine, other))
    waiting = parse_pod(dra_pod("p", {"name": "g", "resourceClaimName": "a"}))
    allocated = {**other, "status": {"allocation": {"devices": {"results": []}}}}

    def hint(old: dict[str, Any] | None, new: dict[str, Any]) -> QueueingHint:
        return plugin.after_claim_change(
            waiting, ClusterChange(ClusterEvent.RESOURCE_CLAIM_CHANGE, None, None, old, new)
        )

    assert hint(allocated, other) is QueueingHint.QUEUE  # another pod's claim deallocated: its devices are free
    assert hint(other, allocated) is QueueingHint.SKIP  # another claim allocated: no help
    assert hint(None, mine) is QueueingHint.QUEUE  # the pod's own claim created
    assert hint(mine, {**mine, "metadata": {**mine["metadata"], "labels": {"x": "y"}}}) is QueueingHint.SKIP
    assert hint(mine, {**mine, "status": {"reservedFor": []}}) is QueueingHint.QUEUE
    # a pod whose template claim is not there yet waits for its own update, not for claims
    gated = parse_pod(dra_pod("q", {"name": "g", "resourceClaimTemplateName": "tpl"}))
    change = ClusterChange(ClusterEvent.RESOURCE_CLAIM_CHANGE, None, None, None, mine)
    assert plugin.after_claim_change(gated, change) is QueueingHint.SKIP


def test_post_filter_deallocates_a_claim_allocated_elsewhere_that_nobody_uses() -> None:
    stale = claim("a", exactly("gpu", "gpu"), namespace="ns")
    stale["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "n2", "device": "gpu-0"}]},
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]
            },
        }
    }
    api = FakeClaims(stale)
    plugin = DynamicResources(listers(GPU, *SLICES, api.store["a"]), writer=api)
    raw = dra_pod("p", {"name": "g", "resourceClaimName": "a"})
    t = table(node("n1"))  # n2 is gone: the claim's devices are out of reach
    state: CycleState = {}

    async def attempt() -> Status:
        assert plugin.pre_filter(state, parse_pod(raw), t).status.success
        assert rejections(plugin, state, raw, t) == {"resourceclaim not available on the node": ["n1"]}
        status = plugin.post_filter(state, parse_pod(raw), Diagnosis(1))
        await plugin.drain()
        return status

    status = asyncio.run(attempt())
    assert (status.code, status.message) == (Code.UNSCHEDULABLE, "deallocation of ResourceClaim completed")
    assert api.calls == ["deallocate"] and "allocation" not in api.store["a"]["status"]
    # a pod without claims, and one refused by an earlier PreFilter (no state): kube's answers
    no_claims: CycleState = {}
    plugin.pre_filter(no_claims, parse_pod(pod("plain")), t)
    plain = plugin.post_filter(no_claims, parse_pod(pod("plain")), Diagnosis(1))
    assert (plain.code, plain.message) == (Code.UNSCHEDULABLE, "")  # kube 1.37: no message
    assert plugin.post_filter({}, parse_pod(pod("plain")), Diagnosis(1)).code is Code.ERROR


def test_args_are_kube_dynamic_resources_args() -> None:
    handle = Handle(table())
    assert new({}, handle).filter_timeout == 10.0
    assert new({"filterTimeout": "0s", "bindingTimeout": "600s"}, handle).filter_timeout == 0.0
    with pytest.raises(ArgsError) as err:
        new({"filterTimeout": "soon", "scoring": True}, handle)
    assert [path for path, _ in err.value.problems] == ["filterTimeout", "scoring"]
