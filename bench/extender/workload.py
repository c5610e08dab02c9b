"""Node and pod objects shaped like a real cluster's, as kube-scheduler sends them to an extender.

A kubelet-managed node carries labels, conditions, addresses, node info and an image list; that, not the load
annotations, is most of the bytes an extender must parse without a node cache. The sizes here (about 8 KB per
node) are those of a typical worker node's JSON without managedFields.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.policy import default_policy

_STAMP = "2026-11-22T10:00:00Z"


def node(i: int, now: datetime, rng: random.Random) -> dict[str, Any]:
    name = f"node-{i:05d}"
    stamp = now - timedelta(seconds=rng.uniform(5, 170))
    hot = rng.random() < 0.1  # one node in ten above the 0.65 threshold
    annotations = {
        sync.name: encode_usage(rng.uniform(0.7, 0.95) if hot else rng.uniform(0.05, 0.6), stamp)
        for sync in default_policy().sync_policy
    }
    annotations["node_hot_value"] = encode_hot_value(rng.choice((0, 0, 0, 1)), stamp)
    annotations |= {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
    }
    resources = {
        "cpu": "32",
        "memory": "131892156Ki",
        "pods": "110",
        "ephemeral-storage": "101430960Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }
    allocatable = resources | {"cpu": "31800m", "memory": "129692156Ki", "ephemeral-storage": "93478772582"}
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"6f1c{i:08x}-0000-4000-8000-{i:012x}",
            "resourceVersion": str(100000 + i),
            "creationTimestamp": _STAMP,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "m6i.8xlarge",
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": f"eu-west-1{'abc'[i % 3]}",
                "node-role.kubernetes.io/worker": "",
                "nodepool": f"pool-{i % 4}",
            },
            "annotations": annotations,
        },
        "spec": {
            "podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24",
            "podCIDRs": [f"10.{i // 256 % 256}.{i % 256}.0/24"],
            "providerID": f"aws:///eu-west-1a/i-{i:017x}",
        },
        "status": {
            "capacity": resources,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": t,
                    "status": s,
                    "lastHeartbeatTime": _STAMP,
                    "lastTransitionTime": _STAMP,
                    "reason": r,
                    "message": m,
                }
                for t, s, r, m in (
                    (
                        "MemoryPressure",
                        "False",
                        "KubeletHasSufficientMemory",
                        "kubelet has sufficient memory available",
                    ),
                    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                )
            ],
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{i // 256 % 256}.{i % 256}"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{i:032x}",
                "systemUUID": f"ec2{i:05x}-0000-0000-0000-000000000000",
                "bootID": f"{i:08x}-1111-2222-3333-444444444444",
                "kernelVersion": "6.1.0-28-cloud-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.35.4",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {
                    "names": [
                        f"registry.example.com/team-{k % 7}/service-{k}@sha256:{(i * 31 + k):064x}",
                        f"registry.example.com/team-{k % 7}/service-{k}:v1.{k}.0",
                    ],
                    "sizeBytes": 50_000_000 + k * 1_000_003,
                }
                for k in range(25)
            ],
        },
    }


def pod(uid: int) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": f"web-7d4b9c-{uid:05x}",
            "namespace": "shop",
            "uid": f"pod-{uid:032x}",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d4b9c",
                    "uid": "rs-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [
                {
                    "name": "web",
                    "image": "registry.example.com/shop/web:v3",
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"cpu": "1", "memory": "2Gi"},
                    },
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                }
            ],
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def fleet(n: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    now = datetime.now(UTC)
    return [node(i, now, rng) for i in range(1, n + 1)]
