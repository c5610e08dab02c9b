"""The annotator on other Prometheus-compatible backends and behind authenticating gateways, all real servers.

VictoriaMetrics single-node with vmalert (Debian's ``victoria-metrics``) scrapes the same exporter as the stack's
Prometheus and evaluates the same rule file: the annotations it leads to must equal Prometheus's; when it goes
down, nothing is updated or erased. Each auth mode
(bearer token, basic auth, tenant header with a path prefix, client certificate) is enforced by a gateway in
front of the real Prometheus (``tests.support.promauth``); a wrong credential is refused and nothing is written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from crane_sandbox.pki import make_pki
from crane_sandbox.prometheus import parse_query_response, rules_path
from crane_sandbox.victoria import VictoriaMetrics, Vmalert, check_rules
from crane_shared.annotations import decode
from tests.support.annotator import Stack, history, peaks
from tests.support.deploy import CHART
from tests.support.policy import UPSTREAM_METRICS as METRICS
from tests.support.promauth import AuthMode, AuthProxy, client_certificate
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

LATENCY_OFFSET = 2.0
"""the VictoriaMetrics under test hides samples newer than this (its default is 30 s; short here for speed)"""


async def vm_query(url: str, promql: str) -> list[Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/api/v1/query", params={"query": promql}) as r:
        return parse_query_response(await r.json(content_type=None))


async def test_victoriametrics_with_vmalert_gives_the_annotations_prometheus_gives(
    stack: Stack, start_annotator: Callable[..., Any]
) -> None:
    vm = VictoriaMetrics(stack.run_dir, stack.exporter.targets(), latency_offset=f"{LATENCY_OFFSET:g}s")
    async with vm:
        await vm.import_history(history(stack.nodes, time.time() - 60))
        async with Vmalert(stack.run_dir, vm.url, rules_path("fast")):
            for metric in METRICS:  # rule output (and imported history) for every node before annotating
                await eventually(_count_is(vm.url, metric, len(stack.nodes)), timeout=90, what=f"VM has {metric}")
            since = datetime.now(UTC)
            on_prometheus = await start_annotator(name="on-prometheus")
            prometheus_values = await eventually(lambda: stack.fresh_values(since), timeout=60, what="annotated")
            await on_prometheus.stop()

            since = datetime.now(UTC)
            on_vm = await start_annotator(
                "--prometheus-url",
                f"{vm.url}/prometheus",  # VM's Prometheus API under its path prefix
                "--prometheus-latency-offset",
                f"{LATENCY_OFFSET:g}s",
                name="on-victoriametrics",
            )
            vm_values = await eventually(lambda: stack.fresh_values(since), timeout=60, what="annotated from VM")
            assert await on_vm.metric("crane_annotator_prometheus_up") == 1
            # stamped with the offset: no annotation claims to be newer than the data VM could show
            for node in stack.nodes:
                stamp = decode((await stack.annotations(node.name))["cpu_usage_avg_5m"]).timestamp
                assert stamp.timestamp() <= time.time() - LATENCY_OFFSET + 0.5
            # VictoriaMetrics goes down mid-run: queries fail and are counted, no value is updated or erased
            await vm.stop()
            down = datetime.now(UTC)
            await eventually(
                lambda: on_vm.metric("crane_annotator_prometheus_errors_total", metric=METRICS[0], kind="connection"),
                timeout=60,
                what="the outage counted",
            )
            assert await stack.fresh_values(down) is None  # nothing updated...
            for node in stack.nodes:  # ...and nothing erased
                annotations = await stack.annotations(node.name)
                assert all(m in annotations for m in METRICS)
    differences = {
        (node, metric): abs(vm_values[node][metric] - prometheus_values[node][metric])
        for node in prometheus_values
        for metric in METRICS
    }
    worst = max(differences.items(), key=lambda item: item[1])
    assert worst[1] <= 0.001, f"VictoriaMetrics and Prometheus differ most on {worst[0]}: {worst[1]:.5f}"
    for i, node in enumerate(stack.nodes):  # the history peaks, exactly, through vmalert's max_over_time
        assert vm_values[node.name]["cpu_usage_max_avg_1d"] == round(peaks(i)["cpu_1d"] / 100, 5)
        assert vm_values[node.name]["mem_usage_max_avg_1h"] == round(peaks(i)["mem_1h"] / 100, 5)


def _count_is(url: str, metric: str, expected: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        samples = await vm_query(url, f"count({metric})")
        return bool(samples) and samples[0].value == expected

    return check


async def test_the_shipped_recording_rules_load_in_vmalert_as_they_are(tmp_path: Path) -> None:
    for rules in (CHART / "files" / "recording-rules.yml", rules_path("fast"), rules_path("upstream")):
        ok, output = await check_rules(rules, tmp_path)
        assert ok, f"vmalert refuses {rules}:\n{output}"


def _credentials(tmp: Path, mode: str, proxy: AuthProxy, cert: tuple[Path, Path]) -> list[str]:
    """The annotator flags for ``mode``, with the secrets in files."""
    if mode == "bearer":
        (tmp / "token").write_text(proxy.token + "\n")
        return ["--prometheus-bearer-token-file", str(tmp / "token")]
    if mode == "basic":
        (tmp / "password").write_text(proxy.password + "\n")
        return ["--prometheus-username", proxy.username, "--prometheus-password-file", str(tmp / "password")]
    if mode == "tenant":
        return ["--prometheus-tenant", proxy.tenant]
    return [
        "--prometheus-ca-file",
        str(proxy.pki.ca_cert),
        "--prometheus-client-cert-file",
        str(cert[0]),
        "--prometheus-client-key-file",
        str(cert[1]),
    ]


@pytest.mark.parametrize("mode", ["bearer", "basic", "tenant", "mtls"])
async def test_each_auth_mode_reaches_prometheus_through_an_enforcing_gateway(
    stack: Stack, start_annotator: Callable[..., Any], tmp_path: Path, mode: AuthMode
) -> None:
    pki = await asyncio.to_thread(make_pki, tmp_path / "pki")
    cert = await asyncio.to_thread(client_certificate, pki, tmp_path / "client", "crane-annotator")
    proxy = AuthProxy(
        stack.prometheus.url,
        mode,
        pki,
        token="t0k3n-" + mode,
        username="crane",
        password="pa55-" + mode,
        tenant="team-a",
        prefix="/prometheus" if mode == "tenant" else "",
    )
    async with proxy:
        # a wrong credential: refused by the gateway, counted by the annotator, nothing written
        wrong = tmp_path / "wrong"
        wrong.mkdir()
        bad = AuthProxy(proxy.upstream, mode, pki, token="other", username="crane", password="other", tenant="b")
        bad_flags = (
            _credentials(wrong, mode, bad, cert) if mode != "mtls" else ["--prometheus-ca-file", str(pki.ca_cert)]
        )
        refused = await start_annotator("--prometheus-url", proxy.url, "--prometheus-retries", "0", *bad_flags)
        await eventually(lambda: refused.metric("crane_annotator_prometheus_errors_total", metric=METRICS[0],
                                                kind="query" if mode != "mtls" else "connection"),
                         timeout=30, what="the refusal counted")  # fmt: skip
        assert proxy.forwarded == 0
        await refused.stop()

        since = datetime.now(UTC)
        await start_annotator("--prometheus-url", proxy.url, *_credentials(tmp_path, mode, proxy, cert))
        await eventually(lambda: stack.fresh_values(since), timeout=60, what=f"annotated through {mode}")
        assert proxy.forwarded > 0
        if mode == "bearer":  # the token rotates: the gateway and the file change, the annotator follows
            proxy.token = "rotated-" + mode
            (tmp_path / "token").write_text(proxy.token)
            since = datetime.now(UTC)
            await eventually(lambda: stack.fresh_values(since), timeout=60, what="annotated after rotation")
        if mode == "tenant":
            assert all(h.get("X-Scope-OrgID") == "team-a" for h in proxy.headers_seen[-3:])
