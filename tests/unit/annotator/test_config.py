"""Flags and environment: what operators type, and refusing to start on bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from crane_annotator.config import parse_config
from crane_shared.annotations import TimestampStyle
from crane_shared.policy import default_policy
from tests.support.policy import write_policy


def test_defaults_use_the_shipped_policy_and_upstream_compatible_names() -> None:
    config = parse_config([])
    assert config.policy == default_policy()
    assert config.lease.name == "crane-annotator"
    assert config.instance_label == "instance"
    assert config.hot_value_interval == 15.0
    assert config.stamp.style is TimestampStyle.RFC3339


def test_durations_accept_go_syntax_and_env_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRANE_HOT_VALUE_INTERVAL", "1m30s")
    config = parse_config(
        [
            "--prometheus-timeout",
            "500ms",
            "--hot-value-debounce",
            "0.1",
            "--lease-name",
            "annotator-b",
            "--instance-label",
            "node",
        ]
    )
    assert config.hot_value_interval == 90.0
    assert config.prometheus.timeout == 0.5
    assert config.hot_value_debounce == 0.1
    assert (config.lease.name, config.instance_label) == ("annotator-b", "node")


def test_a_bad_policy_file_refuses_to_start_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = write_policy(tmp_path / "policy.yaml", {"syncPolicy": [{"name": "cpu_usage_avg_5m", "period": "0s"}]})
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--policy", str(policy)])
    assert exit_info.value.code == 2
    assert "syncPolicy[0].period" in capsys.readouterr().err


def test_a_bad_reclaim_section_refuses_to_start_with_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {
        "syncPolicy": [{"name": "cpu_usage_avg_5m", "period": "3m"}, {"name": "mem_usage_avg_5m", "period": "3m"}],
        "reclaim": {"cpu": {"reclaimThreshold": 1.2}, "memory": {"policy": "requests"}, "degradeAfter": "soon"},
    }
    policy = write_policy(tmp_path / "policy.yaml", spec)
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--policy", str(policy)])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(str(policy))]
    assert [line.split(": ")[1] for line in lines] == [
        "spec.reclaim.cpu.reclaimThreshold",
        "spec.reclaim.memory.policy",
        "spec.reclaim.degradeAfter",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--hot-value-interval", "0s"],
        ["--prometheus-timeout", "1d"],
        ["--legacy-timezone", "Mars/Base"],
        ["--renew-deadline", "20s"],
        ["--patch-concurrency", "0"],
    ],
)
def test_bad_flags_refuse_to_start(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv)
    assert exit_info.value.code == 2


@pytest.mark.parametrize("flag", ["--legacy-zone", "--legacy-timezone"])
def test_the_legacy_zone_has_one_name_and_keeps_the_former_one(flag: str) -> None:
    assert parse_config([flag, "Europe/Berlin"]).stamp.legacy_zone.key == "Europe/Berlin"


def test_the_former_legacy_zone_variable_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRANE_LEGACY_TIMEZONE", "Europe/Paris")
    assert parse_config([]).stamp.legacy_zone.key == "Europe/Paris"
    monkeypatch.setenv("CRANE_LEGACY_ZONE", "UTC")
    assert parse_config([]).stamp.legacy_zone.key == "UTC"
