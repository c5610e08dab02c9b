"""/metrics and /debug/* behind Kubernetes delegated authentication and authorization on the real API server:
the caller's bearer token is checked with a TokenReview and a SubjectAccessReview for ``get`` on the path, as
kube-scheduler's secure port does. /healthz and /readyz stay open."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.rbac import account_token, chart_prefix, install_identities
from crane_shared.kube import KubeSettings
from crane_shared.service import Access, ServiceRuntime
from tests.support.event_recorder_cluster import child as recorder_child


async def _get(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        await r.read()
        return r.status


async def _state(request: web.Request) -> web.Response:
    return web.json_response({})


async def test_delegated_access_needs_a_token_the_api_server_authenticates_and_authorizes(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str
) -> None:
    v1, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    for name in ("scraper", "nobody"):
        await v1.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    role = f"{namespace}-metrics"
    await rbac.create_cluster_role(
        {"metadata": {"name": role}, "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}
    )
    await rbac.create_cluster_role_binding(
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}],
        }
    )
    spec = {"spec": {"expirationSeconds": 600}}
    scraper = (await v1.create_namespaced_service_account_token("scraper", namespace, spec)).status.token
    nobody = (await v1.create_namespaced_service_account_token("nobody", namespace, spec)).status.token

    runtime = ServiceRuntime("access-test", "127.0.0.1", 0)
    runtime.configure_access(Access.DELEGATED, Access.DELEGATED, KubeSettings(str(cluster.kubeconfig_path)))
    runtime.app.router.add_get("/debug/state", _state)
    await runtime.start_http()
    base = f"http://127.0.0.1:{runtime.port}"
    try:
        try:
            assert await _get(f"{base}/healthz") == 200  # the kubelet's probes need no token
            assert await _get(f"{base}/metrics") == 401
            assert await _get(f"{base}/metrics", "not-a-token") == 401
            assert await _get(f"{base}/metrics", nobody) == 403
            assert await _get(f"{base}/metrics", scraper) == 200
            assert await _get(f"{base}/debug/state", scraper) == 403  # granted /metrics only
        finally:
            await rbac.delete_cluster_role_binding(role)
            await rbac.delete_cluster_role(role)
    finally:
        await runtime.stop_http()


async def test_the_charts_rbac_locks_a_services_metrics_to_the_metrics_reader_role(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, redis_url: str
) -> None:
    """A real service as the chart deploys it (``--metrics-access delegated``, its own ServiceAccount bound to
    system:auth-delegator by the chart) answers /metrics to the chart's scraper account (the ServiceMonitor's
    identity, bound to the metrics-reader ClusterRole) and refuses every other token: the chart's RBAC both lets
    the service ask the API server and keeps other callers out."""
    accounts = await install_identities(cluster, kube, namespace)
    prefix = chart_prefix(namespace)
    scraper = await account_token(kube, namespace, f"{prefix}-metrics-scraper")
    recorder = recorder_child(
        accounts["event-recorder"].kubeconfig,
        redis_url,
        namespace,
        cluster.run_dir / "logs",
        "--metrics-access",
        "delegated",
    )
    await recorder.process.start()
    base = f"http://127.0.0.1:{recorder.port}"
    try:
        await recorder.process.wait_ready(lambda: _ok(f"{base}/healthz"), timeout=30)
        assert await _get(f"{base}/metrics") == 401
        assert await _get(f"{base}/metrics", accounts["annotator"].token) == 403  # a service, not a reader
        assert await _get(f"{base}/metrics", scraper) == 200
    finally:
        await recorder.process.stop()


async def _ok(url: str) -> bool:
    return await _get(url) == 200
