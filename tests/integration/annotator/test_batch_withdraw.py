"""``cranectl withdraw-batch`` on the real API server, as the account of the chart's pre-delete hook (its RBAC
rendered from the chart with ``spec.reclaim``): a loan left on a node (``crane.io/batch-*`` in node status, the
batch annotations) is taken back; other resources and annotations stay; nodes without a loan are not touched."""

from __future__ import annotations

import asyncio
import sys
import uuid

import pytest
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.rbac import DEFAULT_NAMESPACE, account_token, chart_prefix, service_identity
from crane_shared.batch import (
    BATCH_CPU,
    BATCH_CPU_USAGE_KEY,
    BATCH_MEMORY,
    POD_USAGE_KEY,
    batch_metric_key,
    loan_status,
)

pytestmark = pytest.mark.integration


async def test_cranectl_withdraw_batch_takes_every_loan_back_as_the_uninstall_hook(
    cluster: LocalCluster, kube: client.ApiClient
) -> None:
    await service_identity(cluster, "annotator")  # the chart's RBAC, hook account included, in the namespace
    account = f"{chart_prefix(DEFAULT_NAMESPACE)}-uninstall"
    token = await account_token(kube, DEFAULT_NAMESPACE, account)
    kubeconfig = cluster.write_kubeconfig(
        cluster.run_dir / "kubeconfigs" / f"{account}.yaml", cluster.kubeconfig_dict(token, account)
    )
    core = client.CoreV1Api(kube)
    label = uuid.uuid4().hex[:8]
    lender, plain = f"wd-{label}-lender", f"wd-{label}-plain"
    notes = {
        BATCH_CPU_USAGE_KEY: "0.10000,2026-11-26T10:00:00+00:00",
        POD_USAGE_KEY: '{"t":"2026-11-26T10:00:00+00:00","p":{}}',
        batch_metric_key("cpu_usage_avg_5m"): "0.10000,2026-11-26T10:00:00+00:00",
        "cpu_usage_avg_5m": "0.30000,2026-11-26T10:00:00+00:00",
    }
    for name in (lender, plain):
        await core.create_node({"metadata": {"name": name, "annotations": notes if name == lender else {}}})
        status = loan_status(2000, 4 << 30) if name == lender else {"status": {}}
        status["status"]["capacity"] = {**status["status"].get("capacity", {}), "cpu": "8", "memory": "32Gi"}
        await core.patch_node_status(name, status, _content_type="application/merge-patch+json")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cranectl",
            "withdraw-batch",
            "--kubeconfig",
            str(kubeconfig),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        lines = [line for line in out.decode().splitlines() if line.startswith(f"wd-{label}")]
        assert lines == [  # the quantities as the API server canonicalises them
            f"{lender}: crane.io/batch-cpu=2k crane.io/batch-memory=4294967296 set to 0, then removed; annotations "
            "removed: batch.crane.io/cpu_usage_avg_5m, crane.io/batch-cpu-usage, crane.io/pod-usage"
        ]
        node = await core.read_node(lender)
        for section in (node.status.capacity, node.status.allocatable or {}):
            assert BATCH_CPU not in section and BATCH_MEMORY not in section
        assert node.status.capacity["cpu"] == "8"  # the node's own resources stay
        assert node.metadata.annotations == {"cpu_usage_avg_5m": notes["cpu_usage_avg_5m"]}
    finally:
        for name in (lender, plain):
            await core.delete_node(name)
