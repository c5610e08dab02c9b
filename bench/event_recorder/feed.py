"""Synthetic Scheduled events, encoded exactly as watch lines from the API server (managedFields included)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from crane_shared.events import micro_time


def watch_line(namespace: str, pod: str, uid: str, node: str, at: float, rv: int) -> bytes:
    """One ``ADDED`` watch line for a kube-scheduler binding event (about 1.2 kB, like the real ones)."""
    stamp = micro_time(at)
    obj = {
        "kind": "Event",
        "apiVersion": "events.k8s.io/v1",
        "metadata": {
            "name": f"{pod}.{uuid.uuid4().hex[:16]}",
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(rv),
            "creationTimestamp": stamp[:19] + "Z",
            "managedFields": [
                {
                    "manager": "kube-scheduler",
                    "operation": "Update",
                    "apiVersion": "events.k8s.io/v1",
                    "time": stamp[:19] + "Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:action": {},
                        "f:eventTime": {},
                        "f:note": {},
                        "f:reason": {},
                        "f:regarding": {},
                        "f:reportingController": {},
                        "f:reportingInstance": {},
                        "f:type": {},
                    },
                }
            ],
        },
        "eventTime": stamp,
        "reportingController": "default-scheduler",
        "reportingInstance": "default-scheduler-node-0",
        "action": "Binding",
        "reason": "Scheduled",
        "regarding": {
            "kind": "Pod",
            "namespace": namespace,
            "name": pod,
            "uid": uid,
            "apiVersion": "v1",
            "resourceVersion": str(rv - 1),
        },
        "note": f"Successfully assigned {namespace}/{pod} to {node}",
        "type": "Normal",
        "deprecatedSource": {},
        "deprecatedFirstTimestamp": None,
        "deprecatedLastTimestamp": None,
    }
    return json.dumps({"type": "ADDED", "object": obj}, separators=(",", ":")).encode() + b"\n"


class QueueFeed:
    """A list function shaped like kubernetes-asyncio's (``_preload_content=False``) whose list is empty and whose
    watch streams the lines put on ``lines``: the recorder's whole path from watch bytes on, without an API server.
    """

    def __init__(self) -> None:
        self.lines: asyncio.Queue[bytes] = asyncio.Queue()

    async def __call__(self, **kwargs: Any) -> _Response:
        return _Response(self.lines if kwargs.get("watch") else None)


class _Response:
    status = 200
    reason = "OK"

    def __init__(self, lines: asyncio.Queue[bytes] | None) -> None:
        self.headers: dict[str, str] = {}
        self.content = self
        self._lines = lines

    async def read(self) -> bytes:
        return b'{"kind": "EventList", "items": [], "metadata": {"resourceVersion": "1"}}'

    async def readany(self) -> bytes:
        """What a socket read would return: every line queued so far (at least one; waits for it)."""
        assert self._lines is not None
        parts = [await self._lines.get()]
        while not self._lines.empty() and len(parts) < 256:
            parts.append(self._lines.get_nowait())
        return b"".join(parts)

    def release(self) -> None:
        pass
