"""``helm install`` of the chart on the real API server: every object is accepted (API validation, RBAC objects
the API server checks for escalation), each service account can do what its service needs and nothing more, an
upgrade keeps the generated Redis password, and uninstall removes what it installed.

Pods do not start here: this API server has no kubelets (KWOK is not part of this branch's sandbox), so the test
stops at the objects and their permissions; the images themselves run in test_images.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_shared.kube import api_client_from_dict
from tests.support.deploy import CHART, helm

NS = "crane-helm"
RELEASE = "crane"

# (service account, verb, group, resource, namespace or None, name or None, expected)
ACCESS: list[tuple[str, str, str, str, str | None, str | None, bool]] = [
    ("event-recorder", "watch", "", "events", None, None, True),
    ("event-recorder", "list", "events.k8s.io", "events", None, None, True),
    ("event-recorder", "create", "", "events", "default", None, False),
    ("event-recorder", "list", "", "pods", None, None, False),
    ("event-recorder", "get", "", "secrets", NS, None, False),
    ("annotator", "patch", "", "nodes", None, None, True),
    ("annotator", "watch", "", "nodes", None, None, True),
    ("annotator", "delete", "", "nodes", None, None, False),
    ("annotator", "update", "", "nodes", None, None, False),
    ("annotator", "create", "coordination.k8s.io", "leases", NS, None, True),
    ("annotator", "update", "coordination.k8s.io", "leases", NS, "crane-annotator", True),
    ("annotator", "update", "coordination.k8s.io", "leases", NS, "crane-scheduler", False),
    ("annotator", "update", "coordination.k8s.io", "leases", "kube-system", "crane-annotator", False),
    ("annotator", "list", "", "pods", None, None, False),
    ("scheduler", "create", "", "pods/binding", "default", None, True),
    ("scheduler", "patch", "", "pods/status", "default", None, True),
    ("scheduler", "create", "events.k8s.io", "events", "default", None, True),
    ("scheduler", "get", "", "pods", "default", None, True),
    ("scheduler", "update", "coordination.k8s.io", "leases", NS, "crane-scheduler", True),
    ("scheduler", "update", "coordination.k8s.io", "leases", "kube-system", "kube-scheduler", False),
    ("scheduler", "delete", "", "pods", "default", None, True),  # preemption's victims
    ("scheduler", "update", "", "persistentvolumes", None, None, True),  # VolumeBinding's PreBind
    ("scheduler", "update", "", "persistentvolumeclaims", "default", None, True),
    ("scheduler", "delete", "", "persistentvolumeclaims", "default", None, False),
    ("scheduler", "watch", "storage.k8s.io", "csinodes", None, None, True),
    ("scheduler", "watch", "storage.k8s.io", "csistoragecapacities", None, None, True),
    ("scheduler", "list", "storage.k8s.io", "csidrivers", None, None, True),
    ("scheduler", "watch", "policy", "poddisruptionbudgets", None, None, True),
    ("scheduler", "update", "storage.k8s.io", "storageclasses", None, None, False),
    ("scheduler", "patch", "", "nodes", None, None, False),
    ("extender", "watch", "", "nodes", None, None, True),
    ("extender", "patch", "", "nodes", None, None, False),
    ("descheduler", "create", "", "pods/eviction", "default", None, True),  # the Eviction API only
    ("descheduler", "delete", "", "pods", "default", None, False),
    ("descheduler", "patch", "", "pods", "default", None, False),
    ("descheduler", "watch", "", "pods", None, None, True),
    ("descheduler", "watch", "policy", "poddisruptionbudgets", None, None, True),
    ("descheduler", "watch", "apps", "replicasets", None, None, True),
    ("descheduler", "create", "events.k8s.io", "events", "default", None, True),  # one Event format
    ("descheduler", "create", "", "events", "default", None, False),
    ("descheduler", "patch", "", "nodes", None, None, False),
    ("descheduler", "update", "coordination.k8s.io", "leases", NS, "crane-descheduler", True),
    ("descheduler", "update", "coordination.k8s.io", "leases", NS, "crane-scheduler", False),
    ("redis", "list", "", "nodes", None, None, False),
    # delegated /metrics: each service asks the API server about its scrapers' tokens (system:auth-delegator)
    ("scheduler", "create", "authentication.k8s.io", "tokenreviews", None, None, True),
    ("annotator", "create", "authorization.k8s.io", "subjectaccessreviews", None, None, True),
    ("event-recorder", "create", "authentication.k8s.io", "tokenreviews", None, None, True),
    ("extender", "create", "authorization.k8s.io", "subjectaccessreviews", None, None, True),
    ("redis", "create", "authentication.k8s.io", "tokenreviews", None, None, False),
]


async def _helm(cluster: LocalCluster, *args: str, check: bool = True) -> str:
    result = await asyncio.to_thread(helm, *args, "--kubeconfig", str(cluster.kubeconfig_path), check=check)
    return result.stdout + result.stderr


async def _allowed(
    kube: client.ApiClient, sa: str, verb: str, group: str, resource: str, ns: str | None, name: str | None
) -> bool:
    subresource = ""
    if "/" in resource:
        resource, subresource = resource.split("/", 1)
    attrs: dict[str, Any] = {"verb": verb, "group": group, "resource": resource, "subresource": subresource}
    if ns:
        attrs["namespace"] = ns
    if name:
        attrs["name"] = name
    body = {"spec": {"user": f"system:serviceaccount:{NS}:crane-{sa}", "resourceAttributes": attrs}}
    resp = await client.AuthorizationV1Api(kube).create_subject_access_review(body, _preload_content=False)
    review = json.loads(await resp.read())
    return bool(review["status"].get("allowed"))


async def _names(call: Any, *args: Any) -> set[str]:
    resp = await call(*args, _preload_content=False)
    return {o["metadata"]["name"] for o in json.loads(await resp.read())["items"]}


async def test_chart_installs_and_each_service_account_has_exactly_its_permissions(
    cluster: LocalCluster, kube: client.ApiClient
) -> None:
    out = await _helm(
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NS,
        "--create-namespace",
        "--set",
        "extender.enabled=true",
    )
    print(out)
    assert "STATUS: deployed" in out
    try:
        apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
        services = {
            "crane-event-recorder",
            "crane-annotator",
            "crane-scheduler",
            "crane-extender",
            "crane-descheduler",
        }
        assert await _names(apps.list_namespaced_deployment, NS) == services | {"crane-redis"}
        assert await _names(core.list_namespaced_service_account, NS) >= services | {"crane-redis"}
        assert await _names(client.PolicyV1Api(kube).list_namespaced_pod_disruption_budget, NS) == services
        assert await _names(client.NetworkingV1Api(kube).list_namespaced_network_policy, NS) == services | {
            "crane-redis"
        }
        assert {"crane-policy", "crane-scheduler-config"} <= await _names(core.list_namespaced_config_map, NS)
        roles = await _names(client.RbacAuthorizationV1Api(kube).list_cluster_role)
        assert services <= roles

        wrong = []
        for sa, verb, group, resource, ns, name, expected in ACCESS:
            if await _allowed(kube, sa, verb, group, resource, ns, name) != expected:
                wrong.append(f"{sa} {verb} {group}/{resource} ns={ns} name={name}: expected allowed={expected}")
        assert not wrong, "\n".join(wrong)

        # The same as the annotator would do it, with a token of its ServiceAccount.
        token = await core.create_namespaced_service_account_token(
            "crane-annotator", NS, {"spec": {"expirationSeconds": 600}}
        )
        await core.create_node({"metadata": {"name": "helm-node"}})
        as_annotator = await api_client_from_dict(cluster.kubeconfig_dict(token.status.token, user="annotator"))
        try:
            await client.CoreV1Api(as_annotator).patch_node(
                "helm-node", {"metadata": {"annotations": {"cpu_usage_avg_5m": "0.1,2026-01-01T00:00:00Z"}}}
            )
            try:
                await client.CoreV1Api(as_annotator).list_namespaced_secret(NS)
                raise AssertionError("the annotator's account can read Secrets")
            except client.ApiException as err:
                assert err.status == 403
        finally:
            await as_annotator.close()
        node = await core.read_node("helm-node")
        assert node.metadata.annotations["cpu_usage_avg_5m"].startswith("0.1,")

        # An upgrade keeps the generated Redis password (lookup of the existing Secret).
        secret = await core.read_namespaced_secret("crane-redis-auth", NS)
        out = await _helm(
            cluster,
            "upgrade",
            RELEASE,
            str(CHART),
            "--namespace",
            NS,
            "--set",
            "extender.enabled=true,annotator.replicas=3",
        )
        assert "STATUS: deployed" in out
        assert (await core.read_namespaced_secret("crane-redis-auth", NS)).data == secret.data
        assert (await apps.read_namespaced_deployment("crane-annotator", NS)).spec.replicas == 3
    finally:
        await _helm(cluster, "uninstall", RELEASE, "--namespace", NS, check=False)
    assert await _names(client.AppsV1Api(kube).list_namespaced_deployment, NS) == set()
    assert "crane-annotator" not in await _names(client.RbacAuthorizationV1Api(kube).list_cluster_role)
