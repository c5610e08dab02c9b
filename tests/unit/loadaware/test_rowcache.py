"""Dynamic's per-row result caches give what a full evaluation gives, whatever happened in between."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from crane_scheduler.framework import Handle
from crane_scheduler.loadaware.args import parse_args
from crane_scheduler.loadaware.plugin import Dynamic
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import parse_node, parse_pod
from crane_scheduler.rowcache import FilterCache, RowVersions, ScoreCache
from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.loadtaintpolicy import NewNodesPolicy
from crane_shared.policy import default_policy
from tests.support.scheduler import node, pod

NOW = 1_800_000_000.0
METRICS = [s.name for s in default_policy().sync_policy]


def annotated(name: str, usage: float, age: float, hot: int, cpu: str) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(NOW, UTC) - timedelta(seconds=age)
    n = node(name, cpu=cpu, memory="16Gi")
    n["metadata"]["annotations"] = {m: encode_usage(usage, stamp) for m in METRICS}
    n["metadata"]["annotations"]["node_hot_value"] = encode_hot_value(hot, stamp)
    return n


def uncached(plugin: Dynamic, table: NodeTable, state: dict[str, Any]) -> tuple[list[tuple[str, list[int]]], Any]:
    """The plugin's Filter and Score computed from scratch over every row, as before the caches."""
    now, extra, own_hot = state["Dynamic.inputs"]
    judged = state["Dynamic.judged"]
    cpu, memory, learned = state["Dynamic.size"]
    rows = np.arange(table.n_rows, dtype=np.intp)
    masks = plugin.columns.filter(rows, now, plugin._incoming(table, cpu, memory, learned), extra, judged=judged)
    reasons = [(r, np.flatnonzero(m & table.live).tolist()) for r, m in masks]
    return [(r, hit) for r, hit in reasons if hit], plugin.columns.scores(rows, now, extra, own_hot, judged=judged)


usages = st.floats(0, 1.2, allow_nan=False)
events = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.integers(0, 9), st.sampled_from(["100m", "1", "3"])),
        st.tuples(st.just("unbind"), st.integers(0, 30), st.just("")),
        st.tuples(st.just("delete"), st.integers(0, 30), st.just("")),  # the bound pod seen deleted
        st.tuples(st.just("annotate"), st.integers(0, 9), st.tuples(usages, st.integers(-60, 4000), st.integers(0, 9))),
        st.tuples(st.just("resize"), st.integers(0, 9), st.sampled_from(["2", "4", "16"])),
        st.tuples(st.just("remove"), st.integers(0, 9), st.just("")),
        st.tuples(st.just("wait"), st.floats(0, 400), st.just("")),
    ),
    max_size=25,
)


@settings(max_examples=120, deadline=None)
@given(
    start=st.lists(  # None: a node never annotated (with ``new_nodes``: judged by its bindings' estimates)
        st.one_of(st.none(), st.tuples(usages, st.integers(-60, 4000), st.integers(0, 9))), min_size=1, max_size=10
    ),
    steps=events,
    sizes=st.lists(st.sampled_from(["100m", "500m", "2", "6"]), min_size=1, max_size=4),
    new_nodes=st.booleans(),
)
def test_cached_filter_and_score_equal_a_full_evaluation(
    start: list[tuple[float, int, int] | None], steps: list[tuple[str, Any, Any]], sizes: list[str], new_nodes: bool
) -> None:
    clock = [NOW]
    table = NodeTable(capacity=2)
    policy = replace(default_policy(), new_nodes=NewNodesPolicy(new_nodes))
    plugin = Dynamic(parse_args({}), Handle(table), wall_clock=lambda: clock[0], policy=policy)
    cpus = {}
    for i, first in enumerate(start):
        cpus[i] = "8"
        table.upsert_node(
            parse_node(node(f"n{i}", cpu="8", memory="16Gi") if first is None else annotated(f"n{i}", *first, "8"))
        )
    bound: list[Any] = []
    for k, (kind, arg, extra) in enumerate(steps):
        name = f"n{arg % max(1, len(start))}"
        if kind == "bind" and name in table.rows:
            p = parse_pod(pod(f"b{k}", cpu=extra))
            plugin.reserve({}, p, name)
            bound.append(p)
        elif kind == "unbind" and bound:
            plugin.unreserve({}, bound.pop(arg % len(bound)), "")
        elif kind == "delete" and bound:
            plugin.recent.depart(bound[arg % len(bound)].uid, clock[0])
        elif kind == "annotate":
            usage, age, hot = extra
            stamp_age = age - (clock[0] - NOW)
            table.upsert_node(parse_node(annotated(name, usage, stamp_age, hot, cpus.get(arg, "8"))))
        elif kind == "resize" and name in table.rows:
            cpus[arg % len(start)] = extra
            initial = start[arg % len(start)]
            if initial is None:
                table.upsert_node(parse_node(node(name, cpu=extra, memory="16Gi")))
            else:
                usage, age, hot = initial
                table.upsert_node(parse_node(annotated(name, usage, age, hot, extra)))
        elif kind == "remove":
            table.remove_node(name)
        elif kind == "wait":
            clock[0] += arg
        for size in sizes:  # several pod sizes between changes: one cached result each
            state: dict[str, Any] = {}
            incoming = parse_pod(pod("incoming", cpu=size))
            got = plugin.filter(state, incoming, table)
            rows = np.flatnonzero(table.live)
            scores = plugin.score(state, incoming, table, rows)
            want_reasons, want_scores = uncached(plugin, table, state)
            assert [(r.reason, np.flatnonzero(r.mask).tolist()) for r in got] == want_reasons
            assert scores.tolist() == want_scores[rows].tolist()


def test_a_decision_between_changes_recomputes_only_the_changed_rows() -> None:
    versions = RowVersions()
    scores, codes = ScoreCache(versions), FilterCache(versions)
    computed: list[list[int]] = []

    def compute(rows: Any) -> Any:
        computed.append(rows.tolist())
        return np.zeros(len(rows), dtype=np.int64)

    scores.get(1000, compute)
    codes.get("size", 1000, lambda rows: compute(rows).astype(np.int8))
    assert [len(c) for c in computed] == [1000, 1000]
    computed.clear()
    scores.get(1000, compute)
    codes.get("size", 1000, lambda rows: compute(rows).astype(np.int8))
    assert computed == [], "nothing changed: nothing recomputed"
    versions.touch([7, 400])
    scores.get(1000, compute)
    codes.get("size", 1000, lambda rows: compute(rows).astype(np.int8))
    assert computed == [[7, 400], [7, 400]]
    computed.clear()
    codes.get("other size", 1000, lambda rows: compute(rows).astype(np.int8))
    assert [len(c) for c in computed] == [1000], "a new pod size is computed once for every row"
    versions.touch_all()
    computed.clear()
    scores.get(1000, compute)
    assert [len(c) for c in computed] == [1000]
