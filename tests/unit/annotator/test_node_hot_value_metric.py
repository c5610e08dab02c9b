"""crane_annotator_node_hot_value{node}: the hot value each node carries, for the cluster-load dashboard."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from crane_annotator.matching import NodeAddresses
from crane_annotator.metrics import AgeCollector
from crane_annotator.nodes import NodeInfo
from crane_shared.annotations import HOT_VALUE_KEY


def test_hot_value_of_each_annotated_node_is_exported() -> None:
    nodes = {
        "a": NodeInfo(NodeAddresses("a"), {HOT_VALUE_KEY: 100.0}, {HOT_VALUE_KEY: 3.0}),
        "b": NodeInfo(NodeAddresses("b"), {}, {}),  # not annotated yet: no series, rather than a made-up 0
    }
    registry = CollectorRegistry()
    registry.register(AgeCollector(lambda: nodes, [HOT_VALUE_KEY], dict, started=0.0, clock=lambda: 110.0))
    text = generate_latest(registry).decode()
    assert 'crane_annotator_node_hot_value{node="a"} 3.0' in text
    assert 'node_hot_value{node="b"}' not in text
    assert 'crane_annotator_annotation_age_seconds{key="node_hot_value"} 10.0' in text
