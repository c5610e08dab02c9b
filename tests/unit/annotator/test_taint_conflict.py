"""A load-taint write that meets a newer node (409, the resourceVersion precondition): a lift is read again and
retried at once (a hot node's taint must not outlive its heat by an evaluation for someone else's label change);
a set is not written from a re-read the plan never judged (the node may have opted out or been recreated): it is
judged again at the next evaluation, from the informer's newer copy."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import UTC, datetime
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from crane_annotator.matching import NodeAddresses
from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.nodes import NodeInfo
from crane_annotator.taints import LoadTaints
from crane_annotator.writer import Outcome
from crane_shared.annotations import encode_usage
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.loadtaintpolicy import TAINT_KEY
from crane_shared.policy import default_policy, dump_policy, parse_policy
from crane_shared.policyfile import PolicyFile

OURS: dict[str, object] = {"key": TAINT_KEY, "value": "cpu_usage_avg_5m", "effect": "NoSchedule"}


class Writer:
    """``NodePatcher.patch_taints``: records each write (node, taints, resourceVersion), answers ``outcomes``."""

    def __init__(self, *outcomes: Outcome) -> None:
        self.outcomes = list(outcomes)
        self.writes: list[tuple[str, list[dict[str, object]], str]] = []

    async def __call__(self, node: str, taints: list[dict[str, object]], version: str) -> Outcome:
        self.writes.append((node, taints, version))
        return self.outcomes.pop(0) if self.outcomes else "ok"


class Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.status, self.reason, self.headers = 200, "OK", dict[str, str]()
        self._data = json.dumps(body).encode()

    async def read(self) -> bytes:
        return self._data


class Core:
    """The node as the API server holds it now (``read_node``), counting the reads."""

    def __init__(self, taints: list[dict[str, object]], version: str) -> None:
        self.taints, self.version, self.reads = taints, version, 0

    async def read_node(self, name: str, **_: Any) -> Response:
        self.reads += 1
        meta = {"name": name, "uid": "u1", "resourceVersion": self.version}
        return Response({"metadata": meta, "spec": {"taints": self.taints}})


def taints_worker(
    cpu: float, taints: tuple[dict[str, object], ...], writer: Writer, core: Core
) -> tuple[LoadTaints, dict[str, NodeInfo]]:
    """The worker over one node ``n1`` (its informer copy at resourceVersion "1", in the returned mapping)."""
    document = yaml.safe_load(dump_policy(default_policy()))
    taint = {"hotRounds": 1, "coolRounds": 1, "minUntaintedNodes": 0, "thresholds": {"cpu_usage_avg_5m": 0.65}}
    document["spec"]["loadTaint"] = taint
    policy = parse_policy(yaml.safe_dump(document))
    sample = encode_usage(cpu, datetime.now(UTC).replace(microsecond=0))
    info = NodeInfo(
        NodeAddresses("n1", (), ()),
        {},
        {},
        texts={"cpu_usage_avg_5m": sample},
        taints=taints,
        uid="u1",
        resource_version="1",
    )
    informer = {"n1": info}
    worker = LoadTaints(
        PolicyFile(None, parse_policy, lambda: policy),
        DynamicArgs,
        lambda: informer,
        writer,
        AnnotatorMetrics(CollectorRegistry()),
        None,
        clock=time.time,
    )
    worker._core = core  # the API server's node, read after a conflict
    return worker, informer


async def test_a_set_that_meets_a_newer_node_is_judged_again_next_evaluation_not_rewritten_at_once() -> None:
    writer, core = Writer("conflict"), Core([], "2")
    worker, informer = taints_worker(0.95, (), writer, core)
    [(change, outcome)] = await worker.evaluate()
    assert (change.taint, outcome) == (True, "conflict")
    assert len(writer.writes) == 1 and core.reads == 0  # no write from a copy the plan did not judge
    informer["n1"] = dataclasses.replace(informer["n1"], resource_version="2")  # the watch brings the newer node
    [(change, outcome)] = await worker.evaluate()  # the next evaluation judges it: still hot, set
    assert (change.taint, outcome) == (True, "ok") and writer.writes[-1][1:] == ([OURS], "2")


async def test_a_lift_that_meets_a_newer_node_is_read_again_and_retried_at_once_keeping_the_other_taints() -> None:
    other: dict[str, object] = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    writer, core = Writer("conflict"), Core([other, OURS], "2")
    worker, _ = taints_worker(0.1, (OURS,), writer, core)
    [(change, outcome)] = await worker.evaluate()
    assert (change.taint, outcome) == (False, "ok") and core.reads == 1
    assert [(taints, version) for _, taints, version in writer.writes] == [([], "1"), ([other], "2")]
