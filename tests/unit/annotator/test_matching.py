"""Node <-> series matching: every instance style users have, and a deterministic choice on ties."""

from __future__ import annotations

import pytest

from crane_annotator.matching import (
    MatchKind,
    NodeAddresses,
    address_index,
    match_series,
    split_instance,
)
from crane_shared.prometheus import Series

NODES = [
    NodeAddresses("node-a", ("10.0.0.1",), ("host-a",)),
    NodeAddresses("node-b", ("10.0.0.2",), ("host-b.example.com",)),
    NodeAddresses("node-c", ("fd00::c",), ()),
    NodeAddresses("Node-D", (), ()),
]
INDEX = address_index(NODES)


def s(instance: str | None, value: str = "50", **labels: str) -> Series:
    if instance is not None:
        labels["instance"] = instance
    return Series(labels, value)


@pytest.mark.parametrize(
    ("instance", "node", "kind"),
    [
        ("10.0.0.1", "node-a", MatchKind.IP),
        ("10.0.0.1:9100", "node-a", MatchKind.IP_PORT),
        ("host-a", "node-a", MatchKind.HOSTNAME),
        ("host-a:9100", "node-a", MatchKind.HOSTNAME_PORT),
        ("node-a", "node-a", MatchKind.NAME),
        ("node-a:9100", "node-a", MatchKind.NAME_PORT),
        ("HOST-B.example.com", "node-b", MatchKind.HOSTNAME),
        ("[fd00::c]:9100", "node-c", MatchKind.IP_PORT),
        ("fd00::c", "node-c", MatchKind.IP),
        ("fd00:0:0::c", "node-c", MatchKind.IP),  # same address, other spelling
        ("[fd00::c]", "node-c", MatchKind.IP),
        ("node-d", "Node-D", MatchKind.NAME),
    ],
)
def test_each_instance_style_finds_its_node(instance: str, node: str, kind: MatchKind) -> None:
    result = match_series([s(instance)], INDEX)
    assert set(result.chosen) == {node}
    assert result.chosen[node].kind is kind
    assert result.unmatched_instances == ()


def test_ipv6_without_brackets_is_not_read_as_host_and_port() -> None:
    assert split_instance("fd00::c") == ("fd00::c", False)
    assert split_instance("[fd00::c]:9100") == ("fd00::c", True)
    assert split_instance("10.0.0.1:9100") == ("10.0.0.1", True)
    assert split_instance("10.0.0.1:http") == ("10.0.0.1:http", False)


def test_best_rank_wins_then_highest_usage_whatever_the_series_order() -> None:
    series = [s("node-a", "95"), s("10.0.0.1:9100", "9.5"), s("10.0.0.1:9256", "70"), s("host-a", "80")]
    for ordering in (series, series[::-1]):
        result = match_series(ordering, INDEX)
        assert result.chosen["node-a"].instance == "10.0.0.1:9256"
        assert result.chosen["node-a"].value == "70"  # numerically highest, not "9.5" > "70" as strings
        assert [m.instance for m in result.shadowed["node-a"]] == ["10.0.0.1:9100", "host-a", "node-a"]
    exact = match_series([*series, s("10.0.0.1", "10")], INDEX)
    assert exact.chosen["node-a"].kind is MatchKind.IP and exact.chosen["node-a"].value == "10"


def test_same_instance_twice_prefers_a_number_over_nan_then_the_smaller_instance() -> None:
    nan_first = [s("10.0.0.1:9100", "NaN", job="a"), s("10.0.0.1:9100", "40", job="b")]
    assert match_series(nan_first, INDEX).chosen["node-a"].value == "40"
    equal = [s("10.0.0.1:9101", "40"), s("10.0.0.1:9100", "40")]
    assert match_series(equal, INDEX).chosen["node-a"].instance == "10.0.0.1:9100"


def test_series_for_unknown_instances_and_without_the_label_are_reported() -> None:
    result = match_series([s("10.9.9.9:9100"), s("ghost"), s(None, job="x"), s("10.0.0.2")], INDEX)
    assert set(result.chosen) == {"node-b"}
    assert result.unmatched_instances == ("10.9.9.9:9100", "ghost")
    assert result.without_label == 1


def test_label_name_is_configurable() -> None:
    series = [Series({"instance": "10.0.0.1", "node": "node-b"}, "42")]
    result = match_series(series, INDEX, label="node")
    assert set(result.chosen) == {"node-b"}


def test_an_address_two_nodes_claim_is_given_to_both() -> None:
    index = address_index([NodeAddresses("x", ("10.1.1.1",)), NodeAddresses("y", ("10.1.1.1",))])
    result = match_series([s("10.1.1.1:9100")], index)
    assert set(result.chosen) == {"x", "y"}


def test_node_named_like_another_nodes_ip_prefers_the_ip_meaning() -> None:
    index = address_index([NodeAddresses("10.0.0.7", ("10.0.0.8",)), NodeAddresses("n", ("10.0.0.7",))])
    result = match_series([s("10.0.0.7")], index)
    assert result.chosen["n"].kind is MatchKind.IP
    assert result.chosen["10.0.0.7"].kind is MatchKind.NAME
