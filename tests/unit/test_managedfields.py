"""``managedFields`` cut out of the API server's JSON before decoding: the decoded object is the whole one without
them, and any other layout is left to decode whole (nothing else is ever cut)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crane_shared.managedfields import loads, without_managed_fields


def _encode(obj: Any) -> bytes:
    """As the API server's encoder writes it: compact, fields in the order given (Go's struct order)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def _without(obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(_encode(obj))
    for item in out.get("items", [out]):
        item.get("metadata", {}).pop("managedFields", None)
    return out


ENTRY = {
    "manager": "kube-scheduler",
    "operation": "Update",
    "apiVersion": "v1",
    "time": "2026-11-29T03:00:00Z",
    "fieldsType": "FieldsV1",
    "fieldsV1": {
        "f:status": {"f:conditions": {".": {}, 'k:{"type":"PodScheduled"}': {".": {}, "f:status": {}}}},
        "f:metadata": {"f:finalizers": {'v:"x/y"': {}}, "f:labels": {"f:app": {}}},
    },
    "subresource": "status",
}


def _pod(name: str = "web-1", entries: list[Any] | None = None, **meta: Any) -> dict[str, Any]:
    metadata = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "7", **meta}
    metadata["managedFields"] = entries if entries is not None else [ENTRY, {**ENTRY, "manager": "kubectl"}]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "pause"}]},
        "status": {"phase": "Pending"},
    }


def test_a_pod_as_the_api_server_sends_it_decodes_whole_but_for_its_managed_fields() -> None:
    pod = _pod(labels={"app": "web"}, ownerReferences=[{"kind": "ReplicaSet", "name": "web"}], finalizers=["x/y"])
    cut = without_managed_fields(_encode(pod))
    assert b"managedFields" not in cut
    assert json.loads(cut) == loads(_encode(pod)) == _without(pod)


def test_a_manager_whose_name_ends_like_the_metadata_decodes_whole() -> None:
    pod = _pod(entries=[{**ENTRY, "manager": "}]},"}])
    assert loads(_encode(pod)) == json.loads(_encode(pod))


def test_a_watch_event_and_a_list_lose_each_objects_managed_fields_only() -> None:
    event = {"type": "MODIFIED", "object": _pod()}
    assert json.loads(without_managed_fields(_encode(event))) == {"type": "MODIFIED", "object": _without(_pod())}
    listed = {"kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": [_pod("a"), _pod("b"), _pod("c")]}
    assert json.loads(without_managed_fields(_encode(listed))) == _without(listed)


def test_another_encoders_order_is_left_whole() -> None:
    """managedFields not last in metadata: the array ends in ``}],`` and the next ``}]},"`` is the owner
    references' end, whose key must not go with the cut."""
    pod = _pod()
    meta = pod["metadata"]
    meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web"}]  # after managedFields, unlike Go's order
    data = _encode(pod)
    assert without_managed_fields(data) is data


def test_objects_without_managed_fields_are_the_same_bytes() -> None:
    pod = _pod()
    del pod["metadata"]["managedFields"]
    data = _encode(pod)
    assert without_managed_fields(data) is data


def _entries(text: st.SearchStrategy[str]) -> st.SearchStrategy[list[dict[str, Any]]]:
    field_key = st.builds(lambda p, t: p + t, st.sampled_from(["f:", "k:", "v:", "i:"]), text) | st.just(".")
    fields: st.SearchStrategy[dict[str, Any]] = st.recursive(
        st.just({}), lambda inner: st.dictionaries(field_key, inner, max_size=3), max_leaves=8
    )
    entry = st.builds(
        lambda manager, op, f, sub: {
            "manager": manager,
            "operation": op,
            "apiVersion": "v1",
            "time": "2026-11-29T03:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": f,
            **({"subresource": sub} if sub else {}),
        },
        text,
        st.sampled_from(["Update", "Apply"]),
        fields,
        st.sampled_from(["", "status", "binding"]),
    )
    return st.lists(entry, min_size=1, max_size=3)


anything = st.text(alphabet=st.sampled_from('ab:{}[],"\\. \n'), max_size=8)
names = st.text(alphabet=st.sampled_from("abc-./019"), min_size=1, max_size=8)


@settings(max_examples=300)
@given(st.lists(st.tuples(_entries(anything), st.dictionaries(anything, anything, max_size=3)), min_size=1, max_size=3))
def test_whatever_the_managed_fields_hold_each_object_decodes_whole_or_whole_but_for_them(items: list[Any]) -> None:
    """Managers, field names and labels full of quotes, brackets and braces: an object is never cut anywhere
    else (where a cut is not certain, it decodes whole)."""
    listed = {"items": [_pod(f"p{i}", e, labels=lab) for i, (e, lab) in enumerate(items)]}
    whole, trimmed = json.loads(_encode(listed)), _without(listed)
    got = loads(_encode(listed))
    for g, w, t in zip(got["items"], whole["items"], trimmed["items"], strict=True):
        assert g in (w, t)


@settings(max_examples=300)
@given(st.lists(st.tuples(_entries(names), st.dictionaries(anything, anything, max_size=3)), min_size=1, max_size=3))
def test_managed_fields_as_kubernetes_writes_them_always_go(items: list[Any]) -> None:
    """Manager names as clients set them; field keys and labels with quotes, brackets and braces."""
    listed = {"items": [_pod(f"p{i}", e, labels=lab) for i, (e, lab) in enumerate(items)]}
    assert loads(_encode(listed)) == _without(listed)
