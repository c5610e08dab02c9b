"""The descheduler policy: defaults from the scheduler's thresholds, one line per problem naming its field path."""

from __future__ import annotations

import pytest

from crane_descheduler.policy import NodePool, default_policy, parse_policy
from crane_sandbox.sandbox import SANDBOX_POLICY
from crane_shared.policy import default_policy as scheduler_default
from crane_shared.policy import parse_policy as parse_scheduler_policy
from crane_shared.policyyaml import PolicyError

HEAD = "apiVersion: descheduler.policy.crane.io/v1alpha1\nkind: LoadAwareDeschedulerPolicy\n"


def test_default_high_thresholds_are_the_scheduler_predicates_of_its_short_window_metrics():
    policy = default_policy(scheduler_default())
    (pool,) = policy.pools
    # the 1h maxima are left out: a relieved node would look hot for an hour
    assert pool.high == {"cpu_usage_avg_5m": 0.65, "mem_usage_avg_5m": 0.65}
    assert pool.low == {"cpu_usage_avg_5m": pytest.approx(0.35), "mem_usage_avg_5m": pytest.approx(0.35)}
    assert policy.anomaly.hot_rounds == 3 and policy.anomaly.normal_rounds == 2


def test_a_maximum_over_a_window_is_never_a_high_threshold_however_often_it_is_synced():
    """bench.rebalance: the sandbox syncs the hour's maximum every 15 s; as a default threshold it kept both
    relieved nodes hot (the peak stays an hour) and each lost a second pod that cooled nothing."""
    sandbox = parse_scheduler_policy(SANDBOX_POLICY)
    assert sandbox.period_of("cpu_usage_max_avg_1h").total_seconds() == 15
    (pool,) = default_policy(sandbox).pools
    assert pool.high == {"cpu_usage_avg_5m": 0.65, "mem_usage_avg_5m": 0.65}
    text = HEAD + "spec:\n  nodePools:\n    - name: a\n      highThresholds: {cpu_usage_max_avg_1h: 0.9}\n"
    with pytest.raises(PolicyError) as err:
        parse_policy(text, sandbox)
    assert err.value.problems[0].startswith(
        "spec.nodePools[0].highThresholds.cpu_usage_max_avg_1h: a maximum over a window; no eviction lowers it"
    )


def test_pools_select_by_labels_and_default_their_thresholds():
    text = HEAD + (
        "spec:\n"
        "  anomaly: {consecutiveAbnormalities: 5, consecutiveNormalities: 3}\n"
        "  nodePools:\n"
        "    - name: gpu\n"
        "      nodeSelector: {pool: gpu}\n"
        "      highThresholds: {cpu_usage_avg_5m: 0.8}\n"
        "    - name: rest\n"
        "  limits: {maxUnavailablePerWorkload: '25%', maxPerMinute: 10}\n"
    )
    policy = parse_policy(text, scheduler_default())
    gpu, rest = policy.pools
    assert gpu == NodePool("gpu", {"pool": "gpu"}, {"cpu_usage_avg_5m": 0.8}, {"cpu_usage_avg_5m": 0.5})
    assert rest.high == {"cpu_usage_avg_5m": 0.65, "mem_usage_avg_5m": 0.65}
    assert policy.pool_of({"pool": "gpu"}) is gpu and policy.pool_of({}) is rest
    assert policy.limits.max_unavailable_per_workload == "25%" and policy.limits.per_minute == 10
    assert policy.anomaly.hot_rounds == 5


def test_every_problem_is_reported_once_naming_its_field_path():
    text = HEAD + (
        "spec:\n"
        "  anomaly: {consecutiveAbnormalities: 0}\n"
        "  nodePools:\n"
        "    - name: a\n"
        "      highThresholds: {cpu_usage_avg_5m: 1.5, gpu_usage: 0.5}\n"
        "      lowThresholds: {mem_usage_avg_5m: 0.9}\n"
        "      nodeSelektor: {}\n"
        "  evictable: {minPodAge: soon, recreatingOwnerKinds: [DaemonSet]}\n"
        "  limits: {maxUnavailablePerWorkload: 150%, maxPerNodePerRound: -1}\n"
    )
    with pytest.raises(PolicyError) as err:
        parse_policy(text, scheduler_default(), "d.yaml")
    assert err.value.problems == [
        "spec.anomaly.consecutiveAbnormalities: must be >= 1, got 0",
        'spec.nodePools[0].nodeSelektor: unknown field (did you mean "nodeSelector"?)',
        "spec.nodePools[0].highThresholds.cpu_usage_avg_5m: must be within [0, 1], got 1.5",
        'spec.nodePools[0].highThresholds.gpu_usage: metric "gpu_usage" has no syncPolicy entry in the scheduler '
        "policy",
        "spec.nodePools[0].lowThresholds.mem_usage_avg_5m: has no high threshold",
        "spec.evictable.minPodAge: invalid duration 'soon': expected a number at 'soon'",
        "spec.evictable.recreatingOwnerKinds: DaemonSet pods are never evicted",
        'spec.limits.maxUnavailablePerWorkload: must be a count >= 0 or a percent like "25%", got "150%"',
        "spec.limits.maxPerNodePerRound: must be >= 0, got -1",
    ]
    assert str(err.value).splitlines()[0].startswith("d.yaml: spec.anomaly")


def test_a_zero_high_threshold_is_refused():
    text = HEAD + "spec:\n  nodePools: [{name: a, highThresholds: {cpu_usage_avg_5m: 0}}]\n"
    with pytest.raises(PolicyError) as err:
        parse_policy(text, scheduler_default())
    assert err.value.problems == [
        "spec.nodePools[0].highThresholds.cpu_usage_avg_5m: must be > 0 (0 would call every node hot; leave the "
        "metric out instead)"
    ]


def test_invalid_yaml_and_wrong_kind_are_refused():
    with pytest.raises(PolicyError, match="duplicate key"):
        parse_policy(HEAD + "spec: {}\nspec: {}\n", scheduler_default())
    with pytest.raises(PolicyError, match='kind: must be "LoadAwareDeschedulerPolicy", got "Other"'):
        parse_policy("apiVersion: descheduler.policy.crane.io/v1alpha1\nkind: Other\n", scheduler_default())


def test_the_drain_is_off_unless_given_and_its_fields_are_checked() -> None:
    from crane_descheduler.policy import Drain

    assert default_policy(scheduler_default()).drain is None
    on = parse_policy(HEAD + "spec:\n  drain: {}\n", scheduler_default())
    assert on.drain == Drain({}, {"cpu": 0.5, "memory": 0.5}, 3, 1)
    given = parse_policy(
        HEAD + "spec:\n  drain: {usageBelow: {cpu_usage_avg_5m: 0.2}, requestsBelow: {cpu: 0.4}, maxNodes: 2}\n",
        scheduler_default(),
    )
    assert given.drain == Drain({"cpu_usage_avg_5m": 0.2}, {"cpu": 0.4, "memory": 0.5}, 3, 2)
    text = HEAD + (
        "spec:\n  drain: {usageBelow: {gpu: 0.1}, requestsBelow: {cpu: 0, pods: 0.5}, consecutiveRounds: 0, max: 1}\n"
    )
    with pytest.raises(PolicyError) as err:
        parse_policy(text, scheduler_default())
    assert err.value.problems == [
        "spec.drain.max: unknown field (expected one of: usageBelow, requestsBelow, consecutiveRounds, maxNodes)",
        'spec.drain.usageBelow.gpu: metric "gpu" has no syncPolicy entry in the scheduler policy',
        "spec.drain.requestsBelow.cpu: must be within (0, 1], got 0",
        "spec.drain.requestsBelow.pods: only cpu and memory",
        "spec.drain.consecutiveRounds: must be >= 1, got 0",
    ]
