"""Estimates learned from a workload's measured pods: the pure rules, the scheduler's index, and placements."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crane_scheduler.framework import ArgsError, Diagnosis
from crane_scheduler.loadaware.args import parse_args
from crane_scheduler.loadaware.learned import WorkloadUsage
from crane_scheduler.podinfo import parse_pod
from crane_shared.batch import POD_USAGE_KEY, PodUsage
from crane_shared.loadaware.learned import LearnArgs, learned_usage, percentile, workload_key
from tests.support.loadaware import NOW, Setup, loaded, replica, with_pod_usage

GI = float(2**30)


def test_a_workload_is_one_template_of_one_controller() -> None:
    meta = replica("web", 0, "1", "1Gi")["metadata"]
    assert workload_key(meta) == ("ns", "rs-web", "web-h1")
    meta["labels"] = {"controller-revision-hash": "r7"}
    assert workload_key(meta) == ("ns", "rs-web", "r7")
    meta["labels"] = {"app": "web"}
    assert workload_key(meta) is None, "no template label"
    meta["labels"] = {"pod-template-hash": "h"}
    meta["ownerReferences"][0]["controller"] = False
    assert workload_key(meta) is None, "no controller owner"


@given(st.lists(st.floats(0, 1e12, allow_nan=False), min_size=1, max_size=30), st.floats(0, 100))
def test_percentile_is_numpys_linear_rule(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-9)


def test_too_few_measured_pods_learn_nothing() -> None:
    samples = [PodUsage(1.0, GI), PodUsage(2.0, 2 * GI)]
    assert learned_usage(samples, LearnArgs(min_pods=3)) is None
    assert learned_usage(samples, LearnArgs(min_pods=2, percentile=100)) == PodUsage(2.0, 2 * GI)
    assert learned_usage(samples, LearnArgs(enabled=False, min_pods=1)) is None


def _index(pods: int, cpu: float = 1.5, age: float = 10) -> WorkloadUsage:
    index = WorkloadUsage(LearnArgs())
    for i in range(pods):
        raw = replica("web", i, "1", "1Gi")
        index.pod_added(f"u{i}", "ns", f"web-{i}", raw["metadata"])
    usage = {f"ns/web-{i}": (cpu + 0.1 * i, GI) for i in range(pods)}
    index.node_changed("n", with_pod_usage(loaded("n", 0.1), usage, age=age)["metadata"]["annotations"])
    return index


def test_the_index_joins_the_nodes_pod_usage_with_the_informers_pods() -> None:
    meta = replica("web", 99, "1", "1Gi")["metadata"]
    found = _index(3).estimate(meta, NOW)
    assert found is not None and found.cpu_cores == pytest.approx(percentile([1.5, 1.6, 1.7], 90))
    assert _index(2).estimate(meta, NOW) is None, "two measured pods: the factor"
    assert _index(3, age=3600).estimate(meta, NOW) is None, "samples older than maxAge are not used"
    other = replica("api", 0, "1", "1Gi")["metadata"]
    assert _index(3).estimate(other, NOW) is None, "another workload learns nothing from web"


def test_a_pod_leaving_or_a_new_measurement_changes_the_estimate() -> None:
    index = _index(3)
    meta = replica("web", 99, "1", "1Gi")["metadata"]
    assert index.estimate(meta, NOW) is not None
    computed = index.computed
    assert index.estimate(meta, NOW) is not None and index.computed == computed, "cached between changes"
    index.pod_removed("u0")
    assert index.estimate(meta, NOW) is None
    index.pod_added("again", "ns", "web-0", replica("web", 0, "1", "1Gi")["metadata"])
    usage = {f"ns/web-{i}": (0.2, GI) for i in range(3)}
    index.node_changed("n", with_pod_usage(loaded("n", 0.1), usage)["metadata"]["annotations"])
    found = index.estimate(meta, NOW)
    assert found is not None and found.cpu_cores == pytest.approx(0.2)


def test_a_malformed_pod_usage_annotation_is_reported_and_counts_as_unmeasured() -> None:
    index = _index(3)
    assert index.node_changed("n", {POD_USAGE_KEY: '{"t": 1}'}) is not None
    assert index.estimate(replica("web", 99, "1", "1Gi")["metadata"], NOW) is None


@pytest.mark.parametrize(
    ("learned", "path"),
    [
        ({"minPods": 0}, "estimate.learned.minPods"),
        ({"percentile": 101}, "estimate.learned.percentile"),
        ({"maxAge": "soon"}, "estimate.learned.maxAge"),
        ({"enabled": "yes"}, "estimate.learned.enabled"),
        ({"minPod": 3}, "estimate.learned.minPod"),
        ("on", "estimate.learned"),
    ],
)
def test_bad_learned_args_name_the_field(learned: Any, path: str) -> None:
    with pytest.raises(ArgsError) as err:
        parse_args({"estimate": {"learned": learned}})
    assert path in [p for p, _ in err.value.problems]


def test_learned_args_parse() -> None:
    args = parse_args({"estimate": {"learned": {"minPods": 5, "percentile": 99, "maxAge": "2m"}}})
    assert args.estimate.learned == LearnArgs(True, 5, 99.0, timedelta(minutes=2))


# -- placements: a second replica on a node it would push over the threshold (cpu_usage_avg_5m: 0.65) ----------


def scale_up(
    usage: float, peer_cpu: float, peer_memory: float, request_cpu: str, request_memory: str, **args: Any
) -> Setup:
    """Node "full" of 16 cores / 128Gi at ``usage`` on every metric, running three measured replicas of web."""
    peers = {f"ns/web-{i}": (peer_cpu, peer_memory) for i in range(3)}
    n = with_pod_usage(loaded("full", usage, memory="128Gi"), peers)
    s = Setup(n, args={"ownBindingsInHotValue": False, **args})
    for i in range(3):
        running = replica("web", i, request_cpu, request_memory)
        running["spec"]["nodeName"] = "full"
        s.table.add_pod(parse_pod(running))
    return s


def test_a_cpu_heavy_workload_gets_its_measured_usage_and_the_second_replica_is_refused() -> None:
    """Each web pod uses 2 cores of its 2-core request: 2/16 = 0.125 per replica. The factor (0.6) says 0.075:
    0.48 + 0.075 + 0.075 passes twice; learned, the second replica would bring 0.48 + 0.125 + 0.125 > 0.65."""
    learned = scale_up(0.48, 2.0, GI, "2", "1Gi")
    assert learned.place(replica("web", 3, "2", "1Gi")) == "full"
    second = learned.place(replica("web", 4, "2", "1Gi"))
    assert isinstance(second, Diagnosis)
    assert "1 node(s) would have cpu_usage_avg_5m above 0.65" in second.message
    factor = scale_up(0.48, 2.0, GI, "2", "1Gi", estimate={"learned": {"enabled": False}})
    assert factor.place(replica("web", 3, "2", "1Gi")) == "full"
    assert factor.place(replica("web", 4, "2", "1Gi")) == "full"


def test_a_memory_heavy_request_that_is_never_used_no_longer_blocks_the_replica() -> None:
    """Each web pod requests 24Gi and touches 2Gi: the factor says 0.6 x 24Gi = 14.4Gi = 0.1125 of 128Gi, over the
    memory threshold (0.55 + 0.1125 > 0.65); learned (2Gi = 0.016) it fits."""
    learned = scale_up(0.55, 0.1, 2 * GI, "100m", "24Gi")
    assert learned.place(replica("web", 3, "100m", "24Gi")) == "full"
    factor = scale_up(0.55, 0.1, 2 * GI, "100m", "24Gi", estimate={"learned": {"enabled": False}})
    refused = factor.place(replica("web", 3, "100m", "24Gi"))
    assert isinstance(refused, Diagnosis) and "would have mem_usage_avg_5m above 0.65" in refused.message
