"""PodTopologySpread through a full decision, with expectations worked out from kube-scheduler 1.35's code."""

from __future__ import annotations

from typing import Any

import pytest

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import EXPLAIN_SCORES, ArgsError, Handle
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.podtopologyspread import Args, PodTopologySpread
from crane_scheduler.podinfo import parse_pod
from tests.support.scheduler import chosen, failure, feasible, node, pod, simulator, table

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def labelled(p: dict[str, Any], **labels: str) -> dict[str, Any]:
    p["metadata"]["labels"] = labels
    return p


def spread(
    key: str = ZONE, skew: int = 1, action: str = "DoNotSchedule", sel: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "maxSkew": skew,
        "topologyKey": key,
        "whenUnsatisfiable": action,
        "labelSelector": {"matchLabels": sel if sel is not None else {"app": "web"}},
        **extra,
    }


def web(name: str, *constraints: dict[str, Any], node_name: str = "", **labels: str) -> dict[str, Any]:
    spec = {"topologySpreadConstraints": list(constraints)} if constraints else None
    return labelled(pod(name, node_name=node_name, spec=spec), **({"app": "web"} | labels))


def zoned(name: str, zone: str, **labels: str) -> dict[str, Any]:
    return node(name, labels={ZONE: zone, **labels})


def score_of(t: NodeTable, p: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, int]:
    state: dict[str, Any] = {}
    sim = simulator(t, config)
    result = sim.algorithm.schedule(next(iter(sim.profiles.values())), parse_pod(p), state)
    assert isinstance(result, ScheduleResult), result
    rows, explained = state[EXPLAIN_SCORES]
    found = {name: s for name, _, s in explained}.get("PodTopologySpread")
    return {} if found is None else {t.names[int(r)]: int(s) for r, s in zip(rows, found, strict=True)}


def test_do_not_schedule_keeps_zone_skew_within_max_skew() -> None:
    t = table(zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b"), bound=[web("w0", node_name="a1")])
    # zone a holds 1, b 0: one more in a makes the skew 2
    assert feasible(t, web("w1", spread())) == {"b1"}
    assert feasible(t, web("w1", spread(skew=2))) == {"a1", "a2", "b1"}


def test_skew_failure_and_missing_label_use_kubes_reasons() -> None:
    t = table(zoned("a1", "a"), node("bare"), bound=[web("w0", node_name="a1")])
    # One domain, fewer than minDomains: the global minimum counts as 0, so a1's skew is 1 + 1 - 0 > 1.
    assert failure(t, web("w1", spread(skew=1, minDomains=2))) == (
        "0/2 nodes are available: 1 node(s) didn't match pod topology spread constraints, "
        "1 node(s) didn't match pod topology spread constraints (missing required label)."
    )


def test_min_domains_treats_missing_domains_as_zero() -> None:
    t = table(zoned("a1", "a"), zoned("a2", "a"), bound=[web("w0", node_name="a1")])
    assert feasible(t, web("w1", spread(skew=1))) == {"a1", "a2"}  # one domain: min is its own count
    assert failure(t, web("w1", spread(skew=1, minDomains=2))).endswith("spread constraints.")


def test_node_affinity_policy_honor_ignores_domains_the_pod_cannot_use() -> None:
    nodes = (zoned("a1", "a", pool="x"), zoned("b1", "b", pool="y"))
    t = table(*nodes, bound=[web("w0", node_name="a1")])
    p = web("w1", spread())
    p["spec"]["nodeSelector"] = {"pool": "x"}
    assert chosen(t, p) == "a1"  # zone b is not eligible (Honor): a is the only domain, skew stays 1
    p2 = web("w1", spread(nodeAffinityPolicy="Ignore"))
    p2["spec"]["nodeSelector"] = {"pool": "x"}
    assert failure(t, p2).startswith("0/2 nodes are available:")


def test_node_taints_policy_honor_leaves_out_tainted_nodes() -> None:
    tainted = node("b1", labels={ZONE: "b"}, taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    t = table(zoned("a1", "a"), tainted, bound=[web("w0", node_name="a1")])
    assert failure(t, web("w1", spread())).startswith("0/2 nodes are available: 1 node(s) didn't match pod topology")
    assert chosen(t, web("w1", spread(nodeTaintsPolicy="Honor"))) == "a1"


def test_match_label_keys_narrow_the_selector_to_the_pods_revision() -> None:
    t = table(
        zoned("a1", "a"),
        zoned("b1", "b"),
        bound=[web("old0", node_name="b1", rev="1"), web("old1", node_name="b1", rev="1")],
    )
    # only the pods of revision 2 count: none anywhere, so both zones fit
    assert feasible(t, web("new0", spread(matchLabelKeys=["rev"]), rev="2")) == {"a1", "b1"}
    assert feasible(t, web("new0", spread(), rev="2")) == {"a1"}


def test_schedule_anyway_scores_the_emptier_zone_higher() -> None:
    t = table(
        zoned("a1", "a"),
        zoned("b1", "b"),
        zoned("c1", "c"),
        bound=[web("w0", node_name="a1"), web("w1", node_name="a1"), web("w2", node_name="b1")],
    )
    # 3 domains: weight ln(5); raw a = round(2 ln5) = 3, b = round(ln5) = 2, c = 0 -> 100 * (3 + 0 - s) / 3
    assert score_of(t, web("w3", spread(action="ScheduleAnyway"))) == {"a1": 0, "b1": 33, "c1": 100}


def test_nodes_without_the_key_score_zero_when_the_pod_has_constraints() -> None:
    t = table(zoned("a1", "a"), node("bare"), bound=[web("w0", node_name="a1")])
    assert score_of(t, web("w1", spread(action="ScheduleAnyway"))) == {"a1": 100, "bare": 0}


def test_system_defaults_spread_replicas_of_a_replicaset() -> None:
    t = table(node("n1"), node("n2"))
    plugin = PodTopologySpread(Args(), Handle(t))
    rs = {"metadata": {"namespace": "ns", "name": "rs"}, "spec": {"selector": {"matchLabels": {"app": "web"}}}}
    plugin.owners.on_event("ReplicaSet", "ADDED", rs)
    owned = web("w")
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True}
    ]
    constraints = plugin.constraints(parse_pod(owned), "ScheduleAnyway")
    assert [(c.key, c.max_skew) for c in constraints] == [(HOST, 3), (ZONE, 5)]
    assert constraints[0].selector.matches({"app": "web"}) and not constraints[0].selector.matches({"app": "x"})
    assert plugin.constraints(parse_pod(web("lonely")), "ScheduleAnyway") == []  # no owner, no service
    svc = {"metadata": {"namespace": "ns", "name": "s"}, "spec": {"selector": {"app": "web"}}}
    plugin.owners.on_event("Service", "ADDED", svc)
    assert len(plugin.constraints(parse_pod(web("lonely")), "ScheduleAnyway")) == 2


def test_list_defaulting_and_validation() -> None:
    args = Args.parse(
        {
            "defaultingType": "List",
            "defaultConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}],
        }
    )
    assert not args.system_defaulted and len(args.default_constraints) == 1
    assert Args.parse({"defaultingType": "List"}).default_constraints == ()
    with pytest.raises(ArgsError, match="defaultConstraints must be empty"):
        Args.parse({"defaultConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}]})
    with pytest.raises(ArgsError, match="must not define a selector"):
        Args.parse(
            {
                "defaultingType": "List",
                "defaultConstraints": [
                    {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}
                ],
            }
        )


def test_pods_being_deleted_and_other_namespaces_do_not_count() -> None:
    gone = web("w0", node_name="a1")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    elsewhere = web("w1", node_name="a1")
    elsewhere["metadata"]["namespace"] = "other"
    t = table(zoned("a1", "a"), zoned("b1", "b"), bound=[gone, elsewhere, web("w2", node_name="b1")])
    assert chosen(t, web("w3", spread())) == "a1"
