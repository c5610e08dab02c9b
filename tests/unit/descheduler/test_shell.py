"""The descheduler's thin edges: the per-pod usage answers, the Eviction request under a lost term, the flags."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from crane_descheduler.__main__ import main
from crane_descheduler.config import parse_config
from crane_descheduler.descheduler import Descheduler, Options
from crane_descheduler.evictor import Evictor, event_body
from crane_descheduler.plan import Eviction
from crane_descheduler.pods import pod_view
from crane_descheduler.usage import MEMORY_QUERY, combine, cpu_query, fetch_usage, per_pod
from crane_shared.batch import PodUsage
from crane_shared.kube import api_client_from_dict
from crane_shared.leader import Term
from crane_shared.prometheus import PrometheusError, QueryResult, Series
from tests.support.descheduler import pod
from tests.support.fakeapi import kubeconfig_for


def test_usage_is_summed_per_pod_and_bad_samples_are_dropped_and_counted():
    assert cpu_query(300) == (
        'sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{container!="",container!="POD"}[300s]))'
    )
    assert MEMORY_QUERY.startswith("sum by (namespace, pod) (container_memory_working_set_bytes{")
    cpu, dropped = per_pod(
        [
            Series({"namespace": "a", "pod": "p"}, "1.5"),
            Series({"namespace": "a", "pod": "q"}, "NaN"),
            Series({"namespace": "a", "pod": "r"}, "-1"),
            Series({"pod": "s"}, "1"),
            Series({"namespace": "a", "pod": "t"}, "x"),
            Series({"namespace": "a", "pod": "m"}, "0.5"),
        ]
    )
    assert cpu == {"a/p": 1.5, "a/m": 0.5} and dropped == 4
    # a pod is measured only when both answers have it
    assert combine(cpu, {"a/p": 2e9}) == {"a/p": PodUsage(1.5, 2e9)}


def _eviction() -> Eviction:
    return Eviction(pod_view(pod("victim", "hot")), "hot", "cool", "cpu_usage_avg_5m", 0.912, 0.65)


class _Answers:
    """A query client answering each query with the next result."""

    def __init__(self, *results: QueryResult) -> None:
        self.results = list(results)

    async def query(self, promql: str) -> QueryResult:
        return self.results.pop(0)


async def test_a_partial_usage_answer_evicts_nothing_that_round():
    """A Thanos store or replica down (or VictoriaMetrics' isPartial): the pods it did not answer for look idle, so
    the round gets no usage at all rather than a biased one."""
    whole = QueryResult([Series({"namespace": "ns", "pod": "p"}, "0.5")], 1)
    partial = QueryResult([Series({"namespace": "ns", "pod": "p"}, "0.5")], 1, warnings=("store down",), partial=True)
    usage, _ = await fetch_usage(_Answers(whole, whole), 300)
    assert usage == {"ns/p": PodUsage(0.5, 0.5)}
    with pytest.raises(PrometheusError, match="partial answer"):
        await fetch_usage(_Answers(whole, partial), 300)


async def test_a_leader_that_lost_its_term_sends_no_eviction():
    # nothing listens at this address: any request would come back as an error, not as lost_lease
    api = await api_client_from_dict(kubeconfig_for("http://127.0.0.1:9"))
    try:
        term = Term()
        term.lost.set()
        assert await Evictor(api, "me").evict(_eviction(), term) == "lost_lease"
        assert await Evictor(api, "me").evict(_eviction(), Term()) == "error"
    finally:
        await api.close()


async def test_an_eviction_a_disruption_budget_refuses_429_is_counted_pdb_and_nothing_else_is_sent():
    """The API server's 429 (a budget that allows no disruption now, or whose status is behind its spec; the
    planner's pre-check mirrors both, so only a race gets here): ``pdb``, retried in a later round; never a delete,
    no Event."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429, "reason": "TooManyRequests"}
        return web.json_response(status, status=429)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api = await api_client_from_dict(kubeconfig_for(f"http://127.0.0.1:{runner.addresses[0][1]}"))
    try:
        assert await Evictor(api, "me").evict(_eviction(), Term()) == "pdb"
    finally:
        await api.close()
        await runner.cleanup()
    assert seen == ["POST /api/v1/namespaces/default/pods/victim/eviction"]


async def _evict_against(handle, monkeypatch: pytest.MonkeyPatch, answered=None) -> str:
    """``Evictor.evict`` against an HTTP server answering with ``handle``; its result. ``answered``: set before the
    server stops (a handler still waiting would hold its shutdown)."""
    monkeypatch.setattr("crane_descheduler.evictor.REQUEST_TIMEOUT", 0.5)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    api = await api_client_from_dict(kubeconfig_for(f"http://127.0.0.1:{runner.addresses[0][1]}"))
    try:
        return str(await Evictor(api, "me").evict(_eviction(), Term()))
    finally:
        if answered is not None:
            answered.set()
        await api.close()
        await runner.cleanup()


async def test_an_eviction_accepted_with_a_body_that_is_not_json_is_evicted_and_its_event_written(monkeypatch):
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        return web.Response(status=201, text="<html>a proxy's page</html>")

    assert await _evict_against(handle, monkeypatch) == "evicted"
    assert seen == [
        "POST /api/v1/namespaces/default/pods/victim/eviction",
        "POST /apis/events.k8s.io/v1/namespaces/default/events",
    ]


async def test_an_eviction_that_timed_out_may_have_happened_and_counts_as_one(monkeypatch):
    """The API server may have evicted the pod before the answer was lost: ``unknown``, which the descheduler
    counts against its budgets as an eviction (never one beyond them)."""
    import asyncio

    answer = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        await answer.wait()  # not before the eviction timed out
        return web.Response(status=201)

    try:
        assert await _evict_against(handle, monkeypatch, answer) == "unknown"
    finally:
        answer.set()


def test_the_event_is_the_shared_events_k8s_io_format_naming_node_metric_value_threshold_and_target():
    body = event_body(_eviction(), "me", datetime(2026, 1, 1, tzinfo=UTC).timestamp())
    assert body["apiVersion"] == "events.k8s.io/v1" and body["type"] == "Normal"
    assert body["reason"] == "LoadAwareDescheduled" and body["regarding"]["uid"] == "uid-victim"
    assert body["reportingController"] == "crane-descheduler" and body["reportingInstance"] == "me"
    assert body["eventTime"] == "2026-01-01T00:00:00.000000Z"
    assert body["note"] == (
        "evicted from node hot: cpu_usage_avg_5m 0.912 above its threshold 0.65 "
        "(another node, e.g. cool, passes the scheduler's filter for it)"
    )


def test_flags_have_crane_variables(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CRANE_DRY_RUN", "true")
    monkeypatch.setenv("CRANE_DESCHEDULING_INTERVAL", "30s")
    config = parse_config(["--descheduler-policy", "/p.yaml"])
    assert config.dry_run and config.interval == 30 and config.policy == "/p.yaml"
    assert config.lease.name == "crane-descheduler"


@pytest.fixture
def session_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """``main`` configures logging: in the test process that would cache every module's logger on first use, with a
    handler on this test's captured stderr, and later tests' log captures would see nothing."""
    monkeypatch.setattr("crane_descheduler.__main__.configure_logging", lambda *_: None)


@pytest.mark.usefixtures("session_logging")
def test_a_bad_policy_refuses_to_start_naming_each_problem(tmp_path, capsys):
    bad = tmp_path / "d.yaml"
    bad.write_text(
        "apiVersion: descheduler.policy.crane.io/v1alpha1\nkind: LoadAwareDeschedulerPolicy\nspec: {limitz: {}}\n"
    )
    assert main(["--descheduler-policy", str(bad)]) == 2
    assert f'{bad}: spec.limitz: unknown field (did you mean "limits"?)' in capsys.readouterr().err


@pytest.mark.usefixtures("session_logging")
def test_a_bad_scheduler_config_refuses_to_start_naming_the_problem(tmp_path, capsys):
    bad = tmp_path / "scheduler.yaml"
    bad.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
        "profiles: [{schedulerName: crane-scheduler, pluginConfig: [{name: NodeResourcesFit, args: {scoringStrategy:"
        " {type: Packed}}}]}]\n"
    )
    assert main(["--scheduler-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad --scheduler-config" in err and "Packed" in err


async def test_policy_files_reload_and_an_invalid_one_keeps_the_old_policy(tmp_path):
    head = "apiVersion: descheduler.policy.crane.io/v1alpha1\nkind: LoadAwareDeschedulerPolicy\n"
    path = tmp_path / "descheduler.yaml"

    def swap(text: str, name: str) -> None:  # as a ConfigMap update does: a new file renamed over the old one
        new = tmp_path / name
        new.write_text(head + text)
        os.replace(new, path)

    swap("spec: {limits: {maxPerMinute: 3}}\n", "v1")
    api = await api_client_from_dict(kubeconfig_for("http://127.0.0.1:9"))
    try:
        registry = CollectorRegistry()
        options = Options(interval=1, usage_window=5, dry_run=True, identity="me")
        d = Descheduler(api, None, registry, options, None, str(path))  # type: ignore[arg-type]
        assert d.policy_file.policy.limits.per_minute == 3
        swap("spec: {limits: {maxPerMinute: 7}}\n", "v2")
        d._reload()
        assert d.policy_file.policy.limits.per_minute == 7
        swap("spec: {limits: {maxPerMinute: -1}}\n", "v3")
        d._reload()
        assert d.policy_file.policy.limits.per_minute == 7
        reloads = {
            r: registry.get_sample_value("crane_descheduler_policy_reloads_total", {"result": r})
            for r in ("applied", "invalid")
        }
        assert reloads == {"applied": 1, "invalid": 1}
    finally:
        await api.close()
