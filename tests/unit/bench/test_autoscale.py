"""bench.autoscale's pure parts: the scenario's load and HPA, and the figures it reports."""

from __future__ import annotations

import pytest

from bench.autoscale.scenario import Hpa, Scenario, pod_usage, usage_annotation
from bench.autoscale.score import (
    NodeLife,
    NodeUsage,
    PodLife,
    Record,
    Tick,
    figures,
    integrate,
    table,
    verdicts,
)

SC = Scenario(
    nodes=1,
    warm_s=10,
    surge_s=20,
    fall_s=30,
    base_work=1.6,
    surge_work=8.0,
    target=0.8,
    hpa_period_s=1,
    scale_down_window_s=10,
    tick_s=1,
)


def test_the_demand_surges_and_falls_back_with_the_phases() -> None:
    assert [SC.phase(t) for t in (0, 9.9, 10, 29.9, 30, 59)] == ["warm", "warm", "surge", "surge", "fall", "fall"]
    assert [SC.work(t) for t in (0, 15, 45)] == [1.6, 8.0, 1.6]
    assert SC.initial_replicas == 2 and SC.recommended(8.0) == 10


def test_the_hpa_scales_up_at_once_and_down_only_after_its_window() -> None:
    hpa = Hpa(SC)
    replicas = {t / 2: hpa.desired(t / 2) for t in range(0, 100)}  # asked twice a period
    assert replicas[0] == 2 and replicas[9.5] == 2
    assert replicas[10] == 10  # the surge: at once
    assert replicas[30] == replicas[39] == 10  # the fall: the window still holds the surge's recommendations
    assert replicas[40] == 2  # the window holds only the fall's now


def test_replicas_share_the_demand_up_to_their_limit() -> None:
    assert pod_usage(8.0, 4, 2.0) == 2.0
    assert pod_usage(8.0, 10, 2.0) == 0.8
    assert pod_usage(1.0, 3, 2.0) == 0.333
    assert pod_usage(8.0, 0, 2.0) == 0.0
    assert usage_annotation(0.8, "512Mi") == "cpu=800m,memory=512Mi"


@pytest.mark.parametrize("bad", [{"surge_s": 0}, {"base_work": 40.0}, {"min_replicas": 0}, {"nodes": 0}])
def test_a_bad_scenario_is_refused_naming_the_field(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        Scenario(**bad)  # type: ignore[arg-type]


def test_scaling_moves_the_durations_only_and_the_smoke_run_is_short() -> None:
    assert SC.scaled(2).duration_s == 120 and SC.scaled(2).surge_work == SC.surge_work
    assert Scenario.smoke().duration_s <= 90


def node(name: str, cpu: float, *, added: bool = False, ready: bool = True) -> NodeUsage:
    return NodeUsage(name, cpu, 0.2, added, ready)


def record() -> Record:
    """One static node hot from the surge until a Karpenter node is Ready at t=20; that node removed at t=45."""
    rec = Record("c", SC, threshold=0.65, round_s=5)
    for t in range(0, 60):
        nodes = [node("static", 0.9 if 10 <= t < 20 else 0.4)]
        if 14 <= t < 45:
            nodes.append(node("kwok-1", 0.5 if t < 30 else 0.1, added=True, ready=t >= 20))
        rec.ticks.append(Tick(float(t), tuple(nodes), replicas=0, running=0, pending=0, pod_cpu=0.8))
    rec.nodes = {
        "static": NodeLife(added=False, first_seen=0),
        "kwok-1": NodeLife(added=True, first_seen=14, claimed=12, ready=20, gone=45),
    }
    rec.pods = {
        "early": PodLife(created=0, running=1),
        "waited": PodLife(created=11, running=21),
        "never": PodLife(created=28),  # still pending at the surge's end (t=30) and at the end
        "scaled-in": PodLife(created=12, gone=18),
    }
    return rec


def test_the_figures_of_a_run() -> None:
    f = figures(record())
    assert (f.pending_at_surge_end, f.longest_pending_at_surge_end_s) == (1, 2)
    assert f.longest_pending_s == 32  # "never": from 28 to the run's end, 60
    assert (f.nodes_added, f.first_added_ready_s, f.last_surge_node_ready_s, f.provisioning_s) == (1, 10, 10, 8)
    assert f.hot_node_minutes == pytest.approx(10 / 60)
    assert f.hot_node_minutes_after_ready == 0
    assert (f.nodes_removed_after_fall, f.last_removed_s) == (1, 15)
    assert f.node_hours == pytest.approx((60 + 31) / 3600)
    assert f.added_node_hours == pytest.approx(31 / 3600)
    assert (f.peak_nodes, f.nodes_at_end) == (2, 1)
    assert "| c | 1 (2 s) | 32 s | 1 | 10 s | 8 s |" in table([f])


def test_a_node_hot_after_the_new_nodes_are_ready_counts_against_the_target() -> None:
    rec = record()
    rec.ticks[25] = Tick(25.0, (node("static", 0.7),), 0, 0, 0, 0.8)
    f = figures(rec)
    assert f.hot_node_minutes_after_ready == pytest.approx(1 / 60)


def test_the_targets_compare_c_with_a_of_the_same_run() -> None:
    c = figures(record())
    a_rec = record()
    a_rec.variant = "a"
    a_rec.pods["never"] = PodLife(created=28, running=40)  # (a)'s longest wait: 12 s
    for i, tick in enumerate(a_rec.ticks):  # (a) keeps its added node to the end: more node-hours
        if tick.t >= 45:
            a_rec.ticks[i] = Tick(tick.t, (*tick.nodes, node("kwok-1", 0.1, added=True)), 0, 0, 0, 0.8)
    a = figures(a_rec)
    assert a.longest_pending_s == 12
    met = {v.name: v.met for v in verdicts(c, a, round_s=5)}
    assert met == {
        "longest pending": False,  # 32 s > (a)'s longest wait 12 s + one round 5 s
        "node-minutes above the threshold after the new nodes were Ready": True,
        "node-hours against (a)": False,  # (60 + 31) vs (60 + 46) node-seconds: 14 % fewer
    }


def test_integrate_holds_each_value_until_the_next_tick_and_clips_to_the_window() -> None:
    ticks = [Tick(float(t), (), 0, 0, 0, 0.0) for t in (0, 2, 3)]
    assert integrate(ticks, lambda k: 1.0) == 4.0  # 2 + 1 + the last tick held for one tick length (1)
    assert integrate(ticks, lambda k: k.t, start=1, end=3) == 2.0  # [1,2) at 0, [2,3) at 2


def test_the_pending_target_is_met_within_one_round_of_the_references_wait() -> None:
    c, a = figures(record()), figures(record())
    assert c.longest_pending_s == a.longest_pending_s == 32
    assert next(v for v in verdicts(c, a, round_s=5) if v.name == "longest pending").met
