"""``spec.reclaim`` of the DynamicSchedulerPolicy and the node override annotation: defaults, round trip, and one
problem per bad value, naming its field path."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml

from crane_shared.policy import PolicyError, default_policy, dump_policy, parse_policy
from crane_shared.reclaimpolicy import (
    NodeOverride,
    OverrideError,
    ReclaimPolicy,
    ResourceReclaim,
    parse_override,
)


def policy_text(reclaim: object) -> str:
    document = yaml.safe_load(dump_policy(default_policy()))
    document["spec"]["reclaim"] = reclaim
    return yaml.safe_dump(document)


def test_absent_section_reclaims_nothing_and_an_empty_one_takes_koordinators_defaults() -> None:
    assert default_policy().reclaim is None
    policy = parse_policy(policy_text({}))
    assert policy.reclaim == ReclaimPolicy(
        cpu=ResourceReclaim("usage", 0.60, "cpu_usage_avg_5m"),
        memory=ResourceReclaim("usage", 0.65, "mem_usage_avg_5m"),
        pod_usage_window=timedelta(minutes=5),
        degrade_after=timedelta(minutes=15),
        change_threshold=0.1,
        max_age=timedelta(minutes=5),
    )


def test_choices_are_read_and_round_trip_through_yaml() -> None:
    reclaim = {
        "cpu": {"reclaimThreshold": 0.7, "nodeMetric": "cpu_usage_max_avg_1h"},
        "memory": {"policy": "request", "reclaimThreshold": 0.5},
        "podUsageWindow": "2m",
        "degradeAfter": "10m",
        "changeThreshold": 0.05,
        "maxAge": "10m",
        "batchMetrics": {"mem_usage_avg_5m": "batch_mem_usage_avg_5m", "cpu_usage_max_avg_1h": "sum(x) by (i)"},
    }
    policy = parse_policy(policy_text(reclaim))
    assert policy.reclaim is not None
    assert policy.reclaim.cpu == ResourceReclaim("usage", 0.7, "cpu_usage_max_avg_1h")
    assert policy.reclaim.memory == ResourceReclaim("request", 0.5, "mem_usage_avg_5m")
    assert policy.reclaim.degrade_after == timedelta(minutes=10)
    assert policy.reclaim.batch_metrics == (
        ("cpu_usage_max_avg_1h", "sum(x) by (i)"),
        ("mem_usage_avg_5m", "batch_mem_usage_avg_5m"),
    )
    assert parse_policy(dump_policy(policy)) == policy


@pytest.mark.parametrize(
    ("reclaim", "problem"),
    [
        ([], "spec.reclaim: must be a mapping, got a list"),
        ({"cpus": {}}, 'spec.reclaim.cpus: unknown field (did you mean "cpu"?)'),
        ({"cpu": {"policy": "usge"}}, "spec.reclaim.cpu.policy: must be one of usage, request, maxUsageRequest"),
        ({"memory": {"reclaimThreshold": 1.5}}, "spec.reclaim.memory.reclaimThreshold: must be within [0, 1]"),
        ({"memory": {"reclaimThreshold": "60%"}}, "spec.reclaim.memory.reclaimThreshold: must be a number"),
        ({"cpu": {"nodeMetric": "nope"}}, 'spec.reclaim.cpu.nodeMetric: metric "nope" has no syncPolicy entry'),
        ({"cpu": {"threshold": 0.5}}, "spec.reclaim.cpu.threshold: unknown field"),
        ({"degradeAfter": "15"}, "spec.reclaim.degradeAfter:"),
        ({"maxAge": "0s"}, "spec.reclaim.maxAge: must be > 0"),
        ({"changeThreshold": 1}, "spec.reclaim.changeThreshold: must be within [0, 1)"),
        ({"podUsageWindow": "500ms"}, "spec.reclaim.podUsageWindow: must be at least 1s"),
        ({"batchMetrics": ["x"]}, "spec.reclaim.batchMetrics: must be a mapping of metric name to PromQL"),
        ({"batchMetrics": {"nope": "x"}}, 'spec.reclaim.batchMetrics.nope: metric "nope" has no syncPolicy entry'),
        ({"batchMetrics": {"mem_usage_avg_5m": ""}}, "spec.reclaim.batchMetrics.mem_usage_avg_5m: must be a PromQL"),
    ],
)
def test_each_bad_value_is_refused_naming_its_field_path(reclaim: object, problem: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(policy_text(reclaim), "policy.yaml")
    assert len(caught.value.problems) == 1, caught.value.problems
    assert caught.value.problems[0].startswith(problem), caught.value.problems


def test_all_problems_of_the_section_are_reported_at_once() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(policy_text({"cpu": {"reclaimThreshold": -1}, "memory": {"policy": "x"}, "maxAge": 3}))
    assert [p.split(":")[0] for p in caught.value.problems] == [
        "spec.reclaim.cpu.reclaimThreshold",
        "spec.reclaim.memory.policy",
        "spec.reclaim.maxAge",
    ]


def test_node_override() -> None:
    assert parse_override(None) == NodeOverride()
    assert parse_override(" OFF ") == NodeOverride(off=True)
    assert parse_override("cpu=0.4") == NodeOverride(cpu_threshold=0.4)
    assert parse_override("cpu=0.4, memory=0") == NodeOverride(cpu_threshold=0.4, memory_threshold=0.0)
    rule = ResourceReclaim("usage", 0.6, "m")
    assert parse_override("cpu=0.4").threshold("cpu", rule) == 0.4
    assert parse_override("cpu=0.4").threshold("memory", rule) == 0.6
    for bad in ("", "cpu", "cpu=2", "gpu=0.1", "cpu=x", "cpu=0.1,cpu=0.2", "no"):
        with pytest.raises(OverrideError, match=r"crane\.io/batch-reclaim"):
            parse_override(bad)
