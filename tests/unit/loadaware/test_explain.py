"""Decision records answer "why this node" and "why still pending" with the inputs the scheduler used."""

from __future__ import annotations

from typing import Any

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.explain import Decision, DecisionLog, render
from crane_scheduler.podinfo import parse_node, parse_pod
from cranectl.__main__ import render_explain
from tests.support.loadaware import NOW, Setup, batch_pod, loaded, replica, with_batch_usage, with_pod_usage
from tests.support.scheduler import node, pod


def decide(s: Setup, raw: dict[str, Any]) -> dict[str, Any]:
    info = parse_pod(raw)
    state: dict[str, Any] = {}
    result = s.algorithm.schedule(s.profile, info, state)
    chosen = result.node if isinstance(result, ScheduleResult) else None
    decision = Decision.from_state(info, NOW, s.table, state, chosen, getattr(result, "message", ""))
    return render(decision, [s.plugin])


def test_why_this_node_shows_every_plugin_score_and_the_load_inputs() -> None:
    s = Setup(loaded("busy", 0.9), loaded("calm", 0.2), loaded("mid", 0.5))
    out = decide(s, pod("p"))
    assert out["result"] == {"node": "calm"}
    best = out["nodes"][0]
    assert best["node"] == "calm" and best["filter"] == "passed"
    assert set(best["scores"]) >= {"Dynamic", "NodeResourcesFit", "NodeResourcesBalancedAllocation"}
    assert best["scores"]["Dynamic"] == 80
    assert best["load"]["metrics"]["cpu_usage_avg_5m"]["annotated"] == 0.2
    busy = next(n for n in out["nodes"] if n["node"] == "busy")
    assert busy["filter"] == {"plugin": "Dynamic", "reason": "node(s) had cpu_usage_avg_5m above 0.65"}
    assert out["rejectedByReason"] == {"node(s) had cpu_usage_avg_5m above 0.65": 1}


def test_explain_shows_the_pods_class_the_batch_usage_taken_out_and_the_estimates_source() -> None:
    peers = {f"ns/web-{i}": (1.5, 2.0**30) for i in range(3)}
    hot = with_pod_usage(with_batch_usage(loaded("hot", 0.8), cpu=0.4, memory=0.4), peers)
    hot["status"]["allocatable"].update({"crane.io/batch-cpu": "8000", "crane.io/batch-memory": "32Gi"})
    s = Setup(hot)
    for i in range(3):
        running = replica("web", i, "2", "1Gi")
        running["spec"]["nodeName"] = "hot"
        s.table.add_pod(parse_pod(running))
    regular = decide(s, replica("web", 3, "2", "1Gi"))
    load = regular["nodes"][0]["load"]
    assert regular["result"] == {"node": "hot"}
    assert load["podClass"] == "regular" and load["metrics"]["cpu_usage_avg_5m"]["batchTakenOut"] == 0.4
    assert load["podEstimate"]["source"] == "learned" and load["podEstimate"]["cpu"] == 1.5
    assert "load: regular pod, estimate 1.5 cores / 1Gi (learned)" in render_explain(regular)
    batch = decide(s, batch_pod("b"))
    load = batch["nodes"][0]["load"]
    assert load["podClass"] == "batch" and load["metrics"]["cpu_usage_avg_5m"]["batchTakenOut"] == 0.0
    assert load["podEstimate"]["source"] == "factor x request"
    assert batch["nodes"][0]["filter"] == {"plugin": "Dynamic", "reason": "node(s) had cpu_usage_avg_5m above 0.65"}


def test_why_still_pending_lists_each_node_with_the_plugin_that_refused_it() -> None:
    s = Setup(loaded("busy", 0.9), node("tiny", cpu="100m"))
    out = decide(s, pod("p", cpu="1"))
    assert out["result"]["pending"].startswith("0/2 nodes are available")
    assert {n["node"]: n["filter"]["plugin"] for n in out["nodes"]} == {"busy": "Dynamic", "tiny": "NodeResourcesFit"}


def test_the_log_keeps_the_latest_decision_of_the_most_recent_pods() -> None:
    log = DecisionLog(size=2)
    for name in ("a", "b", "a", "c"):
        log.add(Decision(f"ns/{name}", name, 0.0, [], [], message=name))
    assert log.get("ns/b") is None
    assert log.get("ns/a") is not None and log.get("ns/c") is not None


def test_cranectl_renders_the_decision_for_a_person() -> None:
    from cranectl.__main__ import render_explain

    s = Setup(loaded("busy", 0.9), loaded("calm", 0.2))
    text = render_explain(decide(s, pod("p")))
    lines = text.splitlines()
    assert lines[0] == "ns/p: scheduled to calm"
    assert lines[2].split()[:3] == ["calm", "total", str(decide(s, pod("q"))["nodes"][0]["total"])]
    assert "busy" in lines[3] and "refused by Dynamic: node(s) had cpu_usage_avg_5m above 0.65" in lines[3]
    assert "cpu_usage_avg_5m=0.20" in lines[2]


def test_decisions_share_the_node_snapshot_until_a_node_changes() -> None:
    s = Setup(loaded("a", 0.1), loaded("b", 0.2))
    log = DecisionLog()
    for name in ("p1", "p2"):
        log.record(parse_pod(pod(name)), NOW, s.table, {}, None, "")
    first, second = log.get("ns/p1"), log.get("ns/p2")
    assert first is not None and second is not None and first.nodes is second.nodes
    s.table.upsert_node(parse_node(loaded("c", 0.3)))
    log.record(parse_pod(pod("p3")), NOW, s.table, {}, None, "")
    third = log.get("ns/p3")
    assert third is not None and third.nodes is not first.nodes and "c" in third.names


def test_explain_shows_the_packing_strategy_and_the_pack_score(tmp_path: Any) -> None:
    import yaml

    from crane_shared.policy import default_policy, dump_policy
    from tests.support.policy import write_policy

    spec = yaml.safe_load(dump_policy(default_policy()))["spec"]
    spec["scoring"] = {"strategy": "pack", "targetUtilization": 0.6}
    path = write_policy(tmp_path / "policy.yaml", spec)
    s = Setup(loaded("fuller", 0.5, hot=0), loaded("emptier", 0.1, hot=0), args={"policyConfigPath": str(path)})
    out = decide(s, pod("p"))
    assert out["result"] == {"node": "fuller"}
    fuller = next(n for n in out["nodes"] if n["node"] == "fuller")
    assert fuller["load"]["scoring"].startswith("pack toward 0.6")
    assert fuller["scores"]["Dynamic"] == fuller["load"]["dynamicScore"] == 93
    assert "load score: pack toward 0.6" in render_explain(out)


def test_explain_says_a_node_without_load_data_is_judged_by_its_recent_bindings(tmp_path: Any) -> None:
    from tests.support.policy import default_policy_with

    path = default_policy_with(tmp_path / "policy.yaml", newNodes={"estimate": True})
    s = Setup(node("new", cpu="8"), args={"estimate": {"cpuFactor": 1.0}, "policyConfigPath": str(path)})
    assert "judgedBy" not in decide(s, pod("first", cpu="500m"))["nodes"][0]["load"]["metrics"]["cpu_usage_avg_5m"]
    for i in range(3):
        assert s.place(pod(f"p{i}", cpu="500m")) == "new"
    out = decide(s, pod("next", cpu="500m"))
    metric = out["nodes"][0]["load"]["metrics"]["cpu_usage_avg_5m"]
    assert metric["state"] == "missing" and metric["usage"] == 3 * 0.0625
    assert metric["judgedBy"] == "missing: judged by 3 recent bindings' estimates (none absorbed)"
    assert "judged by 3 recent bindings' estimates" in render_explain(out)
