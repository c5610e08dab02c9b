"""Flags and environment variables an operator sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from crane_event_recorder.settings import parse_settings
from crane_event_recorder.source import EventApi
from tests.support.policy import write_policy


def test_defaults_watch_all_namespaces_through_events_v1_and_keep_the_longest_window_plus_margin() -> None:
    _, _, settings = parse_settings([])
    assert settings.event_api is EventApi.EVENTS_V1
    assert settings.namespaces == ()
    assert settings.field_selector == "reason=Scheduled"
    assert settings.retention == 5 * 60 + 60  # default policy: hotValue 5m and 1m


def test_retention_follows_the_policy_file_and_the_margin(tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "policy.yaml", {"hotValue": [{"timeRange": "15m", "count": 5}]})
    _, _, settings = parse_settings(["--policy", str(policy), "--retention-margin", "30s"])
    assert settings.retention == 15 * 60 + 30
    _, _, explicit = parse_settings(["--policy", str(policy), "--retention", "2h"])
    assert explicit.retention == 7200


def test_namespaces_and_api_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRANE_NAMESPACES", " team-a, team-b,,team-a ")
    monkeypatch.setenv("CRANE_EVENT_API", "v1")
    monkeypatch.setenv("CRANE_TRIM_INTERVAL", "10s")
    _, _, settings = parse_settings([])
    assert settings.namespaces == ("team-a", "team-b")
    assert settings.event_api is EventApi.CORE_V1
    assert settings.trim_interval == 10


def test_reporting_controllers_default_to_both_schedulers_and_are_configurable() -> None:
    assert parse_settings([])[2].reporting_controllers == ("default-scheduler", "crane-scheduler")
    _, _, settings = parse_settings(["--reporting-controllers", "a, b,,a"])
    assert settings.reporting_controllers == ("a", "b")


@pytest.mark.parametrize(
    "argv",
    [
        ["--retention", "1d"],
        ["--retention", "30s"],  # shorter than the default policy's 5m hotValue window
        ["--retention-margin", "-120"],
        ["--buffer-size", "0"],
        ["--event-api", "v2"],
        ["--trim-interval", "0"],
        ["--reporting-controllers", " , "],
    ],
)
def test_invalid_values_refuse_to_start(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(argv)
    assert "error" in capsys.readouterr().err


def test_a_bad_policy_file_names_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: nope\n")
    with pytest.raises(SystemExit):
        parse_settings(["--policy", str(policy)])
    assert str(policy) in capsys.readouterr().err
