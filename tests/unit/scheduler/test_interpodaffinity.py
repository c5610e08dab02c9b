"""InterPodAffinity through a full decision: verdicts, reasons and scores as kube-scheduler 1.35 computes them."""

from __future__ import annotations

from typing import Any

import numpy as np

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import EXPLAIN_SCORES, ClusterEvent, Handle
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.interpodaffinity import Args, InterPodAffinity
from crane_scheduler.plugins.podindex import PodIndex
from crane_scheduler.podinfo import parse_pod
from tests.support.scheduler import HOST, ZONE, chosen, decide, failure, labelled, node, pod, table


def term(
    key: str = HOST, namespaces: list[str] | None = None, ns_selector: Any = None, **labels: str
) -> dict[str, Any]:
    t: dict[str, Any] = {"labelSelector": {"matchLabels": labels}, "topologyKey": key}
    if namespaces is not None:
        t["namespaces"] = namespaces
    if ns_selector is not None:
        t["namespaceSelector"] = ns_selector
    return t


def affinity(
    kind: str, required: list[Any] | None = None, preferred: list[tuple[int, Any]] | None = None
) -> dict[str, Any]:
    section: dict[str, Any] = {}
    if required:
        section["requiredDuringSchedulingIgnoredDuringExecution"] = required
    if preferred:
        section["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": w, "podAffinityTerm": t} for w, t in preferred
        ]
    return {"affinity": {kind: section}}


def zoned(name: str, zone: str) -> dict[str, Any]:
    return node(name, labels={ZONE: zone})


def scores(t: NodeTable, p: dict[str, Any], plugin: str = "InterPodAffinity") -> dict[str, int]:
    state: dict[str, Any] = {}
    from tests.support.scheduler import simulator

    sim = simulator(t)
    result = sim.algorithm.schedule(sim.profiles["crane-scheduler"], parse_pod(p), state)
    assert isinstance(result, ScheduleResult), result
    rows, explained = state[EXPLAIN_SCORES]
    by_plugin = {name: s for name, _, s in explained}
    if plugin not in by_plugin:
        return {}
    return {t.names[int(r)]: int(s) for r, s in zip(rows, by_plugin[plugin], strict=True)}


# --- required anti-affinity ----------------------------------------------------------------------------------------


def test_required_anti_affinity_on_hostname_avoids_the_peer_and_names_kubes_reason() -> None:
    web = affinity("podAntiAffinity", [term(app="web")])
    t = table(node("a"), node("b"), bound=[labelled(pod("x", node_name="a", spec=web), app="web")])
    assert chosen(t, labelled(pod("y", spec=web), app="web")) == "b"
    t = table(node("a"), bound=[labelled(pod("x", node_name="a"), app="web")])
    assert failure(t, labelled(pod("y", spec=web), app="web")) == (
        "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."
    )


def test_existing_pods_anti_affinity_is_symmetric() -> None:
    web = affinity("podAntiAffinity", [term(ZONE, app="web")])
    t = table(zoned("a", "z1"), zoned("b", "z1"), zoned("c", "z2"), bound=[labelled(pod("x", node_name="a", spec=web))])
    # The incoming pod has no affinity at all; the existing pod's term selects it, across its whole zone.
    assert chosen(t, labelled(pod("y"), app="web")) == "c"
    t = table(zoned("a", "z1"), zoned("b", "z1"), bound=[labelled(pod("x", node_name="a", spec=web))])
    assert failure(t, labelled(pod("y"), app="web")) == (
        "0/2 nodes are available: 2 node(s) didn't satisfy existing pods anti-affinity rules."
    )


def test_anti_affinity_terms_only_see_their_namespaces() -> None:
    web = affinity("podAntiAffinity", [term(app="web")])
    t = table(node("a"), bound=[labelled(pod("x", node_name="a"), namespace="other", app="web")])
    assert chosen(t, labelled(pod("y", spec=web), app="web")) == "a"  # default: the pod's own namespace
    spec = affinity("podAntiAffinity", [term(namespaces=["other"], app="web")])
    assert failure(t, labelled(pod("y", spec=spec), app="web")).endswith("didn't match pod anti-affinity rules.")


def test_namespace_selector_is_resolved_against_namespace_labels() -> None:
    t = table(node("a"), bound=[labelled(pod("x", node_name="a"), namespace="team-b", app="web")])
    index = PodIndex.of(t)
    index.set_namespace({"metadata": {"name": "team-b", "labels": {"team": "b"}}})
    by_team = affinity("podAntiAffinity", [term(ns_selector={"matchLabels": {"team": "b"}}, app="web")])
    assert failure(t, labelled(pod("y", spec=by_team), app="web")).endswith("didn't match pod anti-affinity rules.")
    other_team = affinity("podAntiAffinity", [term(ns_selector={"matchLabels": {"team": "c"}}, app="web")])
    assert chosen(t, labelled(pod("y", spec=other_team), app="web")) == "a"
    every = affinity("podAntiAffinity", [term(ns_selector={}, app="web")])  # {} selects all namespaces
    assert failure(t, labelled(pod("y", spec=every), app="web")).endswith("didn't match pod anti-affinity rules.")


def test_existing_terms_namespace_selector_matches_the_incoming_pods_namespace_labels() -> None:
    spec = affinity("podAntiAffinity", [term(ns_selector={"matchLabels": {"env": "prod"}}, app="web")])
    t = table(node("a"), node("b"), bound=[labelled(pod("x", node_name="a", spec=spec), namespace="infra")])
    PodIndex.of(t).set_namespace({"metadata": {"name": "ns", "labels": {"env": "prod"}}})
    assert chosen(t, labelled(pod("y"), app="web")) == "b"


# --- required affinity ---------------------------------------------------------------------------------------------


def test_required_affinity_lands_in_the_peers_zone() -> None:
    near_db = affinity("podAffinity", [term(ZONE, app="db")])
    t = table(
        zoned("a", "z1"), zoned("b", "z2"), zoned("c", "z2"), bound=[labelled(pod("db", node_name="b"), app="db")]
    )
    for _ in range(3):
        assert chosen(t, labelled(pod("web", spec=near_db), app="web")) in ("b", "c")


def test_required_affinity_without_any_peer_is_unresolvable() -> None:
    near_db = affinity("podAffinity", [term(ZONE, app="db")])
    t = table(zoned("a", "z1"), node("nozone"))
    result = decide(t, labelled(pod("web", spec=near_db), app="web"))
    assert not isinstance(result, ScheduleResult)
    assert result.message == "0/2 nodes are available: 2 node(s) didn't match pod affinity rules."


def test_first_pod_of_a_self_affine_group_may_start_anywhere_with_the_key() -> None:
    group = affinity("podAffinity", [term(ZONE, app="web")])
    t = table(zoned("a", "z1"), node("nozone"))
    assert chosen(t, labelled(pod("web-0", spec=group), app="web")) == "a"  # never the node without the key
    # Once one peer exists, the exception is over: only its zone qualifies.
    t = table(zoned("a", "z1"), zoned("b", "z2"), bound=[labelled(pod("web-0", node_name="b", spec=group), app="web")])
    assert chosen(t, labelled(pod("web-1", spec=group), app="web")) == "b"


def test_affinity_terms_must_match_the_same_pod() -> None:
    both = affinity("podAffinity", [term(ZONE, app="db"), term(HOST, tier="cache")])
    t = table(
        zoned("a", "z1"),
        zoned("b", "z2"),
        bound=[labelled(pod("db", node_name="a"), app="db"), labelled(pod("cache", node_name="a"), tier="cache")],
    )
    # No single pod carries both labels, and the pod does not match its own terms: nothing fits.
    assert failure(t, labelled(pod("w", spec=both))).endswith("didn't match pod affinity rules.")


def test_affinity_reason_takes_precedence_per_node() -> None:
    spec = {
        "affinity": {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term(ZONE, app="db")]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term(HOST, app="web")]},
        }
    }
    t = table(
        zoned("a", "z1"),
        zoned("b", "z2"),
        bound=[labelled(pod("db", node_name="a"), app="db"), labelled(pod("w0", node_name="a"), app="web")],
    )
    assert failure(t, labelled(pod("w1", spec=spec), app="web")) == (
        "0/2 nodes are available: 1 node(s) didn't match pod affinity rules, "
        "1 node(s) didn't match pod anti-affinity rules."
    )


# --- scoring -------------------------------------------------------------------------------------------------------


def test_preferred_affinity_and_anti_affinity_score_min_max_normalised() -> None:
    spec = affinity("podAffinity", preferred=[(5, term(ZONE, app="db"))])
    spec["affinity"]["podAntiAffinity"] = {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 3, "podAffinityTerm": term(HOST, app="web")}]
    }
    t = table(
        zoned("a", "z1"),
        zoned("b", "z1"),
        zoned("c", "z2"),
        bound=[labelled(pod("db", node_name="a"), app="db"), labelled(pod("w0", node_name="a"), app="web")],
    )
    # raw: a = 5 - 3 = 2, b = 5, c = 0 -> (s - 0) * 100 / 5, truncated
    assert scores(t, labelled(pod("w1", spec=spec), app="web")) == {"a": 40, "b": 100, "c": 0}


def test_existing_pods_required_affinity_scores_with_hard_pod_affinity_weight() -> None:
    wants_web = affinity("podAffinity", [term(ZONE, app="web")])
    t = table(zoned("a", "z1"), zoned("b", "z2"), bound=[labelled(pod("x", node_name="a", spec=wants_web))])
    assert scores(t, labelled(pod("y"), app="web")) == {"a": 100, "b": 0}
    handle = Handle(t)
    plugin = InterPodAffinity(Args(hard_pod_affinity_weight=0), handle)
    state: dict[str, Any] = {}
    from crane_scheduler.framework import SKIP

    assert plugin.pre_score(state, parse_pod(labelled(pod("y"), app="web")), t, t.live_rows()) == SKIP


def test_no_matching_pods_skips_scoring() -> None:
    spec = affinity("podAffinity", preferred=[(5, term(ZONE, app="db"))])
    t = table(zoned("a", "z1"), zoned("b", "z2"))
    assert scores(t, labelled(pod("w", spec=spec))) == {}


def test_hard_pod_affinity_weight_is_validated() -> None:
    import pytest

    from crane_scheduler.framework import ArgsError

    with pytest.raises(ArgsError, match="hardPodAffinityWeight"):
        Args.parse({"hardPodAffinityWeight": 101})


# --- incremental counts ----------------------------------------------------------------------------------------------


def test_counts_follow_assume_forget_relabel_and_delete() -> None:
    web = affinity("podAntiAffinity", [term(app="web")])
    t = table(node("a"))
    incoming = labelled(pod("y", spec=web), app="web")
    assert chosen(t, incoming) == "a"  # registers the matcher
    peer = parse_pod(labelled(pod("x"), app="web"))
    t.assume(peer, "a")
    assert failure(t, incoming).endswith("didn't match pod anti-affinity rules.")
    t.forget(peer.uid)
    assert chosen(t, incoming) == "a"
    bound = labelled(pod("z", node_name="a"), app="web")
    t.add_pod(parse_pod(bound))
    assert failure(t, incoming).endswith("didn't match pod anti-affinity rules.")
    bound["metadata"]["labels"] = {"app": "other"}
    t.add_pod(parse_pod(bound))  # relabelled in place
    assert chosen(t, incoming) == "a"
    t.remove_pod(bound["metadata"]["uid"])
    assert chosen(t, incoming) == "a"


def test_wakes_on_pod_and_node_events() -> None:
    plugin = InterPodAffinity(Args(), Handle(table(node("a"))))
    events = plugin.events_to_register()
    for e in (ClusterEvent.POD_ADD, ClusterEvent.POD_DELETE, ClusterEvent.POD_UPDATE, ClusterEvent.NODE_UPDATE):
        assert events & e
    assert np is not None


def test_a_namespace_selector_selects_the_namespaces_it_matches_now_and_no_other_as_kube_137_does() -> None:
    # kube 1.37's mergeAffinityTermNamespacesIfNotEmpty spends the selector on the namespaces it lists; 1.35 took
    # the term by value and kept matching the selector against nil labels, so a NotIn selector admitted every
    # namespace (found by the differential check against the 1.37 judge)
    t = table(
        node("a"),
        node("b"),
        bound=[
            labelled(pod("x", node_name="a"), namespace="team-b", app="web"),
            labelled(pod("z", node_name="b"), namespace="team-a", app="web"),
        ],
    )
    PodIndex.of(t).set_namespace({"metadata": {"name": "team-b", "labels": {"team": "b"}}})
    PodIndex.of(t).set_namespace({"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    not_b = {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["b"]}]}
    spec = affinity("podAntiAffinity", [term(ns_selector=not_b, app="web")])
    assert chosen(t, labelled(pod("y", spec=spec), app="web")) == "a"  # team-b's pod is not selected
    everyone = affinity("podAntiAffinity", [term(ns_selector={}, app="web")])  # {}: every namespace, as before
    assert failure(t, labelled(pod("w", spec=everyone), app="web")).endswith("didn't match pod anti-affinity rules.")


def test_the_pod_index_follows_assume_confirm_relabel_and_move_of_one_pod() -> None:
    from crane_scheduler.plugins.podindex import Matcher, parse_selector

    t = table(node("a"), node("b"))
    index = PodIndex.of(t)
    web = Matcher(((frozenset({"ns"}), parse_selector({"matchLabels": {"app": "web"}})),))
    assert list(index.counts(web)) == [0, 0]
    raw = labelled(pod("x"), app="web")
    t.assume(parse_pod(raw), "a")
    assert list(index.counts(web)) == [1, 0]
    confirmed = labelled(pod("x", node_name="a"), app="web")
    confirmed["metadata"]["uid"] = raw["metadata"]["uid"]
    t.add_pod(parse_pod(confirmed))  # the informer confirms: same placement, nothing moves
    confirmed = {**confirmed, "status": {"phase": "Running"}}
    t.add_pod(parse_pod(confirmed))
    assert list(index.counts(web)) == [1, 0]
    relabelled = {**confirmed, "metadata": {**confirmed["metadata"], "labels": {"app": "db"}}}
    t.add_pod(parse_pod(relabelled))
    assert list(index.counts(web)) == [0, 0]
    moved = {**confirmed, "spec": {**confirmed["spec"], "nodeName": "b"}}
    t.add_pod(parse_pod(moved))
    assert list(index.counts(web)) == [0, 1]
    t.remove_pod(raw["metadata"]["uid"])
    assert list(index.counts(web)) == [0, 0]
