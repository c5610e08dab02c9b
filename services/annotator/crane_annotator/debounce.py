"""Per-node debounce of binding announcements, so a burst of bindings costs one patch per node, not one each.

A node's first announcement opens a window of ``delay`` seconds; announcements for it within the window are
absorbed; when the window closes the node's hot value is recomputed once. The delay bounds the added latency
(a burst is reflected ``delay`` after its first binding, however long it lasts, and again after the next
window), unlike a trailing "quiet period" debounce that a steady stream would postpone forever.
"""

from __future__ import annotations

from collections.abc import Iterable


class Debouncer:
    def __init__(self, delay: float) -> None:
        if delay < 0:
            raise ValueError(f"debounce delay must not be negative, got {delay}")
        self.delay = delay
        self._deadline: dict[str, float] = {}

    def add(self, nodes: Iterable[str], now: float) -> None:
        for node in nodes:
            self._deadline.setdefault(node, now + self.delay)

    def next_deadline(self) -> float | None:
        return min(self._deadline.values(), default=None)

    def take_due(self, now: float) -> list[str]:
        """Nodes whose window has closed, sorted; they are forgotten until announced again."""
        ready = sorted(node for node, at in self._deadline.items() if at <= now)
        for node in ready:
            del self._deadline[node]
        return ready

    def __len__(self) -> int:
        return len(self._deadline)
