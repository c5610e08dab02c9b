"""DefaultBinder: POST pods/<name>/binding through the API writer process (``crane_scheduler.writer``), carrying
the pod's ``Scheduled`` event (written by that process once the bind succeeded: ``Handle.scheduled_report``). A 409
(already bound) is answered with ``Code.ALREADY_BOUND``, which the scheduler treats as someone else's success
rather than an error to retry; nothing raises across the plugin boundary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_scheduler.framework import (
    SCHEDULED_WITH_BIND,
    SUCCESS,
    BindPlugin,
    Code,
    CycleState,
    Handle,
    Status,
    no_args,
)
from crane_scheduler.podinfo import PodInfo
from crane_shared.kube import raw_json


class BindConflict(Exception):
    """409: the pod is already bound (by us earlier, or by someone else): not worth a retry."""


async def bind_pod(api: client.ApiClient, namespace: str, name: str, uid: str, node: str) -> None:
    """POST pods/<name>/binding with an ApiClient of this process (the benchmarks' bind ceiling, the API contract
    test; the scheduler binds through its writer process). kubernetes-asyncio cannot deserialize the Status the
    API answers (it expects a Binding and raises ValueError after a successful bind), so read the raw response and
    judge the status code.
    The UID precondition makes a bind of a deleted-and-recreated pod fail instead of binding the new one."""
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    try:
        v1 = client.CoreV1Api(api)
        await raw_json(v1.create_namespaced_pod_binding(name, namespace, body, _preload_content=False))
    except ApiException as err:
        if err.status == 409:
            raise BindConflict(f"pod {namespace}/{name} is already bound") from err
        raise


class DefaultBinder(BindPlugin):
    name = "DefaultBinder"

    def __init__(self, handle: Handle) -> None:
        self._handle = handle

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        if not self._handle.may_bind():  # the leader's term ended: the next leader binds this pod
            return Status(Code.ERROR, ("not binding: leadership lost",), self.name)
        writer = self._handle.writer
        if writer is None:
            return Status(Code.ERROR, ("not binding: no API writer",), self.name)
        report = self._handle.scheduled_report(pod)
        if report is not None:
            state[SCHEDULED_WITH_BIND] = True  # the writer writes the Scheduled event once the bind succeeded
        if report is None:
            reply = await writer.bind(pod.namespace, pod.name, pod.uid, node)
        else:
            reply = await writer.bind(pod.namespace, pod.name, pod.uid, node, report)
        if reply.ok:
            return SUCCESS
        if reply.status == 409:
            return Status(Code.ALREADY_BOUND, (f"pod {pod.namespace}/{pod.name} is already bound",), self.name)
        # API errors, timeouts, resets, a refusal after the term ended: the pod is retried with backoff
        return Status(Code.ERROR, (f"binding pod to {node}: {reply.describe()}",), self.name)


def new(args: Mapping[str, Any], handle: Handle) -> DefaultBinder:
    no_args(DefaultBinder.name)(args)
    return DefaultBinder(handle)
