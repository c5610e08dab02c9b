"""Which pods may be evicted, and what the rest of the round needs to know about each: pure, over pod JSON.

A pod may go only when a controller recreates it elsewhere: its controller owner is a ReplicaSet, StatefulSet or
Job, or a kind the policy adds (``recreatingOwnerKinds``). Never: DaemonSet pods, mirror and static pods,
system-critical pods (priority class ``system-*-critical`` or priority >= 2e9), pods younger than ``minPodAge``,
pods with local storage (``emptyDir``, ``hostPath``) unless allowed, pods annotated
``descheduler.alpha.kubernetes.io/prefer-no-eviction``, pods not Running or already terminating, pods in an
excluded namespace (the same protections as kubernetes-sigs/descheduler's DefaultEvictor), and pods whose
PodDisruptionBudget allows no disruption right now.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from crane_descheduler.policy import Evictable
from crane_shared.batch import is_batch
from crane_shared.labels import label_selector_matches
from crane_shared.loadaware.podsize import PodSize, is_daemonset_pod, pod_size
from crane_shared.podresources import pod_requests_of

PREFER_NO_EVICTION = "descheduler.alpha.kubernetes.io/prefer-no-eviction"
MIRROR = "kubernetes.io/config.mirror"
CONFIG_SOURCE = "kubernetes.io/config.source"
SYSTEM_CRITICAL = 2_000_000_000
QOS_RANK = {"BestEffort": 0, "Burstable": 1, "Guaranteed": 2}

QoS = Literal["BestEffort", "Burstable", "Guaranteed"]


@dataclass(frozen=True)
class Owner:
    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class PodView:
    """What the planner reads of a pod."""

    namespace: str
    name: str
    uid: str
    node: str
    priority: int
    qos: QoS
    owner: Owner | None
    size: PodSize
    """requests (limits where none): the scheduler's estimate input"""
    requests: Mapping[str, int]
    """kube's ``PodRequests`` (CPU in millicores): what NodeResourcesFit counts"""
    ready: bool
    batch: bool = False
    """it requests the batch resources (``crane_shared.batch.is_batch``): it leaves a hot node first"""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def controller(meta: Mapping[str, Any]) -> Owner | None:
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller"):
            return Owner(str(ref.get("kind")), str(ref.get("name")), str(ref.get("uid")))
    return None


def workload_owners(replicasets: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """ReplicaSet uid -> its controller's uid (a Deployment's, usually): pods of every revision of a Deployment
    count as one workload, so ``maxUnavailablePerWorkload`` is the Deployment's, as its own ``maxUnavailable``."""
    out: dict[str, str] = {}
    for rs in replicasets:
        meta = rs.get("metadata") if isinstance(rs, Mapping) else None
        if not isinstance(meta, Mapping) or not meta.get("uid"):
            continue
        owner = controller(meta)
        if owner is not None:
            out[str(meta["uid"])] = owner.uid
    return out


def workload_of(owner: Owner, owners: Mapping[str, str]) -> str:
    """The uid a pod's budget counts under: its controller's, or that controller's own controller."""
    return owners.get(owner.uid, owner.uid) if owner.kind == "ReplicaSet" else owner.uid


def qos_class(pod: Mapping[str, Any]) -> QoS:
    """The API server's ``status.qosClass``; computed from the containers' resources when absent."""
    given = (pod.get("status") or {}).get("qosClass")
    if given in QOS_RANK:
        return given  # type: ignore[no-any-return]
    containers = (pod.get("spec") or {}).get("containers") or ()
    resources = [c.get("resources") or {} for c in containers]
    if not any((r.get("requests") or r.get("limits")) for r in resources):
        return "BestEffort"
    for r in resources:
        limits, requests = r.get("limits") or {}, r.get("requests") or {}
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                return "Burstable"
    return "Guaranteed"


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """Raises KeyError/TypeError/ValueError for a pod too malformed to plan with (the caller skips and counts)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    requests = pod_requests_of(pod, use_status=True)  # what it holds on its node, resizing in place or not
    conditions = status.get("conditions") or ()
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return PodView(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid", ""),
        node=spec.get("nodeName") or "",
        priority=int(spec.get("priority") or 0),
        qos=qos_class(pod),
        owner=controller(meta),
        size=pod_size(spec, requests),
        requests=requests,
        ready=ready,
        batch=is_batch(spec),
    )


def eviction_blocker(pod: Mapping[str, Any], now: datetime, evictable: Evictable) -> str | None:
    """None when the pod may be evicted; else a short reason (a metric label)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    if meta.get("deletionTimestamp"):
        return "not-running"  # leaving already
    # what a pod is comes before what holds it back: a drain leaves DaemonSet and static pods on a node (kube-proxy
    # in an excluded kube-system too), and a pod not running yet that can never be evicted blocks it now, not
    # after the node's other pods were moved
    if is_daemonset_pod(meta):
        return "daemonset"
    if MIRROR in annotations or annotations.get(CONFIG_SOURCE, "api") != "api":
        return "static"
    if meta.get("namespace") in evictable.exclude_namespaces:
        return "namespace-excluded"
    priority_class = spec.get("priorityClassName") or ""
    if (
        priority_class in ("system-cluster-critical", "system-node-critical")
        or int(spec.get("priority") or 0) >= SYSTEM_CRITICAL
    ):
        return "system-critical"
    if PREFER_NO_EVICTION in annotations:
        return "prefer-no-eviction"
    owner = controller(meta)
    if owner is None or owner.kind not in evictable.owner_kinds:
        return "not-recreated"
    if not evictable.evict_local_storage and any(
        isinstance(v, dict) and ("emptyDir" in v or "hostPath" in v) for v in spec.get("volumes") or ()
    ):
        return "local-storage"
    if (pod.get("status") or {}).get("phase") != "Running":
        return "not-running"  # passes with time
    born = created_at(meta)
    if born is None or now - born < evictable.min_pod_age:
        return "young"
    return None


def created_at(meta: Mapping[str, Any]) -> datetime | None:
    """The object's ``metadata.creationTimestamp``; None without one (``ValueError`` for one that is not a time)."""
    created = meta.get("creationTimestamp")
    return datetime.fromisoformat(str(created).replace("Z", "+00:00")) if created else None


MAX_DISRUPTED_PODS = 2000
"""The Eviction API refuses (403) an eviction under a budget with more entries in ``status.disruptedPods`` than this
(``eviction.go``'s ``MaxDisruptedPodSize``)"""


class Disruptions:
    """What each PodDisruptionBudget still allows this round, judged as the Eviction API judges an eviction
    (``pkg/registry/core/pod/storage/eviction.go``): its ``status.disruptionsAllowed`` (none while its status has
    not observed its spec's generation) less the evictions planned under it so far, the hot nodes' and the drain's
    in one count. A pod that is not Ready goes without spending it when the budget says so
    (``unhealthyPodEvictionPolicy: AlwaysAllow``, or the default ``IfHealthyBudget`` with ``currentHealthy >=
    desiredHealthy > 0``). A pod under a budget with nothing left is passed over (``pdb``) for another: the API
    would answer 429, each such attempt spending a slot of the round's budgets for nothing (a race still ends in a
    429, retried in a later round); a pod more than one budget selects, too (``pdb-multiple``: the API answers
    500); and a pod under a budget whose ``status.disruptedPods`` (evictions its controller has not yet seen
    through, one more for each planned here) is past ``MAX_DISRUPTED_PODS`` (the API answers 403)."""

    def __init__(self, pdbs: Sequence[Mapping[str, Any]]) -> None:
        self._pdbs: list[tuple[str, str, Mapping[str, Any]]] = []  # (key, namespace, selector)
        self.left: Counter[str] = Counter()
        self._unready_free: set[str] = set()  # budgets a pod that is not Ready leaves without spending
        self._disrupted: Counter[str] = Counter()  # status.disruptedPods' entries, with the evictions planned
        for pdb in pdbs:
            pmeta, spec, status = pdb.get("metadata") or {}, pdb.get("spec") or {}, pdb.get("status") or {}
            if spec.get("selector") is None:
                continue  # policy/v1: a null selector selects no pod
            key = f"{pmeta.get('namespace')}/{pmeta.get('name')}"
            allowed = status.get("disruptionsAllowed")
            observed = _int(status.get("observedGeneration")) >= _int(pmeta.get("generation"))
            self.left[key] = allowed if observed and isinstance(allowed, int) and allowed > 0 else 0
            disrupted = status.get("disruptedPods")
            self._disrupted[key] = len(disrupted) if isinstance(disrupted, Mapping) else 0
            healthy, desired = _int(status.get("currentHealthy")), _int(status.get("desiredHealthy"))
            if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow" or healthy >= desired > 0:
                self._unready_free.add(key)
            self._pdbs.append((key, str(pmeta.get("namespace")), spec["selector"]))

    def of(self, pod: Mapping[str, Any]) -> tuple[str, ...]:
        """The budgets (namespace/name) of the pod's namespace that select it."""
        meta = pod.get("metadata") or {}
        namespace, labels = meta.get("namespace"), meta.get("labels") or {}
        return tuple(
            key for key, ns, selector in self._pdbs if ns == namespace and label_selector_matches(selector, labels)
        )

    def refusal(self, budgets: Sequence[str], ready: bool = True) -> str | None:
        """``pdb`` when the pod's budget has nothing left for it; ``pdb-multiple`` when more than one selects it."""
        if len(budgets) > 1:
            return "pdb-multiple"
        spent = self._spent(budgets, ready)
        return "pdb" if any(self.left[k] <= 0 or self._disrupted[k] > MAX_DISRUPTED_PODS for k in spent) else None

    def spend(self, budgets: Sequence[str], ready: bool = True) -> None:
        """An eviction planned under ``budgets`` (of a pod that is ``ready`` or not)."""
        for key in self._spent(budgets, ready):
            self.left[key] -= 1
            self._disrupted[key] += 1

    def _spent(self, budgets: Sequence[str], ready: bool) -> list[str]:
        return [key for key in budgets if ready or key not in self._unready_free]


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0
