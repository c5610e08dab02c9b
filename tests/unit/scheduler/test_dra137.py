"""DynamicResources' extension points for the features kube 1.37 turns on by default (kube's
``dynamicresources.go``, ``extendeddynamicresources.go``, the incubating allocator): the claim made for a pod's
extended resources and its writes, binding conditions in Filter and PreBind, DeviceTaintRules, shares of devices
allocated several times, quantities as Go writes them, NodeResourcesFit leaving device-backed resources to DRA."""

from __future__ import annotations

import asyncio
import random
from decimal import Decimal
from typing import Any

import pytest

from crane_scheduler.framework import Code, CycleState
from crane_scheduler.plugins.dynamicresources.allocator import Allocator
from crane_scheduler.plugins.dynamicresources.capacity import parse
from crane_scheduler.plugins.dynamicresources.plugin import DynamicResources
from crane_scheduler.plugins.noderesources import FitArgs, NodeResourcesFit
from crane_scheduler.podinfo import parse_pod
from tests.support.dra import DRIVER, claim, device, device_class, exactly, resource_slice
from tests.support.dra_plugin import GPU, FakeClaims, dra_pod, listers, rejections
from tests.support.scheduler import node, pod, table

EXTENDED = "example.com/gpu"


def gpu_class_with_resource() -> dict[str, Any]:
    c = device_class("gpu", f'device.driver == "{DRIVER}"')
    c["spec"]["extendedResourceName"] = EXTENDED
    return c


def gpu_pod(name: str = "p", count: str = "1", init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    containers = [
        {
            "name": "app",
            "image": "x",
            "resources": {"requests": {"cpu": "100m", EXTENDED: count}, "limits": {EXTENDED: count}},
        }
    ]
    raw = pod(name, containers=containers)
    if init:
        raw["spec"]["initContainers"] = init
    return raw


# ---------------------------------------------------------------------------------------------- extended resources


def test_an_extended_resource_a_class_maps_is_allocated_where_no_device_plugin_publishes_it() -> None:
    plugin = DynamicResources(listers(gpu_class_with_resource(), resource_slice("s1", [device("gpu-0")], node="n1")))
    raw = gpu_pod()
    # n1: devices; n2: none; n3: a device plugin publishes it (NodeResourcesFit counts it there, DRA stays out)
    t = table(node("n1"), node("n2"), node("n3", extra={EXTENDED: "1"}))
    state: CycleState = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {"cannot allocate all claims": ["n2"]}
    st = state["DynamicResources"]
    assert st.results("n1") == [
        {
            "devices": {  # the request's name: the container's index, the resource's among its sorted requests
                "results": [{"request": "container-0-request-1", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
            },
        }
    ]
    assert st.results("n3") is None  # nothing to allocate there


def test_the_claim_is_created_in_pre_bind_allocated_reserved_and_named_in_the_pods_status() -> None:
    api = FakeClaims()
    objects = listers(gpu_class_with_resource(), resource_slice("s1", [device("gpu-0")], node="n1"))
    plugin = DynamicResources(objects, writer=api)
    sidecar = {"name": "proxy", "image": "x", "restartPolicy": "Always", "resources": {"requests": {EXTENDED: "1"}}}
    setup = {"name": "setup", "image": "x", "resources": {"requests": {EXTENDED: "1"}}}
    raw = gpu_pod(init=[setup, sidecar])
    t = table(node("n1"))
    state: CycleState = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {"cannot allocate all claims": ["n1"]}  # 2 wanted, 1 device
    objects.apply("resourceslices", "MODIFIED", resource_slice("s1", [device("gpu-0"), device("gpu-1")], node="n1"))
    state = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {}
    assert plugin.reserve(state, parse_pod(raw), "n1").success
    assert asyncio.run(plugin.pre_bind(state, parse_pod(raw), "n1")).success
    assert api.calls == ["create", "update", "status", "pod status"]
    (name,) = api.store
    made = api.store[name]
    assert name.startswith("p-extended-resources-")
    assert made["metadata"]["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert made["metadata"]["ownerReferences"][0]["uid"] == raw["metadata"]["uid"]
    # the setup container reuses the long-lived containers' devices (the sidecar's, then the app's)
    assert [r["name"] for r in made["spec"]["devices"]["requests"]] == [
        "container-1-request-0",
        "container-2-request-1",
    ]
    assert [(r["request"], r["device"]) for r in made["status"]["allocation"]["devices"]["results"]] == [
        ("container-1-request-0", "gpu-0"),
        ("container-2-request-1", "gpu-1"),
    ]
    assert made["status"]["allocation"]["allocationTimestamp"]
    assert api.pod_status == {
        "requestMappings": [
            {"containerName": "proxy", "resourceName": EXTENDED, "requestName": "container-1-request-0"},
            {"containerName": "app", "resourceName": EXTENDED, "requestName": "container-2-request-1"},
            {"containerName": "setup", "resourceName": EXTENDED, "requestName": "container-1-request-0"},
        ],
        "resourceClaimName": name,
    }
    assert not plugin.tracker.pending  # no longer in flight; the written claim is assumed

    async def binding_failed() -> None:
        plugin.unreserve(state, parse_pod(raw), "n1")
        await plugin.drain()

    asyncio.run(binding_failed())
    assert api.calls[-1] == "delete" and name not in api.store


def test_an_earlier_attempts_claim_is_deleted_by_post_filter() -> None:
    stale = claim("p-extended-resources-x", exactly("container-0-request-0", "gpu"), namespace="ns")
    raw = gpu_pod()
    stale["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    stale["metadata"]["ownerReferences"] = [
        {"kind": "Pod", "name": "p", "uid": raw["metadata"]["uid"], "controller": True}
    ]
    api = FakeClaims(stale)
    plugin = DynamicResources(listers(gpu_class_with_resource(), stale), writer=api)
    t = table(node("n1"))
    state: CycleState = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {"cannot schedule extended resource claim": ["n1"]}

    async def post_filter() -> tuple[Code, str]:
        status = plugin.post_filter(state, parse_pod(raw), None)  # type: ignore[arg-type]
        await plugin.drain()
        return status.code, status.message

    assert asyncio.run(post_filter()) == (Code.UNSCHEDULABLE, "deletion of ResourceClaim completed")
    assert api.calls == ["delete"] and not api.store


def test_node_resources_fit_leaves_a_device_backed_resource_to_dra_where_no_device_plugin_publishes_it() -> None:
    objects = listers(gpu_class_with_resource())
    fit = NodeResourcesFit(FitArgs(), objects.device_classes)
    t = table(node("n1"), node("n2", extra={EXTENDED: "1"}), node("n3", extra={EXTENDED: "0"}))
    two = parse_pod(gpu_pod(count="2"))
    names = [n.name if n is not None else "" for n in t.nodes]
    assert {(r.reason, tuple(names[i] for i in r.mask.nonzero()[0])) for r in fit.filter({}, two, t)} == {
        (f"Insufficient {EXTENDED}", ("n2",))
    }
    plain = NodeResourcesFit(FitArgs(), listers().device_classes)  # no class maps it: checked everywhere
    assert {r.reason for r in plain.filter({}, two, t)} == {f"Insufficient {EXTENDED}"}
    assert sum(int(r.mask.sum()) for r in plain.filter({}, two, t)) == 3


# ---------------------------------------------------------------------------------------------- binding conditions

PORT = {**device("port-0"), "bindingConditions": ["attached"], "bindingFailureConditions": ["failed"]}


def _conditioned(state: str, stamp: str) -> dict[str, Any]:
    c = claim("a", exactly("port", "gpu"), namespace="ns")
    result: dict[str, Any] = {"request": "port", "driver": DRIVER, "pool": "n1", "device": "port-0"}
    result.update(bindingConditions=["attached"], bindingFailureConditions=["failed"])
    c["status"] = {"allocation": {"devices": {"results": [result]}, "allocationTimestamp": stamp}}
    if state != "none":
        kind = "failed" if state == "failed" else "attached"
        c["status"]["devices"] = [
            {
                "driver": DRIVER,
                "pool": "n1",
                "device": "port-0",
                "conditions": [{"type": kind, "status": "True", "reason": "Driver", "message": f"port {state}"}],
            }
        ]
    return c


@pytest.mark.parametrize(
    ("state", "stamp", "available"),
    [
        ("none", "2099-01-01T00:00:00Z", True),  # waiting, within the binding timeout
        ("none", "2000-01-01T00:00:00Z", False),  # timed out
        ("failed", "2099-01-01T00:00:00Z", False),  # a failure condition
        ("attached", "2000-01-01T00:00:00Z", True),  # bound long ago
    ],
)
def test_an_allocated_claim_whose_binding_failed_or_timed_out_is_available_nowhere(
    state: str, stamp: str, available: bool
) -> None:
    c = _conditioned(state, stamp)
    plugin = DynamicResources(listers(GPU, resource_slice("s1", [PORT], node="n1"), c))
    raw = dra_pod("p", {"name": "g", "resourceClaimName": "a"})
    t = table(node("n1"))
    state_: CycleState = {}
    assert plugin.pre_filter(state_, parse_pod(raw), t).status.success
    expected = {} if available else {"resourceclaim not available on the node": ["n1"]}
    assert rejections(plugin, state_, raw, t) == expected


def test_pre_bind_waits_for_the_binding_conditions_then_binds() -> None:
    api = FakeClaims(claim("a", exactly("port", "gpu"), namespace="ns"))
    objects = listers(GPU, resource_slice("s1", [PORT], node="n1"), api.store["a"])
    plugin = DynamicResources(objects, writer=api)
    raw = dra_pod("p", {"name": "g", "resourceClaimName": "a"})
    t = table(node("n1"))
    state: CycleState = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {}
    assert plugin.reserve(state, parse_pod(raw), "n1").success

    async def bind_then_attach() -> tuple[Code, str]:
        task = asyncio.create_task(plugin.pre_bind(state, parse_pod(raw), "n1"))
        for _ in range(100):
            await asyncio.sleep(0)
            if "status" in api.calls:
                break
        assert not task.done()  # written, waiting for the driver
        written = dict(api.store["a"])
        written["status"] = {
            **written["status"],
            "devices": [
                {
                    "driver": DRIVER,
                    "pool": "n1",
                    "device": "port-0",
                    "conditions": [{"type": "attached", "status": "True"}],
                }
            ],
        }
        written["metadata"] = {**written["metadata"], "resourceVersion": "99"}
        objects.apply("resourceclaims", "MODIFIED", written)
        status = await asyncio.wait_for(task, 10)
        return status.code, status.message

    assert asyncio.run(bind_then_attach()) == (Code.SUCCESS, "")


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        (True, 'device binding failed: claim=a, reason=Driver, message="port failed"'),
        (False, "device binding timeout: context deadline exceeded"),
    ],
)
def test_pre_bind_fails_on_a_binding_failure_condition_and_after_the_binding_timeout(
    failure: bool, expected: str
) -> None:
    api = FakeClaims(claim("a", exactly("port", "gpu"), namespace="ns"))
    objects = listers(GPU, resource_slice("s1", [PORT], node="n1"), api.store["a"])
    ticks = iter(range(0, 10_000, 3))
    plugin = DynamicResources(objects, writer=api, binding_timeout=5, clock=lambda: float(next(ticks)))
    raw = dra_pod("p", {"name": "g", "resourceClaimName": "a"})
    t = table(node("n1"))
    state: CycleState = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {}
    assert plugin.reserve(state, parse_pod(raw), "n1").success

    async def pre_bind() -> tuple[Code, str]:
        task = asyncio.create_task(plugin.pre_bind(state, parse_pod(raw), "n1"))
        await asyncio.sleep(0.05)
        if failure:
            written = dict(api.store["a"])
            status = _conditioned("failed", "2099-01-01T00:00:00Z")["status"]
            written["status"] = {**written["status"], "devices": status["devices"]}
            written["metadata"] = {**written["metadata"], "resourceVersion": "99"}
            objects.apply("resourceclaims", "MODIFIED", written)
        status_ = await asyncio.wait_for(task, 30)
        return status_.code, status_.message

    assert asyncio.run(pre_bind()) == (Code.ERROR, expected)


# ---------------------------------------------------------------------------------------------- taint rules, shares


def test_a_device_taint_rule_keeps_its_devices_from_requests_that_do_not_tolerate_it() -> None:
    objects = listers(
        GPU, resource_slice("s1", [device("gpu-0")], node="n1"), claim("a", exactly("gpu", "gpu"), namespace="ns")
    )
    plugin = DynamicResources(objects)
    raw = dra_pod("p", {"name": "g", "resourceClaimName": "a"})
    t = table(node("n1"))
    rule = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "drain"},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "device": "gpu-0"},
            "taint": {"key": "drain", "effect": "NoExecute"},
        },
    }
    objects.apply("devicetaintrules", "ADDED", rule)
    state: CycleState = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {"cannot allocate all claims": ["n1"]}
    objects.apply("devicetaintrules", "DELETED", rule)
    state = {}
    assert plugin.pre_filter(state, parse_pod(raw), t).status.success
    assert rejections(plugin, state, raw, t) == {}


def test_a_device_allocated_several_times_gives_each_claim_a_share_of_its_capacity() -> None:
    shared = {**device("gpu-0"), "allowMultipleAllocations": True}
    shared["capacity"] = {
        "memory": {"value": "40Gi", "requestPolicy": {"default": "10Gi", "validRange": {"min": "5Gi", "step": "5Gi"}}}
    }
    held = claim("held", exactly("gpu", "gpu"), namespace="other")
    held["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": "n1",
                        "device": "gpu-0",
                        "shareID": "s-1",
                        "consumedCapacity": {"memory": "30Gi"},
                    }
                ]
            }
        }
    }

    def wanting(memory: str) -> dict[str, Any]:
        req = exactly("gpu", "gpu")
        req["exactly"]["capacity"] = {"requests": {"memory": memory}}
        return claim("a", req, namespace="ns")

    raw = dra_pod("p", {"name": "g", "resourceClaimName": "a"})
    t = table(node("n1"))
    for memory, consumed in (
        ("6Gi", "10Gi"),
        ("12Gi", None),
    ):  # 6Gi rounds up to 10Gi (min 5Gi, step 5Gi); 15Gi does not fit
        plugin = DynamicResources(listers(GPU, resource_slice("s1", [shared], node="n1"), held, wanting(memory)))
        state: CycleState = {}
        assert plugin.pre_filter(state, parse_pod(raw), t).status.success
        if consumed is None:
            assert rejections(plugin, state, raw, t) == {"cannot allocate all claims": ["n1"]}
            continue
        assert rejections(plugin, state, raw, t) == {}
        (allocation,) = state["DynamicResources"].results("n1")
        (result,) = allocation["devices"]["results"]
        assert result["consumedCapacity"] == {"memory": consumed} and result["shareID"]


@pytest.mark.parametrize(
    ("text", "canonical", "fmt"),
    [
        ("10Gi", "10Gi", "BinarySI"),
        ("1536Mi", "1536Mi", "BinarySI"),
        ("1.5Gi", "1536Mi", "BinarySI"),
        ("0.5Gi", "512Mi", "BinarySI"),
        ("100", "100", "DecimalSI"),
        ("1000", "1k", "DecimalSI"),
        ("0.5", "500m", "DecimalSI"),
        ("1e3", "1e3", "DecimalExponent"),
        ("1500m", "1500m", "DecimalSI"),
        ("2048", "2048", "DecimalSI"),
    ],
)
def test_quantities_print_as_go_prints_them(text: str, canonical: str, fmt: str) -> None:
    q = parse(text)
    assert (q.text, q.fmt) == (canonical, fmt)
    assert q.plain(Decimal(10 * 2**30)).text == ("10Gi" if fmt == "BinarySI" else "10737418240")


def test_the_search_memo_answers_as_a_fresh_search_does_while_devices_come_and_go() -> None:
    # nodes whose devices share counters are searched node by node; a node no binding touched keeps its answer
    # across cycles (SearchMemo): held to a fresh allocator's answer, pod after pod, as devices are taken and freed
    def partitions(n: str) -> list[dict[str, Any]]:
        devs = []
        for k, size in (("w", 4), ("h0", 2), ("h1", 2), ("q0", 1), ("q1", 1)):
            d = {
                **device(f"gpu-{k}", size=size),
                "consumesCounters": [{"counterSet": "gpu", "counters": {"s": {"value": str(size)}}}],
            }
            devs.append(d)
        devices = resource_slice(f"{n}-devices", devs, node=n, pool=n, count=2)
        counters = resource_slice(f"{n}-counters", [], node=n, pool=n, count=2)
        del counters["spec"]["devices"]
        counters["spec"]["sharedCounters"] = [{"name": "gpu", "counters": {"s": {"value": "4"}}}]
        return [devices, counters]

    nodes = [f"n{i}" for i in range(4)]
    slices = [s for n in nodes for s in partitions(n)]
    small = device_class("small", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].size <= 2')
    objects = listers(GPU, small, *slices)
    plugin = DynamicResources(objects)
    t = table(*(node(n) for n in nodes))
    rng = random.Random(7)
    placed: list[tuple[dict[str, Any], CycleState, str]] = []
    for i in range(40):
        if placed and rng.random() < 0.3:  # a pod leaves: its claim is gone
            gone, gone_state, on = placed.pop(rng.randrange(len(placed)))
            plugin.unreserve(gone_state, parse_pod(gone), on)
            continue
        c = claim(f"c{i}", exactly("gpu", rng.choice(["gpu", "small"]), count=rng.choice([1, 1, 2])), namespace="ns")
        objects.apply("resourceclaims", "ADDED", c)
        raw = dra_pod(f"p{i}", {"name": "g", "resourceClaimName": f"c{i}"})
        state: CycleState = {}
        assert plugin.pre_filter(state, parse_pod(raw), t).status.success
        plugin.filter(state, parse_pod(raw), t)
        st = state["DynamicResources"]
        fresh = Allocator(objects.device_classes(), objects.resource_slices(), set(plugin.tracker.held.devices))
        for n in nodes:
            info = t.nodes[t.rows[n]]
            assert info is not None
            assert st.results(n) == fresh.allocate(info, [c]), (i, n)
        feasible = [n for n in nodes if st.results(n) is not None]
        if feasible:
            on = rng.choice(feasible)
            assert plugin.reserve(state, parse_pod(raw), on).success
            placed.append((raw, state, on))


def test_a_pod_refused_for_an_extended_resource_is_retried_when_a_class_comes_to_map_it() -> None:
    from crane_scheduler.framework import ClusterChange, ClusterEvent, QueueingHint
    from crane_scheduler.plugins.noderesources import after_device_class_change

    info = parse_pod(gpu_pod())
    mapped, other = gpu_class_with_resource(), device_class("other", "true")

    def hint(new: dict[str, Any], old: dict[str, Any] | None = None) -> QueueingHint:
        return after_device_class_change(
            info, ClusterChange(ClusterEvent.DEVICE_CLASS_CHANGE, old_object=old, new_object=new)
        )

    assert hint(mapped) is QueueingHint.QUEUE
    assert hint(other) is QueueingHint.SKIP
    assert hint(mapped, old=mapped) is QueueingHint.SKIP  # the same name as before: nothing new
    implicit = parse_pod(
        pod(
            containers=[
                {
                    "name": "c",
                    "image": "x",
                    "resources": {"requests": {"deviceclass.resource.kubernetes.io/other": "1"}},
                }
            ]
        )
    )
    assert (
        after_device_class_change(implicit, ClusterChange(ClusterEvent.DEVICE_CLASS_CHANGE, new_object=other))
        is QueueingHint.QUEUE
    )
