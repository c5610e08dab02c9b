"""A policy file that is re-read when it changes: the one hot-reload rule of the scheduler and the descheduler.

A ConfigMap update swaps the mounted file; ``reload`` notices it by its stat signature (inode, mtime, size), so
a check costs one ``stat``. A valid new policy is returned (the caller applies it to its next decision); an
invalid one is refused with its problems logged and counted, the old policy stays, and the same broken file is
not re-read until it changes again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, TypeVar

from prometheus_client import Counter

from crane_shared.logs import get_logger
from crane_shared.policyyaml import PolicyError

__all__ = ["PolicyFile"]

P = TypeVar("P")

log = get_logger("crane.policyfile")


class PolicyFile(Generic[P]):
    """The policy file and the stat signature it was loaded at; ``reload`` returns a new valid policy or None.

    ``load(path)`` reads and validates a file (raising ``PolicyError``), ``default()`` is the policy without one.
    """

    def __init__(
        self,
        path: str | None,
        load: Callable[[str], P],
        default: Callable[[], P],
        reloads: Counter | None = None,
    ) -> None:
        self.path = path
        self._load = load
        self._reloads = reloads
        self.policy: P = load(path) if path else default()
        self._signature = self._stat()
        self._refused: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def reload(self) -> P | None:
        signature = self._stat()
        if self.path is None or signature is None or signature == self._signature or signature == self._refused:
            return None
        try:
            policy = self._load(self.path)
        except PolicyError as err:
            self._refused = signature
            if self._reloads is not None:
                self._reloads.labels("invalid").inc()
            log.error(
                "policy file changed but is invalid; keeping the previous policy", path=self.path, problems=str(err)
            )
            return None
        self._signature = signature
        self.policy = policy
        if self._reloads is not None:
            self._reloads.labels("applied").inc()
        log.info("policy reloaded", path=self.path)
        return policy
