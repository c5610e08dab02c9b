"""The simulated fleet: quantities, pod usage, node usage, and the CPU counters Prometheus takes rates of."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio.client import (
    V1Container,
    V1ObjectMeta,
    V1Pod,
    V1PodSpec,
    V1PodStatus,
    V1ResourceRequirements,
)
from prometheus_client.parser import text_string_to_metric_families

from crane_sandbox.exporter import render, shard_of
from crane_sandbox.fleet import (
    DEFAULT_USAGE_FRACTION,
    GI,
    USAGE_ANNOTATION,
    FleetState,
    SimNode,
    base_loads,
    bound_pod,
    make_fleet,
    node_manifest,
    node_status,
    parse_cpu,
    parse_memory,
    parse_usage,
    sim_node_of,
)

MI = 1024**2
T0 = 1_700_000_000.0


def pod(
    uid: str,
    node: str | None = "node-0001",
    *,
    usage: str | None = None,
    requests: list[dict[str, str]] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": uid,
            "name": uid,
            "namespace": "ns",
            "annotations": {USAGE_ANNOTATION: usage} if usage is not None else {},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": f"c{i}", "resources": {"requests": r}} for i, r in enumerate(requests or [])],
        },
        "status": {"phase": phase},
    }


def one_node(cpu: float = 4.0, mem: int = 16 * GI, base_cpu: float = 0.1, base_mem: float = 0.2) -> FleetState:
    node = SimNode("node-0001", "10.0.0.1", cpu, mem, base_cpu, base_mem)
    return FleetState([node], now=T0)


# ---------------------------------------------------------------------------------------------- quantities


@pytest.mark.parametrize(
    ("text", "cores"), [("500m", 0.5), ("2", 2.0), ("1.5", 1.5), ("250000u", 0.25), ("0", 0.0), (3, 3.0)]
)
def test_cpu_quantities(text: str, cores: float) -> None:
    assert parse_cpu(text) == pytest.approx(cores)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512", 512),
        ("1Ki", 1024),
        ("1Mi", MI),
        ("20Gi", 20 * GI),
        ("1Ti", 1024 * GI),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("0.5Gi", GI // 2),
        ("1e3", 1000),
        ("500m", 1),  # fractions of a byte round up, as in Kubernetes
    ],
)
def test_memory_quantities(text: str, size: int) -> None:
    assert parse_memory(text) == size


@pytest.mark.parametrize("text", ["", "abc", "-1", "1Xi", "1 Gi", "Gi", "1.2.3"])
def test_malformed_quantities_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_memory(text)


def test_usage_annotation_gives_cores_and_bytes_and_leaves_missing_keys_open() -> None:
    assert parse_usage("cpu=2,memory=20Gi") == (2.0, 20 * GI)
    assert parse_usage(" memory = 512Mi ") == (None, 512 * MI)
    assert parse_usage("cpu=250m") == (0.25, None)
    for bad in ("cpu", "gpu=1", "cpu=lots"):
        with pytest.raises(ValueError):
            parse_usage(bad)


# ---------------------------------------------------------------------------------------------- pods


def test_pod_without_annotation_uses_default_fraction_of_summed_requests() -> None:
    bound = bound_pod(pod("p", requests=[{"cpu": "1", "memory": "1Gi"}, {"cpu": "500m", "memory": "1Gi"}]))
    assert bound is not None
    assert bound.cpu_cores == pytest.approx(1.5 * DEFAULT_USAGE_FRACTION)
    assert bound.memory_bytes == 2 * GI * DEFAULT_USAGE_FRACTION
    assert bound.annotation_error is None


def test_annotation_overrides_only_the_resources_it_names() -> None:
    bound = bound_pod(pod("p", usage="cpu=3", requests=[{"cpu": "1", "memory": "2Gi"}]))
    assert bound is not None
    assert (bound.cpu_cores, bound.memory_bytes) == (3.0, GI)


def test_malformed_annotation_falls_back_to_default_and_says_why() -> None:
    bound = bound_pod(pod("p", usage="cpu=two", requests=[{"cpu": "2"}]))
    assert bound is not None
    assert bound.cpu_cores == pytest.approx(2 * DEFAULT_USAGE_FRACTION)
    assert bound.annotation_error is not None and "two" in bound.annotation_error


def test_unbound_and_finished_pods_put_no_load() -> None:
    assert bound_pod(pod("p", node=None, usage="cpu=1")) is None
    assert bound_pod(pod("p", usage="cpu=1", phase="Pending")) is None  # bound, kubelet has not started it
    assert bound_pod(pod("p", usage="cpu=1", phase="Succeeded")) is None
    assert bound_pod(pod("p", usage="cpu=1", phase="Failed")) is None


def test_client_models_are_accepted_like_api_dicts() -> None:
    model = V1Pod(
        metadata=V1ObjectMeta(uid="u1", name="p", namespace="ns", annotations={USAGE_ANNOTATION: "memory=1Gi"}),
        spec=V1PodSpec(
            node_name="node-0001",
            containers=[V1Container(name="c", resources=V1ResourceRequirements(requests={"cpu": "2"}))],
        ),
        status=V1PodStatus(phase="Running"),
    )
    bound = bound_pod(model)
    assert bound is not None
    assert (bound.uid, bound.node, bound.cpu_cores, bound.memory_bytes) == ("u1", "node-0001", 1.0, GI)


# ---------------------------------------------------------------------------------------------- nodes


def test_fleet_has_stable_names_ips_and_cycles_instance_styles() -> None:
    fleet = make_fleet(4, instance_styles=("ip", "ip:port", "name"))
    assert [n.name for n in fleet] == ["node-0001", "node-0002", "node-0003", "node-0004"]
    assert [n.instance_label for n in fleet] == ["10.0.0.1", "10.0.0.2:9100", "node-0003", "10.0.0.4"]
    big = make_fleet(600)
    assert len({n.internal_ip for n in big}) == 600
    assert all(n.internal_ip.startswith("10.") for n in big)
    assert make_fleet(600) == big


def test_node_objects_are_ready_with_capacity_addresses_and_hostname_label() -> None:
    node = SimNode("node-0007", "10.0.0.7", 2.5, 8 * GI, labels={"zone": "a"})
    manifest = node_manifest(node)
    assert manifest["metadata"]["labels"] == {"zone": "a", "kubernetes.io/hostname": "node-0007"}
    status = node_status(node, T0)["status"]
    assert status["allocatable"] == {
        "cpu": "2500m",
        "memory": str(8 * GI),
        "pods": "110",
        "ephemeral-storage": "100Gi",
    }
    assert status["addresses"][0] == {"type": "InternalIP", "address": "10.0.0.7"}
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "True")]


def test_node_usage_is_base_plus_pods_over_capacity_clamped() -> None:
    state = one_node(cpu=4.0, mem=16 * GI)
    assert state.usage("node-0001") == pytest.approx((0.1, 0.2))
    state.on_pod(pod("a", usage="cpu=1,memory=4Gi"))
    assert state.usage("node-0001") == pytest.approx((0.35, 0.45))
    state.on_pod(pod("b", usage="cpu=8,memory=64Gi"))
    assert state.usage("node-0001") == (1.0, 1.0)
    state.remove_pod("b")
    state.on_pod(pod("a", usage="cpu=2"))  # modified: replaces, does not add
    assert state.usage("node-0001") == pytest.approx((0.6, 0.2))
    state.on_pod(pod("a", usage="cpu=2", phase="Succeeded"))
    assert state.usage("node-0001") == pytest.approx((0.1, 0.2))


def test_pods_on_nodes_outside_the_fleet_change_nothing() -> None:
    state = one_node()
    state.on_pod(pod("x", node="real-node", usage="cpu=1"))
    assert state.usage("node-0001") == pytest.approx((0.1, 0.2))


def test_resync_forgets_pods_deleted_while_not_watching() -> None:
    state = one_node()
    state.on_pod(pod("gone", usage="cpu=1"))
    state.on_pod(pod("kept", usage="cpu=1"))
    state.resync([pod("kept", usage="cpu=1"), pod("new", usage="cpu=2")])
    assert set(state.pods) == {"kept", "new"}
    assert state.usage("node-0001")[0] == pytest.approx(0.1 + 3 / 4)


# ---------------------------------------------------------------------------------------------- counters


def test_idle_rate_is_one_minus_cpu_usage_in_each_interval() -> None:
    state = one_node(cpu=4.0, base_cpu=0.1)
    state.advance(T0 + 10)
    assert state.cpu_seconds("node-0001") == pytest.approx((9.0, 1.0))
    state.on_pod(pod("a", usage="cpu=2"), now=T0 + 10)  # usage 0.6 from here on
    state.advance(T0 + 20)
    assert state.cpu_seconds("node-0001") == pytest.approx((13.0, 7.0))
    state.remove_pod("a", now=T0 + 30)  # the ten seconds before removal still count at 0.6
    assert state.cpu_seconds("node-0001") == pytest.approx((17.0, 13.0))


def test_counters_never_go_backwards_when_time_does() -> None:
    state = one_node()
    state.advance(T0 + 5)
    before = state.cpu_seconds("node-0001")
    state.advance(T0 + 1)
    assert state.cpu_seconds("node-0001") == before


@given(
    st.lists(
        st.tuples(st.floats(0, 30), st.sampled_from(["add", "remove", "tick"]), st.floats(0, 10)),
        max_size=30,
    )
)
def test_counters_are_monotonic_and_sum_to_elapsed_time(steps: list[tuple[float, str, float]]) -> None:
    state = one_node()
    now = T0
    previous = state.cpu_seconds("node-0001")
    for i, (dt, action, cpu) in enumerate(steps):
        now += dt
        if action == "add":
            state.on_pod(pod(f"p{i}", usage=f"cpu={cpu:.3f}"), now=now)
        elif action == "remove" and state.pods:
            state.remove_pod(next(iter(state.pods)), now=now)
        else:
            state.advance(now)
        current = state.cpu_seconds("node-0001")
        assert current[0] >= previous[0] and current[1] >= previous[1]
        previous = current
    state.advance(now)
    assert sum(state.cpu_seconds("node-0001")) == pytest.approx(now - T0)


# ---------------------------------------------------------------------------------------------- exposition


def test_exposition_has_node_exporter_series_with_read_time() -> None:
    state = FleetState(make_fleet(2, memory_bytes=10 * GI, base_mem_fraction=0.25), now=T0)
    text = render(state.snapshot(now=T0 + 2)).decode()
    series = {
        (s.name, tuple(sorted(s.labels.items()))): (s.value, s.timestamp)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    idle = series[("node_cpu_seconds_total", (("cpu", "0"), ("instance", "10.0.0.1"), ("mode", "idle")))]
    user = series[("node_cpu_seconds_total", (("cpu", "0"), ("instance", "10.0.0.2"), ("mode", "user")))]
    assert idle == pytest.approx((1.8, T0 + 2))
    assert user == pytest.approx((0.2, T0 + 2))
    assert series[("node_memory_MemTotal_bytes", (("instance", "10.0.0.1"),))][0] == 10 * GI
    assert series[("node_memory_MemAvailable_bytes", (("instance", "10.0.0.2"),))][0] == 7.5 * GI
    # node-exporter's uname and kube-state-metrics' CPU capacity, which the batch recording rules join on
    assert series[("node_uname_info", (("instance", "10.0.0.2"), ("nodename", "node-0002")))][0] == 1
    assert series[("kube_node_status_capacity", (("node", "node-0001"), ("resource", "cpu"), ("unit", "core")))][0] == 8
    assert len(series) == 12  # 2 nodes x (idle, user, available, total, uname, capacity)


def test_a_batch_pod_is_exported_with_its_batch_requests_as_kube_state_metrics_names_them() -> None:
    state = one_node()
    state.on_pod(pod("job", usage="cpu=1", requests=[{"crane.io/batch-cpu": "1000"}]), now=T0)
    state.on_pod(pod("web", usage="cpu=1", requests=[{"cpu": "1"}]), now=T0)
    text = render(state.snapshot(now=T0 + 1)).decode()
    requests = [
        (s.labels["pod"], s.labels["resource"], s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "kube_pod_container_resource_requests"
    ]
    assert requests == [("job", "crane_io_batch_cpu", 1000)]


def test_running_pods_export_cadvisor_series_that_follow_their_usage_annotation() -> None:
    state = one_node()
    state.on_pod(pod("a", usage="cpu=1,memory=1Gi", requests=[{"cpu": "2"}]), now=T0)
    state.on_pod(pod("b", phase="Pending", usage="cpu=3"), now=T0)
    state.on_pod(pod("a", usage="cpu=3,memory=2Gi", requests=[{"cpu": "2"}]), now=T0 + 10)  # kubectl annotate
    text = render(state.snapshot(now=T0 + 20)).decode()
    series = {
        (s.name, tuple(sorted(s.labels.items()))): (s.value, s.timestamp)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = (("container", "c0"), ("namespace", "ns"), ("node", "node-0001"), ("pod", "a"))
    # 10 s at 1 core, then 10 s at 3 cores; the pending pod exports nothing
    assert series[("container_cpu_usage_seconds_total", labels)] == pytest.approx((40.0, T0 + 20))
    assert series[("container_memory_working_set_bytes", labels)][0] == 2 * GI
    assert not [k for k in series if ("pod", "b") in k[1]]
    assert state.usage("node-0001")[0] == pytest.approx(0.1 + 3 / 4)
    state.remove_pod("a", now=T0 + 30)
    after = [f.name for f in text_string_to_metric_families(render(state.snapshot(now=T0 + 31)).decode()) if f.samples]
    assert "container_cpu_usage_seconds" not in after and state.pod_cpu_seconds("a") == 0


def test_every_node_lands_in_exactly_one_shard() -> None:
    names = [n.name for n in make_fleet(5000)]
    shards = [shard_of(n, 5) for n in names]
    assert set(shards) == {0, 1, 2, 3, 4}
    assert max(shards.count(i) for i in range(5)) < 1100  # roughly even: no shard is twice its share


def test_uneven_base_load_spreads_every_node_to_its_own_level_below_the_threshold() -> None:
    loads = base_loads("uneven", 10)
    cpus = sorted(cpu for cpu, _ in loads)
    assert len(set(cpus)) == 10
    assert cpus[0] == pytest.approx(0.10) and cpus[-1] == pytest.approx(0.55)
    assert all(mem == pytest.approx(cpu + 0.05) for cpu, mem in loads)
    assert [cpu for cpu, _ in loads] != cpus  # name order does not give the ranking away
    assert base_loads("uneven", 1) == [(0.10, 0.15)]
    assert base_loads("even", 3) == [(0.10, 0.15)] * 3


def test_make_fleet_takes_one_base_load_per_node() -> None:
    fleet = make_fleet(3, base_loads=[(0.1, 0.2), (0.3, 0.4), (0.5, 0.6)])
    assert [(n.base_cpu_fraction, n.base_mem_fraction) for n in fleet] == [(0.1, 0.2), (0.3, 0.4), (0.5, 0.6)]
    with pytest.raises(ValueError, match="base_loads has 2 entries for 3 nodes"):
        make_fleet(3, base_loads=[(0.1, 0.2), (0.3, 0.4)])


# ---------------------------------------------------------------------------------------------- nodes joining


def karpenter_node(name: str = "kwok-np-abc-1", **status: Any) -> dict[str, Any]:
    """A node as Karpenter's KWOK provider creates it: the instance type's size in labels, the launching pods'
    requests as its capacity."""
    labels = {"karpenter.kwok.sh/instance-cpu": "8", "karpenter.kwok.sh/instance-memory": "32Gi"}
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def test_a_node_created_by_the_autoscaler_takes_its_instance_types_size_and_exports_under_its_name() -> None:
    node = sim_node_of(karpenter_node(capacity={"cpu": "2", "memory": "2Gi"}), base=(0.1, 0.15))
    assert node is not None
    assert (node.cpu_cores, node.memory_bytes) == (8.0, 32 * GI)  # not the capacity (the launching requests)
    assert (node.base_cpu_fraction, node.base_mem_fraction, node.instance_label) == (0.1, 0.15, "kwok-np-abc-1")


def test_a_node_without_instance_labels_takes_its_capacity_then_allocatable_and_none_without_a_size() -> None:
    plain = {"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "4"}, "allocatable": {"memory": "8Gi"}}}
    node = sim_node_of(plain)
    assert node is not None and (node.cpu_cores, node.memory_bytes) == (4.0, 8 * GI)
    assert sim_node_of({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "4"}}}) is None
    assert sim_node_of({"metadata": {"name": "n", "labels": {"karpenter.kwok.sh/instance-cpu": "x"}}}) is None


def test_a_removed_node_leaves_the_exporter_with_its_pods_and_the_rest_keeps_counting() -> None:
    state = FleetState(make_fleet(2), now=T0)
    state.on_pod(pod("p", node="node-0002", usage="cpu=2"), now=T0)
    added = sim_node_of(karpenter_node())
    assert added is not None
    state.add_node(added, now=T0)
    state.remove_node("node-0002", now=T0 + 1)
    state.remove_node("never-there", now=T0 + 1)
    names = {s.nodename for s in state.snapshot(now=T0 + 2)}
    assert names == {"node-0001", "kwok-np-abc-1"}
    assert "p" not in state.pods
    text = render(state.snapshot(now=T0 + 3)).decode()
    instances = {
        s.labels["instance"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "node_cpu_seconds_total"
    }
    assert instances == {"10.0.0.1", "kwok-np-abc-1"}
