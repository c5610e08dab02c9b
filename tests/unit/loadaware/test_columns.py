"""The vectorised Dynamic policy agrees with the per-node reference for every input."""

from __future__ import annotations

import functools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from crane_scheduler.loadaware.columns import LoadColumns
from crane_scheduler.loadaware.recent import RecentEffects
from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.batch import BATCH_CPU_USAGE_KEY, BATCH_MEMORY_USAGE_KEY, batch_metric_key
from crane_shared.loadaware.dynamic import (
    DynamicArgs,
    NodeCapacity,
    filter_reason,
    node_load,
    score,
)
from crane_shared.loadtaintpolicy import NewNodesPolicy, ScoringPolicy
from crane_shared.policy import default_policy
from tests.support.policy import UPSTREAM_METRICS as METRICS

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
POLICY = default_policy()

ages = st.one_of(
    st.integers(min_value=-3600, max_value=4 * 3600),  # future (beyond skew), fresh, stale
    st.sampled_from([-30, -31, 0, 479, 480, 481, 15 * 60 + 299, 15 * 60 + 300]),  # the edges
)
usages = st.floats(min_value=0, max_value=1.5, allow_nan=False)
malformed = st.sampled_from(["nan,2026-11-22T11:59:00+00:00", "-1,2026-11-22T11:59:00+00:00", "0.5", ""])


@st.composite
def node_annotations(draw: st.DrawFn) -> dict[str, str]:
    out: dict[str, str] = {}
    for metric in METRICS:
        age = draw(ages)
        if draw(st.booleans()):
            if draw(st.integers(0, 5)) == 0:
                out[metric] = draw(malformed)
            else:
                out[metric] = encode_usage(draw(usages), NOW - timedelta(seconds=age))
        share = draw(st.integers(0, 5))  # the metric's batch share: none, same round, another round, malformed
        if share in (1, 2, 3):
            out[batch_metric_key(metric)] = encode_usage(draw(usages), NOW - timedelta(seconds=age))
        elif share == 4:
            out[batch_metric_key(metric)] = encode_usage(draw(usages), NOW - timedelta(seconds=draw(ages)))
        elif share == 5:
            out[batch_metric_key(metric)] = draw(malformed)
    if draw(st.booleans()):
        out["node_hot_value"] = encode_hot_value(draw(st.integers(0, 12)), NOW - timedelta(seconds=draw(ages)))
    for key in (BATCH_CPU_USAGE_KEY, BATCH_MEMORY_USAGE_KEY):  # the batch pods' usage, taken out for regular pods
        if draw(st.booleans()):
            if draw(st.integers(0, 5)) == 0:
                out[key] = draw(malformed)
            else:
                out[key] = encode_usage(draw(usages), NOW - timedelta(seconds=draw(ages)))
    return out


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.lists(node_annotations(), min_size=1, max_size=8),
    closed=st.booleans(),
    incoming=st.one_of(st.none(), st.tuples(st.floats(0, 0.5), st.floats(0, 0.5))),
    regular=st.booleans(),
    target=st.one_of(st.none(), st.floats(0.05, 0.95)),
)
def test_vectorised_filter_and_score_equal_the_reference(
    nodes: list[dict[str, str]],
    closed: bool,
    incoming: tuple[float, float] | None,
    regular: bool,
    target: float | None,
) -> None:
    """``target``: the ``pack`` strategy toward it (its score counts the incoming pod), else ``spread``."""
    policy = POLICY if target is None else replace(POLICY, scoring=ScoringPolicy("pack", target))
    args = DynamicArgs(policy, stale="fail-closed" if closed else "fail-open")
    cols = LoadColumns(args, capacity=2)  # also exercises growth
    for row, ann in enumerate(nodes):
        cols.set_row(row, ann)
    rows = np.arange(len(nodes), dtype=np.intp)
    now = NOW.timestamp()
    reasons: list[str | None] = [None] * len(nodes)
    extra = (
        None
        if incoming is None
        else {"cpu": np.full(len(nodes), incoming[0]), "memory": np.full(len(nodes), incoming[1])}
    )
    for reason, mask in cols.filter(rows, now, extra, regular=regular):
        for i in np.flatnonzero(mask).tolist():
            assert reasons[i] is None, "a node gets one reason"
            reasons[i] = reason
    vector_scores = cols.scores(rows, now, regular=regular, incoming=extra).tolist()
    for i, ann in enumerate(nodes):
        ref = node_load(f"n{i}", ann, args, NOW, regular=regular)
        pod = None if incoming is None else {"cpu": incoming[0], "memory": incoming[1]}
        assert reasons[i] == filter_reason(ref, args, incoming=pod)
        assert vector_scores[i] == score(ref, args, pod)
        assert cols.reason_of(i, extra, regular=regular) == reasons[i], "the one-row path agrees"
        assert cols.score_of(i, regular=regular, incoming=extra) == vector_scores[i]


bindings = st.lists(
    st.tuples(st.integers(0, 7), st.integers(-900, 5), st.floats(0, 4), st.floats(0, 8 * 2**30)), max_size=12
)
CAPACITY = NodeCapacity(8.0, 32.0 * 2**30)


def _check_against_reference(
    cols: LoadColumns,
    effects: RecentEffects,
    nodes: list[dict[str, str]],
    args: DynamicArgs,
    at: float,
    incoming: tuple[float, float] | None = None,
    regular: bool = False,
) -> None:
    now = datetime.fromtimestamp(at, UTC)
    extra, own = effects.at(at, len(nodes))
    judged = effects.judged_at(len(nodes))
    rows = np.arange(len(nodes), dtype=np.intp)
    pod = (
        None
        if incoming is None
        else {"cpu": np.full(len(nodes), incoming[0]), "memory": np.full(len(nodes), incoming[1])}
    )
    scores = cols.scores(rows, at, extra, own, regular, pod, judged).tolist()
    reasons: list[str | None] = [None] * len(nodes)
    for reason, mask in cols.filter(rows, at, pod, extra, regular, judged):
        for i in np.flatnonzero(mask).tolist():
            reasons[i] = reason
    for i, ann in enumerate(nodes):
        recent = effects.bindings_of(i)
        ref = node_load(f"n{i}", ann, args, now, recent, CAPACITY, regular=regular)
        assert own[i] == ref.own_hot, f"own hot value of n{i} at {at}"
        for metric, reading in ref.readings.items():
            if metric not in extra:
                continue
            if reading.state == "fresh" or reading.bindings:
                assert extra[metric][i] == reading.estimate, f"estimate of {metric} on n{i}"
            assert judged[metric][i] == (reading.bindings > 0), f"{metric} of n{i} judged by its bindings"
        ref_pod = None if incoming is None else {"cpu": incoming[0], "memory": incoming[1]}
        assert scores[i] == score(ref, args, ref_pod)
        assert reasons[i] == filter_reason(ref, args, incoming=ref_pod)
        assert cols.reason_of(i, pod, extra, regular, judged) == reasons[i], "the one-row path agrees"
        assert cols.score_of(i, extra, own, regular, pod, judged) == scores[i]


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.lists(st.one_of(node_annotations(), st.just({})), min_size=1, max_size=8),  # {}: a new node
    recent=bindings,
    later=st.lists(st.integers(0, 1200), max_size=5),
    changed=st.lists(st.tuples(st.integers(0, 7), node_annotations()), max_size=3),
    removed=st.lists(st.integers(0, 11), max_size=3),
    departed=st.lists(st.integers(0, 11), max_size=4),
    closed=st.booleans(),
    incoming=st.one_of(st.none(), st.tuples(st.floats(0, 0.5), st.floats(0, 0.5))),
    regular=st.booleans(),
    target=st.one_of(st.none(), st.floats(0.05, 0.95)),
    new_nodes=st.booleans(),
    new_window=st.one_of(st.none(), st.integers(1, 600)),
)
def test_cached_recent_effects_equal_the_reference_as_time_passes(
    nodes: list[dict[str, str]],
    recent: list[tuple[int, int, float, float]],
    later: list[int],
    changed: list[tuple[int, dict[str, str]]],
    removed: list[int],
    departed: list[int],
    closed: bool,
    incoming: tuple[float, float] | None,
    regular: bool,
    target: float | None,
    new_nodes: bool,
    new_window: int | None,
) -> None:
    """Bindings added, unreserved, departed (pod deleted) and pruned, annotations changed, the clock moving over
    the hot-value ranges and the annotations' freshness edges: the per-node cached effects stay equal to
    ``node_load`` recomputed, and so do the verdicts and scores, for either strategy and class, with or without the
    incoming pod, fail-open or closed.
    With ``newNodes.estimate``, nodes without an annotation (``{}``: a new node) are judged by their bindings'
    estimates while a binding is younger than the estimate window (or ``newNodes.window``) and its pod not
    deleted, and by nothing once the last one passed it; without, they fail open or closed as upstream."""
    policy = POLICY if target is None else replace(POLICY, scoring=ScoringPolicy("pack", target))
    window = timedelta(seconds=new_window) if new_nodes and new_window is not None else None
    policy = replace(policy, new_nodes=NewNodesPolicy(new_nodes, window))
    args = DynamicArgs(policy, stale="fail-closed" if closed else "fail-open")
    check = functools.partial(_check_against_reference, incoming=incoming, regular=regular)
    cols = LoadColumns(args, capacity=2)
    effects = RecentEffects(cols, capacity=2)  # also exercises growth
    start = NOW.timestamp()
    for row, ann in enumerate(nodes):
        cols.set_row(row, ann)
        effects.node_changed(row, f"n{row}", CAPACITY.cpu, CAPACITY.memory, start)
    ordered = sorted(recent, key=lambda b: b[1])
    for i, (row, age, cpu, memory) in enumerate(ordered):
        learned = i % 3 == 1  # some carry a learned usage (no factor)
        effects.add(f"uid-{i}", row % len(nodes), f"n{row % len(nodes)}", start + age, cpu, memory, learned)
    check(cols, effects, nodes, args, start + 5)
    for i in removed:
        effects.remove(f"uid-{i}", start + 5)
    for i in departed:
        effects.depart(f"uid-{i}", start + 5)
    for row, ann in changed:
        row %= len(nodes)
        nodes[row] = ann
        cols.set_row(row, ann)
        effects.node_changed(row, f"n{row}", CAPACITY.cpu, CAPACITY.memory, start + 5)
    check(cols, effects, nodes, args, start + 5)
    at = start + 5
    for step in sorted(later):
        at = start + 5 + step
        effects.prune(at - 600, at)
        check(cols, effects, nodes, args, at)


def test_a_decision_recomputes_only_nodes_whose_own_hot_value_can_have_changed() -> None:
    args = DynamicArgs(POLICY)
    cols = LoadColumns(args)
    effects = RecentEffects(cols)
    start = NOW.timestamp()
    for row in range(100):
        cols.set_row(row, {})
        effects.node_changed(row, f"n{row}", 8.0, 32.0 * 2**30, start)
    for i in range(1000):
        effects.add(f"uid-{i}", i % 100, f"n{i % 100}", start + i / 100, 1.0, 2**30)
    before = effects.recomputed
    for k in range(50):
        effects.at(start + 11 + k / 1000, 100)
    assert effects.recomputed == before, "nothing changes between bindings: no per-node work per decision"
    shortest = min(r.time_range for r in POLICY.hot_value).total_seconds()
    effects.at(start + shortest + 5, 100)
    assert 0 < effects.recomputed - before <= 100, "a range boundary passed: each node recomputed at most once"


def test_a_gangs_own_bindings_left_out_equal_the_hot_value_without_them_and_follow_removal_and_pruning() -> None:
    """``gangHotValue: together``: a member's view of a row is the own hot value of every binding but its group's,
    and the group's rows are known until its bindings are unreserved or pruned."""
    args = DynamicArgs(POLICY)
    start = NOW.timestamp()
    both, others = RecentEffects(LoadColumns(args)), RecentEffects(LoadColumns(args))
    for effects in (both, others):
        for row in range(3):
            effects.cols.set_row(row, {})
            effects.node_changed(row, f"n{row}", 8.0, 32.0 * 2**30, start)
    for i in range(6):  # the gang: four on n0, two on n1
        both.add(f"g-{i}", min(i // 4, 1), f"n{min(i // 4, 1)}", start + i, 1.0, 2**30, group="ns/train")
    for i in range(5):  # other pods: on n0 and n2
        for effects in (both, others):
            effects.add(f"o-{i}", 2 * (i % 2), f"n{2 * (i % 2)}", start + i, 1.0, 2**30)
    now = start + 10
    _, hot = both.at(now, 3)
    _, hot_others = others.at(now, 3)
    assert both.rows_of("ns/train") == [0, 1] and both.rows_of("ns/other") == []
    assert [both.own_hot_without(r, "ns/train", now) for r in range(3)] == hot_others.tolist()
    assert hot[0] > hot_others[0], "the gang's bindings do count for everyone else"
    for i in range(4, 6):
        both.remove(f"g-{i}", now)
    assert both.rows_of("ns/train") == [0]
    both.prune(start + 3, now)
    assert both.rows_of("ns/train") == [], "the gang's bindings on n0 were made at start+0..3"


@settings(max_examples=150, deadline=None)
@given(
    nodes=st.lists(node_annotations(), min_size=1, max_size=6),
    steps=st.lists(
        st.tuples(st.floats(-5, 900), st.one_of(st.none(), st.tuples(st.integers(0, 5), node_annotations()))),
        max_size=8,
    ),
)
def test_cached_freshness_equals_a_fresh_evaluation_at_every_time(
    nodes: list[dict[str, str]], steps: list[tuple[float, tuple[int, dict[str, str]] | None]]
) -> None:
    """Freshness is evaluated once per edge or changed row, not per decision: the cached values equal a full
    evaluation at any time (the clock may also step back), after any row change."""
    args = DynamicArgs(POLICY)
    cols = LoadColumns(args, capacity=2)
    for row, ann in enumerate(nodes):
        cols.set_row(row, ann)
    rows = np.arange(len(nodes), dtype=np.intp)
    at = NOW.timestamp()
    for dt, change in steps:
        at += dt
        if change is not None:
            row, ann = change
            cols.set_row(row % len(nodes), ann)
            nodes[row % len(nodes)] = ann
        fresh = LoadColumns(args)
        for row, ann in enumerate(nodes):
            fresh.set_row(row, ann)
        assert cols.scores(rows, at).tolist() == fresh.scores(rows, at).tolist()
        for metric in METRICS:
            np.testing.assert_array_equal(cols.usage(metric, rows, at), fresh.usage(metric, rows, at))
            np.testing.assert_array_equal(
                cols.usage(metric, rows, at, regular=True), fresh.usage(metric, rows, at, regular=True)
            )
