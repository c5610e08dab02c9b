"""The sandbox's simulated GPUs as a DRA driver would publish them: the slice per node, the DeviceClass, the
command line forms and their errors."""

from __future__ import annotations

from typing import Any

import pytest

from crane_sandbox.devices import (
    DEVICE_CLASS,
    DRIVER,
    EXTENDED_RESOURCE,
    PARTITION_CLASS,
    TAINT,
    device_class,
    node_slices,
    parse_devices,
    parse_node_devices,
    partition_class,
)
from crane_scheduler.plugins.dynamicresources.allocator import Allocator
from crane_scheduler.podinfo import parse_node
from tests.support.dra import claim, exactly


def _devices(count: int, zones: int = 2, spare: bool = False) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = node_slices("node-0001", count, zones, spare=spare)[0]["spec"]["devices"]
    return devices


def test_a_node_pool_holds_its_gpus_spread_over_the_numa_zones_owned_by_the_node() -> None:
    devices_slice, counters = node_slices("node-0001", 4, zones=2, uid="u-1")
    for body in (devices_slice, counters):
        assert body["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "node-0001", "uid": "u-1"}
        ]
        spec = body["spec"]
        assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
            DRIVER,
            "node-0001",
            {"name": "node-0001", "generation": 1, "resourceSliceCount": 2},
        )
    whole = [d for d in devices_slice["spec"]["devices"] if d["attributes"]["partition"]["string"] == "whole"]
    assert [d["name"] for d in whole] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert [d["attributes"]["numa"] for d in whole] == [{"int": 0}, {"int": 0}, {"int": 1}, {"int": 1}]
    assert {d["capacity"]["memory"]["value"] for d in whole} == {"80Gi"}
    assert counters["spec"]["sharedCounters"] == [
        {"name": "gpu-3", "counters": {"memory": {"value": "80Gi"}, "slices": {"value": "4"}}}
    ]


def test_the_last_gpu_is_also_four_partitions_sharing_its_counters() -> None:
    devices = _devices(2)
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-1-p0", "gpu-1-p1", "gpu-1-p2", "gpu-1-p3"]
    assert "consumesCounters" not in devices[0]
    assert {d["consumesCounters"][0]["counterSet"] for d in devices[1:]} == {"gpu-1"}
    assert [d["consumesCounters"][0]["counters"]["slices"]["value"] for d in devices[1:]] == ["4", "1", "1", "1", "1"]


def test_a_spare_gpu_is_tainted_against_pods() -> None:
    spare = _devices(2, spare=True)[-1]
    assert (spare["name"], spare["taints"], spare["attributes"]["partition"]) == ("gpu-2", [TAINT], {"string": "whole"})
    assert all("taints" not in d for d in _devices(2))


def test_without_numa_zones_every_gpu_is_on_zone_0() -> None:
    assert {d["attributes"]["numa"]["int"] for d in _devices(3, zones=0)} == {0}


def test_the_classes_select_whole_gpus_and_quarters_and_map_the_extended_resource() -> None:
    whole, quarter = device_class(), partition_class()
    assert (whole["metadata"]["name"], whole["spec"]["extendedResourceName"]) == (DEVICE_CLASS, EXTENDED_RESOURCE)
    assert quarter["metadata"]["name"] == PARTITION_CLASS and "extendedResourceName" not in quarter["spec"]


def test_what_the_classes_get_from_a_node_as_the_scheduler_allocates() -> None:
    # with the partitionable GPU whole, no quarter is left; with a quarter taken, the GPU is not whole any more;
    # the tainted spare goes to nobody
    slices = node_slices("node-0001", 2, zones=1, spare=True)
    classes = {c["metadata"]["name"]: c for c in (device_class(), partition_class())}
    node = parse_node({"metadata": {"name": "node-0001"}})

    def devices(*claims: dict[str, Any], held: set[tuple[str, str, str]] | None = None) -> list[str] | None:
        found = Allocator(classes, slices, held or set()).allocate(node, list(claims))
        return None if found is None else [r["device"] for a in found for r in a["devices"]["results"]]

    assert devices(claim("c", exactly("gpu", DEVICE_CLASS, count=2))) == ["gpu-0", "gpu-1"]
    assert devices(claim("c", exactly("gpu", DEVICE_CLASS, count=3))) is None  # the spare is tainted
    assert devices(claim("c", exactly("gpu", DEVICE_CLASS, count=2)), claim("d", exactly("q", PARTITION_CLASS))) is None
    assert devices(claim("c", exactly("q", PARTITION_CLASS, count=4))) == [f"gpu-1-p{p}" for p in range(4)]
    assert devices(claim("c", exactly("gpu", DEVICE_CLASS, count=2)), held={(DRIVER, "node-0001", "gpu-1-p0")}) is None


@pytest.mark.parametrize(("text", "count"), [("gpu=8", 8), ("gpu=0", 0), (" gpu=2 ", 2)])
def test_devices_on_the_command_line(text: str, count: int) -> None:
    assert parse_devices(text) == count


@pytest.mark.parametrize(
    ("text", "message"), [("8", "expected gpu=COUNT"), ("tpu=2", "expected gpu=COUNT"), ("gpu=-1", "non-negative")]
)
def test_bad_devices_are_refused_naming_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_devices(text)


def test_per_node_devices() -> None:
    assert parse_node_devices("node-0003=gpu=0") == ("node-0003", 0)
    with pytest.raises(ValueError, match="expected NODE=gpu=COUNT"):
        parse_node_devices("=gpu=2")
    with pytest.raises(ValueError, match="expected NODE=gpu=COUNT"):
        parse_node_devices("gpu=2")
