"""Each built-in plugin's Filter and Score semantics, through a full decision (what a user would observe)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from crane_scheduler.framework import ClusterEvent, Diagnosis
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.noderesources import BalancedAllocation, FitArgs, NodeResourcesFit
from crane_scheduler.plugins.tainttoleration import TaintToleration
from crane_scheduler.podinfo import parse_pod
from tests.support.scheduler import chosen, container, decide, failure, node, pod, table

# --- NodeResourcesFit: filter ------------------------------------------------------------------------------------


def test_pod_lands_on_the_only_node_with_enough_cpu() -> None:
    t = table(node("small", cpu="1"), node("big", cpu="8"), node("mid", cpu="2"))
    assert chosen(t, pod(cpu="3")) == "big"


def test_requests_already_bound_count_against_the_node() -> None:
    t = table(node("a", cpu="4"), node("b", cpu="4"), bound=[pod("x", cpu="3500m", node_name="a")])
    assert chosen(t, pod(cpu="1")) == "b"


def test_insufficient_resources_are_reported_per_resource_and_histogrammed() -> None:
    t = table(node("a", cpu="1", memory="1Gi"), node("b", cpu="8", memory="1Gi"), node("c", cpu="1", memory="64Gi"))
    assert failure(t, pod(cpu="2", memory="2Gi")) == (
        "0/3 nodes are available: 2 Insufficient cpu, 2 Insufficient memory."  # node a counts for both
    )


def test_pod_count_limit_is_too_many_pods() -> None:
    t = table(node("a", pods=1), bound=[pod("x", node_name="a")])
    assert failure(t, pod()) == "0/1 nodes are available: 1 Too many pods."


def test_extended_and_ephemeral_resources_must_fit() -> None:
    t = table(
        node("gpu", extra={"example.com/gpu": "1", "ephemeral-storage": "10Gi"}),
        node("plain", extra={"ephemeral-storage": "100Gi"}),
    )
    assert chosen(t, pod(containers=[container("100m", extra={"example.com/gpu": "1"})])) == "gpu"
    assert failure(t, pod(containers=[container("100m", extra={"ephemeral-storage": "200Gi"})])) == (
        "0/2 nodes are available: 2 Insufficient ephemeral-storage."
    )


def test_ignored_extended_resources_are_not_checked() -> None:
    t = table(node("a"))
    p = pod(containers=[container("100m", extra={"example.com/fpga": "1"})])
    assert failure(t, p) == "0/1 nodes are available: 1 Insufficient example.com/fpga."
    config = {
        "profiles": [
            {
                "schedulerName": "crane-scheduler",
                "pluginConfig": [{"name": "NodeResourcesFit", "args": {"ignoredResourceGroups": ["example.com"]}}],
            }
        ]
    }
    assert chosen(t, p, config) == "a"


def test_init_containers_count_as_the_max_with_the_app_sum() -> None:
    # app 1 + 1 = 2 cores, init 3 cores: the pod needs 3.
    spec = {"initContainers": [container("3", name="init")]}
    p = pod(containers=[container("1"), container("1", name="c2")], spec=spec)
    t = table(node("two", cpu="2500m"), node("four", cpu="4"))
    assert chosen(t, p) == "four"


def test_sidecars_add_to_the_app_sum_and_to_later_init_containers() -> None:
    spec = {"initContainers": [container("1", name="sidecar", restart="Always"), container("2", name="init")]}
    info = parse_pod(pod(containers=[container("1")], spec=spec))
    assert info.requests["cpu"] == 3000  # max(app 1 + sidecar 1, init 2 + sidecar 1)


def test_overhead_and_pod_level_requests() -> None:
    info = parse_pod(pod(cpu="1", spec={"overhead": {"cpu": "250m"}}))
    assert info.requests["cpu"] == 1250
    info = parse_pod(pod(cpu="1", spec={"resources": {"requests": {"cpu": "3"}}}))
    assert info.requests["cpu"] == 3000


def test_missing_requests_fit_anywhere_but_score_as_100m_and_200Mi() -> None:
    info = parse_pod(pod(cpu=None, memory=None))
    assert info.requests == {}
    assert (info.nonzero_cpu, info.nonzero_memory) == (100, 200 * 1024 * 1024)


# --- NodeResourcesFit / BalancedAllocation: scores -----------------------------------------------------------------


def _score(plugin: object, t: NodeTable, p: dict[str, Any]) -> list[int]:
    info = parse_pod(p)
    rows = t.live_rows()
    state: dict[str, Any] = {}
    if hasattr(plugin, "pre_score"):
        plugin.pre_score(state, info, t, rows)
    return [int(x) for x in plugin.score(state, info, t, rows)]  # type: ignore[attr-defined]


def test_least_allocated_prefers_the_emptier_node_with_kube_integer_math() -> None:
    t = table(
        node("a", cpu="4", memory="8Gi"),
        node("b", cpu="4", memory="8Gi"),
        bound=[pod("x", cpu="2", memory="2Gi", node_name="a")],
    )
    # a: cpu (4000-2500)*100/4000 = 37, mem (8-2.5)/8 -> 68 -> (37+68)/2 = 52; b: cpu 87, mem 93 -> 90
    assert _score(NodeResourcesFit(FitArgs()), t, pod(cpu="500m", memory="512Mi")) == [52, 90]
    assert chosen(t, pod(cpu="500m", memory="512Mi")) == "b"


def test_most_allocated_packs() -> None:
    t = table(node("a"), node("b"), bound=[pod("x", cpu="2", memory="2Gi", node_name="a")])
    config = {
        "profiles": [
            {
                "schedulerName": "s",
                "pluginConfig": [{"name": "NodeResourcesFit", "args": {"scoringStrategy": {"type": "MostAllocated"}}}],
            }
        ]
    }
    assert chosen(t, pod(cpu="500m", memory="512Mi"), config) == "a"
    assert _score(NodeResourcesFit(FitArgs("MostAllocated")), t, pod(cpu="500m", memory="512Mi")) == [46, 9]


def test_balanced_allocation_prefers_the_node_whose_balance_the_pod_improves() -> None:
    t = table(
        node("a", cpu="4", memory="4Gi"),
        node("b", cpu="4", memory="4Gi"),
        bound=[pod("x", cpu="2", memory="100Mi", node_name="a")],
    )
    # kube 1.37: 50 + (50 + with - without) / 2. Pod 100m / 2Gi. a: cpu 0.525, mem ~0.524 -> 99, before 0.5 /
    # ~0.024 -> 76: 86. b: 0.025 / 0.5 -> 76, before 0 / 0 -> 100: 63. (1.35 scored the balance after: 99, 76.)
    scores = _score(BalancedAllocation((("cpu", 1), ("memory", 1))), t, pod(cpu="100m", memory="2Gi"))
    assert scores == [86, 63]
    # a pod that leaves a node's balance as it was scores 75 there
    even = table(node("c", cpu="4", memory="4Gi"))
    assert _score(BalancedAllocation((("cpu", 1), ("memory", 1))), even, pod(cpu="1", memory="1Gi")) == [75]


def test_balanced_allocation_skips_best_effort_pods() -> None:
    t = table(node("a"))
    state: dict[str, Any] = {}
    status = BalancedAllocation((("cpu", 1), ("memory", 1))).pre_score(
        state, parse_pod(pod(cpu=None, memory=None)), t, t.live_rows()
    )
    assert status.code.value == "Skip"


# --- TaintToleration ----------------------------------------------------------------------------------------------


def test_untolerated_noschedule_and_noexecute_taints_filter_with_kube_135_reason() -> None:
    t = table(
        node("a", taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
        node("b", taints=[{"key": "maint", "value": "", "effect": "NoExecute"}]),
        node("c", cpu="100m"),
    )
    assert failure(t, pod(cpu="1")) == (
        "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint(s)."
    )


def test_tolerations_match_by_key_value_effect_and_exists() -> None:
    taint = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
    t = table(node("tainted", cpu="8", taints=taint), node("small", cpu="1"))
    for tol in (
        {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Exists"},
        {"operator": "Exists"},
    ):
        assert chosen(t, pod(cpu="2", spec={"tolerations": [tol]})) == "tainted", tol
    wrong_value = {"key": "dedicated", "value": "cpu"}
    wrong_effect = {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}
    for tol in (wrong_value, wrong_effect):
        assert failure(t, pod(cpu="2", spec={"tolerations": [tol]})) == (
            "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint(s)."
        )


def test_prefer_no_schedule_taints_lower_the_score_reversed_and_normalised() -> None:
    prefer = {"key": "k", "value": "v", "effect": "PreferNoSchedule"}
    t = table(node("clean"), node("one", taints=[prefer]), node("two", taints=[prefer, {**prefer, "key": "k2"}]))
    scores = _score(TaintToleration(), t, pod())
    assert TaintToleration().normalize_score({}, parse_pod(pod()), np.array(scores)).tolist() == [100, 50, 0]
    assert chosen(t, pod()) == "clean"
    assert _score(TaintToleration(), t, pod(spec={"tolerations": [{"operator": "Exists"}]})) == [0, 0, 0]


# --- NodeUnschedulable / NodeName --------------------------------------------------------------------------------


def test_cordoned_node_is_skipped_unless_the_pod_tolerates_it() -> None:
    t = table(node("cordoned", cpu="8", unschedulable=True), node("small", cpu="1"))
    assert failure(t, pod(cpu="2")) == "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) were unschedulable."
    tol = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    assert chosen(t, pod(cpu="2", spec={"tolerations": [tol]})) == "cordoned"


def test_node_name_plugin_only_accepts_the_named_node() -> None:
    t = table(node("a"), node("b"))
    info = parse_pod(pod())
    info.node_name = "b"
    result = decide(t, info)
    assert getattr(result, "node", None) == "b"


def test_node_name_restricts_the_cycle_to_its_node_in_prefilter_as_kube_137() -> None:
    # kube 1.37's NodeName PreFilter: the other nodes are the framework's, not the plugin's Filter reason
    t = table(node("a"), node("b", cpu="1"), node("c"))
    info = parse_pod(pod(cpu="2"))
    info.node_name = "b"
    result = decide(t, info)
    assert isinstance(result, Diagnosis)
    assert result.message == (
        "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't satisfy plugin(s) [NodeName]."
    )


# --- NodeAffinity -------------------------------------------------------------------------------------------------


def _affinity(*terms: list[dict[str, Any]], preferred: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    na: dict[str, Any] = {}
    if terms:
        na["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
        }
    if preferred:
        na["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return {"affinity": {"nodeAffinity": na}}


ZONES = [
    node("z1", labels={"zone": "a", "gen": "3"}),
    node("z2", labels={"zone": "b", "gen": "5"}),
    node("z3", labels={"gen": "x"}),
]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ({"key": "zone", "operator": "In", "values": ["b", "c"]}, {"z2"}),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, {"z2", "z3"}),
        ({"key": "zone", "operator": "Exists"}, {"z1", "z2"}),
        ({"key": "zone", "operator": "DoesNotExist"}, {"z3"}),
        ({"key": "gen", "operator": "Gt", "values": ["4"]}, {"z2"}),
        ({"key": "gen", "operator": "Lt", "values": ["4"]}, {"z1"}),
        ({"key": "gen", "operator": "Gt", "values": ["x"]}, set()),  # invalid term matches nothing
        ({"key": "missing", "operator": "NotIn", "values": ["a"]}, {"z1", "z2", "z3"}),
    ],
)
def test_required_affinity_operators(expr: dict[str, Any], expected: set[str]) -> None:
    t = table(*ZONES)
    fits = set()
    for _ in range(20):  # random tie-breaks would reach every feasible node
        result = decide(t, pod(spec=_affinity([expr])), seed=_)
        if hasattr(result, "node"):
            fits.add(result.node)
        else:
            assert result.message == "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    assert fits == expected


def test_terms_are_ored_and_expressions_anded() -> None:
    t = table(*ZONES)
    both = [{"key": "zone", "operator": "In", "values": ["a"]}, {"key": "gen", "operator": "In", "values": ["5"]}]
    assert "didn't match Pod's node affinity" in failure(t, pod(spec=_affinity(both)))
    assert chosen(t, pod(spec=_affinity([both[0]], [both[1]]))) in {"z1", "z2"}


def test_node_selector_must_match_exactly() -> None:
    t = table(*ZONES)
    assert chosen(t, pod(spec={"nodeSelector": {"zone": "b"}})) == "z2"
    assert failure(t, pod(spec={"nodeSelector": {"zone": "q"}})) == (
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    )


def test_match_fields_metadata_name_restricts_the_nodes_considered() -> None:
    t = table(node("a", cpu="1"), node("b"), node("c"))
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}
    spec = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    }
    assert failure(t, pod(cpu="2", spec=spec)) == (
        "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't satisfy plugin(s) [NodeAffinity]."
    )
    assert chosen(t, pod(cpu="500m", spec=spec)) == "a"


def test_preferred_terms_score_by_weight() -> None:
    t = table(*ZONES)
    zone_a = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    gen_gt_4 = {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]}
    preferred = [{"weight": 10, "preference": zone_a}, {"weight": 50, "preference": gen_gt_4}]
    assert chosen(t, pod(spec=_affinity(preferred=preferred))) == "z2"


# --- NodePorts ------------------------------------------------------------------------------------------------------


def test_host_port_conflicts_by_protocol_port_and_ip() -> None:
    used = pod("x", node_name="a", containers=[container("100m", ports=[{"containerPort": 80, "hostPort": 8080}])])
    t = table(node("a", cpu="8"), node("b", cpu="1"), bound=[used])
    same = [{"containerPort": 80, "hostPort": 8080}]
    assert failure(t, pod(cpu="2", containers=[container("2", ports=same)])) == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't have free ports for the requested pod ports."
    )
    udp = [{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]
    assert chosen(t, pod(containers=[container("2", ports=udp)])) == "a"
    other_ip = [{"containerPort": 80, "hostPort": 8080, "hostIP": "10.0.0.1"}]
    assert "free ports" in failure(t, pod(containers=[container("2", ports=other_ip)]))  # 0.0.0.0 overlaps all


def test_only_the_first_rejecting_plugin_is_counted_per_node() -> None:
    # tainted AND too small: kube stops at TaintToleration (earlier in the profile), so no "Insufficient cpu".
    t = table(node("a", cpu="1", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]))
    assert failure(t, pod(cpu="2")) == "0/1 nodes are available: 1 node(s) had untolerated taint(s)."


def test_events_registered_by_plugins() -> None:
    assert TaintToleration().events_to_register() & ClusterEvent.NODE_UPDATE
    assert not TaintToleration().events_to_register() & ClusterEvent.POD_DELETE
    assert NodeResourcesFit(FitArgs()).events_to_register() & ClusterEvent.POD_DELETE
