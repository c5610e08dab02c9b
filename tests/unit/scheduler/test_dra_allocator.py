"""The structured-parameters allocator against kube's own (``structured/internal/incubating``, the implementation
1.37's default gates select). Each expected result is traced by hand through kube's ``allocateOne``: claims, then
requests, then devices, candidates in pool/slice/device order, first complete solution wins."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from crane_scheduler.plugins.dynamicresources.allocator import (
    AllocationError,
    AllocationTimeout,
    Allocator,
    FailedOnNode,
    Features,
    allocated_devices,
)
from crane_scheduler.plugins.dynamicresources.claims import ClaimTracker
from crane_scheduler.plugins.dynamicresources.nodeview import DeviceCache
from crane_scheduler.podinfo import NodeInfo, parse_node
from tests.support.dra import (
    DRIVER,
    claim,
    device,
    device_class,
    exactly,
    first_available,
    opaque,
    resource_slice,
    sub_request,
)

GPU = device_class("gpu", f'device.driver == "{DRIVER}"')


def node(name: str = "n1", **labels: str) -> NodeInfo:
    return parse_node({"metadata": {"name": name, "labels": labels}})


def allocate(
    slices: list[dict[str, Any]],
    *claims: dict[str, Any],
    classes: list[dict[str, Any]] | None = None,
    allocated: set[tuple[str, str, str]] | None = None,
    on: NodeInfo | None = None,
) -> list[dict[str, Any]] | None:
    by_name = {c["metadata"]["name"]: c for c in classes or [GPU]}
    return Allocator(by_name, slices, allocated or set()).allocate(on or node(), list(claims))


def picked(results: list[dict[str, Any]] | None) -> list[list[tuple[str, str]]] | None:
    """(request, device) per claim."""
    if results is None:
        return None
    return [[(r["request"], r["device"]) for r in a["devices"]["results"]] for a in results]


def gpus(*names: str, **kw: Any) -> dict[str, Any]:
    return resource_slice("s-n1", [device(n) for n in names], node="n1", **kw)


def test_the_first_free_device_of_the_node_is_taken_and_the_claim_is_pinned_to_the_node() -> None:
    out = allocate([gpus("gpu-0", "gpu-1")], claim("c", exactly("gpu", "gpu")))
    assert out == [
        {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]},
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
            },
        }
    ]


def test_allocated_devices_are_skipped_and_another_node_slice_never_counts() -> None:
    other = resource_slice("s-n2", [device("gpu-9")], node="n2")
    out = allocate(
        [other, gpus("gpu-0", "gpu-1")], claim("c", exactly("gpu", "gpu")), allocated={(DRIVER, "n1", "gpu-0")}
    )
    assert picked(out) == [[("gpu", "gpu-1")]]
    assert allocate([other], claim("c", exactly("gpu", "gpu"))) is None


def test_allocated_devices_come_from_claims_status_and_admin_access_holds_none() -> None:
    held = claim("a", exactly("gpu", "gpu"))
    held["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"},
                    {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-1", "adminAccess": True},
                ]
            }
        }
    }
    assert allocated_devices([held, claim("b", exactly("gpu", "gpu"))]) == {(DRIVER, "n1", "gpu-0")}


def test_two_claims_of_a_pod_never_get_the_same_device() -> None:
    one = [gpus("gpu-0")]
    assert allocate(one, claim("a", exactly("gpu", "gpu")), claim("b", exactly("gpu", "gpu"))) is None
    two = [gpus("gpu-0", "gpu-1")]
    assert picked(allocate(two, claim("a", exactly("gpu", "gpu")), claim("b", exactly("gpu", "gpu")))) == [
        [("gpu", "gpu-0")],
        [("gpu", "gpu-1")],
    ]


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = resource_slice("old", [device("gpu-old")], node="n1", pool="p", generation=1)
    new = resource_slice("new", [device("gpu-new")], node="n1", pool="p", generation=2)
    assert picked(allocate([old, new], claim("c", exactly("gpu", "gpu")))) == [[("gpu", "gpu-new")]]
    assert picked(allocate([new, old], claim("c", exactly("gpu", "gpu")))) == [[("gpu", "gpu-new")]]


def test_an_incomplete_pool_offers_no_device_and_fails_an_all_request() -> None:
    half = resource_slice("half", [device("gpu-0")], node="n1", pool="p", count=2)
    assert allocate([half], claim("c", exactly("gpu", "gpu"))) is None
    with pytest.raises(AllocationError) as err:
        allocate([half], claim("c", exactly("gpu", "gpu", mode="All")))
    assert str(err.value) == (
        f"claim default/c, request gpu: asks for all devices, but resource pool {DRIVER}/p is currently being updated"
    )


def test_a_pool_being_replaced_by_a_newer_generation_elsewhere_is_left_out() -> None:
    # gen 1 reaches n1 but is incomplete; gen 2 exists only for n2: kube's checkSlicesInPool calls gen 1 obsolete.
    stale = resource_slice("stale", [device("gpu-0")], node="n1", pool="p", generation=1, count=2)
    newer = resource_slice("newer", [device("gpu-1")], node="n2", pool="p", generation=2, count=2)
    assert allocate([stale, newer], claim("c", exactly("gpu", "gpu", mode="All"))) is None


def test_a_pool_complete_across_nodes_is_usable_from_each_node() -> None:
    mine = resource_slice("a", [device("gpu-0")], node="n1", pool="p", count=2)
    theirs = resource_slice("b", [device("gpu-1")], node="n2", pool="p", count=2)
    assert picked(allocate([mine, theirs], claim("c", exactly("gpu", "gpu", mode="All")))) == [[("gpu", "gpu-0")]]


def test_an_invalid_pool_is_the_reason_only_when_nothing_else_fits() -> None:
    dup = resource_slice("dup", [device("gpu-0"), device("gpu-0")], node="n1", pool="bad")
    with pytest.raises(FailedOnNode) as err:
        allocate([dup], claim("c", exactly("gpu", "gpu")))
    assert str(err.value) == "invalid resource pools were encountered"
    good = resource_slice("good", [device("gpu-1")], node="n1", pool="good")
    assert picked(allocate([dup, good], claim("c", exactly("gpu", "gpu")))) == [[("gpu", "gpu-1")]]


def test_class_and_request_selectors_must_all_hold() -> None:
    slices = [
        resource_slice(
            "s",
            [
                device("small", capacity={"memory": "16Gi"}, model="A100"),
                device("big", capacity={"memory": "80Gi"}, model="A100"),
                device("h", capacity={"memory": "80Gi"}, model="H100"),
            ],
            node="n1",
        )
    ]
    big_a100 = exactly(
        "gpu",
        "gpu",
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0',
        f'device.attributes["{DRIVER}"].model == "A100"',
    )
    assert picked(allocate(slices, claim("c", big_a100))) == [[("gpu", "big")]]
    h100_class = device_class("h100", f'device.attributes["{DRIVER}"].model == "H100"')
    out = allocate(slices, claim("c", exactly("gpu", "h100")), classes=[h100_class])
    assert picked(out) == [[("gpu", "h")]]


def test_all_takes_every_matching_device_in_order() -> None:
    slices = [resource_slice("s", [device("a", model="x"), device("b", model="y"), device("c", model="x")], node="n1")]
    req = exactly("gpu", "gpu", f'device.attributes["{DRIVER}"].model == "x"', mode="All")
    assert picked(allocate(slices, claim("c", req))) == [[("gpu", "a"), ("gpu", "c")]]
    # one of them already allocated: All cannot be satisfied.
    assert allocate(slices, claim("c", req), allocated={(DRIVER, "n1", "c")}) is None
    none = exactly("gpu", "gpu", f'device.attributes["{DRIVER}"].model == "z"', mode="All")
    assert allocate(slices, claim("c", none)) is None


def test_first_available_takes_the_first_subrequest_that_fits_and_its_class_config() -> None:
    a100 = device_class("a100", f'device.attributes["{DRIVER}"].model == "A100"', config=[opaque(DRIVER, {"a": 1})])
    h100 = device_class("h100", f'device.attributes["{DRIVER}"].model == "H100"', config=[opaque(DRIVER, {"h": 1})])
    slices = [resource_slice("s", [device("gpu-0", model="A100"), device("gpu-1", model="A100")], node="n1")]
    req = first_available("gpu", sub_request("big", "h100"), sub_request("two", "a100", count=2))
    out = allocate(
        slices,
        claim("c", req, config=[{"requests": ["gpu/two"], **opaque(DRIVER, {"claim": True})}]),
        classes=[a100, h100],
    )
    assert out is not None
    assert picked(out) == [[("gpu/two", "gpu-0"), ("gpu/two", "gpu-1")]]
    # kube 1.37 drops the request list of a config that names every request of the claim ("empty means all")
    assert out[0]["devices"]["config"] == [
        {"source": "FromClass", **opaque(DRIVER, {"a": 1})},
        {"source": "FromClaim", **opaque(DRIVER, {"claim": True})},
    ]
    three = [resource_slice("s", [device(f"gpu-{i}", model="A100") for i in range(3)], node="n1")]
    two = claim("c", req, exactly("other", "a100"), config=[{"requests": ["gpu/two"], **opaque(DRIVER, {})}])
    out = allocate(three, two, classes=[a100, h100])
    assert out is not None and out[0]["devices"]["config"] == [
        {"source": "FromClass", **opaque(DRIVER, {"a": 1})},  # gpu/two and other: all of them
        {"source": "FromClaim", "requests": ["gpu/two"], **opaque(DRIVER, {})},
    ]


def test_an_all_subrequest_takes_all_devices() -> None:
    # kube 1.35's allocateOne recursed for "All" leaving subRequestIndex at 0 (one device, not all); 1.37 keeps it.
    none = device_class("none", "false")
    slices = [resource_slice("s", [device("gpu-0"), device("gpu-1")], node="n1")]
    req = first_available("gpu", sub_request("first", "none"), sub_request("all", "gpu", mode="All"))
    assert picked(allocate(slices, claim("c", req), classes=[GPU, none])) == [
        [("gpu/all", "gpu-0"), ("gpu/all", "gpu-1")]
    ]


def test_match_attribute_backtracks_over_devices() -> None:
    slices = [
        resource_slice(
            "s", [device("d0", numa=0), device("d1", numa=1), device("d2", numa=0), device("d3", numa=1)], node="n1"
        )
    ]
    c = claim("c", exactly("gpu", "gpu", count=2), constraints=[{"matchAttribute": f"{DRIVER}/numa"}])
    assert picked(allocate(slices, c)) == [[("gpu", "d0"), ("gpu", "d2")]]
    # d0 taken: d1 then d3 (d2's numa 0 differs from d1's).
    assert picked(allocate(slices, c, allocated={(DRIVER, "n1", "d0")})) == [[("gpu", "d1"), ("gpu", "d3")]]
    # a device without the attribute never satisfies the constraint.
    bare = [resource_slice("s", [device("x"), device("y")], node="n1")]
    assert allocate(bare, c) is None


def test_match_attribute_scoped_to_some_requests() -> None:
    slices = [resource_slice("s", [device("d0", numa=0), device("d1", numa=1), device("d2", numa=1)], node="n1")]
    c = claim(
        "c",
        exactly("a", "gpu"),
        exactly("b", "gpu"),
        exactly("free", "gpu"),
        constraints=[{"matchAttribute": f"{DRIVER}/numa", "requests": ["b", "free"]}],
    )
    assert picked(allocate(slices, c)) == [[("a", "d0"), ("b", "d1"), ("free", "d2")]]


def test_backtracking_across_requests_gives_a_later_request_the_device_it_needs() -> None:
    slices = [resource_slice("s", [device("d0", model="x"), device("d1", model="y")], node="n1")]
    c = claim("c", exactly("any", "gpu"), exactly("x", "gpu", f'device.attributes["{DRIVER}"].model == "x"'))
    assert picked(allocate(slices, c)) == [[("any", "d1"), ("x", "d0")]]


def test_admin_access_may_take_an_allocated_device() -> None:
    slices = [gpus("gpu-0")]
    c = claim("c", exactly("gpu", "gpu", admin_access=True))
    out = allocate(slices, c, allocated={(DRIVER, "n1", "gpu-0")})
    assert out is not None and out[0]["devices"]["results"][0]["adminAccess"] is True
    assert allocate(slices, claim("c", exactly("gpu", "gpu")), allocated={(DRIVER, "n1", "gpu-0")}) is None


def test_slice_node_selection_by_selector_and_all_nodes() -> None:
    labelled = resource_slice(
        "rack",
        [device("r0")],
        pool="rack",
        node_selector={
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}]
        },
    )
    everywhere = resource_slice("net", [device("shared")], pool="net", all_nodes=True, driver="net.example.com")
    net = device_class("net", 'device.driver == "net.example.com"')
    out = allocate([labelled], claim("c", exactly("gpu", "gpu")), on=node(rack="a"))
    assert out is not None and out[0]["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}]
    }
    assert allocate([labelled], claim("c", exactly("gpu", "gpu")), on=node(rack="b")) is None
    out = allocate([everywhere], claim("c", exactly("n", "net")), classes=[net])
    assert out is not None and "nodeSelector" not in out[0]


def test_errors_are_kube_errors() -> None:
    slices = [gpus("gpu-0")]
    with pytest.raises(AllocationError) as err:
        allocate(slices, claim("c", exactly("gpu", "missing")))
    assert str(err.value) == (
        'claim default/c, request gpu: could not retrieve device class missing: deviceclass.resource.k8s.io "missing" '
        "not found"
    )
    broken = device_class("gpu", f'device.attributes["{DRIVER}"].model == "x"')
    with pytest.raises(AllocationError) as err:
        allocate(slices, claim("c", exactly("gpu", "gpu")), classes=[broken])
    assert str(err.value).startswith("class gpu: selector #0 on device gpu.example.com/n1/gpu-0: CEL runtime error: ")
    with pytest.raises(AllocationError) as err:
        allocate(slices, claim("c", exactly("gpu", "gpu", "device.driver ==")))
    assert str(err.value).startswith("claim default/c: selector #0: CEL compile error: ")
    with pytest.raises(AllocationError) as err:
        allocate(slices, claim("c", exactly("gpu", "gpu", count=33)))
    assert str(err.value) == (
        "claim default/c, request gpu: adding 33 devices exceeds the claim limit of 32, with 0 already accounted for"
    )
    with pytest.raises(AllocationError) as err:
        allocate(slices, claim("c", exactly("a", "gpu", count=20), exactly("b", "gpu", count=13)))
    assert str(err.value) == (
        "claim default/c, request b: adding 13 devices exceeds the claim limit of 32, with 20 already accounted for"
    )


def test_a_device_of_a_disabled_feature_is_never_chosen() -> None:
    counted = {**device("gpu-0"), "consumesCounters": [{"counterSet": "s", "counters": {"mem": {"value": "1"}}}]}
    conditioned = {**device("gpu-1"), "bindingConditions": ["ready"]}
    slices = [resource_slice("s", [conditioned], node="n1")]
    off = Features(binding_conditions=False)
    assert (
        Allocator({"gpu": GPU}, slices, set(), features=off).allocate(node(), [claim("c", exactly("gpu", "gpu"))])
        is None
    )
    assert picked(allocate(slices, claim("c", exactly("gpu", "gpu")))) == [[("gpu", "gpu-1")]]
    slices = [resource_slice("s", [counted, conditioned], node="n1")]
    # with 1.37's gates both are usable; a counter set no slice of the pool declares makes the pool invalid
    with pytest.raises(FailedOnNode, match="invalid resource pools were encountered"):
        allocate(slices, claim("c", exactly("gpu", "gpu")))


def test_a_device_tainted_against_pods_is_chosen_only_by_a_request_that_tolerates_it() -> None:
    # DRADeviceTaints (GA in 1.37): kube allocates a NoSchedule/NoExecute-tainted device only to a request that
    # tolerates it; an effect None taint is informational
    tainted = {**device("gpu-0"), "taints": [{"key": "broken", "effect": "NoSchedule"}]}
    noted = {**device("gpu-1"), "taints": [{"key": "aging", "effect": "None"}]}
    slices = [resource_slice("s", [tainted, noted], node="n1")]
    assert picked(allocate(slices, claim("c", exactly("gpu", "gpu")))) == [[("gpu", "gpu-1")]]
    assert allocate(slices, claim("c", exactly("gpu", "gpu", count=2))) is None


def test_the_search_stops_at_the_deadline() -> None:
    ticks = itertools.count()
    slices = [gpus(*[f"gpu-{i}" for i in range(8)])]
    alloc = Allocator({"gpu": GPU}, slices, set(), clock=lambda: float(next(ticks)))
    with pytest.raises(AllocationTimeout):
        alloc.allocate(node(), [claim("c", exactly("gpu", "gpu", count=8))], deadline=3.0)


def test_counting_answers_a_node_as_the_search_does_for_claims_of_one_shape() -> None:
    big = f'device.attributes["{DRIVER}"].memory >= 40'
    slices = [
        resource_slice("s-n1", [device(f"gpu-{i}", memory=20 * (i % 3)) for i in range(6)], node="n1"),
        resource_slice("s-n2", [device("gpu-0", memory=80), device("gpu-1", memory=80, ready=True)], node="n2"),
    ]
    shapes = [
        [claim("a", exactly("gpu", "gpu", big))],
        [claim("a", exactly("gpu", "gpu", big, count=2))],
        [claim("a", exactly("gpu", "gpu", big)), claim("b", exactly("gpu", "gpu", big, count=2))],
    ]
    for held_count in range(4):
        allocated = {(DRIVER, "n1", f"gpu-{i}") for i in range(2, 2 + held_count)}
        allocator = Allocator({"gpu": GPU}, slices, allocated)
        for claims in shapes:
            plan = allocator.plan(claims)
            assert plan is not None
            for on in (node("n1"), node("n2"), node("n3")):
                found = allocator.allocate(on, claims)
                assert allocator.fits(on, plan) is (found is not None), (held_count, claims, on.name)


def test_claims_counting_cannot_answer_are_left_to_the_search() -> None:
    allocator = Allocator({"gpu": GPU, "other": device_class("other")}, [gpus("gpu-0")], set())
    not_counted = [
        [claim("a", exactly("gpu", "gpu"), exactly("x", "other"))],  # two shapes
        [claim("a", first_available("gpu", sub_request("one", "gpu")))],
        [claim("a", exactly("gpu", "gpu", admin_access=True))],
        [claim("a", exactly("gpu", "gpu", mode="All"))],
        [claim("a", exactly("gpu", "gpu"), constraints=[{"matchAttribute": f"{DRIVER}/model"}])],
        [claim("a", exactly("gpu", "gpu", count=33))],  # the search's error
        [claim("a", exactly("gpu", "missing"))],
    ]
    assert [allocator.plan(claims) for claims in not_counted] == [None] * len(not_counted)
    broken = Allocator({"gpu": device_class("gpu", "device.attributes.nope")}, [gpus("gpu-0")], set())
    plan = broken.plan([claim("a", exactly("gpu", "gpu"))])
    assert plan is not None and broken.fits(node(), plan) is None  # the selector fails there: the search says how


def _holding(name: str, rv: int, *devices: tuple[str, str, str]) -> dict[str, Any]:
    c = claim(name, exactly("gpu", "gpu"))
    c["metadata"]["resourceVersion"] = str(rv)
    if devices:
        results = [{"request": "gpu", "driver": d[0], "pool": d[1], "device": d[2]} for d in devices]
        c["status"] = {"allocation": {"devices": {"results": results}}}
    return c


def test_the_kept_columns_answer_every_cycle_as_counting_afresh_does() -> None:
    """Claims allocated and freed, node objects replaced and rows emptied between cycles, devices in flight and
    assumed versions: the columns kept across cycles (moved by the held devices' log) answer as a fresh count and
    as the search."""
    rng = random.Random(7)
    names = [f"n{i}" for i in range(6)]
    slices = [resource_slice(f"s-{n}", [device(f"gpu-{i}") for i in range(3)], node=n) for n in names]
    slices.append(resource_slice("shared", [device("gpu-s0"), device("gpu-s1")], all_nodes=True))
    devices = [(DRIVER, n, f"gpu-{i}") for n in names for i in range(3)] + [(DRIVER, "shared", "gpu-s0")]
    tracker, cache = ClaimTracker(), DeviceCache()
    store: dict[str, dict[str, Any]] = {}
    rows: list[NodeInfo | None] = [node(n) for n in names]
    version = 0  # the node table's nodes_version: bumped with every row change
    for cycle in range(60):
        for _ in range(rng.randint(0, 3)):
            key = f"c{rng.randint(0, 9)}"
            held_now = rng.sample(devices, rng.randint(0, 2))
            store[f"default/{key}"] = _holding(key, cycle + 2, *held_now)
        if rng.random() < 0.2 and store:
            del store[rng.choice(sorted(store))]
        if rng.random() < 0.3:
            row = rng.randrange(len(rows))
            rows[row] = None if rng.random() < 0.3 else node(names[row], cycle=str(cycle))
            version += 1
        for uid in list(tracker.pending):
            tracker.remove_pending(uid)
        if rng.random() < 0.5:
            tracker.signal_pending(_holding("p", 1, rng.choice(devices)))
        if rng.random() < 0.3 and store:  # PreBind wrote a newer version the informer has not delivered yet
            name = rng.choice(sorted(store)).split("/")[1]
            tracker.assume(_holding(name, cycle + 1000, *rng.sample(devices, rng.randint(0, 2))))
        if rng.random() < 0.2 and tracker.assumed:
            tracker.restore(rng.choice(sorted(tracker.assumed)))
        held = tracker.allocated(store)
        kept = Allocator({"gpu": GPU}, slices, held, cache=cache)
        fresh = Allocator({"gpu": GPU}, slices, {d for d in [*devices, (DRIVER, "shared", "gpu-s1")] if d in held})
        for count in (1, 2, 4):
            claims = [claim("new", exactly("gpu", "gpu", count=count))]
            plan = kept.plan(claims)
            assert plan is not None
            answer = kept.fits_nodes(rows, plan, version)
            again = fresh.fits_nodes(rows, plan)
            for row, on in enumerate(rows):
                got = answer.answer(row)
                assert got == again.answer(row), (cycle, count, row)
                if on is None:
                    assert row not in answer.search and got is None
                    continue
                assert got is (kept.allocate(on, claims) is not None), (cycle, count, row)
