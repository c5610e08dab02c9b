"""The unsupported-field gate: pods using a field no plugin reads yet are refused with the field named."""

from __future__ import annotations

import pytest

from crane_scheduler import unsupported
from crane_scheduler.framework import Diagnosis
from tests.support.scheduler import chosen, decide, node, pod, table


def test_dra_resource_claims_are_dynamic_resources_business_now() -> None:
    t = table(node("a"), node("b"))
    p = pod(spec={"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}]})
    result = decide(t, p)
    assert isinstance(result, Diagnosis)
    assert result.message.startswith('0/2 nodes are available: could not find ResourceClaim "ns/gpu-claim".')


@pytest.mark.parametrize(
    "source", ["gcePersistentDisk", "awsElasticBlockStore", "azureDisk", "cinder", "portworxVolume"]
)
def test_in_tree_volumes_kube_counts_through_csi_migration_are_refused(source: str) -> None:
    t = table(node("a"))
    volumes = [{"name": "cfg", "configMap": {"name": "c"}}, {"name": "data", source: {"pdName": "x"}}]
    result = decide(t, pod(spec={"volumes": volumes}))
    assert isinstance(result, Diagnosis)
    assert f"pod uses spec.volumes[1].{source}, which crane-scheduler does not support yet" in result.message


def test_claims_go_to_the_volume_plugins_not_the_gate() -> None:
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "x"}}]
    result = decide(table(node("a")), pod(spec={"volumes": volumes}))
    assert isinstance(result, Diagnosis)
    assert result.message == '0/1 nodes are available: persistentvolumeclaim "x" not found.'


def test_volumes_no_plugin_reads_are_fine() -> None:
    volumes = [
        {"name": "cfg", "configMap": {"name": "c"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "tok", "projected": {"sources": []}},
    ]
    assert chosen(table(node("a")), pod(spec={"volumes": volumes})) == "a"


def test_the_table_can_shrink_when_a_plugin_supports_a_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(unsupported.UNSUPPORTED, "spec.volumes")
    p = pod(spec={"volumes": [{"name": "data", "gcePersistentDisk": {"pdName": "x"}}]})
    assert chosen(table(node("a")), p) == "a"


def test_a_workload_api_gang_member_is_refused_naming_the_field_not_placed_alone() -> None:
    t = table(node("a"))
    p = pod(spec={"workloadRef": {"name": "training", "podGroup": "workers"}})
    result = decide(t, p)
    assert isinstance(result, Diagnosis)
    assert result.message == (
        "0/1 nodes are available: pod uses spec.workloadRef, which crane-scheduler does not support yet."
    )
