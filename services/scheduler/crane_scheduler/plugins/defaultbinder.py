"""DefaultBinder: POST pods/<name>/binding. A 409 (already bound) surfaces as ``BindConflict``, which the
scheduler treats as someone else's success rather than an error to retry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crane_scheduler.framework import SUCCESS, CycleState, Handle, Status, no_args
from crane_scheduler.podinfo import PodInfo
from crane_shared.kube import bind_pod


class DefaultBinder:
    name = "DefaultBinder"

    def __init__(self, handle: Handle) -> None:
        self._handle = handle

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        await bind_pod(self._handle.api, pod.namespace, pod.name, pod.uid, node)
        return SUCCESS


def new(args: Mapping[str, Any], handle: Handle) -> DefaultBinder:
    no_args(DefaultBinder.name)(args)
    return DefaultBinder(handle)
