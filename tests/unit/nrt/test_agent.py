"""The NRT crane-agent publishes (for simulated nodes): the reference page's example, CPU lists, policies."""

from __future__ import annotations

import pytest

from crane_scheduler.plugins.noderesourcetopology.agent import build_topology, parse_cpuset, uniform_numa
from crane_scheduler.plugins.noderesourcetopology.model import decode_topology

GI = 1024**3


def test_reference_example_two_numa_nodes_one_cpu_reserved() -> None:
    obj = build_topology("worker-1", uniform_numa(2, 8, 16 * GI), reserved={"cpu": 1000, "memory": GI})
    assert obj["craneManagerPolicy"] == {
        "cpuManagerPolicy": "Static",
        "topologyManagerPolicy": "SingleNUMANodePodLevel",
    }
    assert obj["reserved"] == {"cpu": "1", "memory": "1Gi"}
    assert obj["attributes"] == {"go.crane.io/reserved-system-cpus": ""}
    assert [z["resources"] for z in obj["zones"]] == [
        {
            "capacity": {"cpu": "8", "memory": "16Gi"},
            "allocatable": {"cpu": "7", "memory": "15Gi"},
            "reservedCPUNums": 1,
        },
        {"capacity": {"cpu": "8", "memory": "16Gi"}, "allocatable": {"cpu": "8", "memory": "16Gi"}},
    ]
    assert obj["zones"][0]["costs"] == [{"name": "node0", "value": 10}, {"name": "node1", "value": 21}]
    topo = decode_topology(obj)  # and the plugin reads it back
    assert [dict(z.allocatable) for z in topo.numa_zones] == [
        {"cpu": 7000, "memory": 15 * GI},
        {"cpu": 8000, "memory": 16 * GI},
    ]


def test_reserved_cpu_list_is_counted_per_zone() -> None:
    obj = build_topology("w", uniform_numa(2, 8, 16 * GI), reserved={"cpu": 500}, reserved_system_cpus="0,9")
    assert obj["reserved"]["cpu"] == "2"
    assert [z["resources"]["allocatable"]["cpu"] for z in obj["zones"]] == ["7", "7"]
    assert [z["resources"].get("reservedCPUNums") for z in obj["zones"]] == [1, 1]


def test_a_reserve_larger_than_a_zone_carries_only_the_rest() -> None:
    """Upstream carried 2 x reserve - capacity to the next zone."""
    obj = build_topology("w", uniform_numa(2, 4, 8 * GI), reserved={"cpu": 6000, "memory": 10 * GI})
    assert [z["resources"]["allocatable"] for z in obj["zones"]] == [
        {"cpu": "0", "memory": "0"},
        {"cpu": "2", "memory": "6Gi"},
    ]


@pytest.mark.parametrize(
    ("kubelet", "label", "policies"),
    [
        ("static", None, ("None", "SingleNUMANodePodLevel")),
        ("none", "false", ("Static", "None")),
        ("none", "junk", ("Static", "SingleNUMANodePodLevel")),
    ],
)
def test_policies_from_kubelet_and_node_label(kubelet: str, label: str | None, policies: tuple[str, str]) -> None:
    labels = {"topology.crane.io/topology-awareness": label} if label is not None else {}
    obj = build_topology("w", uniform_numa(1, 4, GI), kubelet_cpu_manager_policy=kubelet, node_labels=labels)
    assert (
        obj["craneManagerPolicy"]["cpuManagerPolicy"],
        obj["craneManagerPolicy"]["topologyManagerPolicy"],
    ) == policies


def test_cpuset_lists() -> None:
    assert parse_cpuset("0-3,8, 10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpuset("") == set()
    with pytest.raises(ValueError, match="a-b"):
        parse_cpuset("a-b")
