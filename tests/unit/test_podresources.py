"""kube 1.37's ``PodRequests`` over pod JSON (``crane_shared.podresources``): cases from component-helpers'
``helpers_test.go`` at v0.37.2, plus the pod-level in-place resize (InPlacePodLevelResourcesVerticalScaling)."""

from __future__ import annotations

from typing import Any

import pytest

from crane_shared.podresources import (
    NON_MISSING,
    non_missing_for,
    pod_requests,
    pod_requests_of,
    resize_status_present,
)


def _pod(containers: list[dict[str, Any]], status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": containers, **spec}, "status": status or {}}


def _c(name: str, **requests: str) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": dict(requests)}}


INFEASIBLE = {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(  # "resized, infeasible": the spec is left out, the actuated 2 counts
            _pod(
                [_c("container-1", cpu="4")],
                {
                    "conditions": [INFEASIBLE],
                    "containerStatuses": [{"name": "container-1", "resources": {"requests": {"cpu": "2"}}}],
                },
            ),
            {"cpu": 2000},
            id="infeasible",
        ),
        pytest.param(  # "resized, infeasible & in-progress": max(actuated 2, allocated 4)
            _pod(
                [_c("container-1", cpu="6")],
                {
                    "conditions": [INFEASIBLE],
                    "containerStatuses": [
                        {
                            "name": "container-1",
                            "allocatedResources": {"cpu": "4"},
                            "resources": {"requests": {"cpu": "2"}},
                        }
                    ],
                },
            ),
            {"cpu": 4000},
            id="infeasible-in-progress",
        ),
        pytest.param(  # "resized, no resize status": max(spec 4, actuated 2)
            _pod(
                [_c("container-1", cpu="4")],
                {"containerStatuses": [{"name": "container-1", "resources": {"requests": {"cpu": "2"}}}]},
            ),
            {"cpu": 4000},
            id="no-resize-status",
        ),
        pytest.param(  # "resized: per-resource 3-way maximum"
            _pod(
                [_c("container-1", cpu="30m", memory="20M", **{"ephemeral-storage": "10G"})],
                {
                    "containerStatuses": [
                        {
                            "name": "container-1",
                            "allocatedResources": {"cpu": "20m", "memory": "10M", "ephemeral-storage": "30G"},
                            "resources": {"requests": {"cpu": "10m", "memory": "30M", "ephemeral-storage": "20G"}},
                        }
                    ]
                },
            ),
            {"cpu": 30, "memory": 30_000_000, "ephemeral-storage": 30_000_000_000},
            id="three-way-max",
        ),
        pytest.param(  # "aggregate request resolves max of sums instead of sum of maxes" (1.35 gave 4)
            _pod(
                [_c("c1", cpu="1"), _c("c2", cpu="2")],
                {
                    "containerStatuses": [
                        {"name": "c1", "allocatedResources": {"cpu": "2"}},
                        {"name": "c2", "allocatedResources": {"cpu": "1"}},
                    ]
                },
            ),
            {"cpu": 3000},
            id="max-of-sums",
        ),
        pytest.param(  # a non-sidecar init container's status counts too since 1.37
            _pod(
                [_c("app", cpu="1")],
                {"initContainerStatuses": [{"name": "init", "allocatedResources": {"cpu": "3"}}]},
                initContainers=[_c("init", cpu="2")],
            ),
            {"cpu": 3000},
            id="init-container-status",
        ),
        pytest.param(  # the kubelet's pod-level totals replace the container aggregates
            _pod(
                [_c("c1", cpu="1"), _c("c2", cpu="1")],
                {
                    "allocatedResources": {"cpu": "1500m"},
                    "resources": {"requests": {"cpu": "3"}},
                    "containerStatuses": [{"name": "c1", "allocatedResources": {"cpu": "5"}}],
                },
            ),
            {"cpu": 3000},
            id="pod-level-status-totals",
        ),
        pytest.param(  # pod-level requests: max(spec, status.resources.requests, status.allocatedResources)
            _pod(
                [_c("c1", cpu="100m")],
                {"resources": {"requests": {"cpu": "2", "memory": "1Gi"}}, "allocatedResources": {"cpu": "3"}},
                resources={"requests": {"cpu": "1"}},
            ),
            {"cpu": 3000, "memory": 1 << 30},
            id="pod-level-resize",
        ),
        pytest.param(  # ... and without the spec when the resize is infeasible
            _pod(
                [_c("c1", cpu="100m")],
                {"conditions": [INFEASIBLE], "resources": {"requests": {"cpu": "2"}}},
                resources={"requests": {"cpu": "4"}},
            ),
            {"cpu": 2000},
            id="pod-level-infeasible",
        ),
    ],
)
def test_status_requests_follow_kube_137(pod: dict[str, Any], expected: dict[str, int]) -> None:
    assert pod_requests_of(pod, use_status=True) == expected


def test_spec_reading_ignores_the_status() -> None:
    pod = _pod(
        [_c("c", cpu="4")],
        {"conditions": [INFEASIBLE], "containerStatuses": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
    )
    assert pod_requests_of(pod, use_status=False) == pod_requests(pod["spec"]) == {"cpu": 4000}
    assert resize_status_present(pod)
    assert not resize_status_present(_pod([_c("c", cpu="4")], {"containerStatuses": [{"name": "c", "ready": True}]}))


def test_pod_level_requests_replace_cpu_memory_and_hugepages_only() -> None:
    spec = {
        "containers": [_c("c", cpu="1", memory="1Gi", **{"example.com/gpu": "1"})],
        "resources": {"requests": {"cpu": "3", "hugepages-2Mi": "4Mi"}},
        "overhead": {"cpu": "100m"},
    }
    assert pod_requests(spec) == {"cpu": 3100, "memory": 1 << 30, "example.com/gpu": 1, "hugepages-2Mi": 4 << 20}


def test_scoring_defaults_with_pod_level_requests_fill_only_unnamed_resources() -> None:
    """kube's ``getNonMissingContainerRequests``: with pod-level requests, a default only for a resource the pod's
    requests do not name at all."""
    spec = {"containers": [_c("a", cpu="500m"), _c("b")], "resources": {"requests": {"memory": "1Gi"}}}
    requests = pod_requests(spec)
    assert non_missing_for(requests, spec) == {}  # cpu named by container a, memory at the pod level
    assert non_missing_for(
        pod_requests({"containers": [_c("a")], "resources": {"requests": {"memory": "1Gi"}}}), spec
    ) == {"cpu": 100}
    assert non_missing_for(requests, {"containers": spec["containers"]}) == NON_MISSING
