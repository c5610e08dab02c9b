import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crane_shared.bindings import BindingRecord, BindingSchema, RecordError, pack, unpack

RECORD = BindingRecord(
    uid="0b1c2d3e-aaaa-bbbb-cccc-1234567890ab",
    namespace="default",
    name="web-0",
    node="node-1",
    bound_at=1_697_555_072.25,
    scheduler="crane-scheduler",
)


def fields_of(record: BindingRecord) -> dict[str, object]:
    fields: dict[str, object] = msgpack.unpackb(pack(record))
    return fields


def test_default_keys():
    schema = BindingSchema()
    assert schema.node_key("node-1") == "crane:bindings:node-1"
    assert schema.nodes_key == "crane:nodes"
    assert schema.stream_key == "crane:stream:bindings"


def test_prefix_separates_installations():
    schema = BindingSchema("{crane-b}")
    assert schema.node_key("n") == "{crane-b}:bindings:n"
    assert schema.nodes_key == "{crane-b}:nodes"
    assert schema.stream_key == "{crane-b}:stream:bindings"


def test_no_node_name_collides_with_the_stream():
    schema = BindingSchema()
    assert schema.node_key("stream") != schema.stream_key
    assert schema.node_key("stream:bindings") != schema.stream_key


@pytest.mark.parametrize("bad", ["", None])
def test_empty_names_are_refused(bad):
    with pytest.raises(ValueError, match="empty"):
        if bad is None:
            BindingSchema("")
        else:
            BindingSchema().node_key(bad)


def test_payload_is_a_versioned_map():
    assert fields_of(RECORD) == {
        "v": 1,
        "uid": RECORD.uid,
        "namespace": "default",
        "name": "web-0",
        "node": "node-1",
        "bound_at": 1_697_555_072.25,
        "scheduler": "crane-scheduler",
    }


names = st.text(min_size=1)


@given(
    st.builds(
        BindingRecord,
        uid=names,
        namespace=names,
        name=names,
        node=names,
        bound_at=st.floats(allow_nan=False, allow_infinity=False),
        scheduler=st.text(),
    )
)
def test_pack_unpack_round_trips(record):
    assert unpack(pack(record)) == record


def test_integer_times_and_unknown_fields_are_accepted():
    payload = {**fields_of(RECORD), "bound_at": 1_697_555_072, "added_later": [1, 2]}
    assert unpack(msgpack.packb(payload)) == BindingRecord(**{**RECORD.__dict__, "bound_at": 1_697_555_072.0})


def _packed(payload: object) -> bytes:
    data: bytes = msgpack.packb(payload)
    return data


def _without(field: str) -> bytes:
    payload = fields_of(RECORD)
    del payload[field]
    return _packed(payload)


def _with(field: str, value: object) -> bytes:
    return _packed({**fields_of(RECORD), field: value})


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (_without("v"), "v", "missing"),
        (_with("v", 2), "v", "unsupported payload version 2"),
        (_with("v", True), "v", "unsupported"),
        (_without("uid"), "uid", "missing"),
        (_without("node"), "node", "missing"),
        (_without("bound_at"), "bound_at", "missing"),
        (_with("uid", 7), "uid", "must be a string"),
        (_with("node", ""), "node", "must not be empty"),
        (_with("bound_at", "yesterday"), "bound_at", "must be a number"),
        (_with("bound_at", float("nan")), "bound_at", "finite"),
        (_with("bound_at", True), "bound_at", "must be a number"),
        (_packed([1, 2]), "payload", "must be a map"),
        (b"\xc1", "payload", "not msgpack"),
        (pack(RECORD) + b"\x00", "payload", "not msgpack"),
    ],
)
def test_unpack_names_the_bad_field(data, field, message):
    with pytest.raises(RecordError, match=message) as caught:
        unpack(data)
    assert caught.value.field == field
    assert field in str(caught.value)


@given(st.binary())
def test_unpack_raises_only_record_error(data):
    with contextlib.suppress(RecordError):
        unpack(data)
