"""One pod-sizing rule: the in-process Dynamic plugin and the extender size every pod the same way."""

from __future__ import annotations

from typing import Any

import pytest

from crane_extender.protocol import pod_view
from crane_scheduler.loadaware.plugin import estimated_resources
from crane_scheduler.podinfo import parse_pod
from crane_shared.loadaware.podsize import PodSize, is_daemonset_pod, pod_size


def pod_with(*containers: dict[str, Any], owners: list[Any] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u"}
    if owners is not None:
        meta["ownerReferences"] = owners
    return {"metadata": meta, "spec": {"containers": list(containers), **spec}}


def c(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": requests or {}, "limits": limits or {}}}


CASES = {
    "requests": (pod_with(c({"cpu": "500m", "memory": "1Gi"})), PodSize(0.5, 2.0**30)),
    "limits only": (pod_with(c(limits={"cpu": "2", "memory": "512Mi"})), PodSize(2.0, 512.0 * 2**20)),
    "cpu request, memory limit": (pod_with(c({"cpu": "250m"}, {"memory": "256Mi"})), PodSize(0.25, 256.0 * 2**20)),
    "two containers": (
        pod_with(c({"cpu": "100m", "memory": "100Mi"}), c({"cpu": "300m", "memory": "300Mi"})),
        PodSize(0.4, 400.0 * 2**20),
    ),
    "init container larger": (
        pod_with(c({"cpu": "100m", "memory": "64Mi"}), initContainers=[c({"cpu": "1", "memory": "32Mi"})]),
        PodSize(1.0, 64.0 * 2**20),
    ),
    "overhead": (
        pod_with(c({"cpu": "100m", "memory": "64Mi"}), overhead={"cpu": "50m", "memory": "16Mi"}),
        PodSize(0.15, 80.0 * 2**20),
    ),
    "nothing": (pod_with(c()), PodSize(0.0, 0.0)),
    # pod-level resources (PodLevelResources, beta and on): the pod-level cpu and memory requests replace the
    # containers' sum; a pod-level limit is the fallback where no request is stated
    "pod-level requests": (
        pod_with(
            c({"cpu": "100m", "memory": "64Mi"}),
            c({"cpu": "100m", "memory": "64Mi"}),
            resources={"requests": {"cpu": "1", "memory": "1Gi"}},
        ),
        PodSize(1.0, 2.0**30),
    ),
    "pod-level cpu, container memory": (
        pod_with(c({"memory": "256Mi"}), resources={"requests": {"cpu": "500m"}}),
        PodSize(0.5, 256.0 * 2**20),
    ),
    "pod-level limits only": (
        pod_with(c(limits={"cpu": "4"}), c(), resources={"limits": {"cpu": "2", "memory": "1Gi"}}),
        PodSize(2.0, 2.0**30),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_plugin_and_extender_size_a_pod_alike(case: str) -> None:
    raw, expected = CASES[case]
    assert pod_size(raw["spec"]) == pytest.approx(expected)
    assert estimated_resources(parse_pod(raw)) == pytest.approx((expected.cpu, expected.memory))
    view = pod_view(raw)
    assert (view.cpu, view.memory) == pytest.approx((expected.cpu, expected.memory))


@pytest.mark.parametrize(
    ("owners", "daemonset"),
    [
        ([{"kind": "DaemonSet", "name": "ds"}], True),
        ([{"kind": "ReplicaSet", "name": "rs"}, {"kind": "DaemonSet", "name": "ds"}], True),
        ([{"kind": "ReplicaSet", "name": "rs"}], False),
        (None, False),
        (["not-an-object"], False),
    ],
)
def test_the_daemonset_rule_is_one_rule(owners: list[Any] | None, daemonset: bool) -> None:
    raw = pod_with(c(), owners=owners)
    assert is_daemonset_pod(raw["metadata"]) is daemonset
    assert pod_view(raw).daemonset is daemonset
