"""``bound_version``: the bound object of a pending pod read from the pending version's readings, exactly as a
full parse would read it, or not at all."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from crane_scheduler.podinfo import bound_version, parse_pod
from tests.support.scheduler import container, pod

SCHEDULED = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-28T17:00:00Z"}


def bound(raw: dict[str, Any], node: str = "n1") -> dict[str, Any]:
    """What the API server's binding makes of ``raw``: the node, the PodScheduled condition, a resourceVersion."""
    out = copy.deepcopy(raw)
    out["spec"]["nodeName"] = node
    out["metadata"]["resourceVersion"] = "42"
    out.setdefault("status", {})["conditions"] = [SCHEDULED]
    return out


PENDING = [
    pod(),
    pod(containers=[container("1", "1Gi", ports=[{"containerPort": 80, "hostPort": 8080}])], priority=7),
    pod(spec={"tolerations": [{"key": "k", "operator": "Exists"}], "nodeSelector": {"disk": "ssd"}}),
    pod(spec={"resources": {"requests": {"cpu": "2"}}}),  # pod-level resources
    {**pod(), "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}},
]


def test_a_binding_reads_as_a_full_parse_of_the_bound_object() -> None:
    for raw in PENDING:
        raw["spec"].pop("nodeName", None)
        pending = parse_pod(raw)
        after = bound(raw)
        quick = bound_version(pending, after)
        assert quick is not None
        assert dataclasses.asdict(quick) == dataclasses.asdict(parse_pod(after))
        assert quick.raw is after


def test_anything_else_changed_is_parsed_in_full() -> None:
    raw = pod()
    raw["spec"].pop("nodeName", None)
    pending = parse_pod(raw)
    relabelled = bound(raw)
    relabelled["metadata"]["labels"] = {"app": "x"}
    resized = bound(raw)
    resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    status_resources = bound(raw)
    status_resources["status"]["containerStatuses"] = [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]
    deleting = bound(raw)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-28T17:00:00Z"
    for changed in (relabelled, resized, status_resources, deleting):
        assert bound_version(pending, changed) is None
    assert bound_version(pending, raw) is None  # not bound
    assert bound_version(parse_pod(bound(raw, "n0")), bound(raw)) is None  # the pending version was bound
