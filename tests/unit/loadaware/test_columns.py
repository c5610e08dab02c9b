"""The vectorised Dynamic policy agrees with the per-node reference for every input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from crane_scheduler.loadaware.columns import LoadColumns, RecentBindings, recent_effects
from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.loadaware.dynamic import (
    DynamicArgs,
    NodeCapacity,
    RecentBinding,
    filter_reason,
    node_load,
    score,
)
from crane_shared.policy import default_policy

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
POLICY = default_policy()
METRICS = [s.name for s in POLICY.sync_policy]

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
        if draw(st.booleans()):
            if draw(st.integers(0, 5)) == 0:
                out[metric] = draw(malformed)
            else:
                out[metric] = encode_usage(draw(usages), NOW - timedelta(seconds=draw(ages)))
    if draw(st.booleans()):
        out["node_hot_value"] = encode_hot_value(draw(st.integers(0, 12)), NOW - timedelta(seconds=draw(ages)))
    return out


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.lists(node_annotations(), min_size=1, max_size=8),
    closed=st.booleans(),
    incoming=st.one_of(st.none(), st.tuples(st.floats(0, 0.5), st.floats(0, 0.5))),
)
def test_vectorised_filter_and_score_equal_the_reference(
    nodes: list[dict[str, str]], closed: bool, incoming: tuple[float, float] | None
) -> None:
    args = DynamicArgs(POLICY, stale="fail-closed" if closed else "fail-open")
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
    for reason, mask in cols.filter(rows, now, extra):
        for i in np.flatnonzero(mask).tolist():
            assert reasons[i] is None, "a node gets one reason"
            reasons[i] = reason
    vector_scores = cols.scores(rows, now).tolist()
    for i, ann in enumerate(nodes):
        ref = node_load(f"n{i}", ann, args, NOW)
        pod = None if incoming is None else {"cpu": incoming[0], "memory": incoming[1]}
        assert reasons[i] == filter_reason(ref, args, incoming=pod)
        assert vector_scores[i] == score(ref, args)


bindings = st.lists(
    st.tuples(st.integers(0, 7), st.integers(-900, 5), st.floats(0, 4), st.floats(0, 8 * 2**30)), max_size=12
)


@settings(max_examples=200, deadline=None)
@given(nodes=st.lists(node_annotations(), min_size=1, max_size=8), recent=bindings)
def test_recent_bindings_vectorised_equal_the_reference(
    nodes: list[dict[str, str]], recent: list[tuple[int, int, float, float]]
) -> None:
    args = DynamicArgs(POLICY)
    cols = LoadColumns(args)
    for row, ann in enumerate(nodes):
        cols.set_row(row, ann)
    now = NOW.timestamp()
    store = RecentBindings(capacity=4)  # also exercises compaction
    per_node: dict[int, list[RecentBinding]] = {}
    for i, (row, age, cpu, memory) in enumerate(sorted(recent, key=lambda b: b[1])):
        row %= len(nodes)
        store.add(f"uid-{i}", row, now + age, cpu, memory)
        per_node.setdefault(row, []).append(RecentBinding(f"n{row}", now + age, cpu, memory))
    alloc_cpu, alloc_mem = np.full(len(nodes), 8.0), np.full(len(nodes), 32.0 * 2**30)
    extra, own = recent_effects(cols, store, len(nodes), now, alloc_cpu, alloc_mem)
    rows = np.arange(len(nodes), dtype=np.intp)
    scores = cols.scores(rows, now, extra, own).tolist()
    reasons: list[str | None] = [None] * len(nodes)
    for reason, mask in cols.filter(rows, now, None, extra):
        for i in np.flatnonzero(mask).tolist():
            reasons[i] = reason
    for i, ann in enumerate(nodes):
        ref = node_load(f"n{i}", ann, args, NOW, per_node.get(i, []), NodeCapacity(8.0, 32.0 * 2**30))
        assert scores[i] == score(ref, args)
        assert reasons[i] == filter_reason(ref, args)
