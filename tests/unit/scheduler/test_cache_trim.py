"""The cache keeps no ``managedFields``: memory per pod at 50,000 pods (kube-scheduler trims them too)."""

from __future__ import annotations

from crane_scheduler.podinfo import parse_pod
from tests.unit.scheduler.builders import node, pod
from tests.unit.scheduler.test_scheduler_cycle import Clock, FakeBinder, make

MANAGED = [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]


def test_pods_and_nodes_are_kept_without_managed_fields() -> None:
    s = make(FakeBinder(), Clock())
    raw_node = node("n1")
    raw_node["metadata"]["managedFields"] = list(MANAGED)
    s.cache.node_event("ADDED", raw_node, None)
    pending, placed = pod("pending"), pod("placed")
    placed["spec"]["nodeName"] = "n1"
    for raw in (pending, placed):
        raw["metadata"]["managedFields"] = list(MANAGED)
        s.cache.pod_event("ADDED", raw, None)
    assert "managedFields" not in s.pending[parse_pod(pending).uid].raw["metadata"]
    record = s.table.pods[parse_pod(placed).uid]
    assert record.pod is not None and "managedFields" not in record.pod.raw["metadata"]
    stored = s.table.nodes[s.table.rows["n1"]]
    assert stored is not None and "managedFields" not in stored.raw["metadata"]
    assert "managedFields" not in pending["metadata"], "trimmed in place: the informer's copy is the same object"
