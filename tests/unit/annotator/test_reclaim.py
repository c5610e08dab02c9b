"""The reclaimable-capacity math (koordinator's policies) and the write budget, on plain dataclasses."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from crane_annotator.reclaim import (
    NodeInputs,
    NodePod,
    Published,
    Reclaimable,
    Resources,
    batch_usage,
    node_pod_usage,
    reclaimable,
    should_write,
)
from crane_shared.batch import PodUsage
from crane_shared.reclaimpolicy import NodeOverride, ReclaimPolicy, ResourceReclaim

GI = 1 << 30
NOW = 10_000.0
POLICY = ReclaimPolicy()  # cpu 0.60, memory 0.65, usage policy


def inputs(**changes: object) -> NodeInputs:
    """A 10-core 40 GiB node (1 core, 2 GiB reserved) using 4 cores / 16 GiB: a regular pod using 2 / 8, a batch
    pod using 1 / 4, so the system uses 1 core / 4 GiB."""
    base = NodeInputs(
        capacity=Resources(10, 40 * GI),
        allocatable=Resources(9, 38 * GI),
        pods=(
            NodePod("a/regular", False, Resources(3, 6 * GI)),
            NodePod("a/batch", True, Resources(0, 0)),
        ),
        usage=Resources(4, 16 * GI),
        usage_at=NOW - 60,
        pod_usage={"a/regular": PodUsage(2, 8 * GI), "a/batch": PodUsage(1, 4 * GI), "b/elsewhere": PodUsage(5, GI)},
        pod_usage_at=NOW - 30,
        override=NodeOverride(),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_usage_policy_is_koordinators_formula() -> None:
    # cpu: 10 x 0.6 - max(system 1, reserved 1) - regular 2 = 3 cores; memory: 40 x 0.65 - max(4, 2) - 8 = 14 GiB
    assert reclaimable(inputs(), POLICY, NOW, NOW - 100) == Reclaimable(3000, int(14 * GI), "ok")


def test_regular_usage_rising_shrinks_it_and_batch_usage_does_not() -> None:
    hotter = inputs(
        usage=Resources(5, 16 * GI), pod_usage={"a/regular": PodUsage(3, 8 * GI), "a/batch": PodUsage(1, 4 * GI)}
    )
    assert reclaimable(hotter, POLICY, NOW, 0).cpu_milli == 2000  # type: ignore[union-attr]
    busier_batch = inputs(
        usage=Resources(5, 16 * GI), pod_usage={"a/regular": PodUsage(2, 8 * GI), "a/batch": PodUsage(2, 4 * GI)}
    )
    assert reclaimable(busier_batch, POLICY, NOW, 0).cpu_milli == 3000  # type: ignore[union-attr]


def test_reserved_counts_when_above_system_usage_and_never_goes_negative() -> None:
    reserved = inputs(allocatable=Resources(7, 38 * GI))  # 3 cores reserved > 1 core used by the system
    assert reclaimable(reserved, POLICY, NOW, 0).cpu_milli == 1000  # type: ignore[union-attr]
    full = inputs(usage=Resources(9, 39 * GI), pod_usage={"a/regular": PodUsage(8, 30 * GI)})
    assert reclaimable(full, POLICY, NOW, 0) == Reclaimable(0, 0, "ok")


def test_request_and_max_usage_request_policies() -> None:
    request = dataclasses.replace(POLICY, memory=ResourceReclaim("request", 0.65, "mem_usage_avg_5m"))
    # memory: 26 GiB - reserved 2 - regular request 6 = 18 GiB (system usage is not read)
    assert reclaimable(inputs(), request, NOW, 0).memory_bytes == 18 * GI  # type: ignore[union-attr]
    both = dataclasses.replace(POLICY, cpu=ResourceReclaim("maxUsageRequest", 0.6, "cpu_usage_avg_5m"))
    # cpu: 6 - max(1, 1) - max(request 3, used 2) = 2 cores
    assert reclaimable(inputs(), both, NOW, 0).cpu_milli == 2000  # type: ignore[union-attr]


def test_an_unmeasured_regular_pod_counts_with_its_request() -> None:
    new_pod = inputs(pods=(*inputs().pods, NodePod("a/new", False, Resources(0.5, GI))))
    assert reclaimable(new_pod, POLICY, NOW, 0).cpu_milli == 2500  # type: ignore[union-attr]


def test_override_narrows_or_switches_off_and_a_bad_one_lends_nothing() -> None:
    narrowed = inputs(override=NodeOverride(cpu_threshold=0.5))
    assert reclaimable(narrowed, POLICY, NOW, 0).cpu_milli == 2000  # type: ignore[union-attr]
    assert reclaimable(inputs(override=NodeOverride(off=True)), POLICY, NOW, 0) == Reclaimable(0, 0, "off")
    assert reclaimable(inputs(override=None), POLICY, NOW, 0) == Reclaimable(0, 0, "bad-override")


def test_stale_inputs_degrade_to_zero_and_unknown_ones_wait_until_then() -> None:
    degrade = POLICY.degrade_after.total_seconds()
    old_node = inputs(usage_at=NOW - degrade - 1)
    assert reclaimable(old_node, POLICY, NOW, 0) == Reclaimable(0, 0, "stale")
    old_pods = inputs(pod_usage_at=NOW - degrade - 1)
    assert reclaimable(old_pods, POLICY, NOW, 0) == Reclaimable(0, 0, "stale")
    never = inputs(usage=None, usage_at=None)
    assert reclaimable(never, POLICY, NOW, since=NOW - 60) is None  # term just began: leave what is published
    assert reclaimable(never, POLICY, NOW, since=NOW - degrade - 1) == Reclaimable(0, 0, "stale")


def test_batch_usage_fraction_and_pod_usage_of_the_node() -> None:
    assert batch_usage(inputs()) == Resources(0.1, 0.1)
    assert node_pod_usage(inputs()) == {"a/regular": PodUsage(2, 8 * GI), "a/batch": PodUsage(1, 4 * GI)}
    assert batch_usage(inputs(capacity=Resources(0, 0))) == Resources(0, 0)


def test_a_batch_pod_just_started_counts_as_far_as_the_node_average_holds_it() -> None:
    # the node metric averages 5 minutes; a batch pod running for 1 of them is a fifth of that average, so only a
    # fifth of its usage comes out of the node's usage for regular pods (not all of it, which would read the node
    # as emptier than its regular pods make it); after the window, all of it
    window = 300.0
    pods = (NodePod("a/regular", False, Resources(3, 6 * GI)), NodePod("a/batch", True, Resources(0, 0), NOW - 60))
    assert batch_usage(inputs(pods=pods), NOW, window) == Resources(0.1 / 5, 0.1 / 5)
    later = (pods[0], dataclasses.replace(pods[1], started=NOW - 301))
    assert batch_usage(inputs(pods=later), NOW, window) == Resources(0.1, 0.1)
    assert batch_usage(inputs(), NOW, window) == Resources(0.1, 0.1)  # start unknown: counted in full


def test_write_budget() -> None:
    cap = Resources(10, 40 * GI)
    policy = dataclasses.replace(POLICY, change_threshold=0.1, max_age=timedelta(minutes=5))
    old = Published(3000, 14 * GI, NOW - 60)

    def write(cpu: int, memory: int, old: Published | None = old, now: float = NOW) -> bool:
        return should_write(Reclaimable(cpu, memory, "ok"), old, cap, policy, now)

    assert not write(3000, 14 * GI)  # unchanged
    assert not write(3900, 14 * GI)  # 0.9 core: under 10 % of 10 cores
    assert write(4100, 14 * GI)  # over it
    assert not write(3000, 10 * GI)  # memory moved 4 GiB: exactly 10 % of 40 GiB
    assert write(3000, 9 * GI)  # 5 GiB: more
    assert write(0, 14 * GI)  # to zero: at once
    assert write(3500, 14 * GI, now=NOW + 300)  # small change, but the last write is 5 min old
    assert not write(3000, 14 * GI, now=NOW + 3000)  # unchanged: never rewritten
    assert write(100, 0, old=Published(0, 0, NOW))  # from zero
    assert not write(0, 0, old=None)  # nothing published, nothing to lend
    assert write(1, 0, old=None)


def test_the_batch_share_of_the_node_metric_keeps_the_system_usage_right_while_batch_pods_start() -> None:
    # the batch pod (1 core / 4 GiB) just started: the averaged node metric holds none of it yet (3 cores /
    # 12 GiB), its usage now counts at once: the system reads 12 - 12 = 0 GiB and the node lends 2 GiB too many
    just_started = inputs(usage=Resources(3, 12 * GI))
    assert reclaimable(just_started, POLICY, NOW, 0).memory_bytes == 16 * GI  # type: ignore[union-attr]
    # its share of the node metric (0 so far) keeps the system at 4 GiB: 40 x 0.65 - 4 - 8 = 14 GiB
    with_share = inputs(usage=Resources(3, 12 * GI), batch_share={"cpu": 0.0, "memory": 0.0})
    assert reclaimable(with_share, POLICY, NOW, 0) == Reclaimable(3000, 14 * GI, "ok")
    # once the metric holds it, the same as koordinator's formula
    settled = inputs(batch_share={"cpu": 1.0, "memory": 4.0 * GI})
    assert reclaimable(settled, POLICY, NOW, 0) == reclaimable(inputs(), POLICY, NOW, 0)
