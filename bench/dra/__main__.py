"""``python -m bench.dra``: scheduler_perf's SchedulingWithResourceClaimTemplate (or, with ``--steady-state``,
SteadyStateClusterResourceClaimTemplate), crane-scheduler side by side with kube-scheduler on one API server.

As scheduler_perf's workload (``test/integration/scheduler_perf/dra/performance-config.yaml``, pinned release):
N nodes (4 cpu / 32Gi / 110 pods), each with a ResourceSlice of driver ``test-driver.cdi.k8s.io`` holding
``--claims-per-node`` devices, the DeviceClass ``test-class`` selecting the driver, a ResourceClaimTemplate asking
for one device of the class in each namespace, init pods and measured pods each claiming one device through the
template (``pod-with-claim-template.yaml``). kube-controller-manager runs the resourceclaim controller alone
(it makes the pods' claims from the template; there is no kubelet for the node lifecycle controller to watch).

Differences, for a fair comparison: the init pods are placed by the benchmark, not by the scheduler under test
(bound round-robin, each with its own claim allocated to a device of its node and reserved for it), so both
contenders start from the same occupied devices; the measured pods are created pending and the scheduler starts
only once the controller has made every pod's claim. Throughput = pods / (last bind - first bind), as
``bench.scheduler``; both schedulers with the same client QPS/burst, one after the other, every pod and claim
deleted between them.

``--steady-state`` is scheduler_perf's ``createPodsSteadily`` as the pinned release (1.37) has it: ``--batch`` (10)
pods claiming a device through the template are created; each pod seen bound is deleted (grace 0) and then one new
pod created in its place (each replacement its own task: ``SteadyPods._replace``), for ``--duration`` seconds from
the first bind, so ``--batch`` pods are always on their way. Throughput = pods bound / (last bind - first bind): the
loop's speed, the claim controller's latency included, as kube's; the median pod's round trip is printed in parts
(the controller's claim, then the pod's status naming it, then the bind, then the benchmark's deletion and the next
pod's creation), to tell which of them paces the loop. ``--steady-batches``: 1.35's version instead (each batch
bound whole, then deleted together and the next batch created; the round trip then is a batch's).
Its workloads: empty_500nodes (``--init-pods 0``, kube's threshold 64), half_500nodes (``--init-pods 2500``: 70,
60 with queueing hints), full_500nodes (``--init-pods 4990``: 60).

Kubernetes 1.37's scheduler_perf adds (``--workload``):

- ``extended-resource`` (``dra/extendedresource``, ExtendedResource): ``--classes`` DeviceClasses ``test-class-<i>``
  (with ``--implicit``, none names an extended resource: pods ask for ``deviceclass.resource.kubernetes.io/
  test-class-<i>``; else each names ``example.com/gpu-<i>``), every node a slice of 10 devices with the template's
  attributes (``resourceslice-basic-devices.yaml``), pod i asking for one of resource ``i mod classes`` in its
  resources; the init pods placed by the benchmark, each with the claim the scheduler would have made for it
  (annotated, owned by the pod, allocated and reserved). No claim controller: the scheduler makes the claims.
  Explicit_25classes_5000pods_500nodes threshold 120, Explicit_50classes 130, Implicit_25classes 130.
- ``partitionable`` and ``partitionable-backtracking`` (``dra/partitionabledevices``): every node a pool of a counter
  slice and a device slice (2 devices sharing 4 counters, or 8 devices sharing 8 cpu counters and 70Gi of memory),
  ``--init-claims`` claims allocated (not reserved) one per node from the first node on, measured pods claiming 2
  (backtracking: 7) devices through a template, steady state (``--steady-state``): empty_500nodes (0 init claims),
  half_500nodes (250), full_500nodes (490). No thresholds in 1.37's config.

    .venv/bin/python -m bench.dra                                    # scheduler_perf's 5000pods_500nodes
    .venv/bin/python -m bench.dra --nodes 100 --claims-per-node 20 --init-pods 1000 --pods 1000   # 2000pods_100nodes
    .venv/bin/python -m bench.dra --steady-state --init-pods 0       # SteadyState...ClaimTemplate/empty_500nodes
    .venv/bin/python -m bench.dra --workload extended-resource --classes 25   # Explicit_25classes_5000pods_500nodes
    .venv/bin/python -m bench.dra --workload partitionable --steady-state --init-claims 250   # half_500nodes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from kubernetes_asyncio import client

from bench.scheduler import __main__ as base
from bench.scheduler import workloads
from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_shared.informer import EventType, Informer
from crane_shared.kube import api_client_from_dict, raw_json

DRIVER = "test-driver.cdi.k8s.io"
CLASS = "test-class"
TEMPLATE = "test-claim-template"
TIMEOUT = 120.0


def device_class() -> dict[str, Any]:
    selector = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    return {"metadata": {"name": CLASS}, "spec": {"selectors": [selector]}}


def node_slice(node: str, devices: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"instance-{i}"} for i in range(devices)],
        },
    }


def claim_spec(count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": CLASS}
    if count != 1:
        exactly["count"] = count
    return {"devices": {"requests": [{"name": "req-0", "exactly": exactly}]}}


# ---------------------------------------------------------------------------------------------- 1.37's workloads

EXTENDED_DEVICES = 10  # resourceslice-basic-devices.yaml's numDevices in the ExtendedResource workload
CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def basic_devices(n: int, pci_roots: int = 2) -> list[dict[str, Any]]:
    """resourceslice-basic-devices.yaml's devices (an Intel GPU's attributes)."""
    out = []
    for i in range(n):
        root = i % pci_roots
        attributes = {
            "driver": {"string": "xe"},
            "driverVersion": {"version": "1.2.3"},
            "resource.k8s.io/pciRoot": {"string": str(root)},
            "family": {"string": "Arc Pro B-Series"},
            "health": {"string": "Healthy"},
            "model": {"string": "B60"},
            "pciAddress": {"string": f"0000:0{i}:00.0"},
            "pciId": {"string": "0xe211"},
            "pciRoot": {"string": f"0{root}"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:0{i}:00.0"},
            "resource.kubernetes.io/pciRoot": {"string": f"pci0000:0{root}"},
            "sriov": {"bool": True},
            "type": {"string": "gpu"},
        }
        out.append(
            {
                "name": f"basic-device-{i}",
                "attributes": attributes,
                "capacity": {"memory": {"value": "24480Mi"}, "millicores": {"value": "1k"}},
            }
        )
    return out


def extended_class(i: int, implicit: bool) -> dict[str, Any]:
    """deviceclass-extended-resource.yaml."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}
    if not implicit:
        spec["extendedResourceName"] = f"example.com/gpu-{i}"
    return {"metadata": {"name": f"{CLASS}-{i}"}, "spec": spec}


def extended_resource(i: int, classes: int, implicit: bool) -> str:
    """pod-with-extended-resource.yaml's resource of pod ``i``."""
    base_name = f"deviceclass.resource.kubernetes.io/{CLASS}" if implicit else "example.com/gpu"
    return f"{base_name}-{i % classes}"


def extended_pod(name: str, scheduler: str, resource: str, node: str | None = None) -> dict[str, Any]:
    container = {
        "name": "pause",
        "image": "registry.k8s.io/pause:3.9",
        "resources": {"requests": {resource: "1"}, "limits": {resource: "1"}},
    }
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [container]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


async def extended_init_pods(
    api: client.ApiClient, namespace: str, n: int, nodes: int, args: argparse.Namespace
) -> None:
    """``n`` pods bound round-robin, each with the claim the scheduler makes for an extended resource (annotated,
    owned by the pod, its one request ``container-0-request-0`` allocated to the next free device and reserved)."""
    v1, resource = client.CoreV1Api(api), client.ResourceV1Api(api)

    async def one(i: int) -> None:
        node, name = f"node-{i % nodes:05d}", f"init-{i:05d}"
        wanted = extended_resource(i, args.classes, args.implicit)
        pod = await raw_json(
            v1.create_namespaced_pod(namespace, extended_pod(name, "nobody", wanted, node), _preload_content=False)
        )
        request = {"deviceClassName": f"{CLASS}-{i % args.classes}", "allocationMode": "ExactCount", "count": 1}
        claim = {
            "metadata": {
                "name": f"{name}-extended-resources",
                "annotations": {CLAIM_ANNOTATION: "true"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"], "controller": True}
                ],
            },
            "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": request}]}},
        }
        created = await raw_json(resource.create_namespaced_resource_claim(namespace, claim, _preload_content=False))
        selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        result = {
            "request": "container-0-request-0",
            "driver": DRIVER,
            "pool": node,
            "device": f"basic-device-{i // nodes}",
        }
        created["status"] = {
            "allocation": {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [selector]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}],
        }
        resp = await resource.replace_namespaced_resource_claim_status(
            created["metadata"]["name"], namespace, created, _preload_content=False
        )
        resp.release()

    await base.gather_limited([one(i) for i in range(n)], 100)


def partition_slices(node: str, backtracking: bool) -> list[dict[str, Any]]:
    """resourceslice-partitionable-(backtracking-)countersets.yaml and -devices.yaml."""
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    if backtracking:
        sets = [
            {"name": "counter-set-for-cpu", "counters": {f"cpu{k}": {"value": "1"} for k in range(1, 9)}},
            {"name": "counter-set-for-mem", "counters": {"mem": {"value": "70Gi"}}},
        ]
        devices = [
            {
                "name": f"device-{k}",
                "consumesCounters": [
                    {"counterSet": "counter-set-for-cpu", "counters": {f"cpu{k}": {"value": "1"}}},
                    {"counterSet": "counter-set-for-mem", "counters": {"mem": {"value": "20Gi" if k == 1 else "10Gi"}}},
                ],
            }
            for k in range(1, 9)
        ]
    else:
        sets = [{"name": "counter-set", "counters": {f"counter{k}": {"value": "1"} for k in range(1, 5)}}]
        devices = [
            {
                "name": f"device-{d}",
                "consumesCounters": [
                    {
                        "counterSet": "counter-set",
                        "counters": {f"counter{c}": {"value": "1"} for c in (2 * d - 1, 2 * d)},
                    }
                ],
            }
            for d in (1, 2)
        ]
    spec = {"driver": DRIVER, "nodeName": node, "pool": pool}
    return [
        {"metadata": {"name": f"{node}-countersets"}, "spec": {**spec, "sharedCounters": sets}},
        {"metadata": {"name": f"{node}-devices"}, "spec": {**spec, "devices": devices}},
    ]


async def allocated_claims(api: client.ApiClient, namespace: str, n: int, backtracking: bool) -> None:
    """scheduler_perf's ``allocResourceClaims`` of resourceclaim-partitionable(-backtracking).yaml: claim i allocated
    (not reserved) on node i, to the devices kube's allocator picks there (device-1 and -2; backtracking: 2..8)."""
    resource = client.ResourceV1Api(api)
    count = 7 if backtracking else 2
    names = [f"device-{k}" for k in (range(2, 9) if backtracking else (1, 2))]

    async def one(i: int) -> None:
        node, name = f"node-{i:05d}", f"test-claim-{i}"
        claim = {"metadata": {"name": name}, "spec": claim_spec(count)}
        created = await raw_json(resource.create_namespaced_resource_claim(namespace, claim, _preload_content=False))
        selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        results = [{"request": "req-0", "driver": DRIVER, "pool": node, "device": d} for d in names]
        created["status"] = {
            "allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [selector]}}
        }
        resp = await resource.replace_namespaced_resource_claim_status(name, namespace, created, _preload_content=False)
        resp.release()

    await base.gather_limited([one(i) for i in range(n)], 100)


def pod_body(name: str, scheduler: str, claim: dict[str, str], node: str | None = None) -> dict[str, Any]:
    """scheduler_perf's pod-with-claim-template.yaml (``claim``: the pod's resourceClaims entry's source)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {"name": "pause", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "resource"}]}}
        ],
        "resourceClaims": [{"name": "resource", **claim}],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


async def publish(api: client.ApiClient, nodes: int, per_node: int, args: argparse.Namespace | None = None) -> None:
    resource = client.ResourceV1Api(api)
    workload = getattr(args, "workload", "claim-template")
    if workload == "extended-resource":
        assert args is not None
        classes = [extended_class(i, args.implicit) for i in range(args.classes)]
    else:
        classes = [device_class()]
    for body in classes:
        (await resource.create_device_class(body, _preload_content=False)).release()

    def slices(node: str) -> list[dict[str, Any]]:
        if workload == "extended-resource":
            spec = {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            }
            return [{"metadata": {"name": f"{node}-{DRIVER}"}, "spec": {**spec, "devices": basic_devices(per_node)}}]
        if workload.startswith("partitionable"):
            return partition_slices(node, workload.endswith("backtracking"))
        return [node_slice(node, per_node)]

    async def one(i: int) -> None:
        for body in slices(f"node-{i:05d}"):
            resp = await resource.create_resource_slice(body, _preload_content=False)
            resp.release()

    await base.gather_limited([one(i) for i in range(nodes)], 100)


async def init_pods(api: client.ApiClient, namespace: str, n: int, nodes: int) -> None:
    """``n`` pods bound round-robin, each with its own claim allocated to the next free device of its node and
    reserved for it: what the scheduler under test finds already placed."""
    v1, resource = client.CoreV1Api(api), client.ResourceV1Api(api)

    async def one(i: int) -> None:
        node, name = f"node-{i % nodes:05d}", f"init-{i:05d}"
        claim = {"metadata": {"name": name}, "spec": claim_spec()}
        created = await raw_json(resource.create_namespaced_resource_claim(namespace, claim, _preload_content=False))
        body = pod_body(name, "nobody", {"resourceClaimName": name}, node)
        pod = await raw_json(v1.create_namespaced_pod(namespace, body, _preload_content=False))
        selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        result = {"request": "req-0", "driver": DRIVER, "pool": node, "device": f"instance-{i // nodes}"}
        created["status"] = {
            "allocation": {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [selector]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}],
        }
        resp = await resource.replace_namespaced_resource_claim_status(name, namespace, created, _preload_content=False)
        resp.release()

    await base.gather_limited([one(i) for i in range(n)], 100)


async def claims_made(api: client.ApiClient, namespace: str, n: int) -> None:
    """Until the resourceclaim controller has made all ``n`` pods' claims and recorded them in the pods' status."""
    v1 = client.CoreV1Api(api)
    deadline = time.monotonic() + max(TIMEOUT, n / 10)
    while True:
        pods = (await raw_json(v1.list_namespaced_pod(namespace, _preload_content=False)))["items"]
        done = sum(1 for p in pods if p.get("status", {}).get("resourceClaimStatuses"))
        if done >= n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{namespace}: the resourceclaim controller made {done} of {n} pods' claims")
        await asyncio.sleep(1.0)


class Steady:
    """scheduler_perf's ``createPodsSteadily`` over one namespace (see the module's docstring): ``run`` creates
    the first batch, then replaces each batch once it is bound, until ``duration`` after the first bind; ``stop``
    is set then (``bench.scheduler.measure`` ends the run on it).

    ``phases``: per batch, where its round trip went, as this process's watches see it: from the creation of its
    pods to the resourceclaim controller's last claim for them (``claims``), from there to the last of their
    statuses naming the claims (``recorded``: the controller again; a pod is schedulable only then), from there to
    the last bind (``scheduler``: the scheduler's reaction to the pods' statuses, its decisions, claim writes and
    binds), and from the last bind to the next batch's pods created (``bench``: the deletion and creation)."""

    def __init__(
        self, api: client.ApiClient, namespace: str, scheduler: str, batch: int, duration: float, template: str
    ) -> None:
        self.api, self.namespace, self.scheduler = api, namespace, scheduler
        self.batch, self.duration, self.template = batch, duration, template
        self.stop = asyncio.Event()
        self.generation = 0
        self.bound: set[str] = set()  # names of the current batch's pods seen bound
        self.claimed: set[str] = set()  # names of the claims made for the current batch's pods
        self.recorded: set[str] = set()  # names of the current batch's pods whose status names their claims
        self.changed = asyncio.Event()
        self.marks: dict[str, float] = {}  # the current batch's created / claims / recorded / bound times
        self.phases: list[dict[str, float]] = []
        core = client.CoreV1Api(api)
        resource = client.ResourceV1Api(api)

        async def list_fn(**kw: Any) -> Any:
            return await core.list_namespaced_pod(namespace, **kw)

        async def list_claims(**kw: Any) -> Any:
            return await resource.list_namespaced_resource_claim(namespace, **kw)

        self.informer = Informer("bench-steady-pods", list_fn, self.seen)
        self.claim_informer = Informer("bench-steady-claims", list_claims, self.claim_seen)

    def seen(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED" or not name.startswith(self.prefix):
            return
        if (obj.get("status") or {}).get("resourceClaimStatuses"):
            self.recorded.add(name)
            if len(self.recorded) == self.batch:
                self.marks.setdefault("recorded", time.monotonic())
        if obj["spec"].get("nodeName"):
            self.bound.add(name)
            if len(self.bound) == self.batch:
                self.marks.setdefault("bound", time.monotonic())
            self.changed.set()

    def claim_seen(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        name = obj["metadata"]["name"]  # the controller's <pod>-<pod claim>-<suffix>
        if kind == "ADDED" and name.startswith(self.prefix):
            self.claimed.add(name)
            if len(self.claimed) == self.batch:
                self.marks.setdefault("claims", time.monotonic())

    def phase_summary(self) -> dict[str, float]:
        """Median seconds per batch of each phase (see the class docstring), over the batches seen whole."""
        out: dict[str, float] = {"batches": float(len(self.phases))}
        for phase in ("claims", "recorded", "scheduler", "bench"):
            values = sorted(p[phase] for p in self.phases if phase in p)
            if values:
                out[phase] = values[len(values) // 2]
        return out

    def _next_marks(self) -> None:
        """Close the current batch's phases (at the next batch's creation) and start the next one's."""
        now = time.monotonic()
        m = self.marks
        if self.generation >= 2 and {"created", "claims", "recorded", "bound"} <= m.keys():  # not the first
            recorded = max(m["recorded"], m["claims"])  # two watches: the statuses may be seen first
            self.phases.append(
                {
                    "claims": m["claims"] - m["created"],
                    "recorded": recorded - m["claims"],
                    "scheduler": m["bound"] - recorded,
                    "bench": now - m["bound"],
                }
            )
        self.marks = {"created": now}

    @property
    def prefix(self) -> str:
        return f"pod-{self.generation:04d}-"

    async def create_pods(self, names: list[str]) -> None:
        """Pods of these names, each claiming a device through the template, created concurrently."""
        v1 = client.CoreV1Api(self.api)
        claim = {"resourceClaimTemplateName": self.template}

        async def one(name: str) -> None:
            body = pod_body(name, self.scheduler, claim)
            (await v1.create_namespaced_pod(self.namespace, body, _preload_content=False)).release()

        await asyncio.gather(*(one(name) for name in names))

    async def create_batch(self) -> None:
        self._next_marks()
        await self.create_pods([f"{self.prefix}{i:03d}" for i in range(self.batch)])

    async def run(self) -> None:
        stopping = asyncio.Event()
        watcher = asyncio.create_task(self.informer.run(stopping))
        claim_watcher = asyncio.create_task(self.claim_informer.run(stopping))
        v1 = client.CoreV1Api(self.api)
        try:
            await self.informer.synced.wait()
            await self.claim_informer.synced.wait()
            first: float | None = None
            while True:
                await self.changed.wait()
                self.changed.clear()
                first = first if first is not None else time.monotonic()
                if len(self.bound) < self.batch:
                    continue
                if time.monotonic() - first >= self.duration:
                    return
                resp = await v1.delete_collection_namespaced_pod(
                    self.namespace, grace_period_seconds=0, _preload_content=False
                )
                resp.release()
                self.generation += 1
                self.bound, self.claimed, self.recorded = set(), set(), set()
                await self.create_batch()
        finally:
            self.stop.set()
            stopping.set()
            watcher.cancel()
            claim_watcher.cancel()


class SteadyPods(Steady):
    """1.37's ``createPodsSteadily``: ``batch`` pods on their way at all times; each pod seen bound is deleted and
    one new pod created, in that order (``_replace``). ``phases`` are per pod: from its creation to its
    claim (``claims``), to its status naming the claim (``recorded``), to its bind (``scheduler``), and from its
    bind to its replacement's creation (``bench``)."""

    def __init__(
        self, api: client.ApiClient, namespace: str, scheduler: str, batch: int, duration: float, template: str
    ) -> None:
        super().__init__(api, namespace, scheduler, batch, duration, template)
        self.created = 0  # pods created so far: the next one is pod-<created>
        self.pods: dict[str, dict[str, float]] = {}  # per pod: created / claims / recorded / bound / next times
        self.to_replace: asyncio.Queue[str] = asyncio.Queue()

    def seen(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        marks = self.pods.get(obj["metadata"]["name"])
        if kind == "DELETED" or marks is None:
            return
        if (obj.get("status") or {}).get("resourceClaimStatuses"):
            marks.setdefault("recorded", time.monotonic())
        if obj["spec"].get("nodeName") and "bound" not in marks:
            marks["bound"] = time.monotonic()
            self.to_replace.put_nowait(obj["metadata"]["name"])

    def claim_seen(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        marks = self.pods.get(obj["metadata"]["name"][: len(self._name(0))])  # the controller's <pod>-<claim>-<id>
        if kind == "ADDED" and marks is not None:
            marks.setdefault("claims", time.monotonic())

    @staticmethod
    def _name(i: int) -> str:
        return f"pod-{i:06d}"

    def phase_summary(self) -> dict[str, float]:
        for m in self.pods.values():
            if {"created", "claims", "recorded", "bound", "next"} <= m.keys():
                recorded = max(m["recorded"], m["claims"])  # two watches: the status may be seen first
                self.phases.append(
                    {
                        "claims": m["claims"] - m["created"],
                        "recorded": recorded - m["claims"],
                        "scheduler": m["bound"] - recorded,
                        "bench": m["next"] - m["bound"],
                    }
                )
        self.pods.clear()
        return super().phase_summary()

    async def create(self, n: int) -> None:
        names = [self._name(self.created + i) for i in range(n)]
        self.created += n
        for name in names:
            self.pods[name] = {"created": time.monotonic()}
        await self.create_pods(names)

    async def create_batch(self) -> None:
        await self.create(self.batch)

    async def _replace(self, v1: client.CoreV1Api, name: str) -> None:
        """Delete a bound pod, then create the next one. Each bound pod's replacement is its own task: scheduler_perf
        does them one after the other in one loop, but its Go client's calls take a fraction of this benchmark's
        (Python's client on the scheduler's two cores), and one loop here held both schedulers at its own pace
        (~16 ms a pod: 60 pods/s). Still ``batch`` pods on their way at most: a pod is created only for one bound."""
        resp = await v1.delete_namespaced_pod(
            name, self.namespace, grace_period_seconds=0, propagation_policy="Background", _preload_content=False
        )
        resp.release()
        await self.create(1)
        self.pods[name]["next"] = time.monotonic()

    async def run(self) -> None:
        stopping = asyncio.Event()
        watcher = asyncio.create_task(self.informer.run(stopping))
        claim_watcher = asyncio.create_task(self.claim_informer.run(stopping))
        v1 = client.CoreV1Api(self.api)
        replacing: set[asyncio.Task[None]] = set()
        try:
            await self.informer.synced.wait()
            await self.claim_informer.synced.wait()
            first: float | None = None
            while True:
                name = await self.to_replace.get()
                first = first if first is not None else time.monotonic()
                if time.monotonic() - first >= self.duration:
                    return
                task = asyncio.create_task(self._replace(v1, name))
                replacing.add(task)
                task.add_done_callback(replacing.discard)
        finally:
            for task in replacing:  # no pod is created after the run (its scheduler is stopped then)
                task.cancel()
            self.stop.set()
            stopping.set()
            watcher.cancel()
            claim_watcher.cancel()


async def doubled(api: client.ApiClient, namespaces: list[str]) -> tuple[int, int]:
    """(claims allocated, devices allocated to more than one claim) over ``namespaces``: the run's audit."""
    resource = client.ResourceV1Api(api)
    seen: dict[tuple[str, str], int] = {}
    claims = 0
    for ns in namespaces:
        for c in (await raw_json(resource.list_namespaced_resource_claim(ns, _preload_content=False)))["items"]:
            results = ((c.get("status", {}).get("allocation") or {}).get("devices") or {}).get("results") or []
            claims += bool(results)
            for r in results:
                seen[(r["pool"], r["device"])] = seen.get((r["pool"], r["device"]), 0) + 1
    return claims, sum(1 for n in seen.values() if n > 1)


async def cleared(api: client.ApiClient, namespaces: list[str]) -> None:
    """Delete a run's pods and claims; the next run starts from the same free devices."""
    resource = client.ResourceV1Api(api)
    for ns in namespaces:
        await base.delete_pods(api, ns)
    deadline = time.monotonic() + TIMEOUT * 5
    while True:  # the claims the scheduler allocated keep a finalizer until the controller sees their pod gone
        left = 0
        for ns in namespaces:
            resp = await resource.delete_collection_namespaced_resource_claim(ns, _preload_content=False)
            resp.release()
            left += len((await raw_json(resource.list_namespaced_resource_claim(ns, _preload_content=False)))["items"])
        if not left:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} claims still there in {namespaces}")
        await asyncio.sleep(1.0)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = new_run_dir(f"bench-dra-{args.nodes}")
    result: dict[str, Any] = {"init": args.init_pods, "pods": args.pods}
    # The resourceclaim controller's client gets the schedulers' QPS and burst, as scheduler_perf's does (its
    # clients all have 5000/5000): at the sandbox's 200/400 the controller's writes (a claim and a pod status per
    # pod, a claim deleted per pod) ran out of burst ~3 s into a steady state at ~8 batches/s, and then held the
    # faster scheduler at ~6 batches/s whatever it did.
    controllers = ("resourceclaim-controller",)
    async with LocalCluster(run_dir, controllers=controllers, controller_qps=(args.qps, args.burst)) as cluster:
        api = await api_client_from_dict(cluster.kubeconfig_dict(), qps=0, burst=500)
        try:
            t = time.monotonic()
            await base.create_nodes(api, args.nodes)
            await publish(api, args.nodes, args.claims_per_node, args)
            print(f"{args.nodes} nodes and slices created in {time.monotonic() - t:.1f}s", file=sys.stderr)
            contenders = [("ours", "crane")] + ([] if args.skip_kube else [("kube", "kube")])
            if args.kube_first:  # on a machine whose load drifts, alternate the order between runs
                contenders.reverse()
            for key, who in contenders:
                measure_ns = await base.fresh_namespace(api, f"dra-{who}-1")
                init_ns = await base.fresh_namespace(api, f"dra-{who}-0")
                t = time.monotonic()
                ready: Any = claims_made
                if args.workload == "extended-resource":
                    await extended_init_pods(api, init_ns, args.init_pods, args.nodes, args)
                    ready = None  # the scheduler makes the pods' claims
                elif args.workload.startswith("partitionable"):
                    await allocated_claims(api, init_ns, args.init_claims, args.workload.endswith("backtracking"))
                else:
                    await init_pods(api, init_ns, args.init_pods, args.nodes)
                count = {"partitionable": 2, "partitionable-backtracking": 7}.get(args.workload, 1)
                template = {"metadata": {"name": TEMPLATE}, "spec": {"spec": claim_spec(count)}}
                resp = await client.ResourceV1Api(api).create_namespaced_resource_claim_template(
                    measure_ns, template, _preload_content=False
                )
                resp.release()
                print(f"  init pods/claims placed in {time.monotonic() - t:.1f}s", file=sys.stderr)

                def body(name: str, scheduler: str) -> dict[str, Any]:
                    if args.workload == "extended-resource":
                        i = int(name.rsplit("-", 1)[1])
                        return extended_pod(name, scheduler, extended_resource(i, args.classes, args.implicit))
                    return pod_body(name, scheduler, {"resourceClaimTemplateName": TEMPLATE})

                if args.steady_state:
                    result[key], result[f"{key}_latency"], result[f"{key}_phases"] = await steady_run(
                        cluster, api, args, run_dir, key, measure_ns
                    )
                else:
                    with workloads.created_pods(body, ready):
                        run = base.run_ours if key == "ours" else base.run_kube
                        result[key], result[f"{key}_latency"] = await run(cluster, api, args, run_dir, measure_ns)
                allocated, twice = await doubled(api, [measure_ns, init_ns])
                result[f"{key}_audit"] = {"claims_allocated": allocated, "devices_twice": twice}
                print(
                    f"  {summary_of(result[key])}; {allocated} claims allocated, {twice} devices twice", file=sys.stderr
                )
                await cleared(api, [measure_ns, init_ns])
        finally:
            await api.close()
    return result


async def steady_run(
    cluster: LocalCluster, api: client.ApiClient, args: argparse.Namespace, run_dir: Any, key: str, namespace: str
) -> tuple[base.Run, dict[str, float], dict[str, float]]:
    """One scheduler on the steady workload: the first batch is created (and its claims made) before it starts,
    as the base runners' backlog; the loop runs beside the measurement and ends it. Also the loop's phases
    (``Steady.phase_summary``)."""
    scheduler = "crane-bench" if key == "ours" else "kube-bench"
    kind = Steady if args.steady_batches else SteadyPods
    steady = kind(api, namespace, scheduler, args.batch, args.duration, TEMPLATE)
    tasks: list[asyncio.Task[None]] = []
    original = base.create_pods

    async def first_batch(api: client.ApiClient, namespace: str, n: int, scheduler: str, rate: float = 0.0) -> None:
        await steady.create_batch()
        await claims_made(api, namespace, args.batch)
        tasks.append(asyncio.create_task(steady.run()))

    base.create_pods = first_batch
    try:
        run = base.run_ours if key == "ours" else base.run_kube
        measured, latency = await run(cluster, api, args, run_dir, namespace, stop=steady.stop)
        measured.pods = measured.bound  # as many as the loop made
        return measured, latency, steady.phase_summary()
    finally:
        base.create_pods = original
        for task in tasks:
            task.cancel()


def summary_of(run: base.Run) -> str:
    return f"{run.label}: {run.bound}/{run.pods} bound in {run.seconds:.1f}s, {run.rate:.1f} pods/s"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dra", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--claims-per-node", type=int, default=10, help="devices per node (maxClaimsPerNode)")
    parser.add_argument("--init-pods", type=int, default=2500)
    parser.add_argument("--pods", type=int, default=2500, help="measured pods")
    base.contender_arguments(parser, event_concurrency=32)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--skip-kube", action="store_true")
    parser.add_argument("--kube-first", action="store_true", help="run kube-scheduler before crane-scheduler")
    parser.add_argument(
        "--steady-state", action="store_true", help="SteadyStateClusterResourceClaimTemplate instead (see above)"
    )
    parser.add_argument("--batch", type=int, default=10, help="steady state: pods on their way (per batch)")
    parser.add_argument(
        "--steady-batches",
        action="store_true",
        help="steady state as scheduler_perf 1.35 had it: whole batches bound, deleted and created (see above)",
    )
    parser.add_argument("--duration", type=float, default=10.0, help="steady state: seconds from the first bind")
    parser.add_argument(
        "--workload",
        choices=("claim-template", "extended-resource", "partitionable", "partitionable-backtracking"),
        default="claim-template",
        help="scheduler_perf's DRA workload (see above)",
    )
    parser.add_argument("--classes", type=int, default=25, help="extended-resource: device classes")
    parser.add_argument("--implicit", action="store_true", help="extended-resource: the classes' implicit names")
    parser.add_argument("--init-claims", type=int, default=0, help="partitionable: claims allocated beforehand")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--py-spy", action="store_true", help="sample crane-scheduler with py-spy (bench/scheduler/spy.py)"
    )
    args = parser.parse_args()
    if args.workload == "extended-resource":
        args.claims_per_node = EXTENDED_DEVICES
    if args.steady_state:
        args.pods = 1_000_000  # the loop ends the run (measure waits for this many binds otherwise)
    elif args.workload.startswith("partitionable"):
        parser.error("the partitionable workloads are steady state: add --steady-state")
    elif args.init_pods + args.pods > args.nodes * args.claims_per_node:
        parser.error("more pods than devices: some would stay Pending and the run would wait for its timeout")
    args.plugins = "default"
    r = asyncio.run(bench(args))
    ours, kube = r["ours"], r.get("kube")
    steady = f"batches of {args.batch}" if args.steady_batches else f"{args.batch} pods on their way"
    unit = "batch" if args.steady_batches else "pod"
    if args.workload.startswith("partitionable"):
        print(
            f"\n{args.workload}: {args.nodes} nodes, {args.init_claims} init claims, {steady} for "
            f"{args.duration:g}s, QPS {args.qps:g}/{args.burst}"
        )
    elif args.workload == "extended-resource":
        names = "implicit" if args.implicit else "explicit"
        print(
            f"\nExtendedResource ({names}, {args.classes} classes): {args.nodes} nodes x {args.claims_per_node} "
            f"devices, {args.init_pods} init pods, {args.pods} measured, QPS {args.qps:g}/{args.burst}"
        )
    elif args.steady_state:
        print(
            f"\nSteadyStateClusterResourceClaimTemplate: {args.nodes} nodes x {args.claims_per_node} devices, "
            f"{args.init_pods} init pods, {steady} for {args.duration:g}s, QPS {args.qps:g}/{args.burst}"
        )
    else:
        print(
            f"\nSchedulingWithResourceClaimTemplate: {args.nodes} nodes x {args.claims_per_node} devices, "
            f"{args.init_pods} init pods, {args.pods} measured, QPS {args.qps:g}/{args.burst}"
        )
    print(f"{summary_of(ours)}; decision p50 {ours_p(r, 'p50')} p99 {ours_p(r, 'p99')}; audit {r['ours_audit']}")
    if "ours_phases" in r:
        print(f"  per {unit} (median): {phases_text(r['ours_phases'], unit)}")
    if kube is not None:
        print(f"{summary_of(kube)}; audit {r['kube_audit']}")
        if "kube_phases" in r:
            print(f"  per {unit} (median): {phases_text(r['kube_phases'], unit)}")
        print(f"ratio crane / kube: {ours.rate / kube.rate:.2f}" if kube.rate > 0 else "ratio: -")
    if args.json:
        figures: dict[str, Any] = {
            k: {"bound": v.bound, "pods": v.pods, "seconds": v.seconds, "rate": v.rate}
            for k, v in r.items()
            if isinstance(v, base.Run)
        }
        figures.update({k: v for k, v in r.items() if k.endswith("_phases")})
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


def phases_text(phases: dict[str, float], unit: str = "batch") -> str:
    """A steady run's ``Steady.phase_summary``: where a batch's (or a pod's) round trip went."""
    if unit == "batch":
        names = {
            "claims": "claims made",
            "recorded": "then in the pods' statuses",
            "scheduler": "then all bound",
            "bench": "then the next batch created",
        }
    else:
        names = {
            "claims": "claim made",
            "recorded": "then in the pod's status",
            "scheduler": "then bound",
            "bench": "then deleted and the next pod created",
        }
    parts = [f"{label} {phases[key] * 1e3:.0f} ms" for key, label in names.items() if key in phases]
    return ", ".join(parts) + f" ({phases.get('batches', 0):.0f} {'batches' if unit == 'batch' else 'pods'})"


def ours_p(r: dict[str, Any], q: str) -> str:
    value = r.get("ours_latency", {}).get(q)
    return f"{value * 1e3:.2f} ms" if isinstance(value, float) else "-"


if __name__ == "__main__":
    main()
