"""Kubernetes adapter: which list function serves one scope of Events (all namespaces or one) through one API.

Either Event API is enough: events.k8s.io/v1 and core/v1 are two views of the same stored objects, so a single
watch sees events written through both (verified against a real API server in the integration tests). Watching
both would deliver every event twice. Listing and watching themselves are ``crane_shared.informer``'s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from kubernetes_asyncio import client

from crane_shared.informer import ListFn

__all__ = ["EventApi", "event_list_function", "scope_name"]


class EventApi(StrEnum):
    EVENTS_V1 = "events.k8s.io/v1"
    CORE_V1 = "v1"


def scope_name(event_api: EventApi, namespace: str | None) -> str:
    return f"{event_api.value} {namespace or '(all namespaces)'}"


def event_list_function(api: client.ApiClient, event_api: EventApi, namespace: str | None) -> ListFn:
    """The kubernetes-asyncio list method of Events in ``namespace`` (None: all) through ``event_api``."""
    group: Any = client.EventsV1Api(api) if event_api is EventApi.EVENTS_V1 else client.CoreV1Api(api)
    if namespace is None:
        function: Callable[..., Awaitable[Any]] = group.list_event_for_all_namespaces
        return function

    async def namespaced(**kwargs: Any) -> Any:
        return await group.list_namespaced_event(namespace, **kwargs)

    return namespaced
