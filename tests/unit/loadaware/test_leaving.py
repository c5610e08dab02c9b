"""Preemption that sees real load (``loadaware/leaving.py``): the victims' measured usage and estimates leave their
node in Dynamic's what-if and once gone, exactly the needed victims go, and a refusal says when it could lift
(``loadaware/lift.py``)."""

from __future__ import annotations

import copy
import math
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from crane_scheduler.framework import Diagnosis
from crane_scheduler.loadaware.leaving import Leaving, preempted, share, started, taken_out
from crane_scheduler.loadaware.lift import next_change, retry_after
from crane_scheduler.plugins.defaultpreemption.evaluator import dry_run
from crane_scheduler.plugins.defaultpreemption.plugin import DefaultPreemption
from crane_scheduler.podinfo import PodInfo, parse_pod
from crane_shared.annotations import encode_usage
from crane_shared.batch import POD_USAGE_KEY, PodUsage, encode_pod_usage
from tests.support.loadaware import NOW, Setup
from tests.support.policy import UPSTREAM_METRICS
from tests.support.scheduler import node, pod

STAMP = datetime.fromtimestamp(NOW - 10, UTC)
HOT = "node(s) had cpu_usage_avg_5m above 0.65"


def annotated(name: str, cpu: float, memory: float = 0.2, usage: dict[str, PodUsage] | None = None) -> dict[str, Any]:
    """A 4-core node whose cpu metrics read ``cpu`` and memory metrics ``memory``, with its pods' usage."""
    n = node(name, cpu="4", memory="16Gi")
    notes = {m: encode_usage(cpu if m.startswith("cpu") else memory, STAMP) for m in UPSTREAM_METRICS}
    if usage is not None:
        notes[POD_USAGE_KEY] = encode_pod_usage(usage, STAMP)
    n["metadata"]["annotations"] = notes
    return n


def low(name: str, node_name: str, priority: int = 1, cpu: str = "1") -> dict[str, Any]:
    return pod(name, cpu=cpu, priority=priority, node_name=node_name)


def setup(*nodes: dict[str, Any], bound: list[dict[str, Any]] = (), **args: Any) -> Setup:  # type: ignore[assignment]
    s = Setup(*nodes, args=args or None)
    for raw in bound:
        s.table.add_pod(parse_pod(raw))
    return s


def preemption(s: Setup) -> DefaultPreemption:
    plugin = s.profile.plugins["DefaultPreemption"]
    assert isinstance(plugin, DefaultPreemption)
    return plugin


def attempt(s: Setup, raw: dict[str, Any]) -> tuple[Diagnosis, PodInfo]:
    """One scheduling attempt that finds no node, its PostFilter (preemption) run."""
    info = parse_pod(raw)
    state: dict[str, Any] = {}
    result = s.algorithm.schedule(s.profile, info, state)
    assert isinstance(result, Diagnosis), result
    s.profile.run_post_filter(state, info, result)
    return result, info


def both_dry_runs(s: Setup, info: PodInfo) -> list[list[tuple[str, list[str]]]]:
    """The dry run with the reprieve as arithmetic and as filter rounds: (node, victims) per candidate."""
    plugin = preemption(s)
    per_node, reprieve = plugin._dry_run_mode(s.profile, info)
    assert not per_node and reprieve is not None and reprieve.load == (s.plugin,)

    def run(st: dict[str, Any], p: PodInfo, alive: Any, /, *, with_nominated: bool = True) -> Any:
        return s.profile.run_prefilter_and_filter(st, p, s.table, alive, with_nominated=with_nominated)

    out = []
    for mode in (reprieve, None):
        got = dry_run(s.table, info, s.table.live.copy(), run, [], 0, 100, NOW, reprieve=mode)
        out.append([(c.node, [v.name for v in c.victims]) for c in got.candidates])
        assert not s.plugin.leaving.what_if  # the what-if was undone
    return out


# -- pure parts ------------------------------------------------------------------------------------------------------


def test_share_is_the_part_of_the_window_the_pod_ran_in() -> None:
    assert share(1000, 300, -math.inf, math.inf) == 1.0  # there all along, still there
    assert share(1000, 300, 940, math.inf) == pytest.approx(0.2)  # started a minute before the stamp
    assert share(1000, 300, -math.inf, 1000) == 1.0  # left after the stamp: all of it still in the average
    assert share(1090, 300, -math.inf, 1000) == pytest.approx(0.7)  # left 90 s before the stamp
    assert share(1300, 300, -math.inf, 1000) == 0.0  # the window moved past it
    assert share(1000, 0, -math.inf, math.inf) == 1.0 and share(1000, 0, -math.inf, 999) == 0.0


def test_taken_out_sums_in_pod_order_as_a_fraction_of_the_node() -> None:
    a = Leaving(2, -math.inf, math.inf, 1.0, 2e9)
    b = Leaving(1, -math.inf, math.inf, 0.5, 0.0)
    assert taken_out([a, b], "cpu", 1000, 300, 4.0) == taken_out([b, a], "cpu", 1000, 300, 4.0) == 0.375
    assert taken_out([a, b], "memory", 1000, 300, 8e9) == 0.25
    assert taken_out([a], "cpu", math.nan, 300, 4.0) == 0.0  # no annotation: nothing to take out of


def test_a_victim_is_known_by_kubes_disruption_target_condition() -> None:
    cond = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    assert preempted({"status": {"conditions": [cond]}})
    assert not preempted({"status": {"conditions": [{**cond, "reason": "EvictionByEvictionAPI"}]}})
    assert not preempted({"status": {}}) and not preempted(None)
    assert (
        started({"status": {"startTime": "2027-01-15T08:00:00Z"}}) == datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()
    )
    assert started({"status": {}}) == -math.inf and started({"status": {"startTime": "soon"}}) == -math.inf


def test_next_change_is_the_first_freshness_edge_or_binding_leaving_the_estimate() -> None:
    stamps = {"cpu": np.array([100.0, np.nan, 50.0])}
    windows = {"cpu": 480.0}
    # edges: 100 - 30 (past), 580, 530; oldest bindings 120 + 300
    assert next_change(stamps, windows, 30.0, np.array([120.0]), 300.0, now=200.0) == 420.0
    assert next_change(stamps, windows, 30.0, np.array([]), 300.0, now=200.0) == 530.0
    assert next_change({"cpu": np.array([np.nan])}, windows, 30.0, np.array([]), 300.0, now=200.0) == math.inf
    assert retry_after(math.inf, 5.0) is None and retry_after(7.0, 5.0) == 2.0 and retry_after(4.0, 5.0) == 0.0


# -- in a profile with DefaultPreemption -----------------------------------------------------------------------------


def hot_by_low_priority_pods() -> Setup:
    """Node ``a`` reads cpu 0.80 because of ``big`` (2 cores measured) and ``small`` (0.2 cores); the pods fit by
    requests, so only load keeps ``vip`` out. Node ``b`` reads the same with nothing measured."""
    usage = {"ns/big": PodUsage(2.0, 1e9), "ns/small": PodUsage(0.2, 1e8)}
    return setup(
        annotated("a", 0.80, usage=usage),
        annotated("b", 0.80),
        bound=[low("big", "a"), low("small", "a", priority=2), low("other", "b")],
    )


def test_the_victims_measured_usage_leaves_the_node_and_exactly_the_needed_victim_goes() -> None:
    s = hot_by_low_priority_pods()
    vip = pod("vip", cpu="2", priority=100)
    # a: 0.80 - 0.50 - 0.05 = 0.25; vip's estimate 0.6 x 2 / 4 = 0.30. small (more important) comes back: 0.60 fits;
    # big does not: 0.85. b: nothing measured, still 0.80.
    assert both_dry_runs(s, parse_pod(vip)) == [[("a", ["big"])], [("a", ["big"])]]
    diagnosis, info = attempt(s, vip)
    assert diagnosis.message == f"0/2 nodes are available: 2 {HOT}."
    assert s.table.nominated[info.uid][1] == "a"


def test_a_node_hot_through_unmeasured_pods_stays_hot_and_the_pod_waits_for_its_time() -> None:
    s = setup(annotated("b", 0.80), bound=[low("other", "b")])
    diagnosis, info = attempt(s, pod("vip", cpu="2", priority=100))
    assert diagnosis.post_filter_msg == f"preemption: 0/1 nodes are available: 1 {HOT}."
    assert info.uid not in s.table.nominated
    assert "Dynamic" in diagnosis.rejectors
    # the cpu_usage_avg_5m annotation (3m period) turns stale 8 minutes after its stamp, 10 s ago: 470 s
    assert diagnosis.retry_after == pytest.approx(470)


def test_the_refusals_instant_is_computed_only_for_an_attempt_that_fails_and_once() -> None:
    """Placed on a cool node, a pod does not pay for the hot nodes' retry instant; refused everywhere, it gets the
    same instant as before (computed once for all of Filter's reasons)."""
    s = setup(annotated("hot", 0.80), annotated("full", 0.10, memory=0.90), annotated("cool", 0.10))
    computed = []
    eager = s.plugin._retry_after

    def counted(*args: Any) -> float | None:
        computed.append(args)
        return eager(*args)

    s.plugin._retry_after = counted  # type: ignore[method-assign,assignment]
    assert s.place(pod("p", cpu="100m")) == "cool" and computed == []
    s.table.remove_node("cool")
    diagnosis = s.place(pod("q", cpu="100m"))
    assert isinstance(diagnosis, Diagnosis) and len(diagnosis.reasons) == 2  # two rejections: cpu, memory
    assert len(computed) == 1 and diagnosis.retry_after == pytest.approx(470)


def test_a_gone_victim_keeps_its_usage_out_so_the_preemptor_binds_and_preempts_no_more() -> None:
    s = hot_by_low_priority_pods()
    vip = pod("vip", cpu="2", priority=100)
    assert s.place(vip) != "a"  # refused before
    big = next(r for r in s.table.pods.values() if r.name == "big")
    assert big.pod is not None
    terminating = copy.deepcopy(big.pod.raw)
    terminating["status"] = {
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    }
    s.table.add_pod(parse_pod(terminating))  # the informer sees the condition, then the deletion
    s.table.remove_pod(big.uid)
    a = s.table.nodes[s.table.rows["a"]]
    assert a is not None
    explained = s.plugin.explain_node(a, NOW)
    assert (explained["preemptionVictimsGone"], explained["filter"]) == (1, "passed")  # explain says what Filter does
    assert s.place(vip) == "a"


def test_a_pod_that_leaves_without_being_preempted_leaves_with_the_annotator() -> None:
    s = hot_by_low_priority_pods()
    big = next(r for r in s.table.pods.values() if r.name == "big")
    s.table.remove_pod(big.uid)
    result = s.place(pod("vip", cpu="2", priority=100))
    assert isinstance(result, Diagnosis) and HOT in result.message


def test_recent_low_priority_bindings_estimates_leave_in_the_what_if() -> None:
    """Node ``a`` is hot only by the estimates of two low-priority pods this scheduler just bound."""
    s = setup(annotated("a", 0.18))
    for name in ("l1", "l2"):
        assert s.place(low(name, "", cpu="1")) == "a"  # +0.15 each: 0.48
    vip = pod("vip", cpu="2", priority=100)
    # without both 0.18 + 0.30 = 0.48; l1 back: 0.63 fits; l2 back: 0.78 does not
    assert both_dry_runs(s, parse_pod(vip)) == [[("a", ["l2"])], [("a", ["l2"])]]
    refused = s.place(vip)
    assert isinstance(refused, Diagnosis)
    assert refused.retry_after == pytest.approx(300)  # the bindings leave the estimate after 5 minutes


def test_a_malformed_pod_usage_annotation_is_skipped_counted_and_logged_once() -> None:
    bad = annotated("a", 0.80)
    bad["metadata"]["annotations"][POD_USAGE_KEY] = '{"t": "now"'
    s = setup(bad, bound=[low("big", "a")])
    with capture_logs() as logs:
        for name in ("vip", "vip2"):
            diagnosis, _ = attempt(s, pod(name, cpu="2", priority=100))
            assert diagnosis.post_filter_msg == f"preemption: 0/1 nodes are available: 1 {HOT}."
    assert [e["event"] for e in logs].count(
        "malformed pod-usage annotation skipped: its pods count as not measured"
    ) == 1
    counted = s.plugin.metrics.malformed.labels(POD_USAGE_KEY)._value.get()
    assert counted == 1  # one text, decoded once


def _random_load(seed: int) -> tuple[Setup, PodInfo]:
    """Nodes at random load with random measured pods of random priorities, some not measured; a preemptor."""
    import random

    rng = random.Random(seed)
    nodes, bound = [], []
    for i in range(rng.randint(2, 6)):
        usage: dict[str, PodUsage] = {}
        for j in range(rng.randint(1, 4)):
            name = f"p{i}-{j}"
            bound.append(low(name, f"n{i}", priority=rng.choice([1, 2, 5]), cpu=rng.choice(["300m", "1"])))
            if rng.random() < 0.8:
                usage[f"ns/{name}"] = PodUsage(rng.uniform(0.0, 1.5), rng.uniform(0, 4e9))
        nodes.append(annotated(f"n{i}", rng.uniform(0.3, 0.95), rng.uniform(0.1, 0.7), usage if usage else None))
    s = setup(*nodes, bound=bound)
    return s, parse_pod(pod("vip", cpu=rng.choice(["500m", "1", "2"]), priority=100))


@pytest.mark.parametrize("seed", range(60))
def test_the_arithmetic_reprieve_with_load_finds_what_the_filter_rounds_and_node_by_node_find(seed: int) -> None:
    s, vip = _random_load(seed)
    plugin = preemption(s)
    _, reprieve = plugin._dry_run_mode(s.profile, vip)

    def run(st: dict[str, Any], p: PodInfo, alive: Any, /, *, with_nominated: bool = True) -> Any:
        return s.profile.run_prefilter_and_filter(st, p, s.table, alive, with_nominated=with_nominated)

    found = []
    for mode, per_node in ((reprieve, False), (None, False), (None, True)):
        got = dry_run(s.table, vip, s.table.live.copy(), run, [], 0, 100, NOW, reprieve=mode, per_node=per_node)
        found.append(([(c.node, sorted(v.name for v in c.victims)) for c in got.candidates], dict(got.statuses)))
        assert not s.plugin.leaving.what_if and not s.plugin.leaving.changed - set(range(s.table.n_rows))
    assert found[0] == found[1] == found[2]


def test_a_gone_victim_is_forgotten_once_no_fresh_annotation_can_hold_it() -> None:
    s = hot_by_low_priority_pods()
    leaving = s.plugin.leaving
    leaving.depart(s.table.rows["a"], "gone", Leaving(1, -math.inf, NOW, 2.0, 0.0))
    leaving.prune(NOW + leaving.horizon)
    assert leaving.departed  # an annotation stamped just after the departure may still be fresh and hold it
    leaving.prune(NOW + leaving.horizon + 1)
    assert not leaving.departed and not leaving.counted


def test_a_pod_refused_by_load_only_in_preemptions_what_if_waits_for_dynamics_events_and_time() -> None:
    """The issue's case: Filter says "Insufficient cpu" (NodeResourcesFit refuses first), preemption's dry run
    finds the node hot without the victims too: Dynamic joins the rejectors, with the time its refusal could lift,
    so the pod is not left to the 5-minute flush."""
    s = setup(annotated("a", 0.80), bound=[low(f"l{i}", "a", cpu="1") for i in range(4)])
    diagnosis, _ = attempt(s, pod("vip", cpu="1", priority=100))
    assert diagnosis.reasons == {"Insufficient cpu": 1}
    assert diagnosis.post_filter_msg.endswith(f"preemption: 0/1 nodes are available: 1 {HOT}.")
    assert {"NodeResourcesFit", "Dynamic"} <= diagnosis.rejectors
    assert diagnosis.retry_after == pytest.approx(470)
