"""What a replica had seen when it decided: the one piece of the workers' conflict check (pure).

The scheduling process numbers the state messages it sends its workers (every one goes to every worker, in
order) and remembers, per node, the number of the last one that changed that node's row: the node itself, a
pod placed there (bound, assumed, forgotten, deleted), a pod nominated there. A worker's answer says how many
it had applied; the node it chose is ``fresh`` when nothing about it was sent after that, so the row the worker
filtered is the row the scheduling process holds.

One exception keeps a worker's pipeline fresh: a worker counts each pod it answered on the node it chose at once
(a provisional assumption, until the scheduling process's own word on that pod arrives), so the next pod it
decides sees the earlier ones. The assumption of such a pod on that very node is therefore no news to that
worker: a step made ``by`` a worker changes the row for every other worker only. Per row, the last step not made
by each worker is kept.
"""

from __future__ import annotations


class RowVersions:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.sent = 0
        """state messages sent so far (each worker applies them all, in order)"""
        self._changed: dict[str, list[int]] = {}
        """node -> per worker, the last step that changed the row and was not that worker's own pod"""

    def step(self, *nodes: str, by: int | None = None) -> int:
        """One more state message, changing the rows of ``nodes`` (none: no row, e.g. a namespace); ``by``: the
        assumption of a pod on the node worker ``by`` chose for it (that worker counted it already)."""
        self.sent += 1
        for node in nodes:
            if not node:
                continue
            steps = self._changed.get(node)
            if steps is None:
                steps = self._changed[node] = [0] * self.workers
            for w in range(self.workers):
                if w != by:
                    steps[w] = self.sent
        return self.sent

    def fresh(self, node: str, seen: int, worker: int) -> bool:
        """Whether ``worker``, having applied ``seen`` messages (and counting its own answered pods), saw ``node``'s
        row as it is now."""
        steps = self._changed.get(node)
        return steps is None or steps[worker] <= seen

    def forget(self, node: str) -> None:
        """``node`` was deleted: its entry goes (node names churn under an autoscaler). An answer naming it finds
        no row in the scheduling process's table (never taken), and a node of that name added again steps anew."""
        self._changed.pop(node, None)
