"""Node verdicts reused across requests for as long as they provably stay the same.

kube-scheduler asks filter and then prioritize for every pod, each time about the same nodes, and decoding a
node's load annotations is most of an extender request's cost. ``node_load`` depends on the time only through
freshness (a reading is fresh while ``now < ts + window``, future while ``ts > now + max_skew``, the hot value
fresh for 5 minutes) and through which recent bindings fall inside the hot-value ranges; everything else is a
function of the node's annotations, capacity and recent bindings. So a load computed at ``t0`` is exactly the
load at any ``t`` in ``[t0, valid_until)``, where ``valid_until`` is the first of those instants after ``t0``.

The instants come from ``crane_shared.loadaware.dynamic.valid_until``, next to the rules they are derived from;
``tests/unit/extender/test_memo.py`` checks them against ``node_load`` itself at random times.

Each node keeps one ``Verdict`` (the load, its score, its pod-independent filter reason and the few thresholds the
incoming pod is checked against), so a request costs, per node, a few comparisons that prove the entry still
holds. With the node cache the proof is by identity: the informer stores a new object on every change and the
server keeps one ``NodeView`` per object, so an unchanged node is the same view (``is``); the node's recent
bindings carry a version bumped on every change. Without the cache (nodes in the request) the annotation texts and
the capacity are compared instead. A binding leaving the retention also ends the entry (``until``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from crane_extender.protocol import NodeView, Verdict, has_batch_usage, verdict
from crane_shared.annotations import HOT_VALUE_KEY, annotation_key
from crane_shared.batch import batch_metric_key
from crane_shared.loadaware.dynamic import (
    BATCH_USAGE_KEYS,
    DynamicArgs,
    NodeCapacity,
    RecentBinding,
    node_load,
    valid_until,
)

__all__ = ["LoadMemo"]


@dataclass
class _Entry:
    source: object
    """the informer's node object the verdict was made from (node cache mode), or None"""
    view: NodeView | None
    key: tuple[object, ...]
    version: int
    verdict: Verdict
    since: float
    until: float


class LoadMemo:
    """One remembered verdict per node name, reused while its inputs are equal and its validity holds.

    A changed annotation, capacity, binding or policy is a different key and recomputes; memory is one entry
    per node ever asked about (dropped with ``clear``, e.g. when the policy changes).
    """

    def __init__(
        self,
        on_malformed: Callable[[str, tuple[str, ...]], None] | None = None,
        on_stale_batch: Callable[[str], None] | None = None,
    ) -> None:
        self._on_malformed = on_malformed
        self._on_stale_batch = on_stale_batch
        """called with a node whose batch-usage annotation is stale (regular pods then see the whole usage): once
        per annotation text"""
        self._stale_seen: dict[str, tuple[str | None, ...]] = {}
        """called with a node's undecodable metrics (the hot value as ``node_hot_value``) when a load is computed
        from annotation texts the node's previous entry did not have: once per change, not per request"""
        self._entries: dict[str, _Entry] = {}
        self._args: DynamicArgs | None = None
        self._keys: tuple[str, ...] = ()
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        self._entries.clear()

    def loader(
        self,
        args: DynamicArgs,
        now: datetime,
        recent_of: Callable[[str], Sequence[RecentBinding]],
        version_of: Callable[[str], int] = lambda name: 0,
        retention: float = math.inf,
    ) -> Callable[[str, NodeView | None], Verdict]:
        """A ``Decide.verdict`` for decisions at ``now``; ``version_of(node)`` changes whenever ``recent_of(node)``
        may have (other than by bindings leaving the ``retention``, which the entry's validity covers)."""
        if args is not self._args:
            self._args = args
            self._keys = (
                *(annotation_key(s.name) for s in args.policy.sync_policy),
                HOT_VALUE_KEY,
                *BATCH_USAGE_KEYS.values(),
                *(batch_metric_key(s.name) for s in args.policy.sync_policy),
            )
            self._entries.clear()
        keys, entries, t = self._keys, self._entries, now.timestamp()

        def load(name: str, view: NodeView | None) -> Verdict:
            version = version_of(name)
            entry = entries.get(name)
            if (
                entry is not None
                and entry.view is view
                and view is not None
                and entry.version == version
                and entry.since <= t < entry.until
            ):
                self.hits += 1
                return entry.verdict
            annotations: Mapping[str, str] | None = None
            capacity: NodeCapacity | None = None
            if view is not None:
                annotations, capacity = view.annotations, view.capacity
            key = (tuple(annotations.get(k) for k in keys) if annotations is not None else None, capacity)
            if entry is not None and entry.key == key and entry.version == version and entry.since <= t < entry.until:
                self.hits += 1
                entry.view = view
                entry.source = None
                return entry.verdict
            self.misses += 1
            recent = tuple(recent_of(name))
            found = node_load(name, annotations, args, now, recent, capacity)
            until = valid_until(found, annotations, args, recent, t)
            regular = None
            if has_batch_usage(annotations):  # a regular pod's load differs while the batch usage is fresh
                regular = node_load(name, annotations, args, now, recent, capacity, regular=True)
                until = min(until, valid_until(regular, annotations, args, recent, t))
            if recent:
                until = min(until, min(b.bound_at for b in recent) + retention)
            if self._on_malformed is not None and (entry is None or entry.key[0] != key[0]):
                bad = (*found.malformed, *((HOT_VALUE_KEY,) if found.hot_state == "malformed" else ()))
                if regular is not None:
                    bad += tuple(key for key, st in regular.batch_state.items() if st == "malformed")
                if bad:
                    self._on_malformed(name, bad)
            if regular is not None and self._on_stale_batch is not None and "stale" in regular.batch_state.values():
                texts = tuple(annotations.get(k) for k in regular.batch_state) if annotations else ()
                if self._stale_seen.get(name) != texts:
                    self._stale_seen[name] = texts
                    self._on_stale_batch(name)
            made = verdict(found, args, capacity, regular)
            entries[name] = _Entry(None, view, key, version, made, t, until)
            return made

        return load

    def cached(
        self,
        names: Sequence[str],
        cache: Mapping[str, object],
        versions: Mapping[str, int],
        t: float,
        slow: Callable[[str], Verdict],
    ) -> tuple[list[Verdict], set[str]]:
        """Verdicts for ``names`` in node cache mode, and the names the cache lacks; the per-node proof is inlined
        (this loop is the whole per-node cost of a request): the same informer object, the same bindings version,
        inside the validity. Anything else goes through ``slow`` (``Decide.verdict_of`` on the resolved node)."""
        entries_get, cache_get, versions_get = self._entries.get, cache.get, versions.get
        out: list[Verdict] = []
        append = out.append
        unknown: set[str] = set()
        hits = 0
        for name in names:
            entry = entries_get(name)
            if (
                entry is not None
                and entry.source is not None
                and entry.source is cache_get(name)
                and entry.version == versions_get(name, 0)
                and entry.since <= t < entry.until
            ):
                hits += 1
                append(entry.verdict)
                continue
            source = cache_get(name)
            append(slow(name))
            if source is None:
                unknown.add(name)
            elif (entry := entries_get(name)) is not None:
                entry.source = source
        self.hits += hits
        return out, unknown
