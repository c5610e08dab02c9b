"""Synthetic Scheduled events, encoded exactly as watch lines from the API server (managedFields included)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from crane_event_recorder.source import Page, WatchEvent, parse_watch_line
from crane_shared.kube import micro_time


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


@dataclass
class QueueSource:
    """An ``EventSource`` whose watch replays lines put on ``lines`` (decoded like a real watch stream)."""

    name: str = "synthetic"
    lines: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)

    async def list(self) -> AsyncIterator[Page]:
        yield Page([], "1")

    async def watch(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        while True:
            line = await self.lines.get()
            yield parse_watch_line(line)
