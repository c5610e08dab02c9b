"""Which nodes carry ``crane.io/load-hot``: the debounce counts samples, stale data never taints and lifts, the
floor keeps the last nodes untainted, a new term adopts the taints it finds, and the feature off lifts them all."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from crane_annotator.taintplan import NodeState, TaintNode, plan
from crane_shared.annotations import encode_usage
from crane_shared.debounce import Detector
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.loadtaintpolicy import TAINT_KEY, LoadTaintPolicy, taint_value, with_taint, without_taint
from crane_shared.policy import DynamicSchedulerPolicy, parse_policy
from tests.support.policy import policy_yaml

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
POLICY = replace(
    parse_policy(
        policy_yaml(
            {
                "syncPolicy": [
                    {"name": "cpu_usage_avg_5m", "period": "1m"},
                    {"name": "mem_usage_avg_5m", "period": "1m"},
                ],
                "predicate": [
                    {"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.65},
                    {"name": "mem_usage_avg_5m", "maxLimitPecent": 0.75},
                ],
            }
        )
    ),
    load_taint=LoadTaintPolicy(hot_rounds=2, cool_rounds=2),
)


def node(name: str, cpu: float | None, at: datetime, *, tainted: bool = False, **kw: object) -> TaintNode:
    annotations = {"mem_usage_avg_5m": encode_usage(0.3, at)}
    if cpu is not None:
        annotations["cpu_usage_avg_5m"] = encode_usage(cpu, at)
    return TaintNode(name, annotations, tainted, effect="NoSchedule" if tainted else "", **kw)  # type: ignore[arg-type]


class Cluster:
    """Evaluations over time, the taints applied as planned (every write succeeds)."""

    def __init__(self, policy: DynamicSchedulerPolicy = POLICY) -> None:
        self.policy = policy
        self.tainted: set[str] = set()
        self.states: dict[str, NodeState] = {}
        self.held: list[str] = []

    def evaluate(self, now: datetime, nodes: list[TaintNode]) -> list[tuple[str, bool, str]]:
        current = {n.name: replace(n, tainted=n.name in self.tainted, effect="NoSchedule") for n in nodes}
        result = plan(current, self.states, self.policy, DynamicArgs(self.policy), now)
        self.states, self.held = result.states, result.held
        for c in result.changes:
            (self.tainted.add if c.taint else self.tainted.discard)(c.node)
        return [(c.node, c.taint, c.reason) for c in result.changes]


def test_set_after_k_hot_samples_and_lifted_after_m_cool_ones() -> None:
    c = Cluster()
    t1, t2, t3, t4 = (T0 + timedelta(minutes=i) for i in range(4))
    assert c.evaluate(t1, [node("a", 0.8, t1)]) == []  # one hot sample
    assert c.evaluate(t1 + timedelta(seconds=15), [node("a", 0.8, t1)]) == [], "the same sample is not a new round"
    assert c.evaluate(t2, [node("a", 0.8, t2)]) == [("a", True, "hot")]
    assert c.evaluate(t3, [node("a", 0.3, t3)]) == []  # one cool sample
    assert c.evaluate(t4, [node("a", 0.3, t4)]) == [("a", False, "cooled")]


def test_a_cool_sample_between_hot_ones_starts_the_count_over() -> None:
    c = Cluster()
    ts = [T0 + timedelta(minutes=i) for i in range(4)]
    for t, cpu in zip(ts[:3], (0.8, 0.3, 0.8), strict=True):
        assert c.evaluate(t, [node("a", cpu, t)]) == []
    assert c.evaluate(ts[3], [node("a", 0.8, ts[3])]) == [("a", True, "hot")]


def test_never_set_on_stale_data_and_lifted_as_soon_as_its_data_goes_stale() -> None:
    c = Cluster()
    t1, t2 = T0, T0 + timedelta(minutes=1)
    c.evaluate(t1, [node("a", 0.8, t1)])
    c.evaluate(t2, [node("a", 0.8, t2)])
    assert c.tainted == {"a"}
    # no new sample for longer than the freshness window (1m + 5m): lifted, whatever the last value said
    late = t2 + timedelta(minutes=6, seconds=1)
    assert c.evaluate(late, [node("a", 0.8, t2)]) == [("a", False, "stale")]
    # a metric missing: nothing is judged; the debounce starts over when data comes back
    assert c.evaluate(late, [node("b", None, late)]) == []
    t3 = late + timedelta(minutes=1)
    assert c.evaluate(t3, [node("a", 0.9, t3)]) == [], "after stale data, K new hot samples again"


def test_max_data_age_lifts_sooner_than_the_freshness_window() -> None:
    policy = replace(POLICY, load_taint=LoadTaintPolicy(hot_rounds=1, max_data_age=timedelta(seconds=30)))
    c = Cluster(policy)
    assert c.evaluate(T0, [node("a", 0.8, T0)]) == [("a", True, "hot")]
    assert c.evaluate(T0 + timedelta(seconds=31), [node("a", 0.8, T0)]) == [("a", False, "stale")]


def test_hot_by_any_threshold_metric_and_judged_on_the_regular_usage() -> None:
    policy = replace(POLICY, load_taint=LoadTaintPolicy(hot_rounds=1))
    c = Cluster(policy)
    mem_hot = TaintNode(
        "m", {"cpu_usage_avg_5m": encode_usage(0.1, T0), "mem_usage_avg_5m": encode_usage(0.8, T0)}, False
    )
    # cpu 0.8 of which 0.3 is batch pods' share, measured over the same samples: a regular pod sees 0.5
    batch = TaintNode(
        "b",
        {
            "cpu_usage_avg_5m": encode_usage(0.8, T0),
            "batch.crane.io/cpu_usage_avg_5m": encode_usage(0.3, T0),
            "mem_usage_avg_5m": encode_usage(0.3, T0),
        },
        False,
    )
    assert c.evaluate(T0, [mem_hot, batch]) == [("m", True, "hot")]


def test_the_floor_taints_the_hottest_first_and_holds_the_rest() -> None:
    policy = replace(POLICY, load_taint=LoadTaintPolicy(hot_rounds=1, min_untainted_nodes=2))
    c = Cluster(policy)
    nodes = [node("a", 0.70, T0), node("b", 0.95, T0), node("c", 0.80, T0), node("cool", 0.2, T0)]
    assert c.evaluate(T0, nodes) == [("b", True, "hot"), ("c", True, "hot")]
    assert c.held == ["a"]
    # b cools: room for a
    t1 = T0 + timedelta(minutes=1)
    policy_cool1 = [node("a", 0.70, t1), node("b", 0.2, t1), node("c", 0.80, t1), node("cool", 0.2, t1)]
    c.policy = replace(policy, load_taint=LoadTaintPolicy(hot_rounds=1, cool_rounds=1, min_untainted_nodes=2))
    assert c.evaluate(t1, policy_cool1) == [("b", False, "cooled")]
    assert c.held == ["a"]  # b's room counts once its lift is written: the next evaluation
    assert c.evaluate(t1, policy_cool1) == [("a", True, "hot")]
    # a cordoned node is no room: it neither counts toward the floor nor is held by it
    cordoned = [replace(n, schedulable=n.name != "cool") for n in policy_cool1]
    assert c.evaluate(t1, cordoned) == [("a", False, "floor")]  # the coolest of the tainted ones


def test_a_lift_that_keeps_failing_never_lets_a_new_taint_cross_the_floor() -> None:
    policy = replace(POLICY, load_taint=LoadTaintPolicy(hot_rounds=1, min_untainted_nodes=1))
    stale = T0 - timedelta(minutes=10)
    nodes = {"a": node("a", 0.9, stale, tainted=True), "b": node("b", 0.9, T0)}
    states: dict[str, NodeState] = {}
    for _ in range(2):  # a's lift is never written (a webhook refusing it, say): b waits each time
        result = plan(nodes, states, policy, DynamicArgs(policy), T0)
        states = result.states
        assert [(c.node, c.taint, c.reason) for c in result.changes] == [("a", False, "stale")]
        assert result.held == ["b"]


def test_a_new_term_takes_the_taints_it_finds_as_confirmed_and_lifts_them_after_m_cool_samples() -> None:
    c = Cluster()
    c.tainted = {"a", "b"}  # left by a leader killed mid-round; no state in this term
    t1, t2 = T0, T0 + timedelta(minutes=1)
    assert c.evaluate(t1, [node("a", 0.3, t1), node("b", 0.9, t1)]) == []
    assert c.evaluate(t2, [node("a", 0.3, t2), node("b", 0.9, t2)]) == [("a", False, "cooled")]
    assert c.tainted == {"b"}


def test_opted_out_nodes_and_a_policy_without_the_section_are_lifted() -> None:
    c = Cluster(replace(POLICY, load_taint=LoadTaintPolicy(hot_rounds=1)))
    assert c.evaluate(T0, [node("a", 0.9, T0), node("b", 0.9, T0, opted_out=True)]) == [("a", True, "hot")]
    c.tainted.add("b")
    assert c.evaluate(T0, [node("a", 0.9, T0), node("b", 0.9, T0, opted_out=True)]) == [("b", False, "opted-out")]
    c.policy = replace(POLICY, load_taint=None)
    assert c.evaluate(T0, [node("a", 0.9, T0), node("b", 0.9, T0)]) == [("a", False, "disabled")]


def test_a_changed_effect_is_rewritten_on_the_tainted_nodes() -> None:
    policy = replace(POLICY, load_taint=LoadTaintPolicy(effect="PreferNoSchedule", hot_rounds=1))
    nodes = {"a": node("a", 0.9, T0, tainted=True)}
    result = plan(nodes, {"a": NodeState(Detector(hot=True))}, policy, DynamicArgs(policy), T0)
    assert [(c.node, c.taint) for c in result.changes] == [("a", True)]


@pytest.mark.parametrize(
    ("metric", "value"), [("cpu_usage_avg_5m", "cpu_usage_avg_5m"), ("node:cpu:ratio", "node_cpu_ratio")]
)
def test_taints_keep_the_others_and_carry_the_metric_as_a_label_value(metric: str, value: str) -> None:
    assert taint_value(metric) == value
    others = ({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}, {"key": TAINT_KEY, "effect": "NoSchedule"})
    assert with_taint(others, "NoSchedule", metric) == [
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
        {"key": TAINT_KEY, "value": value, "effect": "NoSchedule"},
    ]
    assert without_taint(others) == [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
