"""The judge process for the differential suite: built by kubebin from the pinned Kubernetes release, one per
session. Without Go the suite is skipped (nothing else can build kube-scheduler's plugins); in CI it fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.judge import Judge, go_available, judge_binary
from tests.support.unavailable import unavailable


@pytest.fixture(scope="session")
def judge() -> Iterator[Judge]:
    if not go_available():
        unavailable(
            "Go is not installed: the judge (kube-scheduler's plugins) is built from the pinned k8s.io/kubernetes"
        )
    j = Judge(judge_binary())
    yield j
    j.close()
