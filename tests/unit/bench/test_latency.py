"""The decision-latency percentiles bench.scheduler reads from both schedulers' Prometheus histograms."""

import asyncio

import pytest

from bench.scheduler.__main__ import create_pods, histogram, percentile

CRANE = """\
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.001",profile="crane-bench"} 90.0
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.005",profile="crane-bench"} 100.0
scheduler_scheduling_algorithm_duration_seconds_bucket{le="+Inf",profile="crane-bench"} 100.0
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.001",profile="other"} 0.0
scheduler_scheduling_algorithm_duration_seconds_bucket{le="+Inf",profile="other"} 7.0
"""

KUBE = """\
# TYPE scheduler_scheduling_algorithm_duration_seconds histogram
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.001"} 50
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.002"} 80
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.004"} 100
scheduler_scheduling_algorithm_duration_seconds_bucket{le="+Inf"} 100
scheduler_scheduling_algorithm_duration_seconds_sum 0.1
scheduler_scheduling_algorithm_duration_seconds_count 100
"""


def test_one_profile_series_is_read_and_interpolated() -> None:
    buckets = histogram(CRANE, "scheduler_scheduling_algorithm_duration_seconds", "crane-bench")
    assert buckets[-1][1] == 100  # the other profile's decisions are not counted
    assert percentile(buckets, 0.5) == pytest.approx(0.001 * 50 / 90)
    assert percentile(buckets, 0.99) == pytest.approx(0.001 + 0.004 * 9 / 10)


def test_kube_schedulers_unlabelled_histogram_is_read() -> None:
    buckets = histogram(KUBE, "scheduler_scheduling_algorithm_duration_seconds", None)
    assert [count for _, count in buckets] == [50, 80, 100, 100]
    assert percentile(buckets, 0.5) == pytest.approx(0.001)
    assert percentile(buckets, 0.9) == pytest.approx(0.003)


class Pods:
    """Records when each pod creation started (stands in for the API client)."""

    def __init__(self) -> None:
        self.started: list[float] = []

    async def create_namespaced_pod(self, namespace: str, body: dict[str, object], **_: object) -> "Pods":
        self.started.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.05)  # a slow reply must not hold the next creation back
        return self

    def release(self) -> None:
        pass


async def test_paced_creation_keeps_its_schedule_when_replies_are_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    pods = Pods()
    monkeypatch.setattr("bench.scheduler.__main__.client.CoreV1Api", lambda api: pods)
    t0 = asyncio.get_running_loop().time()
    await create_pods(None, "ns", 20, "crane", rate=200)
    gaps = [b - a for a, b in zip(pods.started, pods.started[1:], strict=False)]
    assert len(pods.started) == 20
    assert pods.started[-1] - t0 < 0.05 * 20 / 2  # serial creations would take 20 x 50 ms
    assert max(gaps) < 0.04
