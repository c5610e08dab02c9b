"""Wire formats: upstream's result JSON, canonical quantities, NRT decoding errors, args."""

from __future__ import annotations

import pytest

from crane_scheduler.framework import ArgsError
from crane_scheduler.plugins.noderesourcetopology.args import parse_args
from crane_scheduler.plugins.noderesourcetopology.model import (
    TopologyError,
    ZoneResult,
    decode_result,
    decode_topology,
    encode_result,
    format_quantity,
    parse_go_bool,
)
from tests.support.nrt import nrt


@pytest.mark.parametrize(
    ("name", "value", "text"),
    [
        ("cpu", 2000, "2"),
        ("cpu", 1500, "1500m"),
        ("cpu", 12000, "12"),
        ("cpu", 0, "0"),
        ("memory", 4 * 1024**3, "4Gi"),
        ("memory", 1536 * 1024**2, "1536Mi"),
        ("memory", 1500, "1500"),
        ("memory", 1000, "1k"),
        ("hugepages-2Mi", 2 * 1024**2, "2Mi"),
        ("example.com/gpu", 2, "2"),
        ("example.com/gpu", 3000, "3k"),
    ],
)
def test_quantities_are_printed_as_go_prints_them(name: str, value: int, text: str) -> None:
    assert format_quantity(name, value) == text


def test_result_is_upstreams_json_byte_for_byte() -> None:
    assert encode_result((ZoneResult("node0", {"cpu": 2000}),)) == (
        '[{"name":"node0","type":"Node","resources":{"capacity":{"cpu":"2"}}}]'
    )
    assert encode_result((ZoneResult("node0", {"cpu": 1500, "memory": 0}), ZoneResult("node1", {"cpu": 500}))) == (
        '[{"name":"node0","type":"Node","resources":{"capacity":{"cpu":"1500m"}}},'
        '{"name":"node1","type":"Node","resources":{"capacity":{"cpu":"500m"}}}]'
    )


def test_result_round_trips_and_only_node_entries_count() -> None:
    text = (
        '[{"name":"node0","type":"Node","resources":{"capacity":{"cpu":"2","memory":"4Gi"}}},'
        '{"name":"socket0","type":"Socket","resources":{"capacity":{"cpu":"9"}}}]'
    )
    assert decode_result(text) == (ZoneResult("node0", {"cpu": 2000, "memory": 4 * 1024**3}),)
    assert decode_result("[]") == ()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("not json", "not JSON"),
        ('{"name":"node0"}', "must be a JSON list"),
        ('[{"type":"Node"}]', "[0].name"),
        ('[{"name":"node0","type":"Node","resources":{"capacity":{"cpu":"two"}}}]', "cpu"),
    ],
)
def test_malformed_results_name_the_problem(text: str, field: str) -> None:
    with pytest.raises(TopologyError, match="topology-result") as err:
        decode_result(text)
    assert field in str(err.value)


def test_topology_decodes_what_crane_agent_writes() -> None:
    topo = decode_topology(nrt("w1", [("node0", "7", "15Gi"), ("node1", "8", "16Gi")]))
    assert topo.node == "w1" and topo.static and topo.aware_by_default
    assert [(z.name, dict(z.allocatable)) for z in topo.numa_zones] == [
        ("node0", {"cpu": 7000, "memory": 15 * 1024**3}),
        ("node1", {"cpu": 8000, "memory": 16 * 1024**3}),
    ]
    obj = nrt("w1", [("node0", "7")])
    del obj["craneManagerPolicy"]["topologyManagerPolicy"]
    assert decode_topology(obj).aware_by_default  # the CRD's default


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda o: o.pop("craneManagerPolicy"), "cpuManagerPolicy"),
        (lambda o: o["craneManagerPolicy"].update(cpuManagerPolicy="static"), "cpuManagerPolicy"),
        (lambda o: o["craneManagerPolicy"].update(topologyManagerPolicy="Best"), "topologyManagerPolicy"),
        (lambda o: o["zones"][0].update(type="Die"), "zones[0].type"),
        (lambda o: o["zones"][0].pop("name"), "zones[0].name"),
        (lambda o: o["zones"][0]["resources"]["allocatable"].update(cpu="x"), "zones[0].resources.allocatable.cpu"),
    ],
)
def test_bad_topologies_name_the_field(mutate: object, field: str) -> None:
    obj = nrt("w1", [("node0", "7")])
    mutate(obj)  # type: ignore[operator]
    with pytest.raises(TopologyError, match=field.replace("[", r"\[").replace("]", r"\]")):
        decode_topology(obj)


def test_go_parse_bool_spellings() -> None:
    assert [parse_go_bool(t) for t in ("1", "t", "T", "TRUE", "true", "True")] == [True] * 6
    assert [parse_go_bool(t) for t in ("0", "f", "F", "FALSE", "false", "False")] == [False] * 6
    assert parse_go_bool("yes") is None and parse_go_bool("tRUE") is None


def test_args_default_and_validation() -> None:
    assert parse_args({}).resources == ("cpu",)
    assert parse_args({"topologyAwareResources": []}).resources == ("cpu",)
    assert parse_args({"topologyAwareResources": ["cpu", "memory", "hugepages-1Gi", "nvidia.com/gpu"]}).resources == (
        "cpu",
        "memory",
        "hugepages-1Gi",
        "nvidia.com/gpu",
    )
    with pytest.raises(ArgsError) as err:
        parse_args({"topologyAwareResources": ["cpu", "pods", "cpu"], "typo": 1})
    assert {p for p, _ in err.value.problems} == {
        "typo",
        "topologyAwareResources[1]",
        "topologyAwareResources[2]",
    }
