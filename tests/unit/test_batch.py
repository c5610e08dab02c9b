"""The batch/pod-usage contract shared by the annotator, the scheduler and the descheduler."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from crane_shared.batch import PodUsage, PodUsageError, decode_pod_usage, encode_pod_usage, is_batch

AT = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)


def test_a_pod_naming_a_batch_resource_anywhere_is_batch() -> None:
    assert is_batch({"containers": [{"resources": {"requests": {"crane.io/batch-cpu": "500"}}}]})
    assert is_batch({"initContainers": [{"resources": {"limits": {"crane.io/batch-memory": "1Gi"}}}]})
    assert is_batch({"resources": {"requests": {"crane.io/batch-cpu": "1"}}})
    assert not is_batch({"containers": [{"resources": {"requests": {"cpu": "1"}}}]})
    assert not is_batch(None)


def test_pod_usage_round_trips_and_is_stable() -> None:
    pods = {"b/y": PodUsage(0.25, 2e9), "a/x": PodUsage(1.23456, 1024.4)}
    text = encode_pod_usage(pods, AT)
    assert text == encode_pod_usage(dict(reversed(list(pods.items()))), AT)
    got = decode_pod_usage(text)
    assert got.at == AT
    assert got.pods == {"a/x": PodUsage(1.235, 1024.0), "b/y": PodUsage(0.25, 2e9)}


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("nope", "not JSON"),
        ('{"p": {}}', "expected"),
        ('{"t": "yesterday", "p": {}}', "pod-usage.t"),
        ('{"t": "2026-11-26T12:00:00+00:00", "p": {"a/x": [1]}}', "p['a/x']"),
        ('{"t": "2026-11-26T12:00:00+00:00", "p": {"a/x": [-1, 2]}}', "p['a/x']"),
        ('{"t": "2026-11-26T12:00:00+00:00", "p": {"nonamespace": [1, 2]}}', "p['nonamespace']"),
    ],
)
def test_a_malformed_annotation_is_refused_naming_the_field(text: str, names: str) -> None:
    with pytest.raises(
        PodUsageError,
    ) as err:
        decode_pod_usage(text)
    assert names in str(err.value)
