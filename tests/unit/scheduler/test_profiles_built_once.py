"""The scheduler builds its profiles once: validation and serving share the plugin instances, so a plugin's
node-table columns are registered once per profile, annotations decoded once and metrics counted once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from crane_scheduler import __main__ as entry
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import plugin_registry
from crane_scheduler.podinfo import parse_node
from crane_scheduler.writer import ApiWriter, Connection
from tests.support.scheduler import node

TWO_PROFILES = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "leaderElection": {"leaderElect": False},
    "profiles": [{"schedulerName": "crane-scheduler"}, {"schedulerName": "crane-scheduler-b"}],
}


@pytest.fixture
def columns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every column name any plugin registers, in order."""
    seen: list[str] = []
    original = NodeTable.register_column

    def spy(self: NodeTable, name: str, *args: Any, **kwargs: Any) -> None:
        seen.append(name)
        original(self, name, *args, **kwargs)

    monkeypatch.setattr(NodeTable, "register_column", spy)
    return seen


def load(tmp_path: Path, registry: CollectorRegistry) -> entry.Loaded:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(TWO_PROFILES))
    args = entry.build_parser().parse_args(["--config", str(path)])
    return entry.load(args, plugin_registry(), registry)


def test_each_profile_registers_each_plugin_column_once(tmp_path: Path, columns: list[str]) -> None:
    loaded = load(tmp_path, CollectorRegistry())
    assert len(columns) == len(set(columns))
    dynamic = [c for c in columns if c.startswith("Dynamic.")]
    assert len(dynamic) == len(loaded.profiles) == 2
    assert {c.split(".")[2] for c in dynamic} == set(loaded.profiles)


def test_connecting_the_api_keeps_the_validated_plugins(tmp_path: Path, columns: list[str]) -> None:
    loaded = load(tmp_path, CollectorRegistry())
    before = {name: dict(p.plugins) for name, p in loaded.profiles.items()}
    registered = list(columns)  # Dynamic's per profile, NodeDeclaredFeatures' one for all
    api = object()
    writer = ApiWriter(Connection())  # not started: connecting only hands it to the plugins
    loaded.connect(api, writer)
    assert {name: dict(p.plugins) for name, p in loaded.profiles.items()} == before
    assert loaded.handles and all(h.api is api and h.writer is writer for h in loaded.handles)
    assert columns == registered and len(registered) == 3  # connecting built nothing new


def test_a_malformed_annotation_is_decoded_and_counted_once_per_profile(tmp_path: Path, columns: list[str]) -> None:
    registry = CollectorRegistry()
    loaded = load(tmp_path, registry)
    raw = node("n1")
    raw["metadata"]["annotations"] = {"cpu_usage_avg_5m": "not-a-sample"}
    loaded.table.upsert_node(parse_node(raw))
    counted = registry.get_sample_value(
        "crane_scheduler_dynamic_malformed_annotations_total", {"metric": "cpu_usage_avg_5m"}
    )
    assert counted == len(loaded.profiles)


@pytest.mark.parametrize("source", ["proxy-url", "HTTPS_PROXY/HTTP_PROXY"])
def test_a_proxy_to_the_api_server_is_refused_at_start(
    source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API writer speaks to the API server directly: a kubeconfig ``proxy-url``, or a proxy the environment
    gives the server's address, stops the scheduler at start with the source named, instead of being ignored or
    leaving a writer process that is restarted forever."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(TWO_PROFILES))
    cluster: dict[str, str] = {"server": "https://127.0.0.1:1"}
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    if source == "proxy-url":
        cluster["proxy-url"] = "http://127.0.0.1:2"
    else:
        monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:2")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    monkeypatch.setattr(entry, "REGISTRY", CollectorRegistry())
    # configured here, logging would cache every module's logger (later tests' log captures would see nothing)
    monkeypatch.setattr(entry, "configure_logging", lambda *_: None)
    assert entry.main(["--config", str(config), "--kubeconfig", str(kubeconfig)]) == 2
    assert f"{source}: a proxy to the API server is not supported" in capsys.readouterr().err
