"""The sandbox's simulated GPUs as a DRA driver would publish them: the slice per node, the DeviceClass, the
command line forms and their errors."""

from __future__ import annotations

import pytest

from crane_sandbox.devices import DEVICE_CLASS, DRIVER, device_class, node_slice, parse_devices, parse_node_devices


def test_a_node_slice_holds_its_gpus_spread_over_the_numa_zones_owned_by_the_node() -> None:
    body = node_slice("node-0001", 4, zones=2, uid="u-1")
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-0001", "uid": "u-1"}
    ]
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, "node-0001", "node-0001")
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert [d["attributes"]["numa"] for d in spec["devices"]] == [{"int": 0}, {"int": 0}, {"int": 1}, {"int": 1}]
    assert {d["capacity"]["memory"]["value"] for d in spec["devices"]} == {"80Gi"}


def test_without_numa_zones_every_gpu_is_on_zone_0() -> None:
    devices = node_slice("n", 3, zones=0)["spec"]["devices"]
    assert {d["attributes"]["numa"]["int"] for d in devices} == {0}


def test_the_device_class_selects_the_drivers_devices() -> None:
    body = device_class()
    assert body["metadata"]["name"] == DEVICE_CLASS
    assert body["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]


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
