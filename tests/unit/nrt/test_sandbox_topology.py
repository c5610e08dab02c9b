"""The sandbox's simulated nodes as crane-agent would publish them: per-node layout, command line forms, errors."""

from __future__ import annotations

import pytest

from crane_sandbox.fleet import SimNode, make_fleet
from crane_sandbox.topology import (
    TopologySpec,
    node_topology,
    numa_layout,
    parse_node_topology,
    parse_topology,
)
from crane_scheduler.plugins.noderesourcetopology.model import decode_topology

GI = 1024**3


def sim(cpus: float = 8, memory: int = 32 * GI, labels: dict[str, str] | None = None) -> SimNode:
    return SimNode("node-0001", "10.0.0.1", cpus, memory, labels=labels or {})


def test_default_two_zones_split_cpus_and_memory_with_agent_policies() -> None:
    obj = node_topology(sim(), TopologySpec(), uid="u-1")
    assert obj is not None
    assert obj["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "node-0001",
        "uid": "u-1",
        "controller": True,
    }
    assert obj["craneManagerPolicy"] == {
        "cpuManagerPolicy": "Static",
        "topologyManagerPolicy": "SingleNUMANodePodLevel",
    }
    assert [z["name"] for z in obj["zones"]] == ["node0", "node1"]
    assert [z["resources"]["capacity"] for z in obj["zones"]] == [{"cpu": "4", "memory": "16Gi"}] * 2
    topo = decode_topology(obj)  # the scheduler reads it back
    assert [dict(z.allocatable) for z in topo.numa_zones] == [{"cpu": 4000, "memory": 16 * GI}] * 2


def test_reserved_cpus_come_off_the_zones_that_own_them() -> None:
    obj = node_topology(sim(), parse_topology("2:reserved=0-1,5"))
    assert obj is not None
    assert obj["attributes"] == {"go.crane.io/reserved-system-cpus": "0-1,5"}
    assert obj["reserved"]["cpu"] == "3"
    assert [z["resources"]["allocatable"]["cpu"] for z in obj["zones"]] == ["2", "3"]
    assert [z["resources"].get("reservedCPUNums") for z in obj["zones"]] == [2, 1]


def test_uneven_split_gives_the_remainder_to_the_first_zones() -> None:
    layout = numa_layout(sim(cpus=10, memory=10), TopologySpec(zones=3))
    assert [len(z.cpus) for z in layout] == [4, 3, 3]
    assert [z.cpus[0] for z in layout] == [0, 4, 7]
    assert [z.memory for z in layout] == [4, 3, 3]
    assert layout[1].distances == {0: 21, 1: 10, 2: 21}


def test_off_publishes_nothing_and_the_awareness_label_turns_the_topology_policy_off() -> None:
    assert node_topology(sim(), parse_topology("off")) is None
    assert node_topology(sim(), TopologySpec(zones=0)) is None
    obj = node_topology(sim(labels={"topology.crane.io/topology-awareness": "false"}), TopologySpec())
    assert obj is not None and obj["craneManagerPolicy"]["topologyManagerPolicy"] == "None"


def test_every_fleet_node_gets_its_own_object() -> None:
    fleet = make_fleet(3)
    names = [obj["metadata"]["name"] for n in fleet if (obj := node_topology(n, TopologySpec())) is not None]
    assert names == ["node-0001", "node-0002", "node-0003"]


def test_command_line_forms() -> None:
    assert parse_topology("4") == TopologySpec(4, "")
    assert parse_topology(" 1:reserved=0 ") == TopologySpec(1, "0")
    assert parse_node_topology("node-0002=off") == ("node-0002", TopologySpec(0))
    assert parse_node_topology("node-0001=4:reserved=0-1") == ("node-0001", TopologySpec(4, "0-1"))


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("two", "'two'"),
        ("2:pinned=0", "'pinned=0'"),
        ("2:reserved=a-b", "'a-b'"),
        ("-1", "'-1'"),
    ],
)
def test_bad_topology_is_refused_naming_the_part(text: str, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        parse_topology(text)


def test_bad_node_topology_and_impossible_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="NODE=SPEC"):
        parse_node_topology("4")
    with pytest.raises(ValueError, match="2 CPUs cannot make 3 NUMA zones"):
        numa_layout(sim(cpus=2), TopologySpec(zones=3))
    with pytest.raises(ValueError, match="beyond its 8 CPUs"):
        numa_layout(sim(), TopologySpec(zones=2, reserved_cpus="8"))
    with pytest.raises(ValueError, match=">= 0"):
        TopologySpec(zones=-1)
