"""The load taint's worker: the leader evaluates ``taintplan`` and writes ``crane.io/load-hot`` (set, lifted).

Why the annotator: it is the one leader that writes the load annotations the taint is computed from and knows
their freshness; the scheduler (possibly not even running: kube-scheduler with the extender) only reads them, and
a second writer of node state would need a lease of its own. The worker runs in the annotator's leadership term
(``Annotator.lead``), wakes after every metric round (a new sample) and every ``interval`` (data turning stale
while Prometheus is down), re-reads the policy file (``spec.loadTaint`` removed: every taint lifted), and reads the
nodes from the annotator's informer, as the API server holds them.

Each write replaces ``spec.taints`` with the node's own list plus or minus ours, with the node's resourceVersion as
a precondition (``NodePatcher.patch_taints``: a concurrent change of another taint is a 409; a lift is read again
and retried at once, a set is judged again at the next evaluation from the informer's newer copy: the node may have
opted out or been recreated meanwhile); it goes through the patcher's leadership check, so a leader that may have
lost its lease writes nothing. A node that carried our taint and left the informer's view (relabelled out of
``--node-selector``) is read and its taint lifted (reason ``unwatched``): nothing would judge it again. Every
change is counted and reported as an events.k8s.io/v1 Event on the node (``LoadTaintAdded`` /
``LoadTaintRemoved``, best effort).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.nodes import NodeInfo
from crane_annotator.taintplan import Change, NodeState, Reading, Readings, TaintNode, plan
from crane_annotator.writer import Outcome
from crane_shared.events import NODE_EVENT_NAMESPACE, node_event
from crane_shared.kube import api_failure, raw_json
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.loadtaintpolicy import is_ours, with_taint, without_taint
from crane_shared.logs import LogOnce, get_logger
from crane_shared.policy import DynamicSchedulerPolicy
from crane_shared.policyfile import PolicyFile
from crane_shared.retry import sleep_unless

log = get_logger("crane.annotator.taints")

CONTROLLER = "crane-annotator"
EVENT_TIMEOUT = 10
WRITES_AT_ONCE = 8
YIELD_EVERY = 250
"""nodes decoded between two turns of the event loop (the Lease renewals, the rounds' patches go on)"""

TaintWriter = Callable[[str, list[dict[str, object]], str], Awaitable[Outcome]]
"""(node, its new taints, the resourceVersion they replace) -> outcome: ``NodePatcher.patch_taints``"""


def reload_problems(policy: DynamicSchedulerPolicy, synced: Iterable[str]) -> list[str]:
    """Why a changed policy's load taint cannot be applied by a running annotator: it reads the annotations of the
    metrics synced since its start (``syncPolicy`` is read at start only), so a threshold on another metric would
    find every node without data and lift every taint as stale. Refused, the previous policy stays."""
    if policy.load_taint is None:
        return []
    running = set(synced)
    where = "spec.loadTaint.thresholds" if policy.load_taint.thresholds else "spec.predicate (the taint's thresholds)"
    return [
        f'{where}: "{metric}" is not synced by this process (restart to change syncPolicy)'
        for metric in policy.taint_thresholds()
        if metric not in running
    ]


def _taints_of(raw: Mapping[str, Any]) -> list[dict[str, object]]:
    return [t for t in (raw.get("spec") or {}).get("taints") or () if isinstance(t, dict)]


def note(change: Change) -> str:
    r = change.reading
    if change.taint:
        return f"{r.metric} {r.value:.3f} above {r.threshold:g}: kube-scheduler and autoscalers see the node as full"
    why = {
        "cooled": f"cooled: {r.metric} {r.value:.3f}, threshold {r.threshold:g}",
        "stale": f"load data not usable: {r.problem}",
        "opted-out": 'the node opted out (crane.io/load-taint: "off")',
        "disabled": "spec.loadTaint is not in the policy",
        "floor": "minUntaintedNodes: the last untainted nodes stay untainted",
        "unwatched": "the node left the annotator's view (--node-selector): nothing judges its load any more",
    }
    return why.get(change.reason, change.reason)


class LoadTaints:
    def __init__(
        self,
        policy: PolicyFile[DynamicSchedulerPolicy],
        args: Callable[[DynamicSchedulerPolicy], DynamicArgs],
        nodes: Callable[[], Mapping[str, NodeInfo]],
        write: TaintWriter,
        metrics: AnnotatorMetrics,
        api: client.ApiClient | None,
        *,
        identity: str = "",
        interval: float = 15.0,
        may_write: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self._args = args
        self._nodes = nodes
        self._write = write
        self._metrics = metrics
        self._events = client.EventsV1Api(api) if api is not None else None
        self._core = client.CoreV1Api(api) if api is not None else None
        self._identity = identity
        self.interval = interval
        self._may_write = may_write
        self._clock = clock
        self._wake = asyncio.Event()
        self._log_once = LogOnce(log)
        self.states: dict[str, NodeState] = {}
        self.held: list[str] = []
        self.readings: dict[str, Reading] = {}
        """node -> its reading at the last evaluation (debug endpoint)"""
        self.evaluations = 0
        self._pending: set[asyncio.Task[None]] = set()
        self._ours: set[str] = set()
        """nodes that carried our taint at the last evaluation: one that leaves the informer's view is lifted"""
        self._readings = Readings()

    def begin_term(self) -> None:
        """A new term judges from scratch: the taints it finds count as confirmed (``taintplan``)."""
        self.states = {}

    def wake(self) -> None:
        """A metric round ended: new samples to count."""
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Evaluate until ``stopping`` (the term's end); a failed evaluation is logged and retried next time."""
        while not stopping.is_set():
            self._wake.clear()
            try:
                await self.evaluate()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a bug or an unexpected answer: never the end of the term
                self._log_once.warning("evaluate", "load taint evaluation failed", error=repr(err))
            await sleep_unless(stopping, self.interval, until=self._wake.wait())

    async def evaluate(self) -> list[tuple[Change, Outcome]]:
        policy = self.policy.reload() or self.policy.policy
        infos = dict(self._nodes())
        nodes = {
            name: TaintNode(
                name,
                info.texts,
                any(is_ours(t) for t in info.taints),
                info.taint_opt_out,
                not info.unschedulable,
                next((str(t.get("effect", "")) for t in info.taints if is_ours(t)), ""),
            )
            for name, info in infos.items()
        }
        args, now = self._args(policy), datetime.fromtimestamp(self._clock(), UTC)
        if policy.load_taint is not None:  # decode the changed nodes first, yielding now and then (5,000 nodes)
            for i, node in enumerate(nodes.values()):
                self._readings.get(node, policy, args, now)
                if i % YIELD_EVERY == YIELD_EVERY - 1:
                    await asyncio.sleep(0)
            nodes = {name: node for name, node in nodes.items() if name in self._nodes()}  # deleted meanwhile
        self._readings.retain(nodes)
        result = plan(nodes, self.states, policy, args, now, self._readings)
        self.states = result.states
        self.held = result.held
        self.readings = result.readings
        self.evaluations += 1
        gate = asyncio.Semaphore(WRITES_AT_ONCE)
        effect = policy.load_taint.effect if policy.load_taint is not None else "NoSchedule"

        async def apply(change: Change) -> tuple[Change, Outcome]:
            info = infos[change.node]
            current, version = info.taints, info.resource_version
            async with gate:
                for attempt in range(2):  # a 409 (the node changed: our own round's patch, say): read it, once more
                    taints = (
                        with_taint(current, effect, change.reading.metric) if change.taint else without_taint(current)
                    )
                    outcome = await self._write(change.node, taints, version)
                    if outcome != "conflict" or attempt or self._core is None or change.taint:
                        break  # a set met a newer node: the next evaluation judges it again (opt-out, uid, data)
                    fresh = await self._read(change.node)
                    if fresh is None:
                        break
                    current, version = fresh
            self._record(change, outcome, info.uid)
            return change, outcome

        done = list(await asyncio.gather(*(apply(c) for c in result.changes)))
        done += [await self._lift_unwatched(name) for name in sorted(self._ours - nodes.keys())]
        tainted = {name for name, node in nodes.items() if node.tainted}
        for change, outcome in done:
            if outcome == "ok":
                (tainted.add if change.taint else tainted.discard)(change.node)
        again = {c.node for c, outcome in done if c.reason == "unwatched" and outcome in ("error", "conflict")}
        self._ours = tainted | again  # an unwatched node's failed lift is tried again next evaluation
        self._metrics.load_tainted_nodes.set(len(tainted))
        self._metrics.load_taint_held.set(len(result.held))
        if result.held:
            self._log_once.warning(
                "floor", "hot nodes left untainted by minUntaintedNodes", nodes=result.held[:10], count=len(result.held)
            )
        return done

    async def _lift_unwatched(self, node: str) -> tuple[Change, Outcome]:
        """A node that carried our taint and left the informer's view (relabelled out of ``--node-selector``, or
        deleted): read it, and lift the taint it still carries; nothing judges it any more."""
        change = Change(node, False, "unwatched", Reading(None, problem="the node left the annotator's view"))
        raw = await self._get(node, "node not read to lift its taint") if self._core is not None else "error"
        if isinstance(raw, str):
            return change, raw  # deleted (its taint went with it), or unreadable: tried again next evaluation
        current = _taints_of(raw)
        if not any(is_ours(t) for t in current):
            return change, "missing"  # lifted already (by someone else, or the uninstall hook)
        meta = raw.get("metadata") or {}
        outcome = await self._write(node, without_taint(current), str(meta.get("resourceVersion") or ""))
        self._record(change, outcome, str(meta.get("uid") or ""))
        return change, outcome

    async def _read(self, node: str) -> tuple[tuple[Mapping[str, object], ...], str] | None:
        """The node's taints and resourceVersion as the API server holds them now (None: gone or unreadable)."""
        raw = await self._get(node, "node not re-read after a conflict")
        if isinstance(raw, str):
            return None
        return tuple(_taints_of(raw)), str((raw.get("metadata") or {}).get("resourceVersion") or "")

    async def _get(self, node: str, problem: str) -> dict[str, Any] | Outcome:
        """The node as the API server holds it now; ``missing`` when it is gone, ``error`` when it cannot be read
        (logged once, as ``problem``)."""
        assert self._core is not None
        try:
            raw: dict[str, Any] = await raw_json(
                self._core.read_node(node, _preload_content=False, _request_timeout=EVENT_TIMEOUT)
            )
            return raw
        except ApiException as err:
            if err.status == 404:
                return "missing"
            fields = api_failure("get", f"node {node}", err)
        except (TimeoutError, OSError, aiohttp.ClientError) as err:
            fields = api_failure("get", f"node {node}", err)
        self._log_once.warning(f"read:{problem}", problem, node=node, **fields)
        return "error"

    def _record(self, change: Change, outcome: Outcome, uid: str) -> None:
        action = "set" if change.taint else "lifted"
        self._metrics.load_taint_changes.labels(action, change.reason, outcome).inc()
        if outcome == "ok":
            log.info("load taint " + action, node=change.node, reason=change.reason, detail=note(change))
            self._spawn_event(change, uid)
        elif outcome == "conflict":  # changed meanwhile: the next evaluation judges it again from a newer copy
            log.info("load taint write met a newer node; retried next evaluation", node=change.node)

    def _spawn_event(self, change: Change, uid: str) -> None:
        if self._events is None or not self._may_write():
            return
        task = asyncio.get_running_loop().create_task(self._event(change, uid))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _event(self, change: Change, uid: str) -> None:
        """The Event on the node; best effort (the taint is written), failures logged once."""
        assert self._events is not None
        body = node_event(
            node=change.node,
            node_uid=uid,
            reason="LoadTaintAdded" if change.taint else "LoadTaintRemoved",
            action="Taint" if change.taint else "Untaint",
            type_="Normal",
            note=note(change),
            controller=CONTROLLER,
            instance=self._identity,
        )
        try:
            await raw_json(
                self._events.create_namespaced_event(
                    NODE_EVENT_NAMESPACE, body, _preload_content=False, _request_timeout=EVENT_TIMEOUT
                )
            )
        except (ApiException, TimeoutError, OSError, aiohttp.ClientError) as err:
            fields = api_failure("create", f"event on node {change.node}", err)
            self._log_once.warning("event", "event not written", node=change.node, **fields)
