"""``cranectl replay``: traces run through crane-scheduler and crane-descheduler on a virtual clock, as a user
reads the outcome: nodes over the thresholds, evictions, pending pods; the same seed, the same replay; the plot."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from crane_descheduler.policy import default_policy as default_descheduler_policy
from crane_shared.loadtaintpolicy import LoadTaintPolicy
from crane_shared.policy import default_policy, dump_policy
from cranectl import replay, traces
from tests.support.cranectl import assert_plot_and_page, run_cli

POLICY = default_policy()


def run(trace: traces.Trace, *compare: str, seed: int = 0) -> list[replay.Result]:
    sides, judged = replay.sides(POLICY, None, policy_source="default", compare=compare)
    return replay.replay(trace, sides, judged, seed=seed)


def over_within(result: replay.Result, node: str, t: float, window: float) -> bool:
    """Whether ``node`` was over a threshold in a sample of the ``window`` seconds up to ``t``."""
    return any(node in s.over for s in result.samples if t - window <= s.t <= t)


def test_the_descheduler_cools_a_node_the_scheduler_alone_leaves_hot_and_evicts_only_from_it() -> None:
    crane, alone = run(traces.builtin("hotspot"), "no-descheduler")
    assert alone.label == "crane, no descheduler"
    # the noisy neighbour keeps node-1 over the threshold for half an hour without the descheduler
    assert alone.node_minutes_over > 20
    assert alone.evictions == []
    # the descheduler moves pods off it: far fewer node-minutes over, and nothing is left pending
    assert crane.node_minutes_over < alone.node_minutes_over / 2
    assert 1 <= len(crane.evictions) <= 3
    assert crane.pending_at_end == 0
    for e in crane.evictions:
        # only from the hot node, only while it was hot (its 5-minute average over the threshold, as annotated)
        assert e.node == "node-1"
        assert e.target in ("node-2", "node-3", "node-4")
        assert e.value > e.threshold == 0.65
        assert over_within(crane, "node-1", e.t, 300)
        assert 15 * 60 < e.t < 45 * 60  # the neighbour came at 15m and left at 45m
    # the replacements run: the workload keeps its 12 replicas
    assert crane.samples[-1].running == alone.samples[-1].running == 12


def test_the_seed_experiment_requests_crowd_node_03_and_crane_refuses_it() -> None:
    crane, requests = run(traces.builtin("seed"), "requests")
    assert requests.label == "requests only"
    # requests only: node-03 (the fewest requests, the most real load) takes replicas far past the threshold
    assert requests.samples[-1].metrics["node-03"]["mem_usage_avg_5m"] > 0.8
    assert requests.node_minutes_over > 30
    # crane-scheduler: no node goes over; the replicas no node can take stay pending, saying why
    assert crane.node_minutes_over == 0
    assert max(crane.peak.values()) < 0.65
    assert crane.pending_at_end > 0
    assert all("mem_usage_avg_5m above 0.65" in why for why in crane.reasons.values())


def replayed(trace: traces.Trace, seed: int) -> dict[str, object]:
    """The replay's JSON without the wall time it took."""
    body = json.loads(replay.as_json(trace, run(trace, seed=seed)))
    for result in body["runs"]:
        result.pop("seconds")
    return body  # type: ignore[no-any-return]


def test_the_same_seed_gives_the_same_replay_and_another_seed_another_trace() -> None:
    hotspot = traces.builtin("hotspot")
    first = replayed(hotspot, 7)
    assert replayed(hotspot, 7) == first
    assert replayed(hotspot, 8) != first  # the seed breaks the ties between the four equal nodes: it matters

    def generated(seed: int) -> traces.Trace:
        return traces.parse_trace(traces.generate(seed, nodes=4, services=3, jobs=1, hours=1.0), f"seed {seed}")

    assert generated(7) == generated(7)
    assert generated(8).events != generated(7).events
    assert replayed(generated(7), 0) == replayed(generated(7), 0)


def test_the_recording_rules_average_a_window_and_take_the_maximum_of_the_5_minute_average() -> None:
    recorder = replay.Recorder(["n"], ["cpu_usage_avg_5m", "cpu_usage_max_avg_1h", "mem_usage_avg_1m"])
    for minute in range(20):
        cpu = 0.9 if 5 <= minute < 10 else 0.1  # five minutes hot, then calm
        recorder.add(minute * 60.0, {"n": (cpu, 0.5 if minute < 19 else 0.0)})
    values = recorder.values["n"]
    assert values["cpu_usage_avg_5m"] == pytest.approx(0.1)  # the last five samples
    assert values["cpu_usage_max_avg_1h"] == pytest.approx(0.9)  # minutes 5..9 averaged, the hour's maximum
    assert values["mem_usage_avg_1m"] == pytest.approx(0.0)  # only the last sample is within the minute
    with pytest.raises(ValueError, match="policy metric 'cpu_load'"):
        replay.Recorder(["n"], ["cpu_load"])


def test_replay_prints_the_table_and_writes_a_png_and_a_self_contained_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    png, page = tmp_path / "replay.png", tmp_path / "replay.html"
    argv = ["replay", "--trace", "builtin:hotspot", "--compare", "no-descheduler", "--every", "15m"]
    assert run_cli(monkeypatch, *argv, "--plot", str(png), "--html", str(page)) == 0
    out = capsys.readouterr().out
    assert "trace hotspot:" in out
    assert "evicted at" in out and "from node-1 (target e.g. node-" in out
    html = assert_plot_and_page(png, page)
    assert "crane, no descheduler" in html
    assert run_cli(monkeypatch, "replay", "--trace", "builtin:hotspot", "-o", "json") == 0
    body = json.loads(capsys.readouterr().out)
    assert body["trace"] == "hotspot" and body["runs"][0]["evictions"]


def test_a_built_in_trace_prints_as_a_file_that_replays_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(monkeypatch, "replay", "--trace", "builtin:hotspot", "--print-trace") == 0
    path = tmp_path / "hotspot.yaml"
    path.write_text(capsys.readouterr().out)
    assert traces.read_trace(path.read_text(), str(path)) == traces.builtin("hotspot")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"nodez": []}, 'spec.nodez: unknown field (did you mean "nodes"?)'),
        ({"events": [{"at": "ten", "node": "node-1", "base": {"cpu": 0.5}}]}, "spec.events[0].at: invalid duration"),
        ({"events": [{"at": "1m", "node": "node-9", "base": {"cpu": 0.5}}]}, "spec.events[0].node: no node"),
        ({"events": [{"at": "1m", "node": "node-1", "base": {"cpu": 1.5}}]}, "spec.events[0].base.cpu: must be"),
        ({"events": [{"at": "1m", "workload": "web", "replicas": 2, "create": 1}]}, "one change per event"),
        ({"workloads": [{"name": "web", "lifetime": "5m"}]}, "spec.workloads[0].lifetime: only a Job's pods"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_field(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, object],
    words: str,
) -> None:
    doc = traces.document("hotspot")
    doc["spec"].update(change)  # the spec's fields replaced
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert run_cli(monkeypatch, "replay", "--trace", str(path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("cannot replay: ")
    assert words in err


def test_what_replay_does_not_simulate_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(dump_policy(replace(POLICY, load_taint=LoadTaintPolicy())))
    assert run_cli(monkeypatch, "replay", "--trace", "builtin:hotspot", "--policy", str(policy)) == 2
    assert "spec.loadTaint is not replayed" in capsys.readouterr().err
    assert run_cli(monkeypatch, "replay", "--trace", "builtin:nope") == 2
    assert "builtin:nope: no such trace" in capsys.readouterr().err
    assert default_descheduler_policy(POLICY).pools  # the judge's pools come from the scheduler policy


def test_the_readme_shows_what_the_seed_replay_prints_today(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    command = "$ cranectl replay --trace builtin:seed --compare requests --plot docs/replay/seed.png\n"
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    shown = readme.split(command, 1)[1].split("```", 1)[0]
    assert run_cli(monkeypatch, "replay", "--trace", "builtin:seed", "--compare", "requests") == 0

    def untimed(text: str) -> str:  # the TOOK column is this machine's wall time
        return re.sub(r"[0-9.]+s$", "", text.strip(), flags=re.MULTILINE)

    assert untimed(capsys.readouterr().out) == untimed(shown)


def test_the_documented_trace_example_is_a_trace() -> None:
    doc = traces.__doc__ or ""
    example = textwrap.dedent(doc.split("::\n\n", 1)[1].split("\n\nBuilt in", 1)[0])
    trace = traces.read_trace(example, "the traces module's docstring")
    assert [w.kind for w in trace.workloads] == ["Deployment", "Job", "Pod"]
    assert [n.name for n in trace.nodes] == ["node-1", "node-2", "node-3", "node-4"]
    assert run(trace)[0].placed > 12  # the Deployment and the Job's pods, scheduled


def test_a_second_descheduler_policy_is_compared_on_the_same_trace(tmp_path: Path) -> None:
    eager = tmp_path / "eager.yaml"
    eager.write_text(
        "apiVersion: descheduler.policy.crane.io/v1alpha1\nkind: LoadAwareDeschedulerPolicy\n"
        "spec:\n  anomaly: {consecutiveAbnormalities: 1, consecutiveNormalities: 2}\n"
    )
    sides, judged = replay.sides(POLICY, None, policy_source="default", compare=[str(eager)])
    assert [s.label for s in sides] == ["crane", "eager"]
    base, fast = replay.replay(traces.builtin("hotspot"), sides, judged)
    # hot after one round instead of three: the node is relieved sooner, by as many evictions
    assert fast.evictions[0].t < base.evictions[0].t
    assert fast.node_minutes_over < base.node_minutes_over
    assert len(fast.evictions) == len(base.evictions)
