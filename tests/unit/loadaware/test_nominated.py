"""Pods nominated by preemption in Dynamic's load estimate (``loadaware/nominated.py``): what counts, for whom,
and until when."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crane_scheduler.loadaware.plugin import estimated_resources
from crane_scheduler.podinfo import CPU, MEMORY, PodInfo, parse_node, parse_pod
from crane_shared.loadaware.dynamic import resource_of
from tests.support.loadaware import NOW, Setup, loaded
from tests.support.scheduler import pod

# One node of 10 cores: with cpuFactor 1 a 1-core pod adds 0.1 to its estimated usage; the limit is 0.65.
ARGS = {"estimate": {"cpuFactor": 1.0}, "ownBindingsInHotValue": False}
FULL = "0/1 nodes are available: 1 node(s) would have cpu_usage_avg_5m above 0.65."


def setup(a: float = 0.40) -> Setup:
    return Setup(loaded("a", a, cpu="10"), args=ARGS)


def verdict(s: Setup, raw: dict[str, Any]) -> str:
    result = s.place(raw)
    return result if isinstance(result, str) else result.message


def nominee(name: str, priority: int = 10, cpu: str = "1") -> PodInfo:
    return parse_pod(pod(name, cpu=cpu, priority=priority))


def bound(p: PodInfo, node: str) -> PodInfo:
    """``p`` as the informer shows it once bound to ``node``."""
    raw = copy.deepcopy(p.raw)
    raw["spec"]["nodeName"] = node
    return parse_pod(raw)


def nominate(s: Setup, p: PodInfo, node: str) -> None:
    s.table.nominated[p.uid] = (p, node)


@pytest.mark.parametrize("priority", [10, 11])
def test_a_pod_nominated_with_equal_or_higher_priority_takes_its_share_of_the_nodes_headroom(priority: int) -> None:
    s = setup(a=0.50)
    nominate(s, nominee("p1", priority), "a")
    assert verdict(s, pod("p2", cpu="1", priority=10)) == FULL  # 0.50 + 0.1 nominated + 0.1 > 0.65


def test_a_pod_nominated_with_lower_priority_does_not_count() -> None:
    s = setup(a=0.50)
    nominate(s, nominee("p1", priority=1), "a")
    assert verdict(s, pod("p2", cpu="1", priority=10)) == "a"  # kube's addGENominatedPods: p2 may take p1's room


def test_the_nominated_pod_itself_still_fits_its_node() -> None:
    s = setup(a=0.50)
    p1 = nominee("p1")
    nominate(s, p1, "a")
    assert verdict(s, p1.raw) == "a"


def test_the_count_goes_away_when_the_nomination_is_cleared() -> None:
    s = setup(a=0.50)
    p1 = nominee("p1")
    nominate(s, p1, "a")
    assert verdict(s, pod("p2", cpu="1")) == FULL
    s.table.nominated.pop(p1.uid)
    assert verdict(s, pod("p3", cpu="1")) == "a"


def test_a_nominated_pod_bound_here_counts_once_as_a_recent_binding() -> None:
    s = setup(a=0.40)
    p1 = nominee("p1")
    nominate(s, p1, "a")
    assert verdict(s, p1.raw) == "a"  # assumed and reserved; the informer has not cleared the nomination yet
    # 0.40 + 0.1 (p1, recent binding) + 0.1 (p2) = 0.60: counting p1 twice would push a to 0.70
    assert verdict(s, pod("p2", cpu="1")) == "a"


def test_a_nominated_pod_bound_by_another_scheduler_no_longer_counts() -> None:
    s = setup(a=0.50)
    p1 = nominee("p1")
    nominate(s, p1, "a")
    s.table.add_pod(bound(p1, "a"))  # the informer: bound to a (by another scheduler)
    assert verdict(s, pod("p2", cpu="1")) == "a"  # its usage shows in a's annotations later, not here


def test_a_deleted_nominated_pod_no_longer_counts() -> None:
    s = setup(a=0.50)
    p1 = nominee("p1")
    nominate(s, p1, "a")
    s.table.assume(p1, "a")  # our bind in flight ...
    s.table.forget(p1.uid)  # ... failed: the pod is nominated again, not placed
    assert verdict(s, pod("p2", cpu="1")) == FULL
    del s.table.nominated[p1.uid]  # the pod was deleted (the cache drops its nomination)
    assert verdict(s, pod("p3", cpu="1")) == "a"


def test_a_node_added_after_the_nomination_gets_its_share() -> None:
    s = Setup(args=ARGS)
    nominate(s, nominee("p1"), "a")
    s.table.upsert_node(parse_node(loaded("a", 0.50, cpu="10")))
    assert verdict(s, pod("p2", cpu="1")) == FULL


def test_only_filter_counts_nominated_pods_not_the_score() -> None:
    """kube's Score does not see nominated pods either: ranking follows the nodes' load and this scheduler's
    bindings."""
    s = Setup(loaded("a", 0.20, cpu="10"), loaded("b", 0.25, cpu="10"), args=ARGS)
    nominate(s, nominee("p1", cpu="2500m"), "a")  # Filter's estimate for a: 0.45 (+ 0.1 for p2) passes
    assert s.place(pod("p2", cpu="1")) == "a"


OPS = st.lists(
    st.tuples(
        st.sampled_from(["nominate", "clear", "assume", "forget", "bind", "delete"]),
        st.integers(0, 5),  # pod
        st.sampled_from(["a", "b", "c"]),  # node
        st.sampled_from([1, 10, 100]),  # priority
        st.sampled_from(["100m", "1", "2500m"]),  # cpu
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(OPS, st.integers(0, 5), st.sampled_from([1, 10, 100]))
def test_the_kept_sums_equal_a_recount_after_any_events(
    ops: list[tuple[str, int, str, int, str]], incoming: int, priority: int
) -> None:
    s = Setup(loaded("a", 0.3, cpu="10"), loaded("b", 0.2, cpu="8"), loaded("c", 0.1, cpu="4"), args=ARGS)
    pods: dict[int, PodInfo] = {}
    for op, i, node, prio, cpu in ops:
        p = pods.get(i)
        if op == "nominate":
            p = pods[i] = nominee(f"p{i}", prio, cpu) if p is None else p
            s.table.nominated[p.uid] = (p, node)
        elif p is None:
            continue
        elif op == "clear":
            s.table.nominated.pop(p.uid, None)
        elif op == "assume":
            s.table.assume(p, node)
        elif op == "forget":
            s.table.forget(p.uid)
        elif op == "bind":
            s.table.add_pod(bound(p, node))
        elif op == "delete":
            s.table.nominated.pop(p.uid, None)
            s.table.remove_pod(p.uid)
    plugin, table = s.plugin, s.table
    who = pods.get(incoming) or parse_pod(pod("x", cpu="1", priority=priority))
    # kube's addGENominatedPods, from scratch: of at least the pod's priority, not itself, not accounted yet
    expected = {m: np.zeros(table.n_rows) for m in plugin.nominated.extra}
    for uid, (p, node) in table.nominated.items():
        if uid in table.pods or uid == who.uid or p.priority < who.priority:
            continue
        row = table.rows[node]
        cores, mem = estimated_resources(p)
        for metric, arr in expected.items():
            if resource_of(metric) == "cpu":
                arr[row] += 1.0 * cores / (table.alloc[row, table.resources[CPU]] / 1000)
            else:
                arr[row] += 0.6 * mem / table.alloc[row, table.resources[MEMORY]]
    kept = {m: arr[: table.n_rows].copy() for m, arr in plugin.nominated.extra.items()}
    for row, values in plugin.nominated.exclusions(who.uid, who.priority).items():
        for metric, value in values.items():
            kept[metric][row] = value
    for metric in expected:
        np.testing.assert_allclose(kept[metric], expected[metric], rtol=1e-12, atol=1e-15, err_msg=metric)


def test_explain_shows_the_nominated_pods_in_the_filters_verdict_not_in_the_score() -> None:
    s = setup(a=0.60)
    info = s.table.nodes[s.table.rows["a"]]
    assert info is not None
    before = s.plugin.explain_node(info, NOW)
    assert (before["nominatedPods"], before["filter"]) == (0, "passed")
    p1 = nominee("p1")
    nominate(s, p1, "a")
    after = s.plugin.explain_node(info, NOW)
    assert after["nominatedPods"] == 1
    assert after["filter"] == "node(s) had cpu_usage_avg_5m above 0.65"  # 0.60 + 0.1 nominated
    assert after["dynamicScore"] == before["dynamicScore"]
    # as Filter sees it for the explained pod: not its own nomination, none of lower priority
    same = s.plugin.explain_node(info, NOW, "other", p1.priority)
    assert (same["nominatedPods"], same["filter"]) == (1, after["filter"])
    itself = s.plugin.explain_node(info, NOW, p1.uid, p1.priority)
    higher = s.plugin.explain_node(info, NOW, "other", p1.priority + 1)
    assert (itself["nominatedPods"], itself["filter"]) == (0, "passed")
    assert (higher["nominatedPods"], higher["filter"]) == (0, "passed")
