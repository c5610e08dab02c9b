"""Recent bindings for the extender: the hot-spot input kube-scheduler never gives an extender.

An extender is asked to filter and score but never told which node won, so on its own it only knows the
annotator's hot value, which is up to a sync old: a burst of pods all see the same "least loaded" node. The
event-recorder announces every binding on a Redis stream within milliseconds; following it lets the policy count
bindings made after the hot-value annotation and add the estimated usage of pods the averaged metrics have not
absorbed yet, exactly as the in-process plugin does with its own bindings.

The stream carries who was bound where and when, not the pod's size; the extender saw the pod in the filter or
prioritize request just before, so it remembers each pod's requests by UID (bounded) and joins them here. A pod
it never saw (another scheduler, another replica) still counts in the hot value, with no usage estimate.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from crane_extender.protocol import PodView
from crane_shared.binding_store import StreamBatch
from crane_shared.bindings import BindingRecord
from crane_shared.loadaware.dynamic import RecentBinding
from crane_shared.logs import LogOnce, get_logger

__all__ = ["RecentBindings", "follow_bindings"]

log = get_logger("crane.extender.bindings")


@dataclass
class RecentBindings:
    """Bindings of the last ``retention`` per node, each at most once per pod UID; memory bounded.

    ``schedulers`` restricts which schedulers' bindings count (None: every scheduler, as the annotator's hot
    value does; counting only bindings made after that annotation never counts one twice).
    """

    retention: timedelta
    schedulers: frozenset[str] | None = None
    max_pods: int = 50_000
    _by_node: dict[str, deque[tuple[str, RecentBinding]]] = field(default_factory=dict)
    _bound: dict[str, float] = field(default_factory=dict)
    _sizes: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)
    _versions: dict[str, int] = field(default_factory=dict)
    _version: int = 0

    def version(self, node: str) -> int:
        """Changes whenever the node's bindings change (not when one merely ages out: ``for_node`` filters)."""
        return self._versions.get(node, 0)

    @property
    def versions(self) -> Mapping[str, int]:
        """Every node's bindings version (absent: 0), for lookups in a tight loop."""
        return self._versions

    def _bump(self, node: str) -> None:
        self._version += 1  # global, so a node that lost all its bindings and got new ones never repeats a value
        self._versions[node] = self._version

    def remember(self, pod: PodView) -> None:
        """Keep the pod's requests until its binding arrives (oldest forgotten beyond ``max_pods``)."""
        if not pod.uid:
            return
        self._sizes[pod.uid] = (pod.cpu, pod.memory)
        self._sizes.move_to_end(pod.uid)
        while len(self._sizes) > self.max_pods:
            self._sizes.popitem(last=False)

    def add(self, record: BindingRecord, now: float) -> bool:
        """Count a binding; False when it is too old, already counted, or from a scheduler not counted."""
        if self.schedulers is not None and record.scheduler not in self.schedulers:
            return False
        if record.bound_at <= now - self.retention.total_seconds() or record.uid in self._bound:
            return False
        cpu, memory = self._sizes.pop(record.uid, (0.0, 0.0))
        self._by_node.setdefault(record.node, deque()).append(
            (record.uid, RecentBinding(record.node, record.bound_at, cpu, memory))
        )
        self._bound[record.uid] = record.bound_at
        self._bump(record.node)
        if len(self._bound) > self.max_pods:
            self.prune(now)
        return True

    def for_node(self, node: str, now: float) -> tuple[RecentBinding, ...]:
        """Bindings to ``node`` still within the retention window."""
        entries = self._by_node.get(node)
        if not entries:
            return ()
        cutoff = now - self.retention.total_seconds()
        return tuple(b for _, b in entries if b.bound_at > cutoff)

    def prune(self, now: float) -> int:
        """Forget bindings older than the retention; beyond ``max_pods`` the oldest go first."""
        cutoff = now - self.retention.total_seconds()
        if len(self._bound) > self.max_pods:  # a burst larger than the cap: keep the newest max_pods
            cutoff = max(cutoff, sorted(self._bound.values(), reverse=True)[self.max_pods])
        removed = 0
        for node in list(self._by_node):
            entries = self._by_node[node]
            kept = deque(e for e in entries if e[1].bound_at > cutoff)
            for uid, binding in entries:
                if binding.bound_at <= cutoff:
                    self._bound.pop(uid, None)
                    removed += 1
            if len(kept) != len(entries):
                self._bump(node)
            if kept:
                self._by_node[node] = kept
            else:
                del self._by_node[node]
        return removed

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_node.values())

    def nodes(self) -> Iterable[str]:
        return self._by_node.keys()


class BindingStream(Protocol):
    """What ``follow_bindings`` needs of ``crane_shared.binding_store.BindingStore``."""

    async def read_stream(self, last_id: str, block_ms: int | None, count: int) -> StreamBatch: ...


async def follow_bindings(
    store: BindingStream,
    recent: RecentBindings,
    stopping: asyncio.Event,
    *,
    block_ms: int = 1000,
    batch: int = 1000,
    clock: Callable[[], float] = time.time,
    on_record: Callable[[str], None] = lambda result: None,
    max_backoff: float = 10.0,
) -> None:
    """Read the binding stream into ``recent`` until ``stopping``; Redis failures back off and retry.

    Starts from the oldest kept entry, so a restarted extender knows the bindings of the last minutes at once
    (older ones fall outside the retention and are ignored). Without Redis the policy still has the annotations:
    failures are logged once per kind and never stop the extender.
    """
    once = LogOnce(log)
    last_id = "0"
    backoff = 0.2
    last_prune = clock()
    while not stopping.is_set():
        try:
            got = await store.read_stream(last_id, block_ms, batch)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            once.warning(type(err).__name__, "binding stream unavailable; using annotations only", error=repr(err))
            on_record("stream-error")
            await _sleep_or_stop(stopping, backoff * (1 + random.random() / 2))
            backoff = min(max_backoff, backoff * 2)
            continue
        backoff = 0.2
        last_id = got.last_id
        now = clock()
        for record in got.records:
            on_record("counted" if recent.add(record, now) else "ignored")
        for skipped in got.skipped:
            once.warning(
                "undecodable-record",
                "skipping undecodable binding record",
                entry=skipped.entry_id,
                reason=skipped.reason,
            )
            on_record("undecodable")
        if now - last_prune > 10:
            recent.prune(now)
            last_prune = now


async def _sleep_or_stop(stopping: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)
