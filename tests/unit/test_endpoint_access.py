"""/debug/* is served to loopback clients only by default; /healthz to anyone."""

from __future__ import annotations

from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from crane_shared.service import Access, ServiceRuntime, is_loopback


def _request(path: str, peer: str) -> web.Request:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (peer, 40000) if name == "peername" else default
    return make_mocked_request("GET", path, transport=transport)


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.mark.parametrize(
    ("path", "peer", "allowed"),
    [
        ("/debug/explain/ns/p", "127.0.0.1", True),
        ("/debug/explain/ns/p", "::1", True),
        ("/debug/explain/ns/p", "10.244.1.7", False),
        ("/debugger", "10.244.1.7", True),  # only /debug and below
        ("/healthz", "10.244.1.7", True),
        ("/metrics", "10.244.1.7", True),  # default for /metrics: any (the chart's NetworkPolicy limits it)
    ],
)
async def test_default_access(path: str, peer: str, allowed: bool) -> None:
    runtime = ServiceRuntime("t", "127.0.0.1", 0)
    if allowed:
        assert (await runtime._guard(_request(path, peer), _ok)).status == 200
    else:
        with pytest.raises(web.HTTPForbidden):
            await runtime._guard(_request(path, peer), _ok)


async def test_metrics_on_loopback_only_when_configured() -> None:
    runtime = ServiceRuntime("t", "127.0.0.1", 0)
    runtime.configure_access(Access.LOOPBACK, Access.LOOPBACK)
    with pytest.raises(web.HTTPForbidden):
        await runtime._guard(_request("/metrics", "192.168.1.2"), _ok)
    assert is_loopback("127.0.0.5") and not is_loopback("bogus") and not is_loopback(None)


def test_delegated_access_needs_client_settings() -> None:
    with pytest.raises(ValueError, match="delegated"):
        ServiceRuntime("t", "127.0.0.1", 0).configure_access(Access.DELEGATED, Access.LOOPBACK)
