"""A policy change the running annotator's load taint cannot apply is refused: it reads the annotations of the
metrics synced since its start, so a threshold on another metric would find every node without data and lift
every taint as stale, silently."""

from __future__ import annotations

from typing import Any

import yaml

from crane_annotator.taints import reload_problems
from crane_shared.policy import default_policy, dump_policy, parse_policy

STARTED = default_policy().metrics()  # what the process syncs


def policy(**sections: Any) -> Any:
    document = yaml.safe_load(dump_policy(default_policy()))
    document["spec"].update(sections)
    return parse_policy(yaml.safe_dump(document))


def test_a_taint_on_the_metrics_synced_since_the_start_is_applied() -> None:
    assert reload_problems(policy(loadTaint={"thresholds": {"cpu_usage_avg_5m": 0.7}}), STARTED) == []
    assert reload_problems(policy(loadTaint={}), STARTED) == []  # the predicates' metrics
    assert reload_problems(policy(), STARTED) == []  # no taint: every one lifted, nothing read


def test_a_taint_on_a_metric_added_since_the_start_is_refused_naming_the_field_and_the_metric() -> None:
    added = {"name": "gpu_usage_avg_5m", "period": "1m"}
    base = yaml.safe_load(dump_policy(default_policy()))["spec"]
    explicit = policy(syncPolicy=[*base["syncPolicy"], added], loadTaint={"thresholds": {"gpu_usage_avg_5m": 0.5}})
    assert reload_problems(explicit, STARTED) == [
        'spec.loadTaint.thresholds: "gpu_usage_avg_5m" is not synced by this process (restart to change syncPolicy)'
    ]
    predicate = {"name": "gpu_usage_avg_5m", "maxLimitPecent": 0.5}
    by_predicate = policy(
        syncPolicy=[*base["syncPolicy"], added], predicate=[*base["predicate"], predicate], loadTaint={}
    )
    problems = reload_problems(by_predicate, STARTED)
    assert len(problems) == 1 and problems[0].startswith('spec.predicate (the taint\'s thresholds): "gpu_usage_avg_5m"')
