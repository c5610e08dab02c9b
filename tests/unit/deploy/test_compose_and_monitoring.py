"""Offline checks of what users run locally and what operators load into Prometheus and Grafana: both compose
files (Debian's docker-compose), the Prometheus configurations and rules (promtool), the dashboards' JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy import ALERTS, CHART, DASHBOARDS, REPO

SERVICES = {"event-recorder", "annotator", "scheduler", "descheduler"}


def compose_config(file: str) -> dict[str, Any]:
    result = subprocess.run(
        [str(REPO / "scripts" / "container-engine"), "compose", "-f", file, "config"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


@pytest.mark.parametrize(
    ("file", "expected"),
    [
        ("docker-compose.yml", SERVICES | {"kwok", "fleet", "redis", "prometheus", "grafana"}),
        ("docker-compose.cluster.yml", SERVICES | {"redis", "prometheus"}),
    ],
)
def test_compose_file_is_valid_and_runs_the_services_locked_down(file: str, expected: set[str]) -> None:
    config = compose_config(file)
    assert set(config["services"]) == expected
    for name, svc in config["services"].items():
        assert svc["network_mode"] == "host", name
        for volume in svc.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith("/"):
                assert Path(source).exists() or "kube/config" in source, (name, source)
        if name in SERVICES:
            assert svc["read_only"] is True and not svc["user"].startswith("0:"), name
            assert svc["environment"]["CRANE_LISTEN_ADDRESS"] == "127.0.0.1", name
            assert svc["build"]["dockerfile"].endswith("deploy/Dockerfile") and svc["build"]["target"] == name


def test_the_local_cluster_listens_on_loopback_only() -> None:
    """Host networking and an API without authentication: kwokctl must bind 127.0.0.1, not its default 0.0.0.0."""
    kwok = compose_config("docker-compose.yml")["services"]["kwok"]
    target = kwok["command"][kwok["command"].index("--config") + 1]
    mounts = [v.split(":")[:2] if isinstance(v, str) else [v["source"], v["target"]] for v in kwok["volumes"]]
    [source] = [src for src, dst in mounts if dst == target]
    config = yaml.safe_load(Path(source).read_text())
    assert config["kind"] == "KwokctlConfiguration" and config["options"]["bindAddress"] == "127.0.0.1"
    assert yaml.safe_load((REPO / "deploy/compose/kubeconfig").read_text())["clusters"][0]["cluster"]["server"] == (
        "http://127.0.0.1:8080"
    )


def _check_prometheus_config(path: Path, tmp_path: Path) -> None:
    """promtool check config, with the rule files mapped from their container paths to the repository."""
    config = yaml.safe_load(path.read_text())
    files = {"recording-rules.yml": CHART / "files" / "recording-rules.yml", "alerts.yml": ALERTS}
    config["rule_files"] = [str(files[Path(f).name]) for f in config["rule_files"]]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(config))
    result = subprocess.run(["promtool", "check", "config", str(local)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs >= SERVICES, jobs


@pytest.mark.parametrize("path", ["deploy/compose/prometheus.yml", "deploy/prometheus/prometheus.yml"])
def test_prometheus_configurations_are_valid(path: str, tmp_path: Path) -> None:
    _check_prometheus_config(REPO / path, tmp_path)


def test_alert_rules_pass_promtool_and_cover_the_failures_operators_care_about() -> None:
    result = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    assert {
        "CraneAnnotationsStale",
        "CraneAnnotatorDown",
        "CraneEventRecorderDown",
        "CraneSchedulerPendingGrowing",
        "CraneRedisUnreachable",
    } <= alerts


def _walk(node: Any) -> list[dict[str, Any]]:
    out = []
    if isinstance(node, dict):
        out.append(node)
        for v in node.values():
            out += _walk(v)
    elif isinstance(node, list):
        for v in node:
            out += _walk(v)
    return out


@pytest.mark.parametrize("path", sorted(DASHBOARDS.glob("*.json")), ids=lambda p: p.name)
def test_dashboard_is_valid_for_current_grafana(path: Path) -> None:
    dash = json.loads(path.read_text())
    assert dash["schemaVersion"] >= 39 and dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    # Every datasource reference is the variable: no hard-coded datasource UID anywhere.
    refs = [d["datasource"] for d in _walk(dash) if "datasource" in d and isinstance(d["datasource"], dict)]
    assert refs and all(r == {"type": "prometheus", "uid": "${datasource}"} for r in refs), refs
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]


def test_cluster_load_dashboard_shows_what_the_product_is_for() -> None:
    dash = json.loads((DASHBOARDS / "crane-cluster-load.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    for needle in (
        "cpu_usage_active",
        "mem_usage_active",
        "kube_pod_container_resource_requests",
        "stddev(",
        "crane_annotator_node_hot_value",
        "kube_pod_info",
        "scheduler_pending_pods",
        "crane_scheduler_dynamic_policy_threshold",
    ):
        assert needle in exprs, needle


def test_services_dashboard_shows_the_descheduler_evictions_and_node_classes() -> None:
    dash = json.loads((DASHBOARDS / "crane-services.json").read_text())
    exprs = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in dash["panels"]}
    assert "crane_descheduler_evictions_total" in exprs["Evictions /s by result"]
    assert "by (result)" in exprs["Evictions /s by result"]
    assert "max by (class) (crane_descheduler_nodes)" in exprs["Nodes per class"]
    assert "descheduler" in exprs["Services up"]


def test_grafana_provisioning_points_at_the_shipped_dashboards() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["grafana"]["volumes"]}
    provider = yaml.safe_load((REPO / "deploy/compose/grafana/dashboards/crane.yml").read_text())["providers"][0]
    assert (REPO / mounts[provider["options"]["path"]]).resolve() == DASHBOARDS.resolve()


@pytest.mark.parametrize("file", ["docker-compose.yml", "docker-compose.cluster.yml"])
def test_compose_passes_the_prometheus_section_from_the_shell_to_the_annotator(file: str) -> None:
    env = compose_config(file)["services"]["annotator"]["environment"]
    assert env["CRANE_PROMETHEUS_URL"] == "http://127.0.0.1:9090" and env["CRANE_REDIS_URL"].startswith("redis://")
    for name in ("TENANT", "BEARER_TOKEN_FILE", "CLIENT_CERT_FILE", "HEADERS_FILE", "LATENCY_OFFSET"):
        assert f"CRANE_PROMETHEUS_{name}" in env
