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

``--steady-state`` is scheduler_perf's ``createPodsSteadily``: ``--batch`` (10) pods claiming a device through the
template; once all of a batch are bound, they are deleted together (the resourceclaim controller then frees and
deletes their claims) and the next batch is created, for ``--duration`` seconds from the first bind. Throughput
= pods bound / (last bind - first bind): the loop's speed, the claim controller's latency included, as kube's.
Its workloads: empty_500nodes (``--init-pods 0``, kube's threshold 64), half_500nodes (``--init-pods 2500``: 70,
60 with queueing hints), full_500nodes (``--init-pods 4990``: 60).

    .venv/bin/python -m bench.dra                                    # scheduler_perf's 5000pods_500nodes
    .venv/bin/python -m bench.dra --nodes 100 --claims-per-node 20 --init-pods 1000 --pods 1000   # 2000pods_100nodes
    .venv/bin/python -m bench.dra --steady-state --init-pods 0       # SteadyState...ClaimTemplate/empty_500nodes
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


def claim_spec() -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "req-0", "exactly": {"deviceClassName": CLASS}}]}}


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


async def publish(api: client.ApiClient, nodes: int, per_node: int) -> None:
    resource = client.ResourceV1Api(api)
    (await resource.create_device_class(device_class(), _preload_content=False)).release()

    async def one(i: int) -> None:
        resp = await resource.create_resource_slice(node_slice(f"node-{i:05d}", per_node), _preload_content=False)
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
    is set then (``bench.scheduler.measure`` ends the run on it)."""

    def __init__(
        self, api: client.ApiClient, namespace: str, scheduler: str, batch: int, duration: float, template: str
    ) -> None:
        self.api, self.namespace, self.scheduler = api, namespace, scheduler
        self.batch, self.duration, self.template = batch, duration, template
        self.stop = asyncio.Event()
        self.generation = 0
        self.bound: set[str] = set()  # names of the current batch's pods seen bound
        self.changed = asyncio.Event()
        core = client.CoreV1Api(api)

        async def list_fn(**kw: Any) -> Any:
            return await core.list_namespaced_pod(namespace, **kw)

        self.informer = Informer("bench-steady-pods", list_fn, self.seen)

    def seen(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        name = obj["metadata"]["name"]
        if kind != "DELETED" and obj["spec"].get("nodeName") and name.startswith(self.prefix):
            self.bound.add(name)
            self.changed.set()

    @property
    def prefix(self) -> str:
        return f"pod-{self.generation:04d}-"

    async def create_batch(self) -> None:
        v1 = client.CoreV1Api(self.api)
        claim = {"resourceClaimTemplateName": self.template}

        async def one(i: int) -> None:
            body = pod_body(f"{self.prefix}{i:03d}", self.scheduler, claim)
            (await v1.create_namespaced_pod(self.namespace, body, _preload_content=False)).release()

        await asyncio.gather(*(one(i) for i in range(self.batch)))

    async def run(self) -> None:
        stopping = asyncio.Event()
        watcher = asyncio.create_task(self.informer.run(stopping))
        v1 = client.CoreV1Api(self.api)
        try:
            await self.informer.synced.wait()
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
                self.bound = set()
                await self.create_batch()
        finally:
            self.stop.set()
            stopping.set()
            watcher.cancel()


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
    async with LocalCluster(run_dir, controllers=("resourceclaim-controller",)) as cluster:
        api = await api_client_from_dict(cluster.kubeconfig_dict(), qps=0, burst=500)
        try:
            t = time.monotonic()
            await base.create_nodes(api, args.nodes)
            await publish(api, args.nodes, args.claims_per_node)
            print(f"{args.nodes} nodes and slices created in {time.monotonic() - t:.1f}s", file=sys.stderr)
            contenders = [("ours", "crane")] + ([] if args.skip_kube else [("kube", "kube")])
            if args.kube_first:  # on a machine whose load drifts, alternate the order between runs
                contenders.reverse()
            for key, who in contenders:
                measure_ns = await base.fresh_namespace(api, f"dra-{who}-1")
                init_ns = await base.fresh_namespace(api, f"dra-{who}-0")
                t = time.monotonic()
                await init_pods(api, init_ns, args.init_pods, args.nodes)
                template = {"metadata": {"name": TEMPLATE}, "spec": {"spec": claim_spec()}}
                resp = await client.ResourceV1Api(api).create_namespaced_resource_claim_template(
                    measure_ns, template, _preload_content=False
                )
                resp.release()
                print(f"  {args.init_pods} init pods placed in {time.monotonic() - t:.1f}s", file=sys.stderr)

                def body(name: str, scheduler: str) -> dict[str, Any]:
                    return pod_body(name, scheduler, {"resourceClaimTemplateName": TEMPLATE})

                if args.steady_state:
                    result[key], result[f"{key}_latency"] = await steady_run(
                        cluster, api, args, run_dir, key, measure_ns
                    )
                else:
                    with workloads.created_pods(body, claims_made):
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
) -> tuple[base.Run, dict[str, float]]:
    """One scheduler on the steady workload: the first batch is created (and its claims made) before it starts,
    as the base runners' backlog; the loop runs beside the measurement and ends it."""
    scheduler = "crane-bench" if key == "ours" else "kube-bench"
    steady = Steady(api, namespace, scheduler, args.batch, args.duration, TEMPLATE)
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
        return measured, latency
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
    parser.add_argument("--batch", type=int, default=10, help="steady state: pods per batch")
    parser.add_argument("--duration", type=float, default=10.0, help="steady state: seconds from the first bind")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--py-spy", action="store_true", help="sample crane-scheduler with py-spy (bench/scheduler/spy.py)"
    )
    args = parser.parse_args()
    if args.steady_state:
        args.pods = 1_000_000  # the loop ends the run (measure waits for this many binds otherwise)
    elif args.init_pods + args.pods > args.nodes * args.claims_per_node:
        parser.error("more pods than devices: some would stay Pending and the run would wait for its timeout")
    args.plugins = "default"
    r = asyncio.run(bench(args))
    ours, kube = r["ours"], r.get("kube")
    if args.steady_state:
        print(
            f"\nSteadyStateClusterResourceClaimTemplate: {args.nodes} nodes x {args.claims_per_node} devices, "
            f"{args.init_pods} init pods, batches of {args.batch} for {args.duration:g}s, QPS {args.qps:g}/{args.burst}"
        )
    else:
        print(
            f"\nSchedulingWithResourceClaimTemplate: {args.nodes} nodes x {args.claims_per_node} devices, "
            f"{args.init_pods} init pods, {args.pods} measured, QPS {args.qps:g}/{args.burst}"
        )
    print(f"{summary_of(ours)}; decision p50 {ours_p(r, 'p50')} p99 {ours_p(r, 'p99')}; audit {r['ours_audit']}")
    if kube is not None:
        print(f"{summary_of(kube)}; audit {r['kube_audit']}")
        print(f"ratio crane / kube: {ours.rate / kube.rate:.2f}" if kube.rate > 0 else "ratio: -")
    if args.json:
        figures = {
            k: {"bound": v.bound, "pods": v.pods, "seconds": v.seconds, "rate": v.rate}
            for k, v in r.items()
            if isinstance(v, base.Run)
        }
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


def ours_p(r: dict[str, Any], q: str) -> str:
    value = r.get("ours_latency", {}).get(q)
    return f"{value * 1e3:.2f} ms" if isinstance(value, float) else "-"


if __name__ == "__main__":
    main()
