"""The batch recording rules with Prometheus's own rule engine (``promtool test rules``): a node metric less the
batch pods' share of it is the regular usage at every evaluation, also while a batch pod is younger than the
window (the share averages over the metric's own instants, zero before the pod ran), for the window averages and
the window maxima; and the share is 0, not missing, on a node without batch pods. One allowance, on the safe
side: a batch pod's CPU has no rate before its counter's second sample, so its first scrape interval counts as
regular usage (over-read, never under-read)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from crane_sandbox.prometheus import PROMTOOL_BIN, rules_path

NODE = '{instance="10.0.0.1"}'
IDLE = '{instance="10.0.0.2"}'
POD = '{namespace="ns",pod="%s",container="c",node="%s"}'


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": name + labels, "values": values}


def node(instance: str, name: str, available: str, idle_seconds: str) -> list[dict[str, str]]:
    """100 bytes, 8 cores (``idle_seconds``: the fleet's single idle counter, 1 = idle the whole second)."""
    labels = f'{{instance="{instance}"}}'
    return [
        series("node_memory_MemTotal_bytes", labels, "100x90"),
        series("node_memory_MemAvailable_bytes", labels, available),
        series("node_cpu_seconds_total", f'{{instance="{instance}",cpu="0",mode="idle"}}', idle_seconds),
        series("node_uname_info", f'{{instance="{instance}",nodename="{name}"}}', "1x90"),
        series("kube_node_status_capacity", f'{{node="{name}",resource="cpu",unit="core"}}', "8x90"),
    ]


def test_the_metric_less_its_batch_share_is_the_regular_usage_at_every_evaluation(tmp_path: Path) -> None:
    # n1: a regular pod (30 bytes, 2 of 8 cores) and the system (10 bytes, 1 core) the whole time; a batch pod
    # (25 bytes, 2 cores) from t=40s. Memory 40 % then 65 %; CPU 37.5 % then 62.5 % (idle 0.625/s, then 0.375/s).
    inputs = [
        *node("10.0.0.1", "n1", "60x39 35x50", "0+0.625x39 24.75+0.375x50"),
        *node("10.0.0.2", "n2", "90x90", "0+1x90"),
        series("container_memory_working_set_bytes", POD % ("web", "n1"), "30x90"),
        series("container_cpu_usage_seconds_total", POD % ("web", "n1"), "0+2x90"),
        series("container_memory_working_set_bytes", POD % ("job", "n1"), "_x40 25x49"),
        series("container_cpu_usage_seconds_total", POD % ("job", "n1"), "_x40 0+2x49"),
        series(
            "kube_pod_container_resource_requests",
            '{namespace="ns",pod="job",container="c",node="n1",resource="crane_io_batch_cpu",unit="integer"}',
            "_x40 2000x49",
        ),
    ]
    checks = []
    for t in (30, 43, 46, 50, 60, 85):  # before, while the window fills, once it is full again
        for metric in ("mem_usage_avg_5m", "mem_usage_max_avg_1h", "cpu_usage_avg_5m", "cpu_usage_max_avg_1h"):
            regular = f"({metric}{NODE} - on (instance) batch_{metric})"
            if metric.startswith("cpu") and t >= 40 and ("max" in metric or t <= 51):
                # the window holds the batch pod's first CPU second: between the truth and one sample over it
                expr, value = f"({regular} >= bool 37.5) + ({regular} <= bool {37.5 + 25 / 10 + 1e-9})", 2.0
            else:
                expr, value = regular, 40.0 if metric.startswith("mem") else 37.5
            checks.append({"expr": expr, "eval_time": f"{t}s", "exp_samples": [{"labels": NODE, "value": value}]})
        checks.append(  # no batch pod: a share of 0, not a missing series
            {
                "expr": f"batch_mem_usage_avg_5m{IDLE}",
                "eval_time": f"{t}s",
                "exp_samples": [{"labels": f"batch_mem_usage_avg_5m{IDLE}", "value": 0}],
            }
        )
    test = {
        "rule_files": [str(rules_path("fast"))],
        "evaluation_interval": "1s",
        "tests": [{"interval": "1s", "input_series": inputs, "promql_expr_test": checks}],
    }
    path = tmp_path / "batch-rules-test.yml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run([PROMTOOL_BIN, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
