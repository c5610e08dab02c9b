"""Nodes the sandbox did not create join the simulated fleet; deleted nodes leave it.

An autoscaler (Karpenter's KWOK provider, ``--autoscaler karpenter``) creates and deletes Node objects while the
sandbox runs. KWOK plays their kubelet (they carry its annotation); this follower adds each one to ``FleetState``
(``crane_sandbox.fleet.sim_node_of``: the instance type's size, a fresh node's base load), so the exporter serves
its node-exporter series, Prometheus scrapes them, and the annotator writes its load like any other node's; and
removes a deleted node, so its series go stale instead of reporting a ghost. Nodes are followed with the one
shared informer (``crane_shared.informer``), as plain JSON dicts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kubernetes_asyncio import client

from crane_sandbox.fleet import NEW_NODE_BASE, FleetState, SimNode, sim_node_of
from crane_sandbox.pod_follower import InformerTask
from crane_shared.informer import EventType, Informer, Obj

log = logging.getLogger(__name__)


class NodeFollower(InformerTask):
    """Keeps the nodes of ``state`` equal to the cluster's: a node appears once it tells its size, and goes when
    it is deleted. ``on_change(name, added)`` is called after each change (the bench's timeline)."""

    task_name = "node-follower"

    def __init__(
        self,
        api_client: client.ApiClient,
        state: FleetState,
        *,
        base: tuple[float, float] = NEW_NODE_BASE,
        on_change: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.state = state
        self.base = base
        self.on_change = on_change
        self.informer = Informer("sandbox-nodes", client.CoreV1Api(api_client).list_node, handler=self._on_event)
        super().__init__()

    @property
    def synced(self) -> asyncio.Event:
        return self.informer.synced

    def _on_event(self, kind: EventType, new: Obj, old: Obj | None) -> None:
        name = str((new.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            if name in self.state.nodes:
                self.state.remove_node(name)
                self._changed(name, added=False)
            return
        if name in self.state.nodes:
            return
        node: SimNode | None = sim_node_of(new, self.base)
        if node is None:
            return  # no size yet: a later MODIFIED brings it
        self.state.add_node(node)
        log.info("node %s joined the simulated fleet (%g CPUs)", name, node.cpu_cores)
        self._changed(name, added=True)

    def _changed(self, name: str, *, added: bool) -> None:
        if self.on_change is not None:
            self.on_change(name, added)
