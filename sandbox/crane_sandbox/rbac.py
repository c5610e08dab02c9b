"""Each service under the Helm chart's own RBAC, with its own ServiceAccount token.

The ServiceAccounts, (Cluster)Roles and bindings come from ``helm template`` of deploy/helm/crane-scheduler (the
one source of the shipped manifests; no rule is copied here), so every test and sandbox run that starts a service
through ``install_identities`` proves the shipped permissions suffice: a missing verb is a 403 in the service's
log and a failing test. The chart is rendered once per process with placeholder names and the placeholders are
replaced per namespace (a render per test would cost a helm process each).
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_sandbox.cluster import REPO_ROOT, LocalCluster
from crane_shared.kube import api_client_from_dict

CHART = REPO_ROOT / "deploy" / "helm" / "crane-scheduler"
SERVICES = ("event-recorder", "annotator", "scheduler", "extender", "descheduler", "uninstall", "snapshot")
"""the services' accounts, the uninstall hook's (``cranectl stop-annotator``, ``load-taint clear``,
``withdraw-batch``) and ``cranectl snapshot``'s (read-only, ``snapshot.rbac.enabled``)"""
RBAC_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
DEFAULT_NAMESPACE = "crane-services"
CHART_VALUES = (
    # every service and every optional permission the sandbox and the tests use (NRT: topologyAware)
    "extender.enabled=true",
    "extender.nodeCache=true",
    "scheduler.topologyAware=true",
    # the annotator's batch capacity (pods watch, node status patch): granted when the policy has spec.reclaim
    "policy.spec.reclaim.maxAge=5m",
    # the annotator's load taint (node Events in "default") and the uninstall hook's account
    "policy.spec.loadTaint.hotRounds=2",
    # the ServiceMonitor's scraper account, bound to the metrics-reader role (/metrics under delegated access)
    "serviceMonitor.enabled=true",
    # cranectl snapshot's read-only account
    "snapshot.rbac.enabled=true",
    # Redis is not a Kubernetes object here; the chart only needs a URL to render
    "redis.enabled=false",
    "redis.external.url=redis://unused:6379/0",
)
_NS = "zz-placeholder-namespace"
_PREFIX = "zz-placeholder-prefix"
_TIMEOUT = 30
_installed: weakref.WeakKeyDictionary[LocalCluster, dict[str, dict[str, ServiceIdentity]]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ServiceIdentity:
    """One service's ServiceAccount, a token of it and a kubeconfig file carrying that token."""

    service: str
    namespace: str
    account: str
    token: str
    kubeconfig: Path

    @property
    def lease_name(self) -> str:
        """The Lease the chart lets this account update (its own name, in its namespace)."""
        return self.account

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"

    def kubeconfig_dict(self) -> dict[str, Any]:
        config: dict[str, Any] = yaml.safe_load(self.kubeconfig.read_text())
        return config


def helm_binary() -> str:
    """helm built from its Go module by scripts/tools (cached; the first call builds it)."""
    out = subprocess.run(
        [str(REPO_ROOT / "scripts" / "tools"), "helm"], check=True, capture_output=True, text=True, timeout=1800
    )
    return out.stdout.strip()


@functools.cache
def _rendered_template() -> str:
    out = subprocess.run(
        [
            helm_binary(),
            "template",
            "crane",
            str(CHART),
            "--namespace",
            _NS,
            "--set",
            ",".join([f"fullnameOverride={_PREFIX}", "createNamespace=true", *CHART_VALUES]),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout


def chart_prefix(namespace: str) -> str:
    """The object-name prefix for a namespace, truncated as the chart's ``crane.prefix`` does."""
    prefix = namespace[:40]
    return prefix[:-1] if prefix.endswith("-") else prefix


def chart_rbac(namespace: str, prefix: str | None = None) -> list[dict[str, Any]]:
    """The chart's Namespace, ServiceAccounts, roles and bindings for release namespace ``namespace``; object names
    start with ``prefix`` (default: the namespace, so cluster-scoped names differ per namespace)."""
    text = _rendered_template().replace(_PREFIX, prefix or chart_prefix(namespace)).replace(_NS, namespace)
    return [d for d in yaml.safe_load_all(text) if d and d.get("kind") in RBAC_KINDS]


async def apply_objects(api: client.ApiClient, objects: list[dict[str, Any]]) -> None:
    """Create each object, replacing roles and bindings that exist (ServiceAccounts and namespaces are kept)."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    calls: dict[str, tuple[Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]] | None, bool]] = {
        "Namespace": (core.create_namespace, None, False),
        "ServiceAccount": (core.create_namespaced_service_account, None, True),
        "ClusterRole": (rbac.create_cluster_role, rbac.replace_cluster_role, False),
        "ClusterRoleBinding": (rbac.create_cluster_role_binding, rbac.replace_cluster_role_binding, False),
        "Role": (rbac.create_namespaced_role, rbac.replace_namespaced_role, True),
        "RoleBinding": (rbac.create_namespaced_role_binding, rbac.replace_namespaced_role_binding, True),
    }
    for kind in RBAC_KINDS:  # namespaces and accounts before what refers to them
        for obj in (o for o in objects if o["kind"] == kind):
            create, replace, namespaced = calls[kind]
            meta = obj["metadata"]
            where = (meta["namespace"],) if namespaced else ()
            try:
                await create(*where, obj, _request_timeout=_TIMEOUT)
            except ApiException as e:
                if e.status != 409:
                    raise
                if replace is not None:
                    await replace(meta["name"], *where, obj, _request_timeout=_TIMEOUT)


async def install_identities(
    cluster: LocalCluster,
    api: client.ApiClient,
    namespace: str,
    *,
    prefix: str | None = None,
    token_seconds: int = 24 * 3600,
) -> dict[str, ServiceIdentity]:
    """Apply the chart's RBAC for ``namespace`` with the admin client ``api`` and return, per service of
    ``SERVICES``, a kubeconfig authenticating as that service's ServiceAccount (a TokenRequest token)."""
    prefix = prefix or chart_prefix(namespace)
    await apply_objects(api, chart_rbac(namespace, prefix))

    async def one(service: str) -> ServiceIdentity:
        account = f"{prefix}-{service}"
        token = await account_token(api, namespace, account, token_seconds)
        user = f"system:serviceaccount:{namespace}:{account}"
        config = cluster.kubeconfig_dict(token, user)
        path = cluster.write_kubeconfig(kubeconfig_path(cluster, namespace, service), config)
        return ServiceIdentity(service, namespace, account, token, path)

    installed = {i.service: i for i in await asyncio.gather(*(one(s) for s in SERVICES))}
    _installed.setdefault(cluster, {})[namespace] = installed
    return installed


async def account_token(api: client.ApiClient, namespace: str, account: str, seconds: int = 3600) -> str:
    """A bearer token of a ServiceAccount (TokenRequest), e.g. the chart's ``<prefix>-metrics-scraper``."""
    answer = await client.CoreV1Api(api).create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": seconds}}, _request_timeout=_TIMEOUT
    )
    token: str = answer.status.token
    return token


def kubeconfig_path(cluster: LocalCluster, namespace: str, service: str) -> Path:
    """Where ``install_identities`` writes the kubeconfig of ``service``'s account in ``namespace``."""
    return cluster.run_dir / "kubeconfigs" / f"{namespace}-{service}.yaml"


def identity(cluster: LocalCluster, service: str, namespace: str | None = None) -> ServiceIdentity:
    """An identity ``install_identities`` made on this cluster: in ``namespace``, or the first one installed."""
    by_namespace = _installed.get(cluster) or {}
    if not by_namespace or (namespace is not None and namespace not in by_namespace):
        raise LookupError(
            f"no ServiceAccounts installed on this cluster in {namespace or 'any namespace'}: "
            "call crane_sandbox.rbac.install_identities first"
        )
    return by_namespace[namespace or next(iter(by_namespace))][service]


async def service_identity(cluster: LocalCluster, service: str, namespace: str | None = None) -> ServiceIdentity:
    """``identity``, installing the chart's RBAC first (in ``namespace``, default ``DEFAULT_NAMESPACE``) when this
    cluster has none there yet."""
    if namespace in (_installed.get(cluster) or {}) or (namespace is None and _installed.get(cluster)):
        return identity(cluster, service, namespace)
    api = await api_client_from_dict(cluster.kubeconfig_dict())
    try:
        return (await install_identities(cluster, api, namespace or DEFAULT_NAMESPACE))[service]
    finally:
        await api.close()
