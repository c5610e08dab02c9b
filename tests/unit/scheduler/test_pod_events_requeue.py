"""Pods rejected by InterPodAffinity / PodTopologySpread wake on the pod events that can help them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from crane_scheduler.framework import ClusterEvent, Handle, QueuedPod
from crane_scheduler.internal.cache import Cache
from crane_scheduler.internal.queue import SchedulingQueue
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.interpodaffinity import Args, InterPodAffinity
from crane_scheduler.podinfo import parse_pod
from tests.support.scheduler import node, pod


def setup(
    plugin_of: Callable[[Handle], Any] = lambda handle: InterPodAffinity(Args(), handle),
) -> tuple[Cache, SchedulingQueue, NodeTable]:
    """A cache feeding a queue that registers the plugin's events (no hints), over a table with node ``a``."""
    table = NodeTable()
    plugin = plugin_of(Handle(table))
    events = {plugin.name: plugin.events_to_register()}
    queue = SchedulingQueue(lambda qp: (qp.timestamp,), events_of=lambda name: events.get(name, ClusterEvent.ALL))
    cache = Cache(table, queue, {"crane-scheduler"}, clock=lambda: 0.0)
    cache.on_node(node("a"))
    return cache, queue, table


def waiting(queue: SchedulingQueue, raw: dict[str, Any]) -> None:
    queue.add_unschedulable(QueuedPod(parse_pod(raw), 0.0), frozenset({"InterPodAffinity"}), 0.0)


def test_a_new_bound_peer_wakes_the_pod() -> None:
    cache, queue, _ = setup()
    waiting(queue, pod("cache"))
    cache.on_pod(pod("db", node_name="a", scheduler="nobody"))
    assert queue.pop(100.0) is not None


def test_our_assumed_pod_confirmed_by_the_informer_also_counts_as_added() -> None:
    cache, queue, table = setup()
    peer = pod("db")
    table.assume(parse_pod(peer), "a")
    waiting(queue, pod("cache"))
    peer["spec"]["nodeName"] = "a"
    cache.on_pod(peer)
    assert queue.pop(100.0) is not None


def test_a_relabelled_bound_pod_wakes_the_pod_and_a_status_only_update_does_not() -> None:
    cache, queue, _ = setup()
    bound = pod("db", node_name="a", scheduler="nobody")
    cache.on_pod(bound)
    waiting(queue, pod("cache"))
    bound = copy.deepcopy(bound)  # the informer hands over a new object per event
    bound["status"] = {"phase": "Running"}
    cache.on_pod(bound)
    assert queue.pop(100.0) is None
    bound = copy.deepcopy(bound)
    bound["metadata"]["labels"] = {"app": "db"}
    cache.on_pod(bound)
    assert queue.pop(100.0) is not None


def test_a_deleted_node_wakes_pods_topology_spread_rejected() -> None:
    from crane_scheduler.plugins.podtopologyspread import Args as SpreadArgs
    from crane_scheduler.plugins.podtopologyspread import PodTopologySpread

    cache, queue, _ = setup(lambda handle: PodTopologySpread(SpreadArgs(), handle))
    cache.on_node(node("b"))
    queue.add_unschedulable(QueuedPod(parse_pod(pod("w")), 0.0), frozenset({PodTopologySpread.name}), 0.0)
    cache.on_node_deleted(node("b"))
    assert queue.pop(100.0) is not None
