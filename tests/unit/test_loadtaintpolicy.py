"""``spec.loadTaint``, ``spec.scoring`` and ``spec.newNodes`` of the DynamicSchedulerPolicy: defaults, round trip,
and one problem per bad value, naming its field path."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml

from crane_shared.loadtaintpolicy import LoadTaintPolicy, NewNodesPolicy, ScoringPolicy
from crane_shared.policy import PolicyError, default_policy, dump_policy, parse_policy


def policy_text(**sections: object) -> str:
    document = yaml.safe_load(dump_policy(default_policy()))
    document["spec"].update(sections)
    return yaml.safe_dump(document)


def test_absent_sections_spread_and_taint_nothing_and_empty_ones_take_the_defaults() -> None:
    policy = default_policy()
    assert policy.load_taint is None
    assert policy.scoring == ScoringPolicy("spread", 0.6)
    assert policy.new_nodes == NewNodesPolicy(estimate=False)  # upstream's fail-open unless asked
    policy = parse_policy(policy_text(loadTaint={}, scoring={}, newNodes={}))
    assert policy.load_taint == LoadTaintPolicy("NoSchedule", 2, 2, (), None, 0)
    assert policy.scoring == ScoringPolicy("spread", 0.6)
    assert policy.new_nodes == NewNodesPolicy(estimate=False)
    # default thresholds: the enabled predicates, as the Filter refuses
    assert policy.taint_thresholds() == {
        "cpu_usage_avg_5m": 0.65,
        "cpu_usage_max_avg_1h": 0.75,
        "mem_usage_avg_5m": 0.65,
        "mem_usage_max_avg_1h": 0.75,
    }


def test_choices_are_read_and_round_trip_through_yaml() -> None:
    taint = {
        "effect": "PreferNoSchedule",
        "hotRounds": 3,
        "coolRounds": 1,
        "thresholds": {"cpu_usage_avg_5m": 0.7},
        "maxDataAge": "90s",
        "minUntaintedNodes": 2,
    }
    policy = parse_policy(
        policy_text(
            loadTaint=taint,
            scoring={"strategy": "pack", "targetUtilization": 0.5},
            newNodes={"estimate": True, "window": "2m"},
        )
    )
    assert policy.load_taint == LoadTaintPolicy(
        "PreferNoSchedule", 3, 1, (("cpu_usage_avg_5m", 0.7),), timedelta(seconds=90), 2
    )
    assert policy.taint_thresholds() == {"cpu_usage_avg_5m": 0.7}
    assert policy.scoring == ScoringPolicy("pack", 0.5)
    assert policy.new_nodes == NewNodesPolicy(estimate=True, window=timedelta(minutes=2))
    assert parse_policy(dump_policy(policy)) == policy


@pytest.mark.parametrize(
    ("sections", "problem"),
    [
        ({"loadTaint": []}, "spec.loadTaint: must be a mapping, got a list"),
        ({"loadTaint": {"efect": "NoSchedule"}}, 'spec.loadTaint.efect: unknown field (did you mean "effect"?)'),
        ({"loadTaint": {"effect": "NoExecute"}}, "spec.loadTaint.effect: must be one of NoSchedule, PreferNoSchedule"),
        ({"loadTaint": {"hotRounds": 0}}, "spec.loadTaint.hotRounds: must be >= 1, got 0"),
        ({"loadTaint": {"coolRounds": "2"}}, 'spec.loadTaint.coolRounds: must be an integer, got "2"'),
        ({"loadTaint": {"minUntaintedNodes": -1}}, "spec.loadTaint.minUntaintedNodes: must be >= 0, got -1"),
        ({"loadTaint": {"maxDataAge": "0s"}}, "spec.loadTaint.maxDataAge: must be > 0"),
        (
            {"loadTaint": {"thresholds": {"gpu_usage": 0.5}}},
            'spec.loadTaint.thresholds.gpu_usage: metric "gpu_usage" has no syncPolicy entry',
        ),
        (
            {"loadTaint": {"thresholds": {"cpu_usage_avg_5m": 1.5}}},
            "spec.loadTaint.thresholds.cpu_usage_avg_5m: must be within (0, 1], got 1.5",
        ),
        ({"scoring": {"strategy": "binpack"}}, 'spec.scoring.strategy: must be one of spread, pack, got "binpack"'),
        ({"scoring": {"targetUtilization": 1}}, "spec.scoring.targetUtilization: must be within (0, 1), got 1"),
        ({"newNodes": True}, "spec.newNodes: must be a mapping, got true"),
        ({"newNodes": {"estimates": True}}, 'spec.newNodes.estimates: unknown field (did you mean "estimate"?)'),
        ({"newNodes": {"estimate": "yes"}}, 'spec.newNodes.estimate: must be true or false, got "yes"'),
        ({"newNodes": {"estimate": 1}}, "spec.newNodes.estimate: must be true or false, got 1"),
        (
            {"newNodes": {"window": "2m"}},
            "spec.newNodes.window: only with spec.newNodes.estimate: true (nothing is estimated without it)",
        ),
        (
            {"newNodes": {"estimate": True, "window": 120}},
            'spec.newNodes.window: must be a Go duration string like "3m", got 120',
        ),
        (
            {"loadTaint": {}, "predicate": [{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0}]},
            "spec.loadTaint.thresholds: required when no predicate threshold is enabled",
        ),
    ],
)
def test_each_problem_names_its_field_path(sections: dict[str, object], problem: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(policy_text(**sections))
    assert any(p.startswith(problem) for p in caught.value.problems), caught.value.problems
