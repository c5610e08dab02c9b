"""``cranectl nodes``: one row per node with what the load-aware scheduler sees."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from crane_shared.policy import default_policy
from crane_shared.reclaimpolicy import ReclaimPolicy
from cranectl.nodes import node_rows, render

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def stamp(age_s: int) -> str:
    return (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def node(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
    }


def pod(node: str, cpu: str, memory: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
        "status": {"phase": phase},
    }


def test_rows_show_usage_against_thresholds_requests_hot_value_and_age() -> None:
    policy = default_policy()
    nodes = [
        node(
            "b-hot",
            {
                "cpu_usage_avg_5m": f"0.80000,{stamp(30)}",
                "mem_usage_avg_5m": f"0.20000,{stamp(10)}",
                "node_hot_value": f"3,{stamp(5)}",
            },
        ),
        node("a-stale", {"cpu_usage_avg_5m": f"0.10000,{stamp(3600)}", "mem_usage_avg_5m": "garbage"}),
    ]
    pods = [pod("b-hot", "500m", "1Gi"), pod("b-hot", "1", "1Gi"), pod("b-hot", "4", "4Gi", phase="Succeeded")]
    rows = node_rows(nodes, pods, policy, NOW)
    assert [r.name for r in rows] == ["a-stale", "b-hot"]
    stale, hot = rows
    assert hot.usage["cpu_usage_avg_5m"] == "0.80!"  # above the default 0.65 threshold
    assert hot.usage["mem_usage_avg_5m"] == "0.20"
    assert hot.usage["cpu_usage_max_avg_1h"] == "-"  # not annotated yet
    assert (hot.cpu_requested, hot.mem_requested) == (1.5, 2 * 1024**3)  # the finished pod frees its requests
    assert (hot.hot, hot.age) == ("3", "30s")
    assert stale.usage["cpu_usage_avg_5m"] == "0.10?"  # older than its sync period plus the grace
    assert stale.usage["mem_usage_avg_5m"] == "?"
    assert (stale.cpu_requested, stale.hot) == (0.0, "-")
    text = render(rows, policy)
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["NODE", "cpu_usage_avg_5m"]
    assert lines[2].startswith("b-hot") and "1.5/8" in lines[2] and "2.0/32Gi" in lines[2]
    assert "above threshold" in lines[-1]


def test_cranectl_does_not_import_the_sandbox() -> None:
    import subprocess
    import sys

    code = "import sys, cranectl.__main__, cranectl.nodes; print([m for m in sys.modules if 'sandbox' in m])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_batch_columns_show_what_the_node_lends_and_what_batch_pods_request_and_use() -> None:
    policy = dataclasses.replace(default_policy(), reclaim=ReclaimPolicy())
    lending = node("lending", {"crane.io/batch-cpu-usage": f"0.10000,{stamp(5)}"})
    lending["status"]["allocatable"] |= {"crane.io/batch-cpu": "2500", "crane.io/batch-memory": str(8 * 1024**3)}
    batch_pod = pod("lending", "0", "0")
    batch_pod["spec"]["containers"][0]["resources"]["requests"] |= {"crane.io/batch-cpu": "1500"}
    rows = node_rows([lending, node("plain", {})], [batch_pod], policy, NOW)
    assert rows[0].batch_cpu == "1.5/2.5 (0.8)"  # 10 % of 8 cores in use by batch pods
    assert rows[0].batch_mem == "0.0/8.0Gi (-)"
    assert (rows[1].batch_cpu, rows[1].batch_mem) == ("-", "-")
    lines = render(rows, policy).splitlines()
    assert "BATCH CPU" in lines[0] and "1.5/2.5 (0.8)" in lines[1]
    assert "BATCH CPU" not in render(rows[1:], default_policy())


def test_a_metric_with_its_batch_share_shows_the_regular_usage_a_regular_pod_is_judged_by() -> None:
    annotations = {
        "cpu_usage_avg_5m": f"0.80000,{stamp(30)}",
        "batch.crane.io/cpu_usage_avg_5m": f"0.30000,{stamp(30)}",  # the same round: taken out
        "mem_usage_avg_5m": f"0.70000,{stamp(10)}",
        "batch.crane.io/mem_usage_avg_5m": f"0.30000,{stamp(20)}",  # another round: nothing taken out
    }
    (row,) = node_rows([node("n", annotations)], [], default_policy(), NOW)
    assert row.usage["cpu_usage_avg_5m"] == "0.80! r0.50"
    assert row.usage["mem_usage_avg_5m"] == "0.70!"


def test_the_load_taint_column_shows_the_annotators_taint_and_the_opt_out() -> None:
    tainted = node("hot", {"cpu_usage_avg_5m": f"0.90000,{stamp(10)}"})
    tainted["spec"] = {
        "taints": [
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "crane.io/load-hot", "value": "cpu_usage_avg_5m", "effect": "NoSchedule"},
        ]
    }
    nodes = [tainted, node("calm", {}), node("mine", {"crane.io/load-taint": "off"})]
    rows = {r.name: r for r in node_rows(nodes, [], default_policy(), NOW)}
    assert rows["hot"].load_taint == "NoSchedule (cpu_usage_avg_5m)"
    assert (rows["calm"].load_taint, rows["mine"].load_taint) == ("-", "off")
    text = render(list(rows.values()), default_policy())
    assert "LOAD TAINT" in text.splitlines()[0]
    # no section in the policy and no node tainted: no column
    assert "LOAD TAINT" not in render([rows["calm"]], default_policy())
