"""The extender over HTTP, mounted on a ServiceRuntime app: always a 200 kube-scheduler can decode."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from crane_extender.server import Extender, ExtenderMetrics, make_app
from crane_shared.informer import Informer
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.logs import LogOnce
from crane_shared.policy import default_policy
from crane_shared.service import ServiceRuntime
from tests.support.extender import names_args, node, nodes_args, pod, usage


@dataclass
class Recorder:
    """Stands in for a structlog logger: records warnings."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))


@dataclass
class Served:
    client: TestClient  # type: ignore[type-arg]
    extender: Extender
    registry: CollectorRegistry
    log: Recorder

    async def post(self, verb: str, body: Any) -> Any:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        resp = await self.client.post(f"/extender/{verb}", data=data, headers={"Content-Type": "application/json"})
        assert resp.status == 200, await resp.text()
        return await resp.json()

    def count(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


async def _never(**kw: Any) -> Any:
    raise AssertionError("the test fills the cache itself")


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    runtime = ServiceRuntime("test-extender", registry=CollectorRegistry())
    informer = Informer("nodes", _never)
    extender = Extender(
        DynamicArgs(default_policy()),
        informer=informer,
        metrics=ExtenderMetrics.create(runtime.registry),
        max_request_bytes=64 * 2**20,
    )
    log = Recorder()
    extender._once = LogOnce(log)  # type: ignore[arg-type]
    runtime.app.add_subapp("/extender", make_app(extender))
    client = TestClient(TestServer(runtime.app))
    await client.start_server()
    yield Served(client, extender, runtime.registry, log)
    await client.close()


FLEET = [node("cool", usage(0.1)), node("hot", usage({"cpu_usage_avg_5m": 0.9}))]


def fresh(fleet: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fleet with timestamps of now (the server uses the real clock)."""
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    out = []
    for n in fleet:
        values = {k: float(v.split(",")[0]) for k, v in n["metadata"]["annotations"].items()}
        out.append(node(n["metadata"]["name"], usage(values, now=now)))
    return out


async def test_filter_and_prioritize_are_served_under_the_url_prefix(served: Served) -> None:
    fleet = fresh(FLEET)
    result = await served.post("filter", nodes_args(pod(), fleet))
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["cool"]
    assert result["FailedNodes"] == {"hot": "node(s) had cpu_usage_avg_5m above 0.65"}
    scores = await served.post("prioritize", nodes_args(pod(), fleet))
    assert [h["Host"] for h in scores] == ["cool", "hot"]
    assert served.count("crane_extender_requests_total", verb="filter", result="ok") == 1
    assert served.count("crane_extender_filter_nodes_total", verdict="failed") == 1
    metrics = await (await served.client.get("/metrics")).text()
    assert 'crane_extender_requests_total{result="ok",verb="prioritize"} 1.0' in metrics
    assert "crane_extender_request_duration_seconds_bucket" in metrics


async def test_cache_mode_reads_the_informer_once_synced(served: Served) -> None:
    informer = served.extender.informer
    assert informer is not None
    informer.cache.update({n["metadata"]["name"]: n for n in fresh(FLEET)})
    early = await served.post("filter", names_args(pod(), ["cool", "hot"]))
    assert early["Error"] == "crane extender: node cache not synced yet"
    informer.synced.set()
    result = await served.post("filter", names_args(pod(), ["cool", "hot", "gone"]))
    assert result["NodeNames"] == ["cool"]
    assert set(result["FailedNodes"]) == {"hot"} and set(result["FailedAndUnresolvableNodes"]) == {"gone"}
    assert served.count("crane_extender_requests_total", verb="filter", result="unavailable") == 1


async def test_names_without_a_node_cache_explain_the_configuration_fix(served: Served) -> None:
    served.extender.informer = None
    result = await served.post("filter", names_args(pod(), ["a"]))
    assert "nodeCacheCapable: false" in result["Error"] and "--node-cache" in result["Error"]
    assert await served.post("prioritize", names_args(pod(), ["a"])) == []


async def test_malformed_requests_get_error_not_500_counted_and_logged_once(served: Served) -> None:
    for _ in range(3):
        result = await served.post("filter", b"{not json")
        assert result["Error"].startswith("crane extender: malformed filter request: request body is not JSON")
        assert result["Nodes"] is None and result["NodeNames"] is None
    assert await served.post("prioritize", {"Pod": {}}) == []
    assert served.count("crane_extender_malformed_requests_total", kind="not-json") == 3
    assert served.count("crane_extender_requests_total", verb="filter", result="malformed") == 3
    assert served.count("crane_extender_requests_total", verb="prioritize", result="malformed") == 1
    assert [f["kind"] for _, f in served.log.events] == ["malformed:not-json", "malformed:no-nodes"]


async def test_an_internal_failure_is_an_error_answer_not_a_stack_trace(served: Served) -> None:
    served.extender.args = None  # type: ignore[assignment]
    result = await served.post("filter", nodes_args(pod(), FLEET))
    assert result["Error"].startswith("crane extender: internal error: AttributeError")
    assert "Traceback" not in result["Error"]
    assert await served.post("prioritize", nodes_args(pod(), FLEET)) == []
    assert served.count("crane_extender_requests_total", verb="filter", result="error") == 1


async def test_bodies_beyond_aiohttps_default_limit_are_read(served: Served) -> None:
    fleet = [node(f"n{i:04d}", usage(0.2)) for i in range(2000)]
    body = json.dumps(nodes_args(pod(), fleet)).encode()
    assert len(body) > 2**20  # aiohttp's default client_max_size
    scores = await served.post("prioritize", body)
    assert len(scores) == 2000


async def test_a_body_over_the_configured_limit_is_refused_cleanly(served: Served) -> None:
    served.extender.max_request_bytes = 1000
    result = await served.post("filter", nodes_args(pod(), fresh(FLEET)))
    assert "larger than 1000 bytes" in result["Error"]
    assert served.count("crane_extender_malformed_requests_total", kind="too-large") == 1


async def test_a_large_body_is_decoded_off_the_event_loop_which_keeps_serving(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a Nodes-mode body of 2000 nodes is being decoded (held here until /healthz has answered), the loop
    serves other requests; had the decoding run on the loop, /healthz could not answer and the test would time
    out. A small body is decoded inline."""
    import asyncio
    import threading

    from crane_extender import server as server_module

    loop_thread, loop = threading.get_ident(), asyncio.get_running_loop()
    release, decoding = threading.Event(), asyncio.Event()
    decoded_in: list[tuple[int, bool]] = []  # (body size, decoded on the loop's thread)
    from crane_extender.protocol import parse_args as real

    def parse(body: Any) -> Any:
        on_loop = threading.get_ident() == loop_thread
        decoded_in.append((len(body), on_loop))
        if not on_loop:
            loop.call_soon_threadsafe(decoding.set)
            assert release.wait(30), "the test never released the decoding"
        return real(body)

    monkeypatch.setattr(server_module, "parse_args", parse)
    fleet = [node(f"n{i:04d}", usage(0.2)) for i in range(2000)]
    body = json.dumps(nodes_args(pod(), fleet)).encode()
    assert len(body) > server_module.PARSE_OFF_LOOP_BYTES
    large = asyncio.create_task(served.post("prioritize", body))
    try:
        await asyncio.wait_for(decoding.wait(), 30)  # the handler has handed the body to a worker thread
        health = await asyncio.wait_for(served.client.get("/healthz"), 10)
        assert health.status == 200
        assert not large.done()
    finally:
        release.set()
    assert len(await asyncio.wait_for(large, 30)) == 2000
    assert await served.post("prioritize", nodes_args(pod(), fresh(FLEET)))  # small: inline
    assert decoded_in == [(len(body), False), (decoded_in[1][0], True)]


async def test_a_large_malformed_body_is_an_error_answer_from_the_worker_thread(served: Served) -> None:
    from crane_extender.server import PARSE_OFF_LOOP_BYTES

    body = b'{"Pod": {}, "Nodes": {"items": [' + b"1," * PARSE_OFF_LOOP_BYTES + b"}"
    result = await served.post("filter", body)
    assert result["Error"].startswith("crane extender: malformed filter request: request body is not JSON")
    assert served.count("crane_extender_malformed_requests_total", kind="not-json") == 1


async def test_a_large_body_whose_pod_cannot_be_read_is_a_malformed_answer_not_a_500(served: Served) -> None:
    from crane_extender.server import PARSE_OFF_LOOP_BYTES

    padding = [node(f"n{i}", usage(0.1)) for i in range(PARSE_OFF_LOOP_BYTES // 300)]
    body = nodes_args({"metadata": {"name": "p"}, "spec": {"containers": [None]}}, padding)
    result = await served.post("filter", body)
    assert result["Error"].startswith("crane extender: malformed filter request: ExtenderArgs.Pod.spec")
    assert served.count("crane_extender_malformed_requests_total", kind="bad-pod") == 1


async def test_a_daemonset_pod_passes_a_node_the_cache_has_not_seen_yet(served: Served) -> None:
    """A new node's DaemonSet pods come at once, maybe before the node's watch event: kube's own exemption."""
    informer = served.extender.informer
    assert informer is not None
    informer.cache.update({n["metadata"]["name"]: n for n in fresh(FLEET)})
    informer.synced.set()
    daemon = pod()
    daemon["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "agent", "uid": "u", "controller": True}]
    result = await served.post("filter", names_args(daemon, ["new-node", "hot"]))
    assert result["NodeNames"] == ["new-node", "hot"] and result["FailedAndUnresolvableNodes"] == {}


async def test_bind_and_preempt_verbs_say_they_are_not_served(served: Served) -> None:
    for verb, setting in (("bind", "bindVerb"), ("preempt", "preemptVerb")):
        result = await served.post(verb, {"PodName": "p"})
        assert result["Error"].endswith(f"is not served (it filters and prioritizes only): remove {setting}")
        assert served.count("crane_extender_requests_total", verb=verb, result="not-served") == 1


async def test_nodes_and_node_names_together_are_refused(served: Served) -> None:
    both = {**nodes_args(pod(), fresh(FLEET)), "NodeNames": ["cool"]}
    result = await served.post("filter", both)
    assert "has both Nodes and NodeNames" in result["Error"]
