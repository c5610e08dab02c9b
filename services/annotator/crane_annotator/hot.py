"""Hot values: recent bindings per node, counted in Redis, kept here between refreshes.

Independent of Prometheus on purpose (upstream recomputed them only after a successful metric sync). The latest
computed value per node is what every patch carries (see ``writer``); ``to_write`` decides which nodes need a
hot-value-only patch: those whose value changed since we last wrote it, and those whose written timestamp is
getting old (readers treat a hot value older than 5 minutes as missing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from crane_annotator.patches import DEFAULT_STAMP, Stamp, hot_value_annotation
from crane_shared.annotations import AnnotationError, decode
from crane_shared.binding_store import BindingStore
from crane_shared.hotvalue import hot_value, windows
from crane_shared.policy import HotValuePolicy


@dataclass(frozen=True)
class Hot:
    value: int
    at: float
    """unix seconds of the count it was computed from"""
    counts: Mapping[timedelta, int]


def to_write(
    computed: Mapping[str, Hot], written: Mapping[str, tuple[int, float]], now: float, max_age: float
) -> list[str]:
    """Nodes whose hot annotation needs a patch: never written, changed, or written ``max_age`` ago or more."""
    due = []
    for node, hot in computed.items():
        last = written.get(node)
        if last is None or last[0] != hot.value or now - last[1] >= max_age:
            due.append(node)
    return sorted(due)


class HotValues:
    def __init__(
        self,
        store: BindingStore,
        rules: Sequence[HotValuePolicy],
        stamp: Stamp = DEFAULT_STAMP,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._rules = tuple(rules)
        self._windows = windows(self._rules)
        self._stamp = stamp
        self._clock = clock
        self.latest: dict[str, Hot] = {}
        self.written: dict[str, tuple[int, float]] = {}
        """node -> (value, at) of the hot value last written to it (by us, or seen on the node at start)"""

    async def refresh(self, nodes: Iterable[str]) -> dict[str, Hot]:
        """Count each node's bindings per window (one pipelined round trip) and apply upstream's formula."""
        names = list(nodes)
        now = self._clock()
        counts = await self._store.count_in_windows(names, self._windows, now)
        fresh = {node: Hot(hot_value(c, self._rules), now, c) for node, c in counts.items()}
        self.latest.update(fresh)
        return fresh

    def forget(self, keep: Iterable[str]) -> None:
        """Drop nodes that no longer exist."""
        kept = set(keep)
        for table in (self.latest, self.written):
            for node in [n for n in table if n not in kept]:
                del table[node]

    def annotation(self, node: str) -> dict[str, str]:
        """The hot-value annotation from the latest count, for a patch being sent now; empty when unknown."""
        hot = self.latest.get(node)
        if hot is None:
            return {}
        return hot_value_annotation(hot.value, datetime.fromtimestamp(hot.at, UTC), self._stamp)

    def mark_written(self, node: str, annotation_value: str) -> None:
        """Remember a hot-value annotation that is now on the node (sent by us, or found there at start)."""
        try:
            sample = decode(annotation_value, self._stamp.legacy_zone)
        except AnnotationError:
            return
        self.written[node] = (int(sample.value), sample.timestamp.timestamp())
