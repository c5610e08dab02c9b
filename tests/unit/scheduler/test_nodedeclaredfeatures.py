"""NodeDeclaredFeatures (kube 1.37, default profile): the features a pod needs, read from its spec as kube's
component-helpers library reads them, must be declared by the node (``status.declaredFeatures``)."""

from __future__ import annotations

from typing import Any

import pytest

from crane_scheduler.framework import ClusterChange, ClusterEvent, QueueingHint
from crane_scheduler.plugins.nodedeclaredfeatures.features import NAMES, infer_for_scheduling, infer_for_update, try_map
from crane_scheduler.plugins.nodedeclaredfeatures.plugin import after_node_change, after_target_pod_update
from crane_scheduler.podinfo import parse_node, parse_pod
from tests.support.scheduler import chosen, container, failure, node, pod, table

RESTART_ALL = {
    "restartPolicyRules": [{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]
}


def declaring(name: str, *features: str, **kw: Any) -> dict[str, Any]:
    raw = node(name, **kw)
    raw["status"]["declaredFeatures"] = sorted(features)
    return raw


def needing_restart_all() -> dict[str, Any]:
    return pod(containers=[{**container("100m"), **RESTART_ALL}])


def test_registry_is_kubes_sorted_by_name() -> None:
    assert tuple(sorted(NAMES)) == NAMES and len(NAMES) == 9
    assert "RestartAllContainersOnContainerExits" in NAMES and "VolumeBindMountOptions" in NAMES


@pytest.mark.parametrize(
    ("spec", "needed"),
    [
        ({"containers": [{"name": "c"}]}, set()),
        ({"containers": [{"name": "c", **RESTART_ALL}]}, {"RestartAllContainersOnContainerExits"}),
        (
            {"containers": [{"name": "c"}], "initContainers": [{"name": "i", **RESTART_ALL}]},
            {"RestartAllContainersOnContainerExits"},
        ),
        (  # a rule that restarts only its own container needs nothing
            {"containers": [{"name": "c", "restartPolicyRules": [{"action": "Restart"}]}]},
            set(),
        ),
        (
            {"containers": [{"name": "c"}], "hostNetwork": True, "hostUsers": False},
            {"UserNamespacesHostNetworkSupport"},
        ),
        ({"containers": [{"name": "c"}], "hostNetwork": True}, set()),  # hostUsers unset is not false
        ({"containers": [{"name": "c"}], "hostUsers": False}, set()),
        (
            {
                "containers": [
                    {"name": "c", "volumeMounts": [{"name": "v", "mountPath": "/v", "bindMountOptions": ["noexec"]}]}
                ]
            },
            {"VolumeBindMountOptions"},
        ),
        (
            {
                "containers": [{"name": "c"}],
                "ephemeralContainers": [{"name": "e", "volumeMounts": [{"name": "v", "bindMountOptions": ["nodev"]}]}],
            },
            {"VolumeBindMountOptions"},
        ),
        ({"containers": [{"name": "c", "volumeMounts": [{"name": "v", "bindMountOptions": []}]}]}, set()),
    ],
)
def test_inference_for_scheduling(spec: dict[str, Any], needed: set[str]) -> None:
    assert infer_for_scheduling(spec) == needed


def test_inference_for_update_is_the_resize_features() -> None:
    old = {"containers": [{"name": "c"}], "resources": {"requests": {"cpu": "1"}}}
    new = {"containers": [{"name": "c"}], "resources": {"requests": {"cpu": "2"}}}
    assert infer_for_update(old, new) == {"InPlacePodLevelResourcesVerticalScaling"}
    assert infer_for_update(old, old) == set()


def test_try_map_keeps_known_features_of_a_sorted_list() -> None:
    assert try_map(["Alpha", "RestartAllContainersOnContainerExits", "VolumeBindMountOptions", "Zeta"]) == {
        "RestartAllContainersOnContainerExits",
        "VolumeBindMountOptions",
    }
    # kube's merge assumes the sorted order the API server enforces: out of order, what it walked past is lost
    assert try_map(["VolumeBindMountOptions", "RestartAllContainersOnContainerExits"]) == {"VolumeBindMountOptions"}


def test_pod_needing_a_feature_lands_only_where_it_is_declared() -> None:
    t = table(node("plain"), declaring("featured", "RestartAllContainersOnContainerExits", "Unknown"))
    assert chosen(t, needing_restart_all()) == "featured"
    assert chosen(t, pod()) in {"plain", "featured"}


def test_no_node_declaring_it_is_kubes_message() -> None:
    t = table(node("a"), declaring("b", "VolumeBindMountOptions"))
    assert (
        failure(t, needing_restart_all()) == "0/2 nodes are available: 2 node(s) didn't match Pod's required features."
    )


def test_node_declaring_the_feature_wakes_the_pod() -> None:
    p = parse_pod(needing_restart_all())
    before = parse_node(node("a"))
    after = parse_node(declaring("a", "RestartAllContainersOnContainerExits"))
    relabelled = parse_node(node("a", labels={"x": "y"}))
    update = ClusterEvent.NODE_UPDATE
    assert after_node_change(p, ClusterChange(update, before, after)) is QueueingHint.QUEUE
    assert after_node_change(p, ClusterChange(update, before, relabelled)) is QueueingHint.SKIP
    assert after_node_change(p, ClusterChange(ClusterEvent.NODE_ADD, None, before)) is QueueingHint.QUEUE


def test_declared_features_change_is_a_node_update_the_table_sees() -> None:
    t = table(node("a"))
    assert t.upsert_node(parse_node(declaring("a", "VolumeBindMountOptions"))) == "update"
    assert (
        chosen(
            t, pod(containers=[{**container("100m"), "volumeMounts": [{"name": "v", "bindMountOptions": ["nosuid"]}]}])
        )
        == "a"
    )


def test_target_pod_update_queues_only_when_its_requirements_change() -> None:
    plain = {"spec": {"containers": [{"name": "c"}]}}
    assert after_target_pod_update(plain, plain) is QueueingHint.SKIP
    assert (
        after_target_pod_update(plain, {"spec": {"containers": [{"name": "c", **RESTART_ALL}]}}) is QueueingHint.QUEUE
    )
