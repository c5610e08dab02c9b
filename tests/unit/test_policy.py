from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from crane_shared.policy import (
    DynamicSchedulerPolicy,
    HotValuePolicy,
    PolicyError,
    PredicatePolicy,
    PriorityPolicy,
    SyncPolicy,
    default_policy,
    dump_policy,
    load_policy,
    parse_policy,
)

M3, M15, H3 = timedelta(minutes=3), timedelta(minutes=15), timedelta(hours=3)

UPSTREAM_DEFAULT = DynamicSchedulerPolicy(
    sync_policy=(
        SyncPolicy("cpu_usage_avg_5m", M3),
        SyncPolicy("cpu_usage_max_avg_1h", M15),
        SyncPolicy("cpu_usage_max_avg_1d", H3),
        SyncPolicy("mem_usage_avg_5m", M3),
        SyncPolicy("mem_usage_max_avg_1h", M15),
        SyncPolicy("mem_usage_max_avg_1d", H3),
    ),
    predicate=(
        PredicatePolicy("cpu_usage_avg_5m", 0.65),
        PredicatePolicy("cpu_usage_max_avg_1h", 0.75),
        PredicatePolicy("mem_usage_avg_5m", 0.65),
        PredicatePolicy("mem_usage_max_avg_1h", 0.75),
    ),
    priority=(
        PriorityPolicy("cpu_usage_avg_5m", 0.2),
        PriorityPolicy("cpu_usage_max_avg_1h", 0.3),
        PriorityPolicy("cpu_usage_max_avg_1d", 0.5),
        PriorityPolicy("mem_usage_avg_5m", 0.2),
        PriorityPolicy("mem_usage_max_avg_1h", 0.3),
        PriorityPolicy("mem_usage_max_avg_1d", 0.5),
    ),
    hot_value=(HotValuePolicy(timedelta(minutes=5), 5), HotValuePolicy(timedelta(minutes=1), 2)),
)


def test_default_policy_is_exactly_upstreams():
    assert default_policy() == UPSTREAM_DEFAULT


def test_default_policy_round_trips_through_yaml_in_upstream_spelling():
    text = dump_policy(default_policy())
    assert "maxLimitPecent: 0.65" in text
    assert "period: 3m\n" in text
    assert parse_policy(text) == default_policy()


def test_helpers():
    policy = default_policy()
    assert policy.period_of("cpu_usage_max_avg_1d") == H3
    assert policy.metrics()[:2] == ("cpu_usage_avg_5m", "cpu_usage_max_avg_1h")
    assert policy.longest_hot_value_window() == timedelta(minutes=5)
    assert policy.metrics_by_period() == {
        M3: ("cpu_usage_avg_5m", "mem_usage_avg_5m"),
        M15: ("cpu_usage_max_avg_1h", "mem_usage_max_avg_1h"),
        H3: ("cpu_usage_max_avg_1d", "mem_usage_max_avg_1d"),
    }
    with pytest.raises(KeyError, match="gpu"):
        policy.period_of("gpu")
    assert DynamicSchedulerPolicy().longest_hot_value_window() == timedelta(0)


def doc(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "syncPolicy": [
            {"name": "cpu_usage_avg_5m", "period": "3m"},
            {"name": "mem_usage_avg_5m", "period": "3m"},
        ],
        "predicate": [
            {"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.65},
            {"name": "mem_usage_avg_5m", "maxLimitPecent": 0.65},
        ],
        "priority": [{"name": "cpu_usage_avg_5m", "weight": 0.2}, {"name": "mem_usage_avg_5m", "weight": 0.2}],
        "hotValue": [{"timeRange": "5m", "count": 5}, {"timeRange": "1m", "count": 2}],
    }
    return {
        "apiVersion": "scheduler.policy.crane.io/v1alpha1",
        "kind": "DynamicSchedulerPolicy",
        "spec": {**base, **spec},
    }


def text_of(document: Any) -> str:
    return yaml.safe_dump(document, sort_keys=False)


def test_alias_spelling_is_accepted():
    policy = parse_policy(text_of(doc(predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPercent": 0.8}])))
    assert policy.predicate == (PredicatePolicy("cpu_usage_avg_5m", 0.8),)


def test_zero_threshold_and_zero_weights_with_positive_sum_are_allowed():
    policy = parse_policy(
        text_of(
            doc(
                predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0}],
                priority=[{"name": "cpu_usage_avg_5m", "weight": 0}, {"name": "mem_usage_avg_5m", "weight": 1}],
            )
        )
    )
    assert policy.predicate[0].max_limit_percent == 0.0
    assert [p.weight for p in policy.priority] == [0.0, 1.0]


def test_empty_sections_are_allowed():
    policy = parse_policy(text_of(doc(predicate=None, priority=[], hotValue=None)))
    assert (policy.predicate, policy.priority, policy.hot_value) == ((), (), ())


SYNC_3 = [
    {"name": "cpu_usage_avg_5m", "period": "3m"},
    {"name": "mem_usage_avg_5m", "period": "3m"},
    {"name": "cpu_usage_avg_5m", "period": "15m"},
]

INVALID = {
    "hot count 0": (
        doc(hotValue=[{"timeRange": "5m", "count": 5}, {"timeRange": "1m", "count": 0}]),
        "spec.hotValue[1].count: must be > 0",
    ),
    "hot count float": (
        doc(hotValue=[{"timeRange": "5m", "count": 2.5}]),
        "spec.hotValue[0].count: must be an integer, got 2.5",
    ),
    "hot count missing": (doc(hotValue=[{"timeRange": "5m"}]), "spec.hotValue[0].count: required"),
    "hot time range 0": (doc(hotValue=[{"timeRange": "0s", "count": 5}]), "spec.hotValue[0].timeRange: must be > 0"),
    "hot duplicate range": (
        doc(hotValue=[{"timeRange": "5m", "count": 5}, {"timeRange": "300s", "count": 2}]),
        'spec.hotValue[1].timeRange: duplicate time range "5m"',
    ),
    "predicate without sync": (
        doc(predicate=[{"name": "foo", "maxLimitPecent": 0.5}]),
        'spec.predicate[0].name: metric "foo" has no syncPolicy entry',
    ),
    "priority without sync": (
        doc(priority=[{"name": "foo", "weight": 1}]),
        'spec.priority[0].name: metric "foo" has no syncPolicy entry',
    ),
    "weights sum 0": (
        doc(priority=[{"name": "cpu_usage_avg_5m", "weight": 0}]),
        "spec.priority: weights must sum to > 0",
    ),
    "negative weight": (
        doc(priority=[{"name": "cpu_usage_avg_5m", "weight": -1}]),
        "spec.priority[0].weight: must be >= 0, got -1",
    ),
    "weight string": (
        doc(priority=[{"name": "cpu_usage_avg_5m", "weight": "0.2"}]),
        'spec.priority[0].weight: must be a number, got "0.2"',
    ),
    "weight infinite": (
        doc(priority=[{"name": "cpu_usage_avg_5m", "weight": float("inf")}]),
        "spec.priority[0].weight: must be a finite number",
    ),
    "duplicate sync": (doc(syncPolicy=SYNC_3), 'spec.syncPolicy[2].name: duplicate metric "cpu_usage_avg_5m"'),
    "duplicate predicate": (
        doc(predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.5}] * 2),
        'spec.predicate[1].name: duplicate metric "cpu_usage_avg_5m"',
    ),
    "duplicate priority": (
        doc(priority=[{"name": "cpu_usage_avg_5m", "weight": 1}] * 2),
        'spec.priority[1].name: duplicate metric "cpu_usage_avg_5m"',
    ),
    "threshold above 1": (
        doc(
            predicate=[
                {"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.5},
                {"name": "mem_usage_avg_5m", "maxLimitPecent": 1.5},
            ]
        ),
        "spec.predicate[1].maxLimitPecent: must be within [0, 1], got 1.5",
    ),
    "threshold negative": (
        doc(predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPercent": -0.1}]),
        "spec.predicate[0].maxLimitPercent: must be within [0, 1], got -0.1",
    ),
    "threshold as percent": (
        doc(predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPecent": 65}]),
        "spec.predicate[0].maxLimitPecent: must be within [0, 1], got 65",
    ),
    "threshold bool": (
        doc(predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPecent": True}]),
        "spec.predicate[0].maxLimitPecent: must be a number, got true",
    ),
    "threshold nan": (
        doc(predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPecent": float("nan")}]),
        "spec.predicate[0].maxLimitPecent: must be a finite number",
    ),
    "threshold missing": (doc(predicate=[{"name": "cpu_usage_avg_5m"}]), "spec.predicate[0].maxLimitPecent: required"),
    "both spellings": (
        doc(predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.5, "maxLimitPercent": 0.5}]),
        "spec.predicate[0].maxLimitPercent: is an alias of maxLimitPecent",
    ),
    "typo key": (
        doc(predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.5, "maxLimitPercnt": 0.4}]),
        "spec.predicate[0].maxLimitPercnt: unknown field (did you mean",
    ),
    "unknown spec key": (doc(hotValues=[]), 'spec.hotValues: unknown field (did you mean "hotValue"?)'),
    "unknown top key": ({**doc(), "metadata": {"name": "x"}}, "metadata: unknown field"),
    "period int": (
        doc(syncPolicy=[{"name": "cpu_usage_avg_5m", "period": 180}]),
        'spec.syncPolicy[0].period: must be a Go duration string like "3m", got 180',
    ),
    "period days": (
        doc(syncPolicy=[{"name": "cpu_usage_avg_5m", "period": "1d"}]),
        "spec.syncPolicy[0].period: invalid duration '1d': Go durations have no \"d\" unit",
    ),
    "period zero": (
        doc(syncPolicy=[{"name": "cpu_usage_avg_5m", "period": "0s"}]),
        "spec.syncPolicy[0].period: must be > 0",
    ),
    "period missing": (doc(syncPolicy=[{"name": "cpu_usage_avg_5m"}]), "spec.syncPolicy[0].period: required"),
    "name empty": (doc(syncPolicy=[{"name": "", "period": "3m"}]), "spec.syncPolicy[0].name: must not be empty"),
    "name missing": (doc(priority=[{"weight": 1}]), "spec.priority[0].name: required"),
    "name not a string": (
        doc(syncPolicy=[{"name": 5, "period": "3m"}]),
        "spec.syncPolicy[0].name: must be a metric name string, got 5",
    ),
    "annotation key clash": (
        doc(
            syncPolicy=[{"name": "cpu:avg", "period": "3m"}, {"name": "cpu_avg", "period": "3m"}],
            predicate=[],
            priority=[],
        ),
        'spec.syncPolicy[1].name: metric "cpu_avg" maps to annotation key "cpu_avg", '
        "already used by spec.syncPolicy[0]",
    ),
    "hot value key": (
        doc(syncPolicy=[{"name": "node_hot_value", "period": "3m"}], predicate=[], priority=[]),
        'spec.syncPolicy[0].name: metric "node_hot_value" maps to annotation key',
    ),
    "unmappable name": (
        doc(syncPolicy=[{"name": ":::", "period": "3m"}], predicate=[], priority=[]),
        "spec.syncPolicy[0].name: metric name ':::' has no letters or digits",
    ),
    "section not a list": (doc(predicate={"name": "cpu_usage_avg_5m"}), "spec.predicate: must be a list"),
    "item not a mapping": (doc(hotValue=["5m"]), 'spec.hotValue[0]: must be a mapping, got "5m"'),
    "wrong apiVersion": (
        {**doc(), "apiVersion": "v1"},
        'apiVersion: must be "scheduler.policy.crane.io/v1alpha1", got "v1"',
    ),
    "missing apiVersion": ({k: v for k, v in doc().items() if k != "apiVersion"}, "apiVersion: required"),
    "wrong kind": ({**doc(), "kind": "Policy"}, 'kind: must be "DynamicSchedulerPolicy", got "Policy"'),
    "missing spec": ({k: v for k, v in doc().items() if k != "spec"}, "spec: required"),
    "spec not a mapping": ({**doc(), "spec": []}, "spec: must be a mapping, got a list"),
    "document not a mapping": (["spec"], "document: must be a mapping"),
}


@pytest.mark.parametrize(("document", "problem"), INVALID.values(), ids=INVALID.keys())
def test_each_problem_names_its_field_path(document, problem):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text_of(document), "policy.yaml")
    assert any(line.startswith(f"policy.yaml: {problem}") for line in str(caught.value).splitlines())


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("apiVersion: [unclosed\nkind: x\n", "line 2, column 5: invalid YAML"),
        ("apiVersion: a\napiVersion: b\n", "line 2, column 1: invalid YAML: duplicate key 'apiVersion'"),
        ("", "document: must be a mapping"),
    ],
)
def test_yaml_problems_name_the_line(text, problem):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "policy.yaml")
    assert caught.value.problems[0].startswith(problem)


def test_all_problems_are_reported_at_once_in_file_order():
    document = doc(
        syncPolicy=[{"name": "cpu_usage_avg_5m", "period": "1d"}, {"name": "mem_usage_avg_5m", "period": "3m"}],
        predicate=[{"name": "cpu_usage_avg_5m", "maxLimitPecent": 2}],
        hotValue=[{"timeRange": "5m", "count": 0}],
    )
    with pytest.raises(PolicyError) as caught:
        parse_policy(text_of(document), "policy.yaml")
    paths = [problem.split(":", 1)[0] for problem in caught.value.problems]
    assert paths == ["spec.syncPolicy[0].period", "spec.predicate[0].maxLimitPecent", "spec.hotValue[0].count"]
    assert str(caught.value).count("\n") == 2
    assert caught.value.source == "policy.yaml"


def test_load_policy_reads_a_file(tmp_path: Path):
    path = tmp_path / "policy.yaml"
    path.write_text(dump_policy(default_policy()))
    assert load_policy(path) == default_policy()


def test_unreadable_policy_file_is_a_policy_error_naming_the_path(tmp_path: Path):
    path = tmp_path / "missing.yaml"
    with pytest.raises(PolicyError, match="cannot read policy file") as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path}: ")
