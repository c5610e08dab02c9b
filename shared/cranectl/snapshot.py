"""``cranectl snapshot``: the state that decides placement, from a live cluster to one file.

What is written (``kind: CraneSnapshot``, JSON or YAML by the file's extension): ``takenAt`` (the time
``cranectl simulate`` replays the load annotations at), the scheduler's ``KubeSchedulerConfiguration`` and the
Dynamic policy when given (``--config`` / ``--policy``: local files, e.g. the chart's ConfigMap saved with
``kubectl get cm ... -o jsonpath``), and ``objects``, each with its ``kind``:

- nodes (labels, annotations: the load, the hot value, the batch loan; taints, allocatable), ``--node-selector``
  keeping only the nodes the scheduler sees (its flag of that name);
- pods bound to those nodes and pending pods (not finished): metadata (labels, owners), the spec fields the
  scheduler reads, and of the status the phase, the start time (preemption orders its victims by it), the
  nomination, the conditions and an in-place resize's. Never written: containers' ``env``, ``envFrom``, ``command``,
  ``args``, probes and lifecycle hooks; volumes other than claims are kept by name and type only; annotations are
  kept except ``kubectl.kubernetes.io/last-applied-configuration`` (a copy of the whole manifest, env included) and
  ``managedFields`` are dropped. Nothing is read from Secrets or ConfigMaps;
- PodGroups (scheduler-plugins' ``scheduling.x-k8s.io``, Kubernetes' ``scheduling.k8s.io`` PodGroups and
  Workloads), DRA objects (ResourceClaims, ResourceClaimTemplates: ``simulate`` makes a new pod's claims from
  them, ResourceSlices, DeviceClasses), PVCs, PVs, StorageClasses, CSINodes,
  CSIDrivers, CSIStorageCapacities, VolumeAttachments, PodDisruptionBudgets, Namespaces, NodeResourceTopologies
  (crane's NUMA plugin), PriorityClasses (a manifest's ``priorityClassName`` resolved as admission would);
- the default spreading's owners (Services, ReplicationControllers, ReplicaSets, StatefulSets): their metadata and
  ``spec.selector`` only (``SELECTOR_ONLY``), never their pod templates.

Every kind the scheduler reads is listed (a test holds the two together).

An API group the server does not serve (404) is recorded in ``notServed`` and skipped; any other error stops the
command naming the resource and the status. Every request has a timeout (``--timeout``). Lists are paged.
The account needs only ``list`` on those resources (``CORE`` and ``GROUPED``); nothing is written. The chart's
opt-in ``snapshot.rbac.enabled`` grants exactly that to a ServiceAccount ``<release>-snapshot``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_shared.kube import raw_json

KIND = "CraneSnapshot"
API_VERSION = "crane.io/v1alpha1"
PAGE = 500
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
TERMINAL = ("Succeeded", "Failed")
POD_STATUS = ("phase", "startTime", "nominatedNodeName", "conditions", "resize")
"""what of a pod's status is kept (``startTime``: preemption orders its victims by it)"""
CONTAINER_SECRETS = (
    "env",
    "envFrom",
    "command",
    "args",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
)

CORE = (
    "nodes",
    "pods",
    "namespaces",
    "persistentvolumeclaims",
    "persistentvolumes",
    "services",
    "replicationcontrollers",
)
"""the core group's resources listed (``take``); with ``GROUPED``, what the chart's snapshot role grants ``list`` on"""

# (kind, group, version, plural): the custom and newer APIs, listed through the generic client; a 404 is "not
# served" (an older cluster, a CRD not installed), recorded, not an error. Of two versions of one resource, the
# first served is listed (the same objects, not twice).
GROUPED: list[tuple[str, str, str, str]] = [
    ("PodGroup", "scheduling.x-k8s.io", "v1alpha1", "podgroups"),
    ("PodGroup", "scheduling.k8s.io", "v1beta1", "podgroups"),
    ("Workload", "scheduling.k8s.io", "v1beta1", "workloads"),
    ("Workload", "scheduling.k8s.io", "v1alpha1", "workloads"),
    ("ResourceClaim", "resource.k8s.io", "v1", "resourceclaims"),
    ("ResourceClaimTemplate", "resource.k8s.io", "v1", "resourceclaimtemplates"),
    ("ResourceSlice", "resource.k8s.io", "v1", "resourceslices"),
    ("DeviceClass", "resource.k8s.io", "v1", "deviceclasses"),
    ("StorageClass", "storage.k8s.io", "v1", "storageclasses"),
    ("CSINode", "storage.k8s.io", "v1", "csinodes"),
    ("CSIDriver", "storage.k8s.io", "v1", "csidrivers"),
    ("CSIStorageCapacity", "storage.k8s.io", "v1", "csistoragecapacities"),
    ("VolumeAttachment", "storage.k8s.io", "v1", "volumeattachments"),
    ("ReplicaSet", "apps", "v1", "replicasets"),
    ("StatefulSet", "apps", "v1", "statefulsets"),
    ("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets"),
    ("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses"),
    ("NodeResourceTopology", "topology.crane.io", "v1alpha1", "noderesourcetopologies"),
]


class SnapshotError(RuntimeError):
    """A request failed: the message names the resource and the API's answer."""


def scrub_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as the scheduler reads it, without what may hold secrets (env, command lines, probes, the
    last-applied manifest) or bulk (managedFields)."""
    out = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations:
        annotations.pop(LAST_APPLIED, None)
    spec = out.get("spec") or {}
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(key) or ():
            for name in CONTAINER_SECRETS:
                container.pop(name, None)
    volumes = []
    for volume in spec.get("volumes") or ():
        kept = {k: v for k, v in volume.items() if k in ("name", "persistentVolumeClaim", "ephemeral")}
        kept |= {k: {} for k in volume if k not in kept}  # other sources by type only (secret, configMap, ...)
        volumes.append(kept)
    if volumes:
        spec["volumes"] = volumes
    status = out.get("status") or {}
    out["status"] = {k: status[k] for k in POD_STATUS if k in status}
    if "containerStatuses" in status:  # an in-place resize's allocated resources
        out["status"]["containerStatuses"] = [
            {k: c[k] for k in ("name", "allocatedResources", "resources") if k in c}
            for c in status["containerStatuses"]
        ]
    return out


SELECTOR_ONLY = ("Service", "ReplicationController", "ReplicaSet", "StatefulSet")
"""kinds the scheduler reads only the selector of (the default spreading's owners): their pod templates (env,
command lines) and statuses are not written"""


def scrub(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    out["kind"] = kind
    meta = out.setdefault("metadata", {})
    meta.pop("managedFields", None)
    if meta.get("annotations"):
        meta["annotations"].pop(LAST_APPLIED, None)
    if kind in SELECTOR_ONLY:
        out["spec"] = {"selector": (out.get("spec") or {}).get("selector")}
        out.pop("status", None)
    return out


async def _paged(what: str, call: Callable[[str | None], Awaitable[Any]]) -> list[dict[str, Any]]:
    """Every item of a list, page by page; ``SnapshotError`` naming ``what`` on any error."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        try:
            body = await raw_json(call(token))
        except ApiException as err:
            raise SnapshotError(f"listing {what}: HTTP {err.status} {err.reason}: {_message(err)}") from err
        except TimeoutError as err:
            raise SnapshotError(f"listing {what}: timed out") from err
        items.extend((body or {}).get("items") or ())
        token = ((body or {}).get("metadata") or {}).get("continue") or None
        if not token:
            return items


def _message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "{}").get("message") or err.body or "")
    except (ValueError, AttributeError):
        return str(err.body or "")


async def take(
    api: client.ApiClient,
    *,
    node_selector: str | None = None,
    timeout: float = 60.0,
    config: Mapping[str, Any] | None = None,
    policy: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The snapshot document (see the module's docstring)."""
    v1 = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    taken = now or datetime.now(UTC)

    def core(method: Callable[..., Any], **kw: Any) -> Callable[[str | None], Awaitable[Any]]:
        def call(token: str | None) -> Awaitable[Any]:
            extra = {"_continue": token} if token else {}
            return method(limit=PAGE, _preload_content=False, _request_timeout=timeout, **kw, **extra)  # type: ignore[no-any-return]

        return call

    nodes = await _paged("nodes", core(v1.list_node, **({"label_selector": node_selector} if node_selector else {})))
    names = {n["metadata"]["name"] for n in nodes}
    pods = await _paged("pods", core(v1.list_pod_for_all_namespaces))
    kept_pods = [
        scrub(scrub_pod(p), "Pod")
        for p in pods
        if (p.get("status") or {}).get("phase") not in TERMINAL
        and ((p.get("spec") or {}).get("nodeName") in names or not (p.get("spec") or {}).get("nodeName"))
    ]
    objects = [scrub(n, "Node") for n in nodes]
    objects += [scrub(o, "Namespace") for o in await _paged("namespaces", core(v1.list_namespace))]
    objects += [
        scrub(o, "PersistentVolumeClaim")
        for o in await _paged("persistentvolumeclaims", core(v1.list_persistent_volume_claim_for_all_namespaces))
    ]
    objects += [
        scrub(o, "PersistentVolume") for o in await _paged("persistentvolumes", core(v1.list_persistent_volume))
    ]
    objects += [scrub(o, "Service") for o in await _paged("services", core(v1.list_service_for_all_namespaces))]
    objects += [
        scrub(o, "ReplicationController")
        for o in await _paged("replicationcontrollers", core(v1.list_replication_controller_for_all_namespaces))
    ]
    not_served: list[str] = []
    listed: set[tuple[str, str]] = set()
    for kind, group, version, plural in GROUPED:
        if (plural, group) in listed:
            continue

        def call(token: str | None, g: str = group, v: str = version, p: str = plural) -> Awaitable[Any]:
            extra = {"_continue": token} if token else {}
            return custom.list_cluster_custom_object(  # type: ignore[no-any-return]
                g, v, p, limit=PAGE, _preload_content=False, _request_timeout=timeout, **extra
            )

        try:
            found = await _paged(f"{plural}.{group}/{version}", call)
        except SnapshotError as err:
            if isinstance(err.__cause__, ApiException) and err.__cause__.status == 404:
                not_served.append(f"{plural}.{group}/{version}")
                continue
            raise
        listed.add((plural, group))
        objects += [scrub(o, kind) for o in found]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "takenAt": taken.isoformat(),
        "nodeSelector": node_selector,
        "schedulerConfig": dict(config) if config is not None else None,
        "policy": dict(policy) if policy is not None else None,
        "notServed": not_served,
        "objects": objects + kept_pods,
    }


def write(document: Mapping[str, Any], path: Path) -> None:
    """YAML for ``.yaml``/``.yml``, else JSON."""
    if path.suffix in (".yaml", ".yml"):
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        path.write_text(yaml.dump(dict(document), Dumper=dumper, sort_keys=False))
    else:
        path.write_text(json.dumps(document, indent=1))


def read(path: Path) -> dict[str, Any]:
    """A snapshot file back; ``ValueError`` naming the file when it is not one."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"{path}: {err.strerror}") from err
    try:
        doc = json.loads(text)  # JSON first: a large snapshot parses ~100x faster than as YAML
    except ValueError:
        try:
            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: not JSON or YAML: {err}") from err
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError(f"{path}: not a snapshot (kind: {KIND} expected)")
    if not isinstance(doc.get("objects"), list) or not isinstance(doc.get("takenAt"), str):
        raise ValueError(f"{path}: a snapshot needs objects (a list) and takenAt")
    return doc


def policy_path_of(config: Mapping[str, Any] | None) -> str | None:
    """The Dynamic plugin's ``policyConfigPath`` in a scheduler configuration (the first profile naming one)."""
    for profile in (config or {}).get("profiles") or ():
        for entry in (profile or {}).get("pluginConfig") or ():
            if (entry or {}).get("name") == "Dynamic":
                path = ((entry or {}).get("args") or {}).get("policyConfigPath")
                if path:
                    return str(path)
    return None


def load_document(path: str | None, what: str) -> dict[str, Any] | None:
    """A local YAML file given by a flag (``--config``, ``--policy``), parsed; ``ValueError`` naming the flag."""
    if path is None:
        return None
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"{what} {path}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ValueError(f"{what} {path}: not YAML: {err}") from err
    if not isinstance(doc, dict):
        raise ValueError(f"{what} {path}: not a YAML mapping")
    return doc
