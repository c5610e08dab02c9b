"""The Dynamic policy: upstream's contract, and each deliberate difference (crane-upstream.md)."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.loadaware.dynamic import (
    DynamicArgs,
    EstimateArgs,
    NodeCapacity,
    NodeLoad,
    RecentBinding,
    filter_reason,
    incoming_fraction,
    node_load,
    raw_score,
    score,
    valid_until,
)
from crane_shared.loadtaintpolicy import NewNodesPolicy
from crane_shared.policy import default_policy, parse_policy
from tests.support.policy import UPSTREAM_METRICS as METRICS
from tests.support.policy import policy_yaml

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
ARGS = DynamicArgs(default_policy(), estimate=EstimateArgs(enabled=False))


def annotated(
    usage: float | dict[str, float],
    age: timedelta = timedelta(seconds=10),
    hot: int | None = None,
    hot_age: timedelta = timedelta(seconds=10),
) -> dict[str, str]:
    values = usage if isinstance(usage, dict) else dict.fromkeys(METRICS, usage)
    out = {m: encode_usage(v, NOW - age) for m, v in values.items()}
    if hot is not None:
        out["node_hot_value"] = encode_hot_value(hot, NOW - hot_age)
    return out


def load(annotations: dict[str, str], args: DynamicArgs = ARGS, **kw: Any) -> NodeLoad:
    return node_load("n1", annotations, args, NOW, **kw)


# --- contract kept from upstream -------------------------------------------------------------------------------


def test_usage_above_threshold_rejects_with_a_node_free_reason() -> None:
    reason = filter_reason(load(annotated({"cpu_usage_avg_5m": 0.66})), ARGS)
    assert reason == "node(s) had cpu_usage_avg_5m above 0.65"
    assert "n1" not in reason


def test_threshold_comparison_is_strict() -> None:
    assert filter_reason(load(annotated({"cpu_usage_avg_5m": 0.65})), ARGS) is None


def test_threshold_zero_disables_the_predicate() -> None:
    policy = parse_policy(
        policy_yaml(
            {
                "syncPolicy": [{"name": "cpu_usage_avg_5m", "period": "3m"}],
                "predicate": [{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0}],
                "priority": [{"name": "cpu_usage_avg_5m", "weight": 1}],
                "hotValue": [{"timeRange": "5m", "count": 5}],
            }
        )
    )
    args = DynamicArgs(policy)
    assert filter_reason(load(annotated({"cpu_usage_avg_5m": 0.99}), args), args) is None


def test_daemonset_pods_always_pass() -> None:
    assert filter_reason(load(annotated(0.99)), ARGS, daemonset=True) is None


def test_metric_is_fresh_until_period_plus_five_minutes_strictly() -> None:
    period_plus_grace = timedelta(minutes=3 + 5)
    just_fresh = load(annotated({"cpu_usage_avg_5m": 0.9}, age=period_plus_grace - timedelta(seconds=1)))
    expired = load(annotated({"cpu_usage_avg_5m": 0.9}, age=period_plus_grace))
    assert filter_reason(just_fresh, ARGS) is not None
    assert expired.readings["cpu_usage_avg_5m"].state == "stale"
    assert filter_reason(expired, ARGS) is None  # fail open, as upstream


def test_score_is_the_weighted_idle_share_minus_ten_per_hot_value() -> None:
    values = {
        "cpu_usage_avg_5m": 0.2,
        "cpu_usage_max_avg_1h": 0.3,
        "cpu_usage_max_avg_1d": 0.4,
        "mem_usage_avg_5m": 0.5,
        "mem_usage_max_avg_1h": 0.6,
        "mem_usage_max_avg_1d": 0.7,
    }
    weights = {
        "cpu_usage_avg_5m": 0.2,
        "cpu_usage_max_avg_1h": 0.3,
        "cpu_usage_max_avg_1d": 0.5,
        "mem_usage_avg_5m": 0.2,
        "mem_usage_max_avg_1h": 0.3,
        "mem_usage_max_avg_1d": 0.5,
    }
    expected = sum((1 - values[m]) * weights[m] for m in METRICS) * 100 / sum(weights.values())
    assert raw_score(load(annotated(values)), ARGS) == pytest.approx(expected)
    assert score(load(annotated(values, hot=2)), ARGS) == round(expected) - 20


def test_score_is_clamped_to_zero() -> None:
    assert score(load(annotated(0.9, hot=5)), ARGS) == 0


def test_hot_value_is_fresh_for_five_minutes() -> None:
    assert load(annotated(0.1, hot=3, hot_age=timedelta(minutes=4, seconds=59))).hot == 3
    assert load(annotated(0.1, hot=3, hot_age=timedelta(minutes=5))).hot == 0


# --- deliberate differences ------------------------------------------------------------------------------------


def test_an_unannotated_node_is_neutral_not_worst() -> None:
    busy = score(load(annotated(0.8)), ARGS)
    new = score(load({}), ARGS)
    idle = score(load(annotated(0.05)), ARGS)
    assert busy < new < idle
    assert new == 50


def test_missing_metrics_do_not_count_as_full_usage() -> None:
    only_5m = {"cpu_usage_avg_5m": 0.1, "mem_usage_avg_5m": 0.1}
    assert score(load(annotated(only_5m)), ARGS) == 90  # upstream: (0.9*0.2*2)*100/2.0 = 18


def test_scores_are_rounded_not_truncated() -> None:
    # idle share 0.65999 everywhere: upstream truncates to 65, we round to 66
    assert score(load(annotated(0.34001)), ARGS) == 66


@pytest.mark.parametrize(
    "text",
    ["nan,2026-11-22T11:59:50+00:00", "inf,2026-11-22T11:59:50+00:00", "-0.5,2026-11-22T11:59:50+00:00", "garbage"],
)
def test_malformed_values_are_ignored_and_reported(text: str) -> None:
    loaded = load({**annotated(0.1), "cpu_usage_avg_5m": text})
    assert loaded.malformed == ("cpu_usage_avg_5m",)
    assert filter_reason(loaded, ARGS) is None


def test_future_timestamps_never_stay_fresh() -> None:
    loaded = load(annotated({"cpu_usage_avg_5m": 0.9}, age=-timedelta(hours=1)))
    assert loaded.readings["cpu_usage_avg_5m"].state == "future"
    assert filter_reason(loaded, ARGS) is None


def test_fail_closed_rejects_nodes_without_fresh_data() -> None:
    args = DynamicArgs(default_policy(), stale="fail-closed")
    assert filter_reason(load({}, args), args) == "node(s) had no fresh cpu_usage_avg_5m"


def test_legacy_bare_z_timestamps_are_read_in_the_legacy_zone() -> None:
    shanghai_wall_clock = (NOW + timedelta(hours=8) - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    loaded = load({"cpu_usage_avg_5m": f"0.90000,{shanghai_wall_clock}"})
    assert loaded.readings["cpu_usage_avg_5m"].state == "fresh"


# --- hot spots: own bindings and estimated usage -----------------------------------------------------------------


def test_own_bindings_after_the_hot_annotation_add_to_the_hot_value() -> None:
    stamped = NOW - timedelta(seconds=20)
    ann = annotated(0.1, hot=1, hot_age=timedelta(seconds=20))
    before = [RecentBinding("n1", stamped.timestamp() - 5)] * 4  # already counted by the annotator
    after = [RecentBinding("n1", stamped.timestamp() + 5)] * 2
    assert load(ann, recent=before).hot == 1
    assert load(ann, recent=before + after).hot == 2  # 2 within 1m -> +1, never double counted


def test_without_a_fresh_hot_annotation_own_bindings_count_over_the_whole_windows() -> None:
    recent = [RecentBinding("n1", NOW.timestamp() - 30)] * 5
    assert load(annotated(0.1), recent=recent).hot == 1 + 2  # floor(5/5) + floor(5/2)


def test_estimate_adds_the_unabsorbed_share_of_recent_pods() -> None:
    args = DynamicArgs(default_policy(), estimate=EstimateArgs(cpu_factor=1.0, memory_factor=1.0))
    capacity = NodeCapacity(cpu=10, memory=100)
    stamped_age = timedelta(seconds=10)
    ann = annotated(0.5, age=stamped_age)
    stamped = (NOW - stamped_age).timestamp()
    recent = [
        RecentBinding("n1", stamped + 1, cpu=2, memory=10),  # after the stamp: fully added
        RecentBinding("n1", stamped - 150, cpu=2, memory=10),
    ]  # half absorbed by the 5m average
    loaded = load(ann, args, recent=recent, capacity=capacity)
    assert loaded.readings["cpu_usage_avg_5m"].usage == pytest.approx(0.5 + 0.2 + 0.1)
    assert loaded.readings["mem_usage_avg_5m"].usage == pytest.approx(0.5 + 0.1 + 0.05)
    assert filter_reason(loaded, args) == "node(s) had cpu_usage_avg_5m above 0.65"


def test_estimate_is_not_applied_to_stale_readings() -> None:
    args = DynamicArgs(default_policy())
    loaded = load(
        annotated(0.5, age=timedelta(hours=5)),
        args,
        recent=[RecentBinding("n1", NOW.timestamp(), cpu=8)],
        capacity=NodeCapacity(10, 100),
    )
    assert loaded.readings["cpu_usage_avg_5m"].usage is None


def test_a_node_the_incoming_pod_would_push_over_the_threshold_is_refused() -> None:
    loaded = load(annotated(0.60))
    assert filter_reason(loaded, ARGS, incoming={"cpu": 0.04}) is None
    assert filter_reason(loaded, ARGS, incoming={"cpu": 0.06}) == "node(s) would have cpu_usage_avg_5m above 0.65"
    assert filter_reason(loaded, ARGS, daemonset=True, incoming={"cpu": 0.5}) is None


def test_incoming_fraction_applies_the_factors_to_the_node_size() -> None:
    est = EstimateArgs(cpu_factor=0.5, memory_factor=1.0)
    assert incoming_fraction(est, cpu=2, memory=10, capacity=NodeCapacity(8, 100)) == {"cpu": 0.125, "memory": 0.1}
    assert incoming_fraction(EstimateArgs(incoming_pod=False), 2, 10, NodeCapacity(8, 100)) == {}


# --- a node never annotated (an autoscaler's new node): the opt-in ``newNodes.estimate`` ---------------------------

EIGHT_CORES = NodeCapacity(cpu=8, memory=32 * 2**30)
NEW_NODES = replace(default_policy(), new_nodes=NewNodesPolicy(estimate=True))
ESTIMATING = DynamicArgs(NEW_NODES)  # factor 0.6, 5-minute window, incoming pod counted


def replicas(n: int, age: float = 10, cpu: float = 0.5, learned: bool = False) -> list[RecentBinding]:
    """``n`` pods of ``cpu`` cores (512 MiB) bound ``age`` seconds ago."""
    return [RecentBinding("n1", NOW.timestamp() - age, cpu, 2**29, learned)] * n


def test_without_the_opt_in_a_new_node_passes_whatever_was_bound_to_it_as_upstream() -> None:
    upstream = DynamicArgs(default_policy(), own_bindings_in_hot_value=False)  # the score without hot-value terms
    eighteen = load({}, upstream, recent=replicas(18), capacity=EIGHT_CORES)
    reading = eighteen.readings["cpu_usage_avg_5m"]
    assert (reading.state, reading.bindings, reading.usage) == ("missing", 0, None)
    assert filter_reason(eighteen, upstream) is None  # fail-open
    assert score(eighteen, upstream) == 50  # neutral


def test_a_new_node_is_judged_by_the_estimates_of_the_pods_bound_to_it() -> None:
    pod = incoming_fraction(ESTIMATING.estimate, 0.5, 2**29, EIGHT_CORES)  # 0.6 x 0.5 / 8 = 0.0375 of the cpu
    assert filter_reason(load({}, ESTIMATING, capacity=EIGHT_CORES), ESTIMATING, incoming=pod) is None  # fail-open
    sixteen = load({}, ESTIMATING, recent=replicas(16), capacity=EIGHT_CORES)
    reading = sixteen.readings["cpu_usage_avg_5m"]
    assert (reading.state, reading.bindings) == ("missing", 16)
    assert reading.usage == pytest.approx(16 * 0.0375)  # 0 + every estimate, none absorbed: 0.6
    assert filter_reason(sixteen, ESTIMATING, incoming=pod) is None  # 0.6375: one more fits
    seventeen = load({}, ESTIMATING, recent=replicas(17), capacity=EIGHT_CORES)
    assert filter_reason(seventeen, ESTIMATING, incoming=pod) == "node(s) would have cpu_usage_avg_5m above 0.65"
    eighteen = load({}, ESTIMATING, recent=replicas(18), capacity=EIGHT_CORES)
    assert filter_reason(eighteen, ESTIMATING) == "node(s) had cpu_usage_avg_5m above 0.65"


def test_a_new_nodes_learned_estimates_count_as_they_are() -> None:
    loaded = load({}, ESTIMATING, recent=replicas(4, cpu=1.0, learned=True), capacity=EIGHT_CORES)
    assert loaded.readings["cpu_usage_avg_5m"].usage == pytest.approx(4 / 8)


def test_a_new_nodes_bindings_leave_its_estimate_after_the_window() -> None:
    young = load({}, ESTIMATING, recent=replicas(18, age=299), capacity=EIGHT_CORES)
    old = load({}, ESTIMATING, recent=replicas(18, age=300), capacity=EIGHT_CORES)
    assert filter_reason(young, ESTIMATING) == "node(s) had cpu_usage_avg_5m above 0.65"
    assert old.readings["cpu_usage_avg_5m"].bindings == 0
    assert filter_reason(old, ESTIMATING) is None  # no data left: fail-open as before
    closed = DynamicArgs(NEW_NODES, stale="fail-closed")
    gone = load({}, closed, recent=replicas(18, age=300), capacity=EIGHT_CORES)
    assert filter_reason(gone, closed) == "node(s) had no fresh cpu_usage_avg_5m"


@pytest.mark.parametrize(("window", "counted_at", "gone_at"), [(120, 119, 120), (600, 599, 600)])
def test_a_new_nodes_bindings_count_for_the_new_nodes_window_when_one_is_set(
    window: int, counted_at: int, gone_at: int
) -> None:
    """``newNodes.window``: how long a binding counts on a node never measured, shorter or longer than the
    estimate's 5 minutes (an autoscaler's node whose first reading comes later than the estimate window)."""
    policy = replace(NEW_NODES, new_nodes=NewNodesPolicy(estimate=True, window=timedelta(seconds=window)))
    args = DynamicArgs(policy, own_bindings_in_hot_value=False)
    young = load({}, args, recent=replicas(18, age=counted_at), capacity=EIGHT_CORES)
    old = load({}, args, recent=replicas(18, age=gone_at), capacity=EIGHT_CORES)
    assert filter_reason(young, args) == "node(s) had cpu_usage_avg_5m above 0.65"
    assert old.readings["cpu_usage_avg_5m"].bindings == 0
    assert filter_reason(old, args) is None
    recent = replicas(18, age=window - 10)
    loaded = load({}, args, recent=recent, capacity=EIGHT_CORES)
    assert valid_until(loaded, {}, args, recent, NOW.timestamp()) == NOW.timestamp() + 10  # when the window ends


def test_a_new_node_with_bindings_passes_fail_closed_while_under_the_thresholds() -> None:
    closed = DynamicArgs(NEW_NODES, stale="fail-closed")
    assert filter_reason(load({}, closed, capacity=EIGHT_CORES), closed) == "node(s) had no fresh cpu_usage_avg_5m"
    assert filter_reason(load({}, closed, recent=replicas(2), capacity=EIGHT_CORES), closed) is None


def test_a_new_nodes_score_follows_its_estimates_instead_of_staying_neutral() -> None:
    empty = score(load({}, ESTIMATING, capacity=EIGHT_CORES), ESTIMATING)
    filled = score(load({}, ESTIMATING, recent=replicas(16), capacity=EIGHT_CORES), ESTIMATING)
    assert empty == 50
    assert filled < empty  # cpu metrics 0.6 used, memory metrics 16 x 0.6 x 0.5 GiB / 32 GiB


def test_once_one_metric_is_annotated_a_missing_one_is_no_data_as_before() -> None:
    """The annotator writes each metric on its own period (a 1-day maximum up to 3 hours after the 5-minute
    average): a measured node is bounded by its fresh readings plus the estimates, not by estimates alone."""
    only_5m = annotated({"cpu_usage_avg_5m": 0.3, "mem_usage_avg_5m": 0.2})
    loaded = load(only_5m, ESTIMATING, recent=replicas(8), capacity=EIGHT_CORES)
    assert loaded.readings["cpu_usage_avg_5m"].usage == pytest.approx(0.3 + 8 * 0.0375)
    day = loaded.readings["cpu_usage_max_avg_1d"]
    assert (day.state, day.bindings, day.usage) == ("missing", 0, None)


@pytest.mark.parametrize("annotation", ["stale", "future", "malformed"])
def test_only_a_node_without_any_metric_annotation_is_judged_by_estimates(annotation: str) -> None:
    text = {
        "stale": encode_usage(0.1, NOW - timedelta(hours=5)),
        "future": encode_usage(0.1, NOW + timedelta(hours=1)),
        "malformed": "garbage",
    }[annotation]
    loaded = load({m: text for m in METRICS}, ESTIMATING, recent=replicas(18), capacity=EIGHT_CORES)
    reading = loaded.readings["cpu_usage_avg_5m"]
    assert (reading.state, reading.bindings, reading.usage) == (annotation, 0, None)
    assert filter_reason(loaded, ESTIMATING) is None  # fail-open, as before


def test_a_new_nodes_verdict_changes_when_a_binding_leaves_the_window() -> None:
    args = DynamicArgs(NEW_NODES, own_bindings_in_hot_value=False)  # no hot-value edge at the same time
    recent = replicas(18, age=100)
    loaded = load({}, args, recent=recent, capacity=EIGHT_CORES)
    assert filter_reason(loaded, args) is not None
    until = valid_until(loaded, {}, args, recent, NOW.timestamp())
    assert until == NOW.timestamp() + 200  # bound 100 s ago, counted for 300 s
    assert valid_until(load({}, args, capacity=EIGHT_CORES), {}, args, (), NOW.timestamp()) == math.inf


def test_a_deleted_pods_estimate_no_longer_counts_on_its_node_but_its_binding_stays_in_the_hot_value() -> None:
    """A pod seen deleted or terminal runs no more: a new node judged by it alone is empty again (and passes,
    fail-open), a measured node loses its unabsorbed estimate; the hot value still counts the binding, as the
    annotator's counts its ``Scheduled`` event."""
    gone = [replace(b, left=True) for b in replicas(18)]
    new = load({}, ESTIMATING, recent=gone, capacity=EIGHT_CORES)
    assert filter_reason(load({}, ESTIMATING, recent=replicas(18), capacity=EIGHT_CORES), ESTIMATING) is not None
    assert new.readings["cpu_usage_avg_5m"].bindings == 0
    assert filter_reason(new, ESTIMATING) is None
    assert valid_until(new, {}, ESTIMATING, gone, NOW.timestamp()) == NOW.timestamp() - 10 + 60  # the 1m hot rule
    measured = annotated(0.3)
    kept = load(measured, ESTIMATING, recent=replicas(4), capacity=EIGHT_CORES)
    left = load(measured, ESTIMATING, recent=[replace(b, left=True) for b in replicas(4)], capacity=EIGHT_CORES)
    assert kept.readings["cpu_usage_avg_5m"].estimate > 0
    assert left.readings["cpu_usage_avg_5m"].estimate == 0
    assert left.own_hot == kept.own_hot > 0
