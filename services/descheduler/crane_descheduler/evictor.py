"""Evictions through the Eviction API only, and the Event that explains each one.

``POST pods/{name}/eviction`` (policy/v1) with the pod's UID as a precondition, so a pod recreated under the same
name is never the one evicted. The API server answers 429 when a PodDisruptionBudget forbids the eviction now:
that is reported as ``pdb`` and the pod is simply considered again in a later round; it is never turned into a
delete. Every request has a timeout and every answer is status-checked (``raw_json``). The Event is an
events.k8s.io/v1 Event built by ``crane_shared.events.event_body``, the format every service writes.

Leadership: the caller's ``Term`` is checked right before each request; a leader that may have lost its lease
sends nothing more (``lost_lease``).
"""

from __future__ import annotations

from typing import Any, Literal

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_descheduler.plan import Eviction
from crane_shared.events import event_body as pod_event
from crane_shared.kube import api_failure, raw_json
from crane_shared.leader import Term
from crane_shared.logs import LogOnce, get_logger

Result = Literal["evicted", "pdb", "gone", "lost_lease", "error", "unknown"]
"""``unknown``: the request timed out, so the API server may have evicted the pod: counted against the budgets
as an eviction (never one beyond them)"""
REQUEST_TIMEOUT = 30
COMPONENT = "crane-descheduler"
REASON = "LoadAwareDescheduled"

log = get_logger("crane.descheduler.evictor")


DRAIN_REASON = "LoadAwareDrained"


def message(e: Eviction) -> str:
    if e.kind == "drain":
        return (
            f"evicted from node {e.node} to empty it: real usage and requests are low ({e.metric} {e.value:.3f} "
            f"below {e.threshold:g}) and every pod on it has a place elsewhere (this one, e.g. {e.target})"
        )
    place = (
        "a batch pod yielding to the node's regular pods; no other node has room for it now"
        if e.target is None
        else f"another node, e.g. {e.target}, passes the scheduler's filter for it"
    )
    return f"evicted from node {e.node}: {e.metric} {e.value:.3f} above its threshold {e.threshold:g} ({place})"


def event_body(e: Eviction, identity: str, at: float | None = None) -> dict[str, Any]:
    """The Normal ``LoadAwareDescheduled`` (a drain: ``LoadAwareDrained``) Event regarding the evicted pod (action
    ``Descheduled``, as kubernetes-sigs/descheduler's)."""
    return pod_event(
        namespace=e.pod.namespace,
        pod=e.pod.name,
        pod_uid=e.pod.uid,
        reason=DRAIN_REASON if e.kind == "drain" else REASON,
        action="Descheduled",
        type_="Normal",
        note=message(e),
        controller=COMPONENT,
        instance=identity,
        at=at,
    )


class Evictor:
    def __init__(self, api: client.ApiClient, identity: str) -> None:
        self._core = client.CoreV1Api(api)
        self._events = client.EventsV1Api(api)
        self._identity = identity
        self._log = LogOnce(log)

    async def evict(self, e: Eviction, term: Term) -> Result:
        if not term.held:
            return "lost_lease"
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": e.pod.name, "namespace": e.pod.namespace},
            "deleteOptions": {"preconditions": {"uid": e.pod.uid}} if e.pod.uid else {},
        }
        try:
            await raw_json(
                self._core.create_namespaced_pod_eviction(
                    e.pod.name, e.pod.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
                )
            )
        except ApiException as err:
            if err.status == 429:
                return "pdb"
            if err.status in (404, 409):  # gone, or a new pod under the same name (UID precondition)
                return "gone"
            fields = api_failure("create", f"pods/eviction {e.pod.key}", err)
            self._log.warning(f"evict-{err.status}", "eviction failed", pod=e.pod.key, **fields)
            return "error"
        except TimeoutError as err:
            fields = api_failure("create", f"pods/eviction {e.pod.key}", err)
            self._log.warning("evict-timeout", "eviction timed out: it may have happened", pod=e.pod.key, **fields)
            return "unknown"
        except (OSError, aiohttp.ClientError) as err:
            fields = api_failure("create", f"pods/eviction {e.pod.key}", err)
            self._log.warning("evict-transport", "eviction failed", pod=e.pod.key, **fields)
            return "error"
        except ValueError:  # a 2xx whose body is not JSON: the eviction was accepted
            self._log.warning("evict-body", "eviction accepted with a body that is not JSON", pod=e.pod.key)
        await self.record(e, term)
        return "evicted"

    async def record(self, e: Eviction, term: Term) -> None:
        """The Event on the evicted pod; best effort (the eviction already happened), failures logged once."""
        if not term.held:
            return
        try:
            await raw_json(
                self._events.create_namespaced_event(
                    e.pod.namespace,
                    event_body(e, self._identity),
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            )
        except (ApiException, TimeoutError, OSError, aiohttp.ClientError) as err:
            fields = api_failure("create", f"event on pod {e.pod.key}", err)
            self._log.warning("event", "event not written", pod=e.pod.key, **fields)
        except ValueError:  # a 2xx whose body is not JSON: written
            self._log.warning("event-body", "event written with a body that is not JSON", pod=e.pod.key)
