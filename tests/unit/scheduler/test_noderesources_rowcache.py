"""NodeResourcesFit's and BalancedAllocation's per-row result caches give what a full evaluation gives, whatever
happened to the table in between (pods assumed, bound, forgotten, removed; what-ifs; nodes added, resized,
removed; a resource no node had before)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import noderesources
from crane_scheduler.plugins.noderesources import BalancedAllocation, FitArgs, NodeResourcesFit
from crane_scheduler.podinfo import PodInfo, parse_node, parse_pod
from crane_scheduler.rowcache import RowVersions
from tests.support.scheduler import container, node, pod

GPU = "example.com/gpu"
SIZES = st.sampled_from([("100m", "100Mi", None), ("1", "2Gi", None), ("3", "6Gi", None), ("500m", None, "1")])
STRATEGIES = [
    FitArgs(),
    FitArgs(strategy="MostAllocated"),
    FitArgs(strategy="RequestedToCapacityRatio", shape=((0, 0), (100, 10))),
    FitArgs(resources=(("cpu", 1), ("memory", 1), (GPU, 3))),
]


def sized(name: str, size: tuple[str, str | None, str | None], node_name: str = "") -> PodInfo:
    cpu, memory, gpu = size
    extra = {GPU: gpu} if gpu else None
    return parse_pod(pod(name, node_name=node_name, containers=[container(cpu, memory, extra=extra)]))


@contextlib.contextmanager
def vector_only() -> Iterator[None]:
    """Every recomputation on the vector path (no row one by one)."""
    kept = noderesources.ONE_BY_ONE
    noderesources.ONE_BY_ONE = -1
    try:
        yield
    finally:
        noderesources.ONE_BY_ONE = kept


def rejections(found: list[Any]) -> list[tuple[str, bool, list[int]]]:
    return [(r.reason, r.unresolvable, np.flatnonzero(r.mask).tolist()) for r in found]


events = st.lists(
    st.one_of(
        st.tuples(st.just("assume"), st.integers(0, 7), SIZES),
        st.tuples(st.just("bind"), st.integers(0, 7), SIZES),
        st.tuples(st.just("forget"), st.integers(0, 40), st.just(None)),
        st.tuples(st.just("remove_pod"), st.integers(0, 40), st.just(None)),
        st.tuples(st.just("resize"), st.integers(0, 7), st.sampled_from(["1", "4", "16"])),
        st.tuples(st.just("gpu_node"), st.integers(0, 7), st.just(None)),
        st.tuples(st.just("remove_node"), st.integers(0, 7), st.just(None)),
        st.tuples(st.just("what_if"), st.integers(0, 40), st.just(None)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@example(  # a request equal to the whole allocatable, on a node with something on it: resolvable
    nodes=1,
    pods_cap=110,
    strategy=FitArgs(),
    seq=[("resize", 0, "1"), ("assume", 0, ("100m", "100Mi", None))],
    decisions=[("1", "2Gi", None)] * 30,
)
@given(
    nodes=st.integers(1, 8),
    pods_cap=st.sampled_from([2, 110]),
    strategy=st.sampled_from(STRATEGIES),
    seq=events,
    decisions=st.lists(SIZES, min_size=30, max_size=30),
)
def test_cached_results_equal_a_full_evaluation(
    nodes: int, pods_cap: int, strategy: FitArgs, seq: list[tuple[str, Any, Any]], decisions: list[Any]
) -> None:
    """After every change a pod of some size is filtered and scored (the caches keep results per size)."""
    table = NodeTable(capacity=4)
    fit, balanced = NodeResourcesFit(strategy), BalancedAllocation(strategy.resources)
    for i in range(nodes):
        table.upsert_node(parse_node(node(f"n{i}", cpu="4", memory="8Gi", pods=pods_cap)))
    placed: list[str] = []

    def check(size: tuple[str, str | None, str | None]) -> None:
        """Cached (changed rows recomputed one by one in Python) == the vector path over every row."""
        incoming = sized("incoming", size)
        rows = np.flatnonzero(table.live)
        filtered = rejections(fit.filter({}, incoming, table))
        scores = fit.score({}, incoming, table, rows).tolist(), balanced.score({}, incoming, table, rows).tolist()
        with vector_only():
            assert filtered == rejections(fit._filter_all(incoming, table))
            assert scores == (
                fit._score(incoming, table, rows).tolist(),
                balanced._score(incoming, table, rows).tolist(),
            )

    for step, (kind, arg, extra) in enumerate(seq):
        name = f"n{arg % 8}" if isinstance(arg, int) else ""
        if kind in ("assume", "bind") and name in table.rows:
            p = sized(f"p{step}", extra, node_name=name if kind == "bind" else "")
            (table.add_pod(p) if kind == "bind" else table.assume(p, name))
            placed.append(p.uid)
        elif kind in ("forget", "remove_pod") and placed:
            uid = placed[arg % len(placed)]
            (table.forget(uid) if kind == "forget" else table.remove_pod(uid))
        elif kind == "resize" and name in table.rows:
            table.upsert_node(parse_node(node(name, cpu=extra, memory="8Gi", pods=pods_cap)))
        elif kind == "gpu_node":
            table.upsert_node(parse_node(node(name, cpu="8", memory="16Gi", pods=pods_cap, extra={GPU: "2"})))
        elif kind == "remove_node":
            table.remove_node(name)
        elif kind == "what_if" and placed:  # preemption's dry run: taken out, checked, put back
            records = table.simulate_remove(placed[arg % len(placed) :])
            check(("1", "2Gi", None))
            table.simulate_add(records)
        check(decisions[step])
    for size in (("100m", "100Mi", None), ("3", "6Gi", None), ("500m", None, "1")):
        check(size)


@settings(max_examples=60, deadline=None)
@given(
    touches=st.lists(
        st.one_of(
            st.lists(st.integers(0, 99), min_size=1, max_size=3),
            st.lists(st.integers(0, 99), min_size=200, max_size=700),
            st.just([]),
        ),
        max_size=40,
    ),
    n=st.integers(1, 120),
)
def test_row_versions_log_answers_as_the_version_array(touches: list[list[int]], n: int) -> None:
    """Which rows changed since a version: the touch log (trimmed as it grows) says what the array says."""
    versions = RowVersions()
    asked: list[int] = [versions.version]
    for rows in touches:
        if len(rows) == 1:
            versions.touch_row(rows[0])
        else:
            versions.touch(rows)
        asked.append(versions.version)
        for at in asked[-5:] + asked[:2]:
            got = versions.stale(at, n)
            assert got is not None
            assert got.tolist() == np.flatnonzero(versions._rows[:n] > at).tolist()
