"""A batch pod is BestEffort or refused: one that also requests (or limits) cpu or memory would count against the
node's regular requests and lose what protects the regular pods beside it (lowest CPU shares, first OOM victim).
crane-scheduler and the extender refuse it, naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crane_extender.protocol import filter_verdicts, parse_args
from crane_shared.batch import BATCH_CPU, BATCH_MEMORY, regular_resources_of_batch_pod
from crane_shared.loadaware.dynamic import EstimateArgs
from tests.support.scheduler import Clock, HeldBinder, node, pod, scheduler_with, step

BATCH = {BATCH_CPU: "2000", BATCH_MEMORY: "4Gi"}


def batch_pod(name: str, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> Any:
    resources = {"requests": {**BATCH, **(requests or {})}, "limits": {**BATCH, **(limits or {})}}
    return pod(name, containers=[{"name": "c", "resources": resources}])


@pytest.mark.parametrize(
    ("requests", "limits", "field"),
    [
        ({}, {}, None),  # BestEffort: fine
        ({"cpu": "0"}, {}, None),  # zero counts as none (kube's QoS ignores it too)
        ({"cpu": "500m"}, {}, "spec.containers[0].resources.requests.cpu"),
        ({}, {"memory": "1Gi"}, "spec.containers[0].resources.limits.memory"),
    ],
)
def test_the_first_regular_resource_of_a_batch_pod_is_named(
    requests: dict[str, str], limits: dict[str, str], field: str | None
) -> None:
    assert regular_resources_of_batch_pod(batch_pod("b", requests, limits)["spec"]) == field
    assert regular_resources_of_batch_pod(pod("regular", cpu="1")["spec"]) is None  # not a batch pod


async def test_crane_scheduler_refuses_a_batch_pod_with_a_cpu_request_naming_the_field() -> None:
    binder = HeldBinder()
    s = scheduler_with(binder, Clock())
    s.on_node(node("n1", cpu="8", extra={BATCH_CPU: "4000", BATCH_MEMORY: str(16 << 30)}))
    s.on_pod(batch_pod("burstable", {"cpu": "1"}))
    s.on_pod(batch_pod("besteffort"))
    await step(s)
    await step(s)
    assert binder.calls == [("besteffort", "n1")]
    message = s.decisions.get("ns/burstable").message  # type: ignore[union-attr]
    assert message.startswith(
        "0/1 nodes are available: batch pod sets spec.containers[0].resources.requests.cpu: a pod requesting "
        "crane.io/batch-cpu or crane.io/batch-memory must request no cpu or memory"
    )


def test_the_extender_refuses_it_on_every_node() -> None:
    body = {"Pod": batch_pod("burstable", {"memory": "1Gi"}), "NodeNames": ["n1", "n2"]}
    result = filter_verdicts(parse_args(json.dumps(body)), [], set(), EstimateArgs())
    assert result["NodeNames"] == [] and result["FailedNodes"] == {}
    reasons = result["FailedAndUnresolvableNodes"]
    assert set(reasons) == {"n1", "n2"}
    assert reasons["n1"].startswith("batch pod sets spec.containers[0].resources.requests.memory")
