"""The batch part of a round with fakes at its edges: annotations only for the nodes the round patches, status
writes only where the budget allows, and the policy file's ``spec.reclaim`` reloaded (or refused) between rounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import yaml
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from crane_annotator.batchround import BatchCapacity, reload_problems, status_patch
from crane_annotator.matching import NodeAddresses
from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.nodes import NodeInfo
from crane_annotator.pods import PodCache, node_pod
from crane_annotator.reclaim import Resources
from crane_annotator.writer import Outcome
from crane_shared.batch import (
    BATCH_CPU,
    BATCH_CPU_USAGE_KEY,
    POD_USAGE_KEY,
    WITHDRAW_REMOVE,
    batch_metric_key,
    decode_pod_usage,
    removed_annotations,
)
from crane_shared.policy import (
    DynamicSchedulerPolicy,
    PolicyError,
    default_policy,
    dump_policy,
    load_policy,
    parse_policy,
)
from crane_shared.policyfile import PolicyFile
from crane_shared.prometheus import QueryResult, Series
from crane_shared.reclaimpolicy import ReclaimPolicy, ResourceReclaim

GI = 1 << 30
NOW = 1_000_000.0


class Answers:
    """Prometheus answering the two per-pod queries (CPU rate first, then memory)."""

    def __init__(self, cpu: Mapping[str, float], memory: Mapping[str, float]) -> None:
        self.cpu, self.memory = cpu, memory

    async def query(self, promql: str) -> QueryResult:
        values = self.cpu if "rate(" in promql else self.memory
        series = [Series({"namespace": k.split("/")[0], "pod": k.split("/")[1]}, str(v)) for k, v in values.items()]
        return QueryResult(series, 1)


def info(
    name: str, batch: tuple[int, int] | None = None, override: str | None = None, keys: tuple[str, ...] = ()
) -> NodeInfo:
    cap = Resources(8, 32 * GI)
    return NodeInfo(NodeAddresses(name, (), ()), {}, {}, cap, cap, batch, override, batch is not None, keys)


def pod(name: str, node: str, *, batch: bool = False) -> dict[str, object]:
    resources = {"requests": {BATCH_CPU: "1000"}, "limits": {BATCH_CPU: "1000"}} if batch else {"requests": {}}
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": resources}]},
        "status": {"phase": "Running"},
    }


class Writes:
    def __init__(self) -> None:
        self.sent: dict[str, Mapping[str, object]] = {}
        self.log: list[tuple[str, Mapping[str, object]]] = []  # every patch, status and metadata, in order

    async def __call__(self, node: str, body: Mapping[str, object]) -> Outcome:
        self.sent[node] = body
        self.log.append((node, body))
        return "ok"

    async def metadata(self, node: str, body: Mapping[str, object]) -> Outcome:
        self.log.append((node, body))
        return "ok"


def capacity(
    nodes: dict[str, NodeInfo],
    policy: ReclaimPolicy | None = None,
    file: PolicyFile[DynamicSchedulerPolicy] | None = None,
) -> tuple[BatchCapacity, Writes]:
    pods = PodCache(client.ApiClient())
    pods._on_list([pod("web", "a"), pod("job", "a", batch=True)])
    writes = Writes()
    prometheus = Answers({"ns/web": 2.0, "ns/job": 1.0}, {"ns/web": 4 * GI, "ns/job": 2 * GI})
    clock = iter([NOW, NOW + 30, NOW + 60, NOW + 2000, NOW + 2001])
    batch = BatchCapacity(
        policy or ReclaimPolicy(),
        prometheus,
        lambda: nodes,
        pods,
        writes,
        AnnotatorMetrics(CollectorRegistry()),
        policy_file=file,
        clock=lambda: next(clock),
        patch_metadata=writes.metadata,
    )
    return batch, writes


WITHDRAWN_KEYS = (BATCH_CPU_USAGE_KEY, POD_USAGE_KEY, batch_metric_key("cpu_usage_avg_5m"))


def withdrawal(node: str, keys: tuple[str, ...] = WITHDRAWN_KEYS) -> list[tuple[str, Mapping[str, object]]]:
    """A loan taken back: 0, then removed from node status, then the batch annotations removed."""
    return [(node, status_patch(0, 0)), (node, WITHDRAW_REMOVE), (node, removed_annotations(list(keys)))]


async def test_a_round_annotates_the_nodes_it_patches_and_writes_status_within_the_budget() -> None:
    nodes = {"a": info("a"), "b": info("b", batch=(4000, 17 * GI))}
    batch, writes = capacity(nodes)
    assert batch.wants(["cpu_usage_avg_5m"]) and not batch.wants(["cpu_usage_max_avg_1h"])
    assert await batch.measure()
    # node usage: a 10 % system + 3 cores of pods; b 10 %
    batch.record({"cpu_usage_avg_5m": {"a": 3.8 / 8, "b": 0.1}, "mem_usage_avg_5m": {"a": 0.3, "b": 0.1}}, True, NOW)
    notes = batch.annotations(["a"], datetime.fromtimestamp(NOW, UTC))
    assert set(notes) == {"a"}  # b is not in this round's patches: nothing of its own
    assert notes["a"][BATCH_CPU_USAGE_KEY].startswith("0.12500,")
    assert set(decode_pod_usage(notes["a"][POD_USAGE_KEY]).pods) == {"ns/web", "ns/job"}
    report = await batch.publish()
    # a: 4.8 - 0.8 - 2 = 2 cores and 20.8 - max(9.6 - 6, 0) - 4 = 13.2 GiB, never published: written;
    # b: 4.0 cores as published (memory within 10 % of capacity): no write
    assert writes.sent == {"a": status_patch(2000, int(13.2 * GI))}
    assert report.written == ["a"] and report.why == {"ok": 2}


async def test_stale_inputs_withdraw_the_loan_to_zero_then_remove_it_with_its_annotations() -> None:
    nodes = {"b": info("b", batch=(4000, 17 * GI), keys=WITHDRAWN_KEYS)}
    batch, writes = capacity(nodes)
    await batch.measure()
    batch.record({"cpu_usage_avg_5m": {"b": 0.1}, "mem_usage_avg_5m": {"b": 0.1}}, True, NOW)
    assert (await batch.publish()).written == []  # NOW + 30: fresh, unchanged
    await batch.publish()  # NOW + 60
    report = await batch.publish()  # NOW + 2000: older than 15 min
    assert report.why == {"stale": 1} and writes.log == withdrawal("b")
    nodes["b"] = info("b")  # as the informer shows it now: nothing lent, no batch annotation
    await batch.publish()  # NOW + 2001: still stale, nothing left to withdraw
    assert writes.log == withdrawal("b")


def test_status_patch_sets_capacity_and_allocatable() -> None:
    assert status_patch(1500, 7) == {
        "status": {
            "capacity": {"crane.io/batch-cpu": "1500", "crane.io/batch-memory": "7"},
            "allocatable": {"crane.io/batch-cpu": "1500", "crane.io/batch-memory": "7"},
        }
    }
    assert node_pod(pod("x", "")) is None
    done = pod("x", "a")
    done["status"] = {"phase": "Succeeded"}
    assert node_pod(done) is None


def test_a_pods_start_is_read_so_a_young_batch_pod_counts_in_part() -> None:
    running = pod("x", "a")
    running["status"] = {"phase": "Running", "startTime": "2026-11-26T17:54:52Z"}
    found = node_pod(running)
    assert found is not None and found[1].started == datetime(2026, 11, 26, 17, 54, 52, tzinfo=UTC).timestamp()
    running["status"] = {"phase": "Running", "startTime": "soon"}
    found = node_pod(running)
    assert found is not None and found[1].started is None  # unreadable: its usage counts in full, as before


def _write(path: Path, reclaim: object) -> None:
    document = yaml.safe_load(dump_policy(default_policy()))
    if reclaim is not None:
        document["spec"]["reclaim"] = reclaim
    path.write_text(yaml.safe_dump(document))


async def test_a_changed_reclaim_section_is_applied_and_a_bad_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    _write(path, {})
    synced = default_policy().metrics()

    def load(source: str) -> DynamicSchedulerPolicy:  # as the annotator wires it
        policy = load_policy(source)
        if problems := reload_problems(policy, synced):
            raise PolicyError(source, problems)
        return policy

    file = PolicyFile(str(path), load, default_policy)
    batch, _ = capacity({}, file=file)
    assert not batch.reload()
    _write(path, {"cpu": {"reclaimThreshold": 0.5}, "maxAge": "1m"})
    assert batch.reload() and batch.policy.cpu.reclaim_threshold == 0.5
    _write(path, {"cpu": {"reclaimThreshold": 5}})  # invalid: refused, the running section kept
    assert not batch.reload()
    assert batch.policy.cpu.reclaim_threshold == 0.5 and batch.lending
    assert reload_problems(parse_policy(dump_policy(default_policy())), synced) == []  # removing it is applied
    elsewhere = dataclasses.replace(ReclaimPolicy(), cpu=ResourceReclaim("usage", 0.6, "cpu_usage_max_avg_1h"))
    policy = dataclasses.replace(default_policy(), reclaim=elsewhere)
    assert reload_problems(policy, ["cpu_usage_avg_5m", "mem_usage_avg_5m"]) == [
        'spec.reclaim.cpu.nodeMetric: "cpu_usage_max_avg_1h" is not synced by this process (restart to change '
        "syncPolicy)"
    ]


async def test_the_node_metrics_batch_share_from_the_same_round_splits_system_from_batch_usage() -> None:
    batch, _ = capacity({"a": info("a")})
    await batch.measure()
    cpu, mem = batch_metric_key("cpu_usage_avg_5m"), batch_metric_key("mem_usage_avg_5m")
    # the batch pod (1 core, 2 GiB) just started: the averages hold none of it yet, nor does its share (0)
    usage = {"cpu_usage_avg_5m": {"a": 2.8 / 8}, "mem_usage_avg_5m": {"a": 7.2 / 32}}
    batch.record({**usage, cpu: {"a": 0.0}, mem: {"a": 0.0}}, True, NOW)
    assert batch.inputs("a", info("a")).batch_share == {"cpu": 0.0, "memory": 0.0}
    # a later round without shares (their query failed): the older shares are not paired with the newer metric
    batch.record(usage, True, NOW + 5)
    assert batch.inputs("a", info("a")).batch_share == {}


async def test_removing_spec_reclaim_withdraws_every_loan_and_measures_nothing_more(tmp_path: Path) -> None:
    """The loan outlives its lender no more: spec.reclaim removed from the policy file, every node that lends (or
    carries batch annotations) gets 0, then nothing, in node status and loses its batch annotations; the rounds
    stop measuring pods and querying shares. Put back, the next round lends again."""
    path = tmp_path / "policy.yaml"
    _write(path, {})
    file = PolicyFile(str(path), load_policy, default_policy)
    nodes = {
        "a": info("a", batch=(2000, 13 * GI), keys=WITHDRAWN_KEYS),
        "b": info("b", keys=(POD_USAGE_KEY,)),
        "c": info("c"),  # never lent: untouched
    }
    batch, writes = capacity(nodes, file=file)
    assert not batch.reload()
    _write(path, None)
    assert batch.reload() and not batch.lending
    assert not batch.wants(["cpu_usage_avg_5m"]) and batch.shares_of(["cpu_usage_avg_5m"]) == {}
    report = await batch.publish()
    assert sorted(report.written) == ["a", "b"] and report.failed == []
    assert sorted(writes.log, key=lambda w: w[0]) == [*withdrawal("a"), ("b", removed_annotations([POD_USAGE_KEY]))]
    await batch.publish()  # the informer has not caught up yet: not withdrawn twice
    assert len(writes.log) == 4
    _write(path, {})
    assert batch.reload() and batch.lending and batch.wants(["cpu_usage_avg_5m"])
