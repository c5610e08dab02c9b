"""The ``Scheduled`` event contract, written by our scheduler and read by the event-recorder.

kube-scheduler reports a binding as an events.k8s.io/v1 Event: reason ``Scheduled``, action ``Binding``, type
Normal, note ``Successfully assigned <ns>/<pod> to <node>``, regarding the pod (with its UID). Writer and reader
share this module so the two cannot drift.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping
from typing import Any


def micro_time(ts: float) -> str:
    """A MicroTime string with exactly six fractional digits (the API rejects other forms for eventTime)."""
    whole = int(ts)
    micros = round((ts - whole) * 1_000_000)
    if micros == 1_000_000:
        whole, micros = whole + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{micros:06d}Z"


SCHEDULED_REASON = "Scheduled"
_NOTE = re.compile(r"^Successfully assigned (?P<ns>[^/\s]+)/(?P<pod>\S+) to (?P<node>\S+)$")


def scheduled_note(namespace: str, pod: str, node: str) -> str:
    return f"Successfully assigned {namespace}/{pod} to {node}"


def parse_scheduled_note(note: str) -> tuple[str, str, str] | None:
    """(namespace, pod, node) from a ``Scheduled`` note, None when it is not one."""
    m = _NOTE.match(note.strip())
    return (m["ns"], m["pod"], m["node"]) if m else None


def event_name(pod: str, suffix: str) -> str:
    """``<pod>.<suffix>`` as a valid object name (DNS subdomain, at most 253 characters) for any pod name."""
    stem = pod[: 252 - len(suffix)].rstrip("-.")
    return f"{stem}.{suffix}"


def scheduled_event(
    *, namespace: str, pod: str, pod_uid: str, node: str, scheduler: str, instance: str, at: float | None = None
) -> dict[str, Any]:
    """An events.k8s.io/v1 Event body exactly as kube-scheduler writes it for a successful binding."""
    return event_body(
        namespace=namespace,
        pod=pod,
        pod_uid=pod_uid,
        reason=SCHEDULED_REASON,
        action="Binding",
        type_="Normal",
        note=scheduled_note(namespace, pod, node),
        scheduler=scheduler,
        instance=instance,
        at=at,
    )


def event_body(
    *,
    namespace: str,
    pod: str,
    pod_uid: str,
    reason: str,
    action: str,
    type_: str,
    note: str,
    scheduler: str,
    instance: str,
    at: float | None = None,
    related: Mapping[str, Any] | None = None,
    regarding: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An events.k8s.io/v1 Event regarding a pod (or the object ``regarding`` names: ``node_event``); ``related``
    is a second object reference (kube's ``Eventf`` related object, e.g. the preemptor of a ``Preempted``
    victim)."""
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": event_name(pod, secrets.token_hex(8)), "namespace": namespace},
        "eventTime": micro_time(time.time() if at is None else at),
        "reportingController": scheduler,
        "reportingInstance": instance,
        "action": action,
        "reason": reason,
        "type": type_,
        "note": note[:1024],
        "regarding": dict(regarding)
        if regarding is not None
        else {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod, "uid": pod_uid},
    }
    if related is not None:
        body["related"] = dict(related)
    return body


NODE_EVENT_NAMESPACE = "default"
"""where Events about a cluster-scoped object live (as the kubelet's and the node controller's)"""


def node_event(
    *,
    node: str,
    node_uid: str,
    reason: str,
    action: str,
    type_: str,
    note: str,
    controller: str,
    instance: str,
    at: float | None = None,
) -> dict[str, Any]:
    """An events.k8s.io/v1 Event regarding a Node, in ``NODE_EVENT_NAMESPACE`` (``kubectl describe node`` shows
    it)."""
    return event_body(
        namespace=NODE_EVENT_NAMESPACE,
        pod=node,
        pod_uid=node_uid,
        reason=reason,
        action=action,
        type_=type_,
        note=note,
        scheduler=controller,
        instance=instance,
        at=at,
        regarding={"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid},
    )
