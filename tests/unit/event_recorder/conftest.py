"""Fakes and helpers for the recorder's unit tests: no real time waits; the API server is ``tests.support.fakeapi``."""

from __future__ import annotations

import pytest

from tests.support.event_recorder import Metrics


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()
