"""The Dynamic plugin in the scheduling framework: placements a user would check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from crane_scheduler.config import ConfigError
from crane_scheduler.framework import ArgsError, ClusterChange, ClusterEvent, Diagnosis, QueueingHint
from crane_scheduler.loadaware import plugin as dynamic_plugin
from crane_scheduler.loadaware.args import parse_args
from crane_scheduler.loadaware.plugin import Dynamic
from crane_scheduler.podinfo import parse_pod
from crane_scheduler.simulate import Simulator
from crane_shared.policy import default_policy, dump_policy
from tests.support.loadaware import NOW, Setup, loaded
from tests.support.policy import default_policy_with, write_policy
from tests.support.scheduler import node, pod


def test_a_node_whose_real_load_is_above_threshold_is_avoided_though_its_requests_are_free() -> None:
    s = Setup(loaded("busy", 0.9), loaded("calm", 0.3, cpu="4"))
    assert s.place(pod(cpu="1")) == "calm"


def test_fit_error_groups_the_load_reason() -> None:
    s = Setup(loaded("a", 0.9), loaded("b", 0.8), node("small", cpu="100m"))
    result = s.place(pod(cpu="1"))
    assert isinstance(result, Diagnosis)
    assert result.message == ("0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had cpu_usage_avg_5m above 0.65.")


def test_the_least_loaded_node_wins_the_score() -> None:
    s = Setup(loaded("a", 0.5), loaded("b", 0.1), loaded("c", 0.3))
    assert s.place(pod()) == "b"


def test_daemonset_pods_ignore_load() -> None:
    s = Setup(loaded("busy", 0.95))
    ds = pod()
    ds["metadata"]["ownerReferences"] = [
        {"kind": "DaemonSet", "name": "ds", "controller": True, "uid": "x", "apiVersion": "apps/v1"}
    ]
    assert s.place(ds) == "busy"


def test_a_burst_spreads_because_own_bindings_count_at_decision_time() -> None:
    nodes = [loaded(f"n{i}", 0.2 + i * 0.01, hot=0) for i in range(10)]
    s = Setup(*nodes)
    placed = [s.place(pod(f"p{i}", cpu="100m")) for i in range(30)]
    counts = {n: placed.count(n) for n in set(map(str, placed))}
    assert max(counts.values()) <= 2 * 30 / 10, counts


def test_without_own_bindings_a_burst_piles_onto_the_idlest_node() -> None:
    nodes = [loaded(f"n{i}", 0.2 + i * 0.01, hot=0) for i in range(10)]
    s = Setup(*nodes, args={"ownBindingsInHotValue": False, "estimate": {"enabled": False}})
    placed = [s.place(pod(f"p{i}", cpu="100m")) for i in range(30)]
    # upstream's behaviour with a stale hot value: only the request-based plugins push back a little
    assert placed.count("n0") > 2 * 30 / 10


def test_estimated_usage_of_just_bound_pods_stops_overfilling_a_node() -> None:
    s = Setup(
        loaded("a", 0.50, cpu="10"),
        loaded("b", 0.52, cpu="10"),
        args={"estimate": {"cpuFactor": 1.0}, "ownBindingsInHotValue": False},
    )
    assert s.place(pod("p1", cpu="1")) == "a"
    # a now carries 0.50 + 0.1 estimated; this pod's own 0.1 would push it over 0.65: b takes it
    assert s.place(pod("p2", cpu="1")) == "b"
    third = s.place(pod("p3", cpu="1"))
    assert isinstance(third, Diagnosis)
    assert third.message == "0/2 nodes are available: 2 node(s) would have cpu_usage_avg_5m above 0.65."


def test_unreserve_forgets_the_binding() -> None:
    s = Setup(loaded("a", 0.1), loaded("b", 0.1))
    info = parse_pod(pod("p"))
    s.plugin.reserve({}, info, "a")
    assert len(s.plugin.recent_on("a")) == 1
    s.plugin.unreserve({}, info, "a")
    assert s.plugin.recent_on("a") == []


def test_malformed_annotations_are_skipped_and_counted() -> None:
    bad = loaded("bad", 0.1)
    bad["metadata"]["annotations"]["cpu_usage_avg_5m"] = "NaN,2026-01-01T00:00:00+00:00"
    s = Setup(bad)
    assert s.place(pod()) == "bad"
    assert s.plugin.metrics.malformed.labels("cpu_usage_avg_5m")._value.get() == 1


def test_policy_reload_applies_a_valid_file_and_refuses_an_invalid_one(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    text = (Path(dynamic_plugin.__file__).parents[3].parent / "shared/crane_shared/default-policy.yaml").read_text()
    path.write_text(text)
    s = Setup(loaded("a", 0.70), args={"policyConfigPath": str(path)})
    assert isinstance(s.place(pod("p1")), Diagnosis)  # 0.70 > 0.65
    path.write_text(text.replace("0.65", "0.8"))
    s.plugin._next_reload_check = 0
    assert s.place(pod("p2")) == "a"
    path.write_text(text.replace("count: 5", "count: 0"))
    s.plugin._next_reload_check = 0
    assert s.place(pod("p3")) == "a"  # invalid file refused: the 0.8 policy stays
    assert s.plugin.args.policy.predicate[0].max_limit_percent == 0.8


def test_the_loaded_policys_thresholds_are_exported_and_follow_a_reload(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    text = (Path(dynamic_plugin.__file__).parents[3].parent / "shared/crane_shared/default-policy.yaml").read_text()
    path.write_text(text)
    s = Setup(loaded("a", 0.1), args={"policyConfigPath": str(path)})
    registry = s.plugin.handle.metrics.registry

    def thresholds() -> dict[str, float]:
        return {
            sample.labels["metric"]: sample.value
            for family in registry.collect()
            if family.name == "crane_scheduler_dynamic_policy_threshold"
            for sample in family.samples
        }

    want = {"cpu_usage_avg_5m": 0.65, "cpu_usage_max_avg_1h": 0.75, "mem_usage_avg_5m": 0.65}
    assert thresholds() == want | {"mem_usage_max_avg_1h": 0.75}
    # a new file: one limit moved, one disabled (0: no series, the panel must not count nodes against it)
    path.write_text(text.replace("maxLimitPecent: 0.65", "maxLimitPecent: 0.8", 1).replace("0.75\n", "0\n", 2))
    s.plugin._next_reload_check = 0
    s.place(pod("p1"))
    assert thresholds() == {"cpu_usage_avg_5m": 0.8, "mem_usage_avg_5m": 0.65}
    path.write_text(text.replace("count: 5", "count: 0"))  # invalid: refused, the gauge keeps the policy in force
    s.plugin._next_reload_check = 0
    s.place(pod("p2"))
    assert thresholds() == {"cpu_usage_avg_5m": 0.8, "mem_usage_avg_5m": 0.65}


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ({"staleData": "sometimes"}, "staleData"),
        ({"estimate": {"cpuFactor": -1}}, "estimate.cpuFactor"),
        ({"estimate": {"window": "1d"}}, "estimate.window"),
        ({"legacyTimeZone": "Mars/Base"}, "legacyTimeZone"),
        ({"policyConfigPth": "/x"}, "policyConfigPth"),
    ],
)
def test_bad_args_name_the_field(args: dict[str, Any], path: str) -> None:
    with pytest.raises(ArgsError) as err:
        parse_args(args)
    assert path in [p for p, _ in err.value.problems]


def test_every_profile_has_its_own_view_of_node_load() -> None:
    sim = Simulator({"profiles": [{"schedulerName": "a"}, {"schedulerName": "b"}]}, clock=lambda: NOW)
    sim.add(loaded("busy", 0.9), kind="Node")
    for name in ("a", "b"):
        dynamic = sim.plugin("Dynamic", name)
        assert isinstance(dynamic, Dynamic)
        [rejection] = dynamic.filter({}, parse_pod(pod()), sim.table)
        assert rejection.reason == "node(s) had cpu_usage_avg_5m above 0.65"


def test_a_missing_or_invalid_policy_file_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    bad = write_policy(tmp_path / "policy.yaml", {"hotValue": [{"timeRange": "5m", "count": 0}]})
    for path in (str(tmp_path / "missing.yaml"), str(bad)):
        with pytest.raises(ConfigError) as err:
            Setup(args={"policyConfigPath": path})
        assert "profiles[0].pluginConfig[0].args.policyConfigPath: " in str(err.value)


def test_daemonset_pods_skip_the_dynamic_score_as_they_skip_the_filter() -> None:
    s = Setup(loaded("idle", 0.05), loaded("busy", 0.6), loaded("hot", 0.3, hot=4))
    rows = np.arange(s.table.n_rows, dtype=np.intp)
    ds = pod("ds")
    ds["metadata"]["ownerReferences"] = [
        {"kind": "DaemonSet", "name": "ds", "controller": True, "uid": "x", "apiVersion": "apps/v1"}
    ]
    assert len(set(s.plugin.score({}, parse_pod(pod()), s.table, rows).tolist())) > 1
    assert s.plugin.score({}, parse_pod(ds), s.table, rows).tolist() == [0] * len(rows)


def test_pack_fills_the_fullest_nodes_toward_the_target_and_leaves_the_emptiest_empty(tmp_path: Path) -> None:
    spec = yaml.safe_load(dump_policy(default_policy()))["spec"]
    spec["scoring"] = {"strategy": "pack", "targetUtilization": 0.6}
    path = write_policy(tmp_path / "policy.yaml", spec)
    nodes = (loaded("a", 0.5, hot=0), loaded("b", 0.3, hot=0), loaded("empty", 0.0, hot=0))
    spread = Setup(*nodes)
    assert spread.place(pod("first", cpu="1")) == "empty"
    pack = Setup(*nodes, args={"policyConfigPath": str(path)})
    # each pod adds 0.6 x 1/16 to its node's estimate (and counts its own share in the score): a reaches the
    # target after 2, b after 8; the empty node is not touched meanwhile, though the request-based plugins prefer it
    placed = [pack.place(pod(f"p{i}", cpu="1")) for i in range(10)]
    assert placed.count("empty") == 0, placed
    assert placed.count("a") == 2 and placed.count("b") == 8, placed


def test_a_device_asked_as_an_extended_resource_or_through_a_claim_is_judged_the_same() -> None:
    # DRA's extended resources (1.37): ``example.com/gpu: 1`` in a container's requests is a claim the scheduler makes;
    # Dynamic judges the pod by its cpu and memory whichever way it asks for the device: same refusals, same scores,
    # same estimate left on the node it is placed on
    nodes = [loaded("hot", 0.9), loaded("warm", 0.5, cpu="8"), loaded("cool", 0.2)]
    seen = []
    for way in ("extended resource", "claim"):
        s = Setup(*nodes)
        trainers = []
        for i in range(3):
            raw = pod(f"trainer-{i}", cpu="2", memory="4Gi")
            if way == "extended resource":
                raw["spec"]["containers"][0]["resources"]["requests"]["example.com/gpu"] = "1"
                raw["spec"]["containers"][0]["resources"]["limits"] = {"example.com/gpu": "1"}
            else:
                raw["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"gpu-{i}"}]
            trainers.append(parse_pod(raw))
        verdicts = []
        rows = np.arange(len(nodes), dtype=np.intp)
        for info in trainers:
            refused = {r.reason: r.mask[: len(nodes)].tolist() for r in s.plugin.filter({}, info, s.table)}
            scores = s.plugin.score({}, info, s.table, rows).tolist()
            verdicts.append((refused, scores, s.plugin.estimate_of(info, NOW)))
            best = max((sc, -i) for i, sc in enumerate(scores) if not any(m[i] for m in refused.values()))
            node_name = nodes[-best[1]]["metadata"]["name"]
            s.plugin.reserve({}, info, node_name)
            s.table.assume(info, node_name)
        seen.append(verdicts)
    assert seen[0] == seen[1]
    refused, scores, _ = seen[0][0]
    assert any(mask == [True, False, False] for mask in refused.values()), refused  # the hot node refused
    assert scores[2] > scores[1]  # the cool node preferred


def new_nodes_by_estimates(tmp_path: Path) -> dict[str, Any]:
    """Dynamic's args: the default policy with ``newNodes.estimate`` on, a factor of 1 (0.5 core / 8 = 0.0625)."""
    path = default_policy_with(tmp_path / "policy.yaml", newNodes={"estimate": True})
    return {"estimate": {"cpuFactor": 1.0}, "policyConfigPath": str(path)}


def test_a_node_without_load_data_fills_by_the_estimates_of_the_pods_bound_to_it(tmp_path: Path) -> None:
    """An autoscaler's new node (no annotation yet) beside a hot one: it takes pods until their estimates
    (1.0 x 0.5 core / 8 each) reach the threshold, not its whole capacity by requests (16)."""
    s = Setup(loaded("hot", 0.9), node("new", cpu="8"), args=new_nodes_by_estimates(tmp_path))
    placed = [s.place(pod(f"p{i}", cpu="500m")) for i in range(12)]
    assert placed[:10] == ["new"] * 10  # 10 x 0.0625 = 0.625; the 11th would make 0.6875
    refused = placed[10]
    assert isinstance(refused, Diagnosis)
    assert refused.message == (
        "0/2 nodes are available: 1 node(s) had cpu_usage_avg_5m above 0.65,"
        " 1 node(s) would have cpu_usage_avg_5m above 0.65."
    )


def test_without_the_opt_in_a_node_without_load_data_takes_pods_up_to_its_requests_as_upstream() -> None:
    s = Setup(loaded("hot", 0.9), node("new", cpu="8"), args={"estimate": {"cpuFactor": 1.0}})
    placed = [s.place(pod(f"p{i}", cpu="500m")) for i in range(17)]
    assert placed[:16] == ["new"] * 16  # fail-open: the requests (8 cores) are the only bound
    assert isinstance(placed[16], Diagnosis)


def test_a_deleted_or_terminal_pods_estimate_leaves_a_new_node_at_once(tmp_path: Path) -> None:
    """The pods bound to a new node are deleted (or finish): it takes pods again at once, not 5 minutes later when
    their estimates would have left the window (a gang whose predecessor was just deleted waited that long)."""
    s = Setup(node("new", cpu="8"), args=new_nodes_by_estimates(tmp_path))
    pods = [pod(f"p{i}", cpu="500m") for i in range(10)]
    assert [s.place(p) for p in pods] == ["new"] * 10
    assert isinstance(s.place(pod("next", cpu="500m")), Diagnosis)
    s.sim.delete({**pods[0], "spec": {**pods[0]["spec"], "nodeName": "new"}}, "Pod")
    finished = {**pods[1], "spec": {**pods[1]["spec"], "nodeName": "new"}, "status": {"phase": "Succeeded"}}
    s.sim.update(finished, "Pod")  # terminal: gone from the accounting, as the pod watch's selector drops it
    hint = s.plugin.queueing_hints()[ClusterEvent.POD_DELETE]
    waiting = parse_pod(pod("next", cpu="500m"))
    bound = parse_pod({**pods[0], "spec": {**pods[0]["spec"], "nodeName": "new"}})
    ours = ClusterChange(ClusterEvent.POD_DELETE, bound)
    other = ClusterChange(ClusterEvent.POD_DELETE, parse_pod({**pod("theirs"), "spec": {"nodeName": "new"}}))
    assert (hint(waiting, ours), hint(waiting, other)) == (QueueingHint.QUEUE, QueueingHint.SKIP)  # retried at once
    assert [s.place(pod(f"again{i}", cpu="500m")) for i in range(2)] == ["new", "new"]
    assert isinstance(s.place(pod("full", cpu="500m")), Diagnosis)
    bindings = s.plugin.recent_on("new")
    assert (len(bindings), sum(b.left for b in bindings)) == (12, 2)  # still in the hot value
