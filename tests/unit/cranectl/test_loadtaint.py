"""``cranectl load-taint clear`` waits for the annotator's Lease to be free before it lifts anything."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cranectl.loadtaint import lease_free, split

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "free"),
    [
        ({"holderIdentity": "", "renewTime": "2026-01-01T11:59:59.000000Z", "leaseDurationSeconds": 1}, True),
        (
            {"holderIdentity": "annotator-0", "renewTime": "2026-01-01T11:59:50.000000Z", "leaseDurationSeconds": 15},
            False,
        ),
        (
            {"holderIdentity": "annotator-0", "renewTime": "2026-01-01T11:59:40.000000Z", "leaseDurationSeconds": 15},
            True,
        ),
        ({}, True),
    ],
)
def test_a_lease_is_free_when_released_or_expired(spec: dict[str, object], free: bool) -> None:
    assert lease_free({"spec": spec}, NOW) is free


def test_references_name_the_flag() -> None:
    assert split("crane-system/crane-annotator", "--lease") == ("crane-system", "crane-annotator")
    with pytest.raises(ValueError, match="--lease: expected NAMESPACE/NAME"):
        split("crane-annotator", "--lease")
