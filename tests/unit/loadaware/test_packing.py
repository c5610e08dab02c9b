"""The ``pack`` strategy of the Dynamic score (``spec.scoring``): Trimaran TargetLoadPacking's curve per metric,
the order it gives nodes, and that order against the spreading one (the same nodes, the opposite preference below
the target, the same above it)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crane_shared.annotations import decode, encode_hot_value, encode_usage
from crane_shared.loadaware.dynamic import DynamicArgs, node_load, score, target_load
from crane_shared.loadtaintpolicy import ScoringPolicy
from crane_shared.policy import parse_policy
from tests.support.policy import policy_yaml

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
ONE_METRIC = parse_policy(
    policy_yaml(
        {
            "syncPolicy": [{"name": "cpu_usage_avg_5m", "period": "1m"}],
            "predicate": [{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.8}],
            "priority": [{"name": "cpu_usage_avg_5m", "weight": 1}],
            "hotValue": [{"timeRange": "1m", "count": 2}],
        }
    )
)
SPREAD = DynamicArgs(ONE_METRIC)
PACK = DynamicArgs(replace(ONE_METRIC, scoring=ScoringPolicy("pack", 0.6)))


def load(usage: float | None, hot: int = 0) -> dict[str, str]:
    out = {} if usage is None else {"cpu_usage_avg_5m": encode_usage(usage, NOW - timedelta(seconds=10))}
    if hot:
        out["node_hot_value"] = encode_hot_value(hot, NOW - timedelta(seconds=10))
    return out


def scored(args: DynamicArgs, usage: float | None, hot: int = 0, pod: float | None = None) -> int:
    incoming = None if pod is None else {"cpu": pod, "memory": 0.0}
    return score(node_load("n", load(usage, hot), args, NOW), args, incoming)


def test_target_load_rises_to_the_target_then_falls_to_zero_at_a_full_node() -> None:
    assert target_load(0.0, 0.6) == pytest.approx(0.6)  # an empty node: the target itself
    assert target_load(0.6, 0.6) == pytest.approx(1.0)  # at the target: the best
    assert target_load(0.8, 0.6) == pytest.approx(0.3)
    assert target_load(1.0, 0.6) == pytest.approx(0.0)
    assert target_load(1.2, 0.6) == 0.0  # past a full node
    assert target_load(-0.1, 0.6) == pytest.approx(0.6)  # negative usage reads as empty


def test_pack_prefers_the_fullest_node_below_the_target_and_leaves_the_emptiest_for_last() -> None:
    usages = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9]
    pack = sorted(usages, key=lambda u: -scored(PACK, u))
    spread = sorted(usages, key=lambda u: -scored(SPREAD, u))
    assert spread == [0.0, 0.1, 0.3, 0.5, 0.7, 0.9]
    # fullest first below the target; an empty node only before nodes past the target
    assert pack == [0.5, 0.3, 0.1, 0.0, 0.7, 0.9]
    assert [scored(PACK, u) for u in pack] == [93, 80, 67, 60, 45, 15]


def test_the_incoming_pod_counts_so_a_node_it_would_take_past_the_target_ranks_lower() -> None:
    # 0.55 + 0.2 = 0.75 (past the target): below 0.3 + 0.2 = 0.5 (under it)
    assert scored(PACK, 0.55, pod=0.2) < scored(PACK, 0.3, pod=0.2)
    assert scored(PACK, 0.55) > scored(PACK, 0.3)  # without the pod, the fuller one wins


def test_no_hot_value_penalty_in_pack_and_an_unannotated_node_is_neutral() -> None:
    assert scored(PACK, 0.5, hot=3) == scored(PACK, 0.5)
    assert scored(SPREAD, 0.5, hot=3) == scored(SPREAD, 0.5) - 30
    assert scored(PACK, None) == 50


@settings(max_examples=300, deadline=None)
@given(
    a=st.floats(0, 1.2),
    b=st.floats(0, 1.2),
    pod=st.one_of(st.none(), st.floats(0, 0.3)),
    target=st.floats(0.1, 0.9),
)
def test_against_the_spreading_order_reversed_below_the_target_kept_above_it(
    a: float, b: float, pod: float | None, target: float
) -> None:
    """Differential: spread ranks the emptier node first; pack ranks it last while both nodes (with the pod) stay
    under the target, and first again once both are over it. Scores are rounded, so ties may appear in one
    strategy where the other separates the nodes: the preferences never cross."""
    pack = DynamicArgs(replace(ONE_METRIC, scoring=ScoringPolicy("pack", target)))
    a, b = (decode(encode_usage(u, NOW)).value for u in (a, b))  # as the annotation holds them (five decimals)
    ua, ub = a + (pod or 0.0), b + (pod or 0.0)
    sa, sb = scored(SPREAD, a), scored(SPREAD, b)
    pa, pb = scored(pack, a, pod=pod), scored(pack, b, pod=pod)
    if sa > sb:  # spread prefers a: a is the emptier one
        if ua <= target and ub <= target:
            assert pa <= pb
        elif ua > target and ub > target:
            assert pa >= pb
    if pa > pb and ua <= target and ub <= target:
        assert sa <= sb  # pack prefers the fuller one below the target


@pytest.mark.parametrize("usage", [0.7, 0.85])
def test_never_past_the_filters_threshold_pack_changes_only_the_score(usage: float) -> None:
    from crane_shared.loadaware.dynamic import filter_reason

    for args in (SPREAD, PACK):
        reason = filter_reason(node_load("n", load(usage), args, NOW), args, incoming={"cpu": 0.05})
        assert (reason is None) == (usage + 0.05 <= 0.8)
