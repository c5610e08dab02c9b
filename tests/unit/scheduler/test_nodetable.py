"""The node table as the scheduler cache: assume, confirm, forget, and nodes coming and going."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from crane_scheduler.framework.runtime import nominated_records
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import Requirement, parse_node, parse_pod
from crane_shared.quantity import quantity
from tests.support.scheduler import node, pod, table


def cpu_requested(t: NodeTable, name: str) -> int:
    return int(t.requested[t.rows[name], t.resources["cpu"]])


def test_assume_counts_at_once_and_forget_undoes_it() -> None:
    t = table(node("a"))
    p = parse_pod(pod(cpu="1"))
    t.assume(p, "a")
    assert cpu_requested(t, "a") == 1000 and int(t.pod_count[0]) == 1
    assert t.forget(p.uid)
    assert cpu_requested(t, "a") == 0 and int(t.pod_count[0]) == 0


def test_a_confirmed_binding_is_not_forgotten_and_not_counted_twice() -> None:
    t = table(node("a"))
    raw = pod(cpu="1")
    t.assume(parse_pod(raw), "a")
    bound = parse_pod({**raw, "spec": {**raw["spec"], "nodeName": "a"}})
    assert t.add_pod(bound) is False  # same node, same requests: nothing changes
    assert not t.forget(bound.uid)
    assert cpu_requested(t, "a") == 1000


def test_binding_observed_on_another_node_moves_the_accounting() -> None:
    t = table(node("a"), node("b"))
    raw = pod(cpu="1")
    t.assume(parse_pod(raw), "a")
    t.add_pod(parse_pod({**raw, "spec": {**raw["spec"], "nodeName": "b"}}))
    assert (cpu_requested(t, "a"), cpu_requested(t, "b")) == (0, 1000)


def test_pods_on_a_node_seen_before_the_node_are_counted_when_it_arrives() -> None:
    t = table(bound=[pod("x", cpu="2", node_name="late")])
    t.upsert_node(parse_node(node("late")))
    assert cpu_requested(t, "late") == 2000


def test_removed_node_row_is_reused_clean() -> None:
    t = table(node("a", labels={"zone": "x"}), node("b"), bound=[pod("x", cpu="2", node_name="a")])
    assert t.remove_node("a") and t.num_nodes == 1
    t.upsert_node(parse_node(node("c")))
    assert t.rows["c"] == 0 and cpu_requested(t, "c") == 0
    assert not t.label_mask(Requirement("zone", "Exists", ())).any()


def test_update_without_scheduling_relevant_change_is_ignored() -> None:
    t = table(node("a"))
    raw = node("a")
    raw["metadata"]["resourceVersion"] = "99"
    assert t.upsert_node(parse_node(raw)) is None
    raw["metadata"]["annotations"] = {"cpu_usage_avg_5m": "0.5,2026-01-01T00:00:00Z"}
    assert t.upsert_node(parse_node(raw)) == "update"


def test_plugin_columns_follow_node_updates() -> None:
    t = table(node("a"), node("b"))
    t.register_column("load", lambda n: float(n.annotations.get("load", "nan")))
    raw = node("b")
    raw["metadata"]["annotations"] = {"load": "0.7"}
    t.upsert_node(parse_node(raw))
    col = t.column("load")
    assert col[t.rows["b"]] == pytest.approx(0.7) and col[t.rows["a"]] != col[t.rows["a"]]  # NaN


def test_table_grows_past_its_capacity() -> None:
    t = table(*(node(f"n{i}", extra={"example.com/gpu": "1"}) for i in range(40)))
    assert t.num_nodes == 40 and int(t.alloc[39, t.resources["example.com/gpu"]]) == 1


@pytest.mark.parametrize(
    ("text", "milli", "value"),
    [
        ("100m", True, 100),
        ("1", True, 1000),
        ("0.5", True, 500),
        ("1.5Gi", False, 1610612736),
        ("1e3", False, 1000),
        ("1k", False, 1000),
        ("1Ki", False, 1024),
        ("1m", False, 1),
        ("250u", True, 1),
    ],
)
def test_quantities_round_up_like_kubernetes(text: str, milli: bool, value: int) -> None:
    assert quantity(text, milli) == value


def test_bad_quantity_is_rejected() -> None:
    with pytest.raises(ValueError):
        quantity("12 apples")


def test_the_nominated_pods_filter_counts_are_the_same_walking_rows_or_nominations() -> None:
    """``nominated_records`` walks the rows of the mask or the nominations, whichever is fewer: both ways give the
    pods nominated to the mask's nodes with at least the pod's priority, not bound, not the pod itself, and a pod
    re-nominated elsewhere or cleared is found only where it is now."""
    rng = random.Random(7)
    for _ in range(60):
        names = [f"n{i}" for i in range(rng.randint(1, 12))]
        t = table(*(node(n) for n in names))
        pods = [parse_pod(pod(f"p{i}", priority=rng.choice((0, 5, 10)))) for i in range(rng.randint(0, 20))]
        for p in pods:
            t.nominated[p.uid] = (p, rng.choice(names))
            if rng.random() < 0.2:
                t.nominated[p.uid] = (p, rng.choice(names))  # nominated again, maybe to another node
            if rng.random() < 0.1:
                del t.nominated[p.uid]
            elif rng.random() < 0.1:
                assert t.nominated.pop(p.uid)[0] is p  # as the pod watch clears one
                assert t.nominated.pop(p.uid, None) is None and t.nominated.get(p.uid) is None
        for p in pods:
            if rng.random() < 0.15:
                t.add_pod(dataclasses.replace(p, node_name=rng.choice(names)))  # bound meanwhile
        me = parse_pod(pod("me", priority=rng.choice((0, 5, 10))))
        if pods and rng.random() < 0.3:
            me = pods[0]
        rows = np.array([rng.random() < rng.random() for _ in range(t.n_rows)], dtype=bool)
        expected = {
            uid
            for uid, (p, n) in t.nominated.items()
            if rows[t.rows[n]] and uid != me.uid and p.priority >= me.priority and uid not in t.pods
        }
        got = nominated_records(t, me, rows)
        assert sorted(r.uid for r in got) == sorted(expected)
        assert all(r.node == t.nominated[r.uid][1] and r.assumed for r in got)


def test_a_nomination_popped_is_told_to_listeners_as_a_deletion_and_an_absent_one_is_not() -> None:
    t = table(node("n1"))
    told: list[tuple[str, object]] = []
    t.nominated.listeners.append(lambda uid, nomination: told.append((uid, nomination)))
    p = parse_pod(pod("p"))
    t.nominated[p.uid] = (p, "n1")
    assert t.nominated.pop("absent", "none") == "none" and t.nominated.get("absent", 1) == 1
    with pytest.raises(KeyError):
        t.nominated.pop("absent")
    assert t.nominated.pop(p.uid) == (p, "n1")
    assert told == [(p.uid, (p, "n1")), (p.uid, None)] and list(t.nominated.on_node("n1")) == []


def test_a_pod_assumed_on_its_nominated_node_is_not_waiting_there() -> None:
    """A decider worker's answer for a node counts as fresh only when no pod nominated there waits for room: one
    assumed there (its nomination written for an autoscaler while it binds) is in the row already."""
    t = table(node("a"), node("b"))
    binding, waiting = parse_pod(pod("binding")), parse_pod(pod("waiting"))
    t.nominated[binding.uid] = (binding, "a")
    assert t.nominated.waiting_on("a", t.pods)
    t.assume(binding, "a")
    assert not t.nominated.waiting_on("a", t.pods) and not t.nominated.waiting_on("b", t.pods)
    t.nominated[waiting.uid] = (waiting, "a")
    assert t.nominated.waiting_on("a", t.pods)
