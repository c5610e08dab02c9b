"""``NodeResourceTopologyMatch``: crane's NUMA-aware placement as a thin adapter over the pure modules.

Extension points (as upstream): PreFilter classifies the pod; Filter answers for every node row at once over
``ZoneTable``; Score prefers results on fewer zones (100 // zones); Reserve picks the zones on the chosen node
and assumes them; Unreserve forgets them; PreBind writes the result on the pod (merge patch, status-checked,
with a timeout) for crane-agent to pin.

Behaviour that differs from upstream, each on purpose (see the package docstring for the list):
the state is per cycle (upstream's ``Clone`` shared it), a non-aware pod whose zones cannot hold it is rejected
instead of passing with a partial or empty result (which made upstream's Score divide by zero and crash),
scalars never panic, memory is recorded in bytes, start-up never waits for the NRT watch.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np
import prometheus_client
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import IntArray, NodeTable, PodRecord
from crane_scheduler.plugins.noderesourcetopology import fit
from crane_scheduler.plugins.noderesourcetopology.args import TopologyArgs, parse_args
from crane_scheduler.plugins.noderesourcetopology.model import (
    ANNOTATION_RESULT,
    CPU_POLICIES,
    GROUP,
    PLURAL,
    VERSION,
    NodeTopology,
    Result,
    TopologyError,
    decode_result,
    decode_topology,
    encode_result,
    format_quantity,
)
from crane_scheduler.plugins.noderesourcetopology.podspec import NOT_PLACED, PodTopology, classify
from crane_scheduler.plugins.noderesourcetopology.zones import (
    KUBELET,
    NO_NRT,
    STATIC_AWARE,
    STATIC_SPREAD,
    ZoneTable,
    ZoneUsage,
)
from crane_scheduler.podinfo import NodeInfo, PodInfo
from crane_shared.informer import EventType, Informer
from crane_shared.kube import raw_json
from crane_shared.logs import LogOnce, get_logger

NAME = "NodeResourceTopologyMatch"
FAILED_TO_GET_NRT = "node(s) failed to get NRT"
INSUFFICIENT_NUMA = "node(s) had insufficient resource of NUMA node"
INSUFFICIENT_ACROSS = "node(s) had insufficient resource across NUMA nodes"
PATCH_TIMEOUT = 10.0
EXPLAIN_RESULTS = 2000

_POD = f"{NAME}.pod"
_ZONES = f"{NAME}.zones"  # per row: zones in the result (0 = none); what Score reads
_RESULT = f"{NAME}.result"  # (node, result) chosen in Reserve; what PreBind writes

log = get_logger("crane.scheduler.nrt")


class NRTMetrics:
    """The plugin's metrics, in the registry the framework handle gives it (shared by every profile's instance)."""

    def __init__(self, metrics: fwk.PluginMetrics) -> None:
        self.placements: prometheus_client.Counter = metrics.counter(
            "crane_scheduler_nrt_placements",
            "Pods whose NUMA result was written, by the topology policy applied (SingleNUMANodePodLevel or None)",
            ["policy"],
        )
        self.rejections: prometheus_client.Counter = metrics.counter(
            "crane_scheduler_nrt_rejections", "Nodes the NRT filter rejected, by reason", ["reason"]
        )
        self.malformed: prometheus_client.Counter = metrics.counter(
            "crane_scheduler_nrt_malformed",
            "NRT objects and topology-result annotations that could not be decoded",
            ["kind"],
        )
        self.topologies: prometheus_client.Gauge = metrics.gauge(
            "crane_scheduler_nrt_objects", "Valid NodeResourceTopology objects known, by cpu manager policy", ["policy"]
        )


class NodeResourceTopologyMatch(
    fwk.PreFilterPlugin,
    fwk.FilterPlugin,
    fwk.ScorePlugin,
    fwk.ReservePlugin,
    fwk.PreBindPlugin,
    fwk.PodExplainPlugin,
    fwk.WorkerPlugin,
    fwk.ObjectPlugin,
):
    name = NAME

    def __init__(self, args: TopologyArgs, handle: fwk.Handle, wall_clock: Callable[[], float] = time.time) -> None:
        self.args = args
        self.handle = handle
        self.metrics = NRTMetrics(handle.metrics)
        self.clock = wall_clock
        self.zones = ZoneTable(args.resources, capacity=max(64, handle.table.n_rows))
        self.usage = ZoneUsage()
        self.topologies: dict[str, NodeTopology] = {}
        self._policies: Counter[str] = Counter(dict.fromkeys(CPU_POLICIES, 0))
        self._informer: Informer | None = None
        self._fed = False
        self.sync_problem = "the NodeResourceTopology list has not completed yet"
        self.recent: OrderedDict[str, tuple[str, Result]] = OrderedDict()  # for explain
        self._log_once = LogOnce(log)
        self._next_expiry = 0.0
        self._cpu = args.resources.index("cpu") if args.has_cpu else -1
        self._rowless_changes: set[str] = set()  # nodes whose usage changed while they had no row
        self._simulated_out: set[str] = set()  # preemption's victims in its what-if (``victims_simulated``)
        if not args.has_cpu:
            log.warning("topologyAwareResources has no cpu: no pod has target containers, the plugin does nothing")
        table = handle.table
        table.register_column(f"{NAME}.{handle.profile}.{id(self)}", self._node_changed, dtype=np.int8)
        table.pod_added.append(self._pod_added)
        table.pod_removed.append(self._pod_removed)
        table.victims_simulated.append(self._victims_simulated)

    # -- inputs: node rows, NRT objects, pods' results -----------------------------------------------------------

    def _node_changed(self, node: NodeInfo) -> int:
        """Node-table hook (node added or changed): make sure its row holds its NRT and usage."""
        row = self.handle.table.rows[node.name]
        topo = self.topologies.get(node.name)
        if row < self.zones.cap and self.zones.topology[row] is topo and node.name not in self._rowless_changes:
            return int(self.zones.code[row])  # most node updates: annotations only
        self._rowless_changes.discard(node.name)
        return self.zones.write(row, topo, self.usage.totals(node.name, self._simulated_out))

    def _rewrite(self, node: str) -> None:
        row = self.handle.table.rows.get(node)
        if row is not None:
            self.zones.write(row, self.topologies.get(node), self.usage.totals(node, self._simulated_out))

    def _victims_simulated(self, victims: list[PodRecord], sign: int) -> None:
        """Preemption's what-if takes ``victims`` out (-1) or puts them back (+1): the zones they hold are free in
        it, as upstream's Filter (which counts the pods on the node) sees them."""
        nodes = {v.node for v in victims if self.usage.result_of(v.uid) is not None}
        if not nodes:
            return
        uids = {v.uid for v in victims}
        if sign < 0:
            self._simulated_out |= uids
        else:
            self._simulated_out -= uids
        self._usage_changed(nodes)

    def _usage_changed(self, nodes: set[str]) -> None:
        rows = self.handle.table.rows
        for node in nodes:
            row = rows.get(node)
            if row is not None and row < self.zones.cap:
                self.zones.write_used(row, self.usage.totals(node, self._simulated_out))
            else:  # no row now (deleted, not added yet): the row it gets must be written whole
                self._rowless_changes.add(node)

    def set_topology(self, obj: Mapping[str, Any]) -> None:
        """An NRT object added or changed; a malformed one leaves its node without an NRT (logged, counted)."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        try:
            topo: NodeTopology | None = decode_topology(obj)
        except TopologyError as err:
            self.metrics.malformed.labels("nrt").inc()
            self._log_once.warning("nrt", "malformed NodeResourceTopology ignored", node=name, error=str(err))
            topo = None
        self._store(name, topo)

    def delete_topology(self, name: str) -> None:
        self._store(name, None)

    def _store(self, name: str, topo: NodeTopology | None) -> None:
        old = self.topologies.pop(name, None)
        if old is not None:
            self._policies[old.cpu_manager_policy] -= 1
        if topo is not None:
            self.topologies[name] = topo
            self._policies[topo.cpu_manager_policy] += 1
        for policy, count in self._policies.items():
            self.metrics.topologies.labels(policy).set(count)
        self._rewrite(name)

    def replace_topologies(self, objs: list[Mapping[str, Any]]) -> None:
        names = {str((o.get("metadata") or {}).get("name", "")) for o in objs}
        for gone in set(self.topologies) - names:
            self.delete_topology(gone)
        for obj in objs:
            self.set_topology(obj)
        self._fed = True

    @property
    def synced(self) -> bool:
        """The NRT objects have been listed (or fed directly, in tests and tools without an API)."""
        if self._informer is not None:
            return self._informer.synced.is_set()
        return self._fed or self.handle.api is None

    def _pod_added(self, pod: PodInfo) -> None:
        """Node-table hook: a bound pod; its result annotation (if any) is what it takes from the zones."""
        text = (pod.raw.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RESULT)
        result: Result | None = None
        if text is not None:
            try:
                result = decode_result(text)
            except TopologyError as err:
                self.metrics.malformed.labels("result").inc()
                self._log_once.warning("result", "malformed topology result ignored", pod=pod.key, error=str(err))
        if result is None and not self.usage.is_assumed(pod.uid) and self.usage.result_of(pod.uid) is None:
            return  # the common case: a pod that takes nothing from any zone
        self._usage_changed(self.usage.set_bound(pod.uid, pod.node_name, result))

    def _pod_removed(self, uid: str) -> None:
        if uid == self.handle.table.reserve_kept:
            return  # bound already ("already bound"): its zones stay taken until its bound object (or the TTL) says
        if self.usage.result_of(uid) is not None or self.usage.is_assumed(uid):
            self._usage_changed(self.usage.remove(uid))

    def _expire(self) -> None:
        now = self.clock()
        if now >= self._next_expiry:
            self._next_expiry = now + 1.0
            self._usage_changed(self.usage.expire(now))

    # -- extension points ---------------------------------------------------------------------------------------

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        try:
            pt = classify(pod.raw, self.args.resources)
        except TopologyError as err:
            return fwk.PreFilterResult(fwk.unschedulable(str(err), unresolvable=True))
        state[_POD] = pt
        if pt.placed and not self.synced:
            return fwk.PreFilterResult(fwk.error(f"{NAME}: {self.sync_problem}"))
        return fwk.PreFilterResult()

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        pt: PodTopology = state.get(_POD, NOT_PLACED)
        if not pt.placed:
            return []
        self._expire()
        n = table.n_rows
        self.zones.ensure(n)
        code = self.zones.code[:n]
        live = table.live
        zones_needed = np.zeros(n, dtype=np.int64)
        rejections = []
        missing = live & (code == NO_NRT)
        if missing.any():
            rejections.append(fwk.Rejection(FAILED_TO_GET_NRT, missing))
        static = np.flatnonzero(live & (code >= STATIC_SPREAD))
        if len(static):
            aware = np.full(len(static), pt.aware) if pt.aware is not None else self.zones.code[static] == STATIC_AWARE
            ok, count = fit.evaluate(
                self.zones.alloc[static],
                self.zones.used[static],
                self.zones.valid[static],
                np.asarray(pt.request, dtype=np.int64),
                aware,
                self._cpu,
            )
            zones_needed[static] = count
            for reason, bad in ((INSUFFICIENT_NUMA, ~ok & aware), (INSUFFICIENT_ACROSS, ~ok & ~aware)):
                if bad.any():
                    mask = np.zeros(n, dtype=bool)
                    mask[static[bad]] = True
                    rejections.append(fwk.Rejection(reason, mask))
        for r in rejections:
            self.metrics.rejections.labels(r.reason).inc(int(np.count_nonzero(r.mask)))
        state[_ZONES] = zones_needed
        return rejections

    def score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        zones = state.get(_ZONES)
        if zones is None:
            return np.zeros(len(rows), dtype=np.int64)
        count = zones[rows]
        return np.where(count > 0, fwk.MAX_NODE_SCORE // np.maximum(count, 1), 0).astype(np.int64)

    def choose(self, pt: PodTopology, node: str) -> tuple[int, Result | None]:
        """The node's code and the zones the pod would take there (None: it does not fit / no result)."""
        row = self.handle.table.rows.get(node)
        if row is None or row >= self.zones.cap:
            return NO_NRT, None
        code = int(self.zones.code[row])
        if code < STATIC_SPREAD:
            return code, None
        aware = pt.aware if pt.aware is not None else code == STATIC_AWARE
        return code, fit.assign(self.zones.zones(row), pt.request, aware, self.args.resources)

    def reserve(self, state: fwk.CycleState, pod: PodInfo, node: str) -> fwk.Status:
        pt: PodTopology = state.get(_POD, NOT_PLACED)
        if not pt.placed:
            return fwk.SUCCESS
        code, result = self.choose(pt, node)
        if code == KUBELET:
            return fwk.SUCCESS
        if code == NO_NRT:
            return fwk.unschedulable(FAILED_TO_GET_NRT)
        if not result:  # Filter said it fits; only a change between Filter and Reserve gets here
            return fwk.unschedulable(INSUFFICIENT_NUMA)
        aware = pt.aware if pt.aware is not None else code == STATIC_AWARE
        state[_RESULT] = (node, result, aware)
        self._usage_changed(self.usage.assume(pod.uid, node, result, self.clock()))
        return fwk.SUCCESS

    def unreserve(self, state: fwk.CycleState, pod: PodInfo, node: str) -> None:
        if state.pop(_RESULT, None) is not None:
            self._usage_changed(self.usage.forget(pod.uid))

    def pre_bind_pre_flight(self, state: fwk.CycleState, pod: PodInfo, node: str) -> fwk.Status:
        """PreBind works when it writes or clears the pod's topology result (``pre_bind``)."""
        return fwk.SUCCESS if self._writes(state, pod) else fwk.SKIP

    def _writes(self, state: fwk.CycleState, pod: PodInfo) -> bool:
        stale = ANNOTATION_RESULT in (pod.raw.get("metadata", {}).get("annotations") or {})
        return state.get(_RESULT) is not None or stale

    async def pre_bind(self, state: fwk.CycleState, pod: PodInfo, node: str) -> fwk.Status:
        chosen = state.get(_RESULT)
        if not self._writes(state, pod):
            return fwk.SUCCESS
        value = encode_result(chosen[1]) if chosen is not None else None  # None clears a stale result
        if self.handle.api is None:
            return fwk.error(f"{NAME}: no API client to write the topology result")
        body = {"metadata": {"uid": pod.uid, "annotations": {ANNOTATION_RESULT: value}}}
        try:
            await raw_json(
                client.CoreV1Api(self.handle.api).patch_namespaced_pod(
                    pod.name,
                    pod.namespace,
                    body,
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                    _request_timeout=PATCH_TIMEOUT,
                )
            )
        except ApiException as err:
            return fwk.Status(
                fwk.Code.ERROR, (f"writing {ANNOTATION_RESULT} on pod {pod.key}: {err.status} {err.reason}",)
            )
        except TimeoutError:
            return fwk.Status(fwk.Code.ERROR, (f"writing {ANNOTATION_RESULT} on pod {pod.key}: timed out",))
        if chosen is not None:
            self.metrics.placements.labels("SingleNUMANodePodLevel" if chosen[2] else "None").inc()
            self.recent[pod.uid] = (node, chosen[1])
            while len(self.recent) > EXPLAIN_RESULTS:
                self.recent.popitem(last=False)
        return fwk.SUCCESS

    # -- explain ------------------------------------------------------------------------------------------------

    def explain_pod(self, uid: str, node: str) -> dict[str, Any]:
        """``numaZones``: the zones written for a pod this scheduler placed recently on ``node`` (empty when it had
        no result there)."""
        found = self.recent.get(uid) or self.usage.result_of(uid)
        if found is None or found[0] != node:
            return {}
        _, result = found
        return {
            "numaZones": [
                {"name": e.zone, "capacity": {k: format_quantity(k, v) for k, v in sorted(e.capacity.items())}}
                for e in result
            ],
        }

    # -- the NRT watch ------------------------------------------------------------------------------------------

    object_kinds = ("NodeResourceTopology",)

    def apply_object(self, kind: str, event: EventType, obj: dict[str, Any]) -> None:
        self._on_event(event, obj, None)

    def objects_listed(self) -> None:
        self._fed = True

    def _on_event(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if kind == "DELETED":
            self.delete_topology(str((obj.get("metadata") or {}).get("name", "")))
        else:
            self.set_topology(obj)

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch the NRT objects. A missing CRD (404) or RBAC (403) does not hold up start-up: the informer
        retries with backoff; meanwhile pods with target containers get a retriable error naming the cause
        and every other pod schedules as usual."""
        if self.handle.api is None:
            return
        api = client.CustomObjectsApi(self.handle.api)
        informer = Informer(
            "noderesourcetopologies",
            partial(api.list_cluster_custom_object, GROUP, VERSION, PLURAL),
            handler=self._on_event,
        )

        def restarted(reason: str) -> None:
            if not informer.synced.is_set():
                self.sync_problem = (
                    f"cannot list {PLURAL}.{GROUP}/{VERSION} (is the CRD installed and may the scheduler list it?)"
                )

        informer.on_restart = restarted
        self._informer = informer
        await informer.run(stopping)


def new(args: Mapping[str, Any], handle: fwk.Handle) -> NodeResourceTopologyMatch:
    return NodeResourceTopologyMatch(parse_args(args), handle)
