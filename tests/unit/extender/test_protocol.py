"""The extender's request-to-response translation: kube-scheduler's rules, and the Dynamic policy unchanged."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crane_extender.protocol import (
    UNKNOWN_NODE_REASON,
    Decide,
    MalformedRequest,
    NodeView,
    extender_score,
    filter_nodes,
    node_view,
    parse_args,
    prioritize_nodes,
)
from crane_shared.loadaware.dynamic import (
    DynamicArgs,
    EstimateArgs,
    NodeCapacity,
    RecentBinding,
    filter_reason,
    incoming_fraction,
    node_load,
    score,
)
from crane_shared.loadtaintpolicy import NewNodesPolicy, ScoringPolicy
from crane_shared.policy import default_policy
from tests.support.extender import NOW, names_args, node, nodes_args, pod, usage
from tests.support.policy import UPSTREAM_METRICS as METRICS

ARGS = DynamicArgs(default_policy(), estimate=EstimateArgs(enabled=False))
HOT_REASON = "node(s) had cpu_usage_avg_5m above 0.65"


def decide(
    cache: dict[str, dict[str, Any]] | None = None,
    recent: dict[str, list[RecentBinding]] | None = None,
    args: DynamicArgs = ARGS,
) -> Decide:
    cache = cache or {}
    recent = recent or {}
    return Decide(
        args, NOW, lambda name: node_view(cache[name]) if name in cache else None, lambda name: recent.get(name, ())
    )


def run_filter(body: dict[str, Any], d: Decide | None = None) -> dict[str, Any]:
    """Through JSON both ways, as on the wire."""
    result = filter_nodes(parse_args(json.dumps(body).encode()), d or decide())
    decoded: dict[str, Any] = json.loads(json.dumps(result))
    return decoded


FLEET = [node("a", usage(0.2)), node("hot", usage({"cpu_usage_avg_5m": 0.9})), node("b", usage(0.3)), node("c", {})]


# --- filter, nodeCacheCapable: false ----------------------------------------------------------------------------


def test_filter_returns_the_passing_node_objects_unchanged_in_input_order() -> None:
    result = run_filter(nodes_args(pod(), FLEET))
    assert result["Nodes"]["items"] == [FLEET[0], FLEET[2], FLEET[3]]
    assert result["FailedNodes"] == {"hot": HOT_REASON}
    assert result["FailedAndUnresolvableNodes"] == {}
    assert result["Error"] == ""


def test_filter_in_nodes_mode_reads_the_request_not_the_cache() -> None:
    stale_cache = {"hot": node("hot", usage(0.1))}
    result = run_filter(nodes_args(pod(), FLEET), decide(cache=stale_cache))
    assert "hot" in result["FailedNodes"]


def test_filter_reasons_name_no_node_so_the_scheduler_histogram_groups_them() -> None:
    fleet = [node(f"n{i}", usage({"cpu_usage_avg_5m": 0.7 + i / 100})) for i in range(5)]
    result = run_filter(nodes_args(pod(), fleet))
    assert result["Nodes"]["items"] == []
    assert set(result["FailedNodes"].values()) == {HOT_REASON}


def test_daemonset_pods_pass_every_node() -> None:
    result = run_filter(nodes_args(pod(owner_kind="DaemonSet"), FLEET))
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["a", "hot", "b", "c"]
    assert result["FailedNodes"] == {}


def test_other_owners_are_not_exempt() -> None:
    assert "hot" in run_filter(nodes_args(pod(owner_kind="ReplicaSet"), FLEET))["FailedNodes"]


def test_an_empty_node_list_gives_an_empty_answer() -> None:
    result = run_filter(nodes_args(pod(), []))
    assert result["Nodes"] == {"items": []}
    assert result["FailedNodes"] == {}


# --- filter, nodeCacheCapable: true -----------------------------------------------------------------------------

CACHE = {n["metadata"]["name"]: n for n in FLEET}


def test_cache_mode_answers_names_in_input_order() -> None:
    result = run_filter(names_args(pod(), ["c", "hot", "b", "a"]), decide(cache=CACHE))
    assert result["NodeNames"] == ["c", "b", "a"]
    assert result["Nodes"] is None
    assert result["FailedNodes"] == {"hot": HOT_REASON}


def test_cache_mode_fails_unknown_nodes_as_unresolvable_with_a_clear_reason() -> None:
    result = run_filter(names_args(pod(), ["a", "new-node"]), decide(cache=CACHE))
    assert result["NodeNames"] == ["a"]
    assert result["FailedAndUnresolvableNodes"] == {"new-node": UNKNOWN_NODE_REASON}
    assert "cache" in UNKNOWN_NODE_REASON


def test_cache_mode_always_answers_a_name_list_even_when_every_node_fails() -> None:
    # kube-scheduler reads a null NodeNames as "no node passed" only by accident; be explicit
    result = run_filter(names_args(pod(), ["hot"]), decide(cache=CACHE))
    assert result["NodeNames"] == []


# --- prioritize -------------------------------------------------------------------------------------------------


def test_prioritize_scores_every_input_node_in_order_on_the_extender_scale() -> None:
    body = nodes_args(pod(), FLEET)
    result = prioritize_nodes(parse_args(json.dumps(body)), decide())
    assert [h["Host"] for h in result] == ["a", "hot", "b", "c"]
    assert all(0 <= h["Score"] <= 10 for h in result)
    by_host = {h["Host"]: h["Score"] for h in result}
    assert by_host["a"] > by_host["b"]  # less loaded scores higher
    assert by_host["c"] == 5  # no data: neutral, not worst


def test_prioritize_in_cache_mode_scores_an_unknown_node_as_unannotated() -> None:
    result = prioritize_nodes(parse_args(json.dumps(names_args(pod(), ["a", "ghost"]))), decide(cache=CACHE))
    assert result == [{"Host": "a", "Score": extender_score(80)}, {"Host": "ghost", "Score": 5}]


@pytest.mark.parametrize(
    ("dynamic", "extender"), [(0, 0), (4, 0), (5, 1), (44, 4), (45, 5), (50, 5), (55, 6), (94, 9), (95, 10), (100, 10)]
)
def test_scores_scale_to_zero_to_ten_rounding_half_up(dynamic: int, extender: int) -> None:
    assert extender_score(dynamic) == extender


# --- hot spots: recent bindings ---------------------------------------------------------------------------------


def test_recent_bindings_lower_the_score_of_the_node_they_went_to() -> None:
    fleet = [node("x", usage(0.2)), node("y", usage(0.2))]
    burst = {"x": [RecentBinding("x", NOW.timestamp() - 5)] * 2}  # two within 1m: hot value 1
    scores = {
        h["Host"]: h["Score"] for h in prioritize_nodes(parse_args(nodes_args(pod(), fleet)), decide(recent=burst))
    }
    assert scores["x"] == scores["y"] - 1


def test_the_estimate_of_recently_bound_pods_can_push_a_node_over_the_threshold() -> None:
    args = DynamicArgs(default_policy(), estimate=EstimateArgs(cpu_factor=1.0))
    fleet = [node("x", usage(0.5), cpu="10"), node("y", usage(0.5), cpu="10")]
    big = {"x": [RecentBinding("x", NOW.timestamp() - 1, cpu=4)]}
    result = run_filter(nodes_args(pod(), fleet), decide(recent=big, args=args))
    assert result["FailedNodes"] == {"x": HOT_REASON}


@pytest.mark.parametrize("estimate", [False, True])
def test_a_node_without_load_data_is_judged_by_its_bindings_only_with_the_opt_in(estimate: bool) -> None:
    """``newNodes.estimate``: the extender reads the same policy; off (the default), upstream's fail-open."""
    policy = replace(default_policy(), new_nodes=NewNodesPolicy(estimate))
    args = DynamicArgs(policy, estimate=EstimateArgs(cpu_factor=1))
    bound = {"new": [RecentBinding("new", NOW.timestamp() - 10, cpu=0.5)] * 11}  # 11 x 0.5 / 8 = 0.6875
    result = run_filter(nodes_args(pod(), [node("new", {}, cpu="8")]), decide(recent=bound, args=args))
    assert result["FailedNodes"] == ({"new": HOT_REASON} if estimate else {})


# --- same answer as the in-process Dynamic plugins ----------------------------------------------------------------

usages = st.floats(min_value=0, max_value=1.2, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.fixed_dictionaries({m: usages for m in METRICS}), min_size=1, max_size=6),
    ages=st.lists(st.integers(min_value=0, max_value=3 * 3600), min_size=6, max_size=6),
    hot=st.integers(min_value=0, max_value=4),
    recent_count=st.integers(min_value=0, max_value=6),
    pack=st.booleans(),
)
def test_verdicts_and_scores_equal_the_dynamic_module(
    values: list[dict[str, float]], ages: list[int], hot: int, recent_count: int, pack: bool
) -> None:
    """Also with the ``pack`` strategy, whose score counts the pod's own estimate."""
    policy = replace(default_policy(), scoring=ScoringPolicy("pack", 0.6)) if pack else default_policy()
    args = DynamicArgs(policy)
    fleet = [node(f"n{i}", usage(v, age=timedelta(seconds=ages[i]), hot=hot)) for i, v in enumerate(values)]
    recent = {"n0": [RecentBinding("n0", NOW.timestamp() - 20, cpu=1, memory=2**30)] * recent_count}
    d = decide(recent=recent, args=args)
    sized = pod(cpu="1", memory="1Gi")
    result = run_filter(nodes_args(sized, fleet), d)
    scores = {h["Host"]: h["Score"] for h in prioritize_nodes(parse_args(nodes_args(sized, fleet)), d)}
    capacity = NodeCapacity(8, 32 * 2**30)
    incoming = incoming_fraction(args.estimate, 1.0, float(2**30), capacity)
    for n in fleet:
        name = n["metadata"]["name"]
        load = node_load(name, n["metadata"]["annotations"], args, NOW, recent.get(name, ()), capacity)
        assert result["FailedNodes"].get(name) == filter_reason(load, args, incoming=incoming)
        assert scores[name] == extender_score(score(load, args, incoming))


# --- malformed requests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"", "empty"),
        (b"{not json", "not-json"),
        (b"[1, 2]", "not-object"),
        (json.dumps({"Nodes": {"items": []}}).encode(), "no-pod"),
        (json.dumps({"Pod": "p", "Nodes": {"items": []}}).encode(), "no-pod"),
        (json.dumps({"Pod": {}}).encode(), "no-nodes"),
        (json.dumps({"Pod": {}, "Nodes": None, "NodeNames": None}).encode(), "no-nodes"),
        (json.dumps({"Pod": {}, "Nodes": [node("a")]}).encode(), "bad-nodes"),
        (json.dumps({"Pod": {}, "Nodes": {"items": {"a": 1}}}).encode(), "bad-nodes"),
        (json.dumps({"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}).encode(), "bad-nodes"),
        (json.dumps({"Pod": {}, "NodeNames": "a,b"}).encode(), "bad-node-names"),
        (json.dumps({"Pod": {}, "NodeNames": ["a", 3]}).encode(), "bad-node-names"),
    ],
)
def test_malformed_requests_are_refused_with_a_kind_and_a_message(body: bytes, kind: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        parse_args(body)
    assert caught.value.kind == kind
    assert str(caught.value)


def test_bad_annotation_values_are_ignored_like_any_malformed_annotation() -> None:
    bad = node("a", usage(0.9))
    bad["metadata"]["annotations"]["cpu_usage_avg_5m"] = 0.9  # a number, not "value,timestamp"
    view = node_view(bad)
    assert "cpu_usage_avg_5m" not in view.annotations
    assert view == NodeView("a", view.annotations, NodeCapacity(8, 32 * 2**30))


def test_a_pod_with_unparseable_resources_is_still_filtered() -> None:
    result = run_filter(nodes_args(pod(cpu="lots"), FLEET))
    assert "hot" in result["FailedNodes"]


def test_pod_requests_become_the_estimate_size() -> None:
    req = parse_args(nodes_args(pod(cpu="1500m", memory="2Gi"), []))
    assert (req.pod.cpu, req.pod.memory) == (1.5, 2 * 2**30)


def test_a_node_the_pod_would_push_over_the_threshold_fails_as_in_the_scheduler_plugin() -> None:
    args = DynamicArgs(default_policy(), estimate=EstimateArgs(cpu_factor=1.0))
    nodes = [node("near", usage(0.60), cpu="10"), node("roomy", usage(0.40), cpu="10")]
    result = run_filter(nodes_args(pod(cpu="1"), nodes), decide(args=args))
    assert result["FailedNodes"] == {"near": "node(s) would have cpu_usage_avg_5m above 0.65"}
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["roomy"]
