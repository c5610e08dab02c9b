"""What the node cache keeps of a Node: addresses for matching, decoded annotations for ages and hot values."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from crane_annotator.nodes import NodeCache, node_info
from crane_shared.annotations import decode
from crane_shared.retry import Backoff
from tests.support.fakeapi import Events, FakeApiServer, Page, Status, fake_api

KEYS = {"cpu_usage_avg_5m", "node_hot_value", "mem_usage_avg_5m"}


def node(annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": "n1", "annotations": annotations},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": "n1.example"},
                {"type": "ExternalIP", "address": "1.2.3.4"},
            ]
        },
    }


def test_addresses_are_internal_ips_and_hostnames_only() -> None:
    info = node_info(node({}), KEYS)
    assert info.addresses.internal_ips == ("10.0.0.1",) and info.addresses.hostnames == ("n1.example",)


@pytest.mark.parametrize(
    "text",
    [
        "0.12345,2023-10-17T15:04:32+00:00",
        "3,2023-10-17T15:04:32+00:00",
        "0.5,2023-10-17T15:04:32Z",
        "0.5,2023-10-17T17:04:32+02:00",
        "0.5,2023-10-17T15:04:32.250Z",
    ],
)
def test_annotations_decode_exactly_as_the_shared_decoder_does(text: str) -> None:
    zone = ZoneInfo("Asia/Shanghai")
    info = node_info(node({"cpu_usage_avg_5m": text}), KEYS, zone)
    expected = decode(text, zone)
    assert info.values["cpu_usage_avg_5m"] == expected.value
    assert info.stamps["cpu_usage_avg_5m"] == expected.timestamp.timestamp()


@pytest.mark.parametrize(
    "text",
    [
        "nan,2023-10-17T15:04:32+00:00",
        "-1,2023-10-17T15:04:32+00:00",
        "1_0,2023-10-17T15:04:32+00:00",
        "0.5,2023-13-17T15:04:32+00:00",
        "garbage",
    ],
)
def test_malformed_annotations_are_left_out(text: str) -> None:
    info = node_info(node({"cpu_usage_avg_5m": text, "other": "x"}), KEYS)
    assert info.values == {} and info.stamps == {}


def test_only_the_keys_we_write_are_kept() -> None:
    stamp = datetime(2023, 10, 17, tzinfo=UTC).isoformat()
    info = node_info(node({"node_hot_value": f"2,{stamp}", "unrelated": f"9,{stamp}"}), KEYS)
    assert info.values == {"node_hot_value": 2.0}


def node_object(name: str, rv: str, ip: str) -> dict[str, object]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": rv},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }


async def test_the_node_cache_survives_a_node_list_answering_503_and_keeps_its_view() -> None:
    """The list answers 503 (API server restarting) before the first success and again on a re-list: the cache
    keeps running, stays unsynced at first, then keeps the nodes it knew until a list succeeds."""
    server = FakeApiServer(lists=[Status(503, "ServiceUnavailable"), Status(503, "ServiceUnavailable")])
    server.lists += [Page([node_object("n1", "5", "10.0.0.1")], "5"), Status(503, "ServiceUnavailable")]
    server.lists += [Page([node_object("n2", "9", "10.0.0.2")], "9")]
    server.watches = [Events([{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}])]
    restarts: list[tuple[str, set[str]]] = []  # each restart with the nodes known at that moment
    async with fake_api(server) as api:
        cache = NodeCache(api, KEYS, backoff=Backoff(0.01, 0.02))
        cache.informer.on_restart = lambda reason: restarts.append((reason, set(cache.nodes)))
        stopping = asyncio.Event()
        task = asyncio.create_task(cache.run(stopping))
        try:
            await server.wait_for(lists=2)
            assert not task.done() and not cache.synced.is_set() and cache.nodes == {}
            await cache.synced.wait()
            await server.wait_for(lists=5)
            assert not task.done()
            await server.wait_for(watches=2)
            assert set(cache.nodes) == {"n2"}
        finally:
            stopping.set()
            await asyncio.wait_for(task, 5)
    assert restarts == [("error", set()), ("error", set()), ("gone", {"n1"}), ("error", {"n1"})]
