"""The annotator process under faults, on the real API server, Redis and Prometheus (the annotator test stack).

- the leader's API connection blackholed for longer than the lease (Toxiproxy): it stops writing before the
  standby starts, and stays a standby when the connection heals;
- Prometheus answering garbage, wrong JSON types, or hanging (a reverse proxy in front of the real one): the
  annotator skips, counts, logs once per metric and kind, keeps running, and resumes when answers are good.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import free_port
from crane_sandbox.rbac import identity, service_identity
from crane_shared.annotations import decode
from crane_shared.kube import raw_json
from crane_shared.loadtaintpolicy import TAINT_KEY
from tests.support.annotator import SELECTOR_KEY, TEST_POLICY, AnnotatorProc, Stack
from tests.support.faults import FaultReport, api_host_port, kubeconfig_via, restart_apiserver
from tests.support.policy import UPSTREAM_METRICS as METRICS
from tests.support.scheduler_cluster import pods_json
from tests.support.scheduler_faults import DEFAULT_TIMING, Pair, burst_with_fault
from tests.support.serviceproc import FAST_LEASE
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow_fault


async def _patches(proc: AnnotatorProc) -> float:
    metrics = await proc.metrics()
    return float(sum(v for (name, labels), v in metrics.items() if name == "crane_annotator_patches_total"))


async def test_leader_blackholed_longer_than_the_lease_stops_writing_before_the_standby_starts(
    stack: Stack,
    cluster: LocalCluster,
    start_annotator: Callable[..., Any],
    proxy_to: Callable[..., Any],
    tmp_path: Path,
    fault_report: FaultReport,
    namespace: str,
) -> None:
    row = fault_report.row("annotator leader's API connection blackholed (2x lease)")
    proxy = await proxy_to(api_host_port(cluster))
    via = tmp_path / "kubeconfig-via-proxy"
    kubeconfig_via(cluster, f"https://{proxy.host_port}", via, account=identity(cluster, "annotator", namespace))
    a = await start_annotator(*FAST_LEASE, "--kubeconfig", str(via), name="annotator-a")
    await eventually(lambda: _is(a, "leader"), what="a leads")
    b = await start_annotator(*FAST_LEASE, name="annotator-b")

    samples: list[tuple[float, str, str]] = []

    async def sample() -> None:
        while True:
            samples.append((time.monotonic(), await a.leadership_or_unreachable(), await b.leadership_or_unreachable()))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.sleep(1)
        await proxy.blackhole()
        cut = time.monotonic()
        cut_wall = datetime.now(UTC)
        await eventually(lambda: _is(b, "leader"), timeout=15, what="the standby leads")
        took_over = time.monotonic() - cut
        await asyncio.sleep(max(0.0, 8 - (time.monotonic() - cut)))  # blackholed for twice the lease
        await proxy.heal()
        a_patches = await _patches(a)
        await asyncio.sleep(3)
        assert await a.leadership_or_unreachable() == "standby", "the old leader took the lease back"
        assert await _patches(a) == a_patches, "the old leader patched after the partition healed"
    finally:
        sampler.cancel()
    a_last_leading = max(t for t, sa, _ in samples if sa == "leader")
    b_first_leading = min(t for t, _, sb in samples if sb == "leader")
    assert a_last_leading < b_first_leading, "two annotators led at once"

    await eventually(_rewritten_since(stack, cut_wall), timeout=20, what="annotations from the new leader")
    row.created = row.bound = len(stack.nodes)
    row.recovery = round(took_over, 2)
    row.note = f"old leader stepped down {a_last_leading - cut:.2f}s after the cut; never two writers"


def _rewritten_since(stack: Stack, since: datetime) -> Callable[[], Awaitable[bool]]:
    """Whether every node's cpu_usage_avg_5m annotation was written after ``since`` (a leader writes them all)."""

    async def check() -> bool:
        for node in stack.nodes:
            text = (await stack.annotations(node.name)).get("cpu_usage_avg_5m")
            if text is None or decode(text).timestamp <= since:
                return False
        return True

    return check


async def _is(proc: AnnotatorProc, state: str) -> bool:
    return await proc.leadership_or_unreachable() == state


class PrometheusFaults:
    """Forwards /api/v1/query to the real Prometheus, or answers with the fault ``mode`` names."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.mode = "pass"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _query(self, request: web.Request) -> web.StreamResponse:
        if self.mode == "hang":
            await self.release.wait()
        if self.mode == "garbage":
            return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="text/html")
        assert self._session is not None
        async with self._session.get(self.upstream + "/api/v1/query", params=request.query) as resp:
            body: Any = await resp.json(content_type=None)
            status = resp.status
        result = body.get("data", {}).get("result") if isinstance(body, dict) else None
        if result and self.mode == "null":
            result[0]["value"] = [result[0]["value"][0], None]
        if result and self.mode == "numeric":
            result[-1]["metric"]["instance"] = 10
        return web.Response(text=json.dumps(body), status=status, content_type="application/json")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/query", self._query)
        self._session = aiohttp.ClientSession()
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


@pytest_asyncio.fixture
async def prometheus_faults(stack: Stack) -> AsyncIterator[PrometheusFaults]:
    faults = PrometheusFaults(stack.prometheus.url)
    await faults.start()
    yield faults
    await faults.stop()


async def _errors(proc: AnnotatorProc, kind: str) -> float:
    metrics = await proc.metrics()
    return float(
        sum(
            v
            for (name, labels), v in metrics.items()
            if name == "crane_annotator_prometheus_errors_total" and dict(labels).get("kind") == kind
        )
    )


async def _stamps(stack: Stack) -> dict[str, str]:
    return {n.name: (await stack.annotations(n.name)).get("cpu_usage_avg_5m", "") for n in stack.nodes}


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("garbage", "bad_response"), ("null", "bad_response"), ("numeric", "bad_response"), ("hang", "timeout")],
)
async def test_prometheus_garbage_wrong_types_or_hanging_is_skipped_counted_logged_once(
    stack: Stack,
    start_annotator: Callable[..., Any],
    prometheus_faults: PrometheusFaults,
    fault_report: FaultReport,
    mode: str,
    kind: str,
) -> None:
    row = fault_report.row(f"Prometheus {mode} ({kind}) under the annotator")
    proc = await start_annotator(
        "--prometheus-url", prometheus_faults.url, "--prometheus-timeout", "500ms", "--prometheus-retries", "1"
    )
    await eventually(lambda: _is(proc, "leader"), what="leads")
    await eventually(lambda: _all_annotated(stack), timeout=30, what="annotated before the fault")
    prometheus_faults.mode = mode
    await eventually(lambda: _errors_at_least(proc, kind, 2 * len(METRICS)), timeout=30, what=f"{kind} counted")
    frozen = await _stamps(stack)
    await asyncio.sleep(3)  # several rounds of every fast metric during the fault
    assert await _stamps(stack) == frozen, "a value from a bad answer was written"
    assert proc.process.running and (await proc.get("/healthz"))[0] == 200
    prometheus_faults.mode = "pass"
    healed = time.monotonic()
    await eventually(lambda: _stamps_changed(stack, frozen), timeout=30, what="annotations resume")
    # Once per metric for this fault's kind; on a loaded machine a 500 ms query can also time out, which is logged
    # once per metric under its own kind (seen in CI: 6 bad_response + 6 timeout lines), so lines are per kind.
    lines = proc.process.log_path.read_text().splitlines()
    logged = [line for line in lines if "query failed" in line and f"error_kind={kind}" in line]
    assert 1 <= len(logged) <= len(METRICS), f"not logged once per metric: {len(logged)} lines"
    row.created = row.bound = len(stack.nodes)
    row.recovery = round(time.monotonic() - healed, 2)
    row.note = f"{int(await _errors(proc, kind))} queries skipped and counted; {len(logged)} log lines"


async def _errors_at_least(proc: AnnotatorProc, kind: str, count: float) -> bool:
    return await _errors(proc, kind) >= count


async def _all_annotated(stack: Stack) -> bool:
    return all((await _stamps(stack)).values())


async def _stamps_changed(stack: Stack, before: dict[str, str]) -> bool:
    now = await _stamps(stack)
    return all(now[n] != before[n] for n in before)


async def test_kill_9_of_the_leading_annotator_the_standby_takes_over_within_the_lease(
    stack: Stack, start_annotator: Callable[..., Any], fault_report: FaultReport
) -> None:
    row = fault_report.row("kill -9 of the leading annotator")
    a = await start_annotator(*FAST_LEASE, name="annotator-a")
    await eventually(lambda: _is(a, "leader"), what="a leads")
    b = await start_annotator(*FAST_LEASE, name="annotator-b")
    await eventually(lambda: _all_annotated(stack), timeout=30, what="annotated before the kill")
    await a.process.kill()
    killed = time.monotonic()
    killed_wall = datetime.now(UTC)
    await eventually(lambda: _is(b, "leader"), timeout=15, what="the standby leads")
    took_over = time.monotonic() - killed
    assert took_over < 4 + 2, "the standby took longer than the lease (+ retries) to take over"

    await eventually(_rewritten_since(stack, killed_wall), timeout=20, what="annotations from the new leader")
    row.created = row.bound = len(stack.nodes)
    row.recovery = round(took_over, 2)


async def test_api_server_restart_under_two_annotators_leaves_one_writer(
    stack: Stack, cluster: LocalCluster, start_annotator: Callable[..., Any], fault_report: FaultReport
) -> None:
    row = fault_report.row("API server restart (5s down) under two annotators")
    a = await start_annotator(*FAST_LEASE, name="annotator-a")
    await eventually(lambda: _is(a, "leader"), what="a leads")
    b = await start_annotator(*FAST_LEASE, name="annotator-b")
    await eventually(lambda: _all_annotated(stack), timeout=30, what="annotated before the restart")
    await restart_apiserver(cluster, down_for=5.0)
    back = time.monotonic()
    back_wall = datetime.now(UTC)
    await eventually(lambda: _one_leader(a, b), timeout=20, what="exactly one leader")

    await eventually(_rewritten_since(stack, back_wall), timeout=30, what="annotations after the restart")
    row.recovery = round(time.monotonic() - back, 2)
    assert a.process.running and b.process.running, "an annotator died with the API server"
    assert await _one_leader(a, b)
    row.created = row.bound = len(stack.nodes)


async def _one_leader(a: AnnotatorProc, b: AnnotatorProc) -> bool:
    return [await a.leadership_or_unreachable(), await b.leadership_or_unreachable()].count("leader") == 1


@pytest.mark.parametrize("mode", ["garbage", "hang"])
@pytest.mark.slow_fault
async def test_prometheus_faults_under_two_scheduler_replicas_every_pod_bound_once(
    stack: Stack,
    start_annotator: Callable[..., Any],
    prometheus_faults: PrometheusFaults,
    cluster: LocalCluster,
    kube: Any,
    namespace: str,
    fault_report: FaultReport,
    mode: str,
) -> None:
    """The annotator's Prometheus answers garbage (or hangs) in the middle of a burst two crane-scheduler replicas
    serve with the Dynamic plugin on the annotated nodes: the annotations stay as they were (no value from a bad
    answer), scheduling goes on from them, every pod is bound once with one Scheduled event, none is lost."""
    row = fault_report.row(f"Prometheus {mode} mid-burst under the annotator, 2 scheduler replicas")
    proc = await start_annotator(
        "--prometheus-url", prometheus_faults.url, "--prometheus-timeout", "500ms", "--prometheus-retries", "1"
    )
    await eventually(lambda: _is(proc, "leader"), what="leads")
    await eventually(lambda: _all_annotated(stack), timeout=30, what="annotated before the fault")
    scheduler_name = f"crane-{namespace}"[:63].rstrip("-")
    account = await service_identity(cluster, "scheduler", namespace)
    pair = Pair(cluster, account, f"{SELECTOR_KEY}={stack.label}", scheduler_name, DEFAULT_TIMING)
    pair.cfg["profiles"][0]["pluginConfig"] = [
        {"name": "Dynamic", "args": {"policyConfigPath": str(stack.policy_path)}}
    ]
    pair.add("a", "--kube-api-qps", "15", "--kube-api-burst", "15")  # a burst of 20 s: the fault lands mid-way
    pair.add("b")
    kind = "bad_response" if mode == "garbage" else "timeout"

    async def prometheus_fault() -> None:
        before = await _errors(proc, kind)
        prometheus_faults.mode = mode
        await eventually(
            lambda: _errors_at_least(proc, kind, before + 2 * len(METRICS)), timeout=30, what=f"{kind} counted"
        )
        prometheus_faults.mode = "pass"
        prometheus_faults.release.set()  # a hanging query answers now
        prometheus_faults.release = asyncio.Event()

    try:
        await burst_with_fault(kube, namespace, scheduler_name, pair, row, prometheus_fault)
        assert proc.process.running and (await proc.get("/healthz"))[0] == 200
        on_stack = {p["spec"]["nodeName"] for p in await pods_json(kube, namespace)}
        assert on_stack <= {n.name for n in stack.nodes}
        row.note = f"pods spread over {len(on_stack)} of {len(stack.nodes)} annotated nodes"
    finally:
        await pair.stop()
        await client.CoreV1Api(kube).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    assert row.doubled == 0 and row.lost == 0 and row.bound == row.created


# --- the load taint (spec.loadTaint) under faults --------------------------------------------------------------


def _taint_policy(tmp_path: Path, **section: Any) -> Path:
    policy = yaml.safe_load(TEST_POLICY)
    policy["spec"]["loadTaint"] = section
    path = tmp_path / "taint-policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    return path


@contextlib.contextmanager
def _loaded(stack: Stack, loads: dict[str, float]) -> Iterator[Callable[[str, float], None]]:
    """Set fleet nodes' CPU load (their series follow at once); every node's load is put back afterwards."""
    before = {n.name: n for n in stack.nodes}

    def load(name: str, cpu: float) -> None:
        stack.state.add_node(dataclasses.replace(before[name], base_cpu_fraction=cpu))

    for name, cpu in loads.items():
        load(name, cpu)
    try:
        yield load
    finally:
        for node in before.values():
            stack.state.add_node(node)


async def _tainted(stack: Stack) -> set[str]:
    out = set()
    for node in stack.nodes:
        raw = await raw_json(client.CoreV1Api(stack.kube).read_node(node.name, _preload_content=False))
        if any(t["key"] == TAINT_KEY for t in raw["spec"].get("taints") or []):
            out.add(node.name)
    return out


async def _taints_are(stack: Stack, expected: set[str]) -> bool:
    return await _tainted(stack) == expected


async def test_the_taint_writer_killed_mid_debounce_leaves_no_taint_on_a_node_that_cooled(
    stack: Stack, start_annotator: Callable[..., Any], tmp_path: Path, fault_report: FaultReport
) -> None:
    """Two nodes hot and tainted; one cools; the leader has counted one of the two cool samples that lift its
    taint when it is killed (SIGKILL, its rounds running every 2 s). The new leader starts with no debounce state:
    it takes the taints it finds as confirmed, lifts the cooled node's after its own first two cool samples, and
    keeps the hot one's."""
    row = fault_report.row("load-taint writer kill -9 mid-debounce (a tainted node cooling)")
    path = _taint_policy(tmp_path, hotRounds=1, coolRounds=2)
    x, y = stack.nodes[0].name, stack.nodes[1].name
    flags = (*FAST_LEASE, "--policy", str(path), "--load-taint-interval", "0.5s")
    with _loaded(stack, {x: 0.9, y: 0.9}) as load:
        a = await start_annotator(*flags, name="annotator-a")
        await eventually(lambda: _is(a, "leader"), what="a leads")
        b = await start_annotator(*flags, name="annotator-b")
        await eventually(lambda: _taints_are(stack, {x, y}), timeout=30, what="both hot nodes tainted")
        load(x, 0.05)

        async def mid_debounce() -> bool:
            _, body = await a.get(f"/debug/nodes/{x}")
            report = (body or {}).get("load_taint") or {}
            return report.get("confirmed_hot") is True and report.get("streak") == 1

        await eventually(mid_debounce, timeout=30, interval=0.1, what="one cool sample of x counted by a")
        await a.process.kill()
        killed = time.monotonic()
        assert await _tainted(stack) == {x, y}, "the killed leader's taints are still there"
        await eventually(lambda: _is(b, "leader"), timeout=15, what="the standby leads")
        await eventually(lambda: _taints_are(stack, {y}), timeout=30, what="x lifted by the new leader")
        recovered = time.monotonic() - killed
        lifted = await b.metric(
            "crane_annotator_load_taint_changes_total", change="lifted", reason="cooled", outcome="ok"
        )
        assert lifted == 1 and await _tainted(stack) == {y}, "the hot node keeps its taint under the new leader"
    await eventually(lambda: _taints_are(stack, set()), timeout=30, what="y lifted once it cools (cleanup)")
    row.created = row.bound = 2
    row.recovery = round(recovered, 2)
    row.note = "the new leader adopted both taints; x lifted after its own 2 cool samples, y kept"


async def test_prometheus_down_lifts_the_taints_after_the_staleness_limit_and_taints_nothing_new(
    stack: Stack, start_annotator: Callable[..., Any], tmp_path: Path, fault_report: FaultReport
) -> None:
    """A node hot and tainted, another turning hot as Prometheus goes away: no new sample arrives, so nothing new is
    tainted; once the last samples are older than ``maxDataAge`` (8 s) every taint is lifted; when Prometheus comes
    back, the hot node is tainted again after two new samples."""
    row = fault_report.row("Prometheus down with a node tainted (maxDataAge 8s)")
    path = _taint_policy(tmp_path, hotRounds=2, coolRounds=2, maxDataAge="8s")
    x, y = stack.nodes[0].name, stack.nodes[1].name
    with _loaded(stack, {x: 0.9}) as load:
        flags = ("--policy", str(path), "--load-taint-interval", "0.5s", "--prometheus-timeout", "500ms")
        annotator = await start_annotator(*flags, "--prometheus-retries", "1")
        await eventually(lambda: _taints_are(stack, {x}), timeout=30, what="x tainted")
        load(y, 0.9)
        await stack.prometheus.stop()
        down_at = datetime.now(UTC)
        try:
            last_samples = await _sample_times(stack, (x, y))
            await eventually(lambda: _taints_are(stack, set()), timeout=30, what="every taint lifted")
            lifted_at = datetime.now(UTC)
            set_during = await annotator.metric(
                "crane_annotator_load_taint_changes_total", change="set", reason="hot", outcome="ok"
            )
            stale = await annotator.metric(
                "crane_annotator_load_taint_changes_total", change="lifted", reason="stale", outcome="ok"
            )
            assert stale is not None and stale >= 1
            newest = max(last_samples.values())
            assert (lifted_at - newest).total_seconds() >= 8, "lifted before the data was older than maxDataAge"
            # nothing is tainted while no sample arrives, however long it lasts
            await eventually(lambda: _no_round_since(annotator, down_at), timeout=15, what="rounds failing")
            assert await _tainted(stack) == set()
            assert (
                await annotator.metric(
                    "crane_annotator_load_taint_changes_total", change="set", reason="hot", outcome="ok"
                )
                == set_during
            )
        finally:
            await stack.prometheus.start()
        back = time.monotonic()
        await eventually(lambda: _taints_are(stack, {x, y}), timeout=60, what="x and y tainted again")
        recovered = time.monotonic() - back
    await eventually(lambda: _taints_are(stack, set()), timeout=30, what="lifted once cool again (cleanup)")
    row.created = row.bound = 2
    row.recovery = round(recovered, 2)
    row.note = f"lifted {(lifted_at - down_at).total_seconds():.1f}s after the outage began; nothing tainted meanwhile"


async def _sample_times(stack: Stack, names: tuple[str, ...]) -> dict[str, datetime]:
    return {n: decode((await stack.annotations(n))["cpu_usage_avg_5m"]).timestamp for n in names}


async def _no_round_since(annotator: AnnotatorProc, since: datetime) -> bool:
    """Prometheus is seen down (the last query failed) and no metric was queried successfully since ``since``."""
    up = await annotator.metric("crane_annotator_prometheus_up")
    last = await annotator.metric("crane_annotator_metric_last_success_timestamp_seconds", metric="cpu_usage_avg_5m")
    return up == 0 and last is not None and last < since.timestamp()
