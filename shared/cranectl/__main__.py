"""cranectl: the operator's tool. ``cranectl explain NS/POD`` asks the scheduler why a pod landed where it did,
or why it is still pending; ``cranectl nodes`` shows each node's real usage, requests, hot value and freshness;
``cranectl plan`` shows the descheduler's last round (node classes, evictions, pods passed over);
``cranectl load-taint clear`` lifts the annotator's ``crane.io/load-hot`` taint from every node and
``cranectl withdraw-batch`` takes back every node's batch loan, after ``cranectl stop-annotator`` (the chart's
pre-delete hook runs them).
``cranectl snapshot -o FILE`` writes the state that decides placement (nodes, pods without env or commands,
PodGroups, DRA objects, the policy and the scheduler's configuration); ``cranectl simulate -f MANIFEST`` places
manifests' pods on a snapshot (or the live cluster, read-only) with crane-scheduler itself and reports each pod's
node or why it stays pending, and each node's requests and estimated load before and after (table, JSON, a plot).
``cranectl replay --trace builtin:seed`` runs a trace (pods arriving and leaving, their usage drifting) through
the scheduler and the descheduler's rounds on a virtual clock and reports each node's load, the nodes over the
thresholds, the evictions and the pending pods over time.
(The development sandbox is ``python -m crane_sandbox``, not part of this tool.)"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from crane_shared.logs import configure_logging


def _nodes(args: argparse.Namespace) -> int:
    from kubernetes_asyncio import client

    from crane_shared.kube import KubeSettings, make_api_client, raw_json
    from crane_shared.policy import policy_or_default
    from cranectl.nodes import node_rows, render

    policy = policy_or_default(args.policy)

    async def fetch() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        api = await make_api_client(KubeSettings(kubeconfig=args.kubeconfig))
        try:
            v1 = client.CoreV1Api(api)
            nodes = await raw_json(v1.list_node(_preload_content=False, _request_timeout=30))
            pods = await raw_json(
                v1.list_pod_for_all_namespaces(
                    field_selector="spec.nodeName!=", _preload_content=False, _request_timeout=60
                )
            )
            return nodes.get("items", []), pods.get("items", [])
        finally:
            await api.close()

    try:
        nodes, pods = asyncio.run(fetch())
    except Exception as err:  # one line for the user, not a traceback
        print(f"cannot list nodes and pods: {err}", file=sys.stderr)
        return 2
    print(render(node_rows(nodes, pods, policy, datetime.now(UTC)), policy))
    return 0


def _refs(args: argparse.Namespace, *flags: tuple[str, str]) -> list[tuple[str, str] | None] | None:
    """NAMESPACE/NAME flags as pairs (None when not given); None after printing the problem."""
    from cranectl.loadtaint import split

    try:
        return [split(getattr(args, attr), flag) if getattr(args, attr) else None for attr, flag in flags]
    except ValueError as err:
        print(err, file=sys.stderr)
        return None


async def _stopped(api: Any, stop: tuple[str, str] | None, lease: tuple[str, str] | None, timeout: float) -> bool:
    """Scale the annotator to 0 and wait for its Lease to be free, as asked; False (said why) if it stays held."""
    from cranectl.loadtaint import stop_annotator, wait_for_free_lease

    if stop is not None:
        await stop_annotator(api, *stop)
        print(f"scaled deployment {stop[0]}/{stop[1]} to 0")
    if lease is not None:
        if not await wait_for_free_lease(api, *lease, timeout):
            print(f"lease {lease[0]}/{lease[1]} still held after {timeout:g}s: stopping here", file=sys.stderr)
            return False
        print(f"lease {lease[0]}/{lease[1]} is free: no annotator writes")
    return True


def _with_api(args: argparse.Namespace, what: str, work: Callable[[Any], Coroutine[Any, Any, int]]) -> int:
    from crane_shared.kube import KubeSettings, make_api_client

    async def run() -> int:
        api = await make_api_client(KubeSettings(kubeconfig=args.kubeconfig))
        try:
            return await work(api)
        finally:
            await api.close()

    try:
        return asyncio.run(run())
    except Exception as err:  # one line for the user (or the hook's log), not a traceback
        print(f"cannot {what}: {err}", file=sys.stderr)
        return 2


def _stop_annotator(args: argparse.Namespace) -> int:
    refs = _refs(args, ("deployment", "--deployment"), ("lease", "--lease"))
    if refs is None:
        return 2

    async def work(api: Any) -> int:
        return 0 if await _stopped(api, refs[0], refs[1], args.timeout) else 1

    return _with_api(args, "stop the annotator", work)


def _load_taint_clear(args: argparse.Namespace) -> int:
    from cranectl.loadtaint import clear_taints

    refs = _refs(args, ("stop_annotator", "--stop-annotator"), ("lease", "--lease"))
    if refs is None:
        return 2

    async def work(api: Any) -> int:
        if not await _stopped(api, refs[0], refs[1], args.timeout):
            return 1
        cleared = await clear_taints(api, args.selector)
        print(f"crane.io/load-hot lifted from {len(cleared)} node(s){': ' + ', '.join(cleared) if cleared else ''}")
        return 0

    return _with_api(args, "clear the load taint", work)


def _withdraw_batch(args: argparse.Namespace) -> int:
    from cranectl.withdraw import run

    try:
        return run(args.kubeconfig, args.dry_run)
    except Exception as err:  # one line for the user, not a traceback
        print(f"cannot withdraw the batch loan: {err}", file=sys.stderr)
        return 2


def _get_json(url: str, what: str, server: str) -> tuple[int, Any]:
    """(0, body) or (exit code, None) with the reason printed: 1 for an error answer, 2 when unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return 0, json.load(resp)
    except urllib.error.HTTPError as err:
        print(f"{what}: {err.read().decode(errors='replace').strip() or err}", file=sys.stderr)
        return 1, None
    except urllib.error.URLError as err:
        print(f"cannot reach {server}: {err.reason}", file=sys.stderr)
        return 2, None


def _explain(args: argparse.Namespace) -> int:
    url = f"{args.scheduler.rstrip('/')}/debug/explain/{args.pod}"
    code, body = _get_json(url, args.pod, f"the scheduler at {args.scheduler}")
    if code:
        return code
    print(json.dumps(body, indent=2) if args.output == "json" else render_explain(body))
    return 0


def _plan(args: argparse.Namespace) -> int:
    url = f"{args.descheduler.rstrip('/')}/debug/plan"
    code, body = _get_json(url, "plan", f"the descheduler at {args.descheduler}")
    if code:
        return code
    print(json.dumps(body, indent=2) if args.output == "json" else render_plan(body))
    return 0


def render_plan(body: dict[str, Any]) -> str:
    """The descheduler's last round: node classes, each planned eviction and its result, pods passed over."""
    if "classes" not in body:
        return f"no round yet (leading: {str(body.get('leading', False)).lower()})"
    lines = [f"round at {body['at']}{' (dry run: nothing evicted)' if body.get('dry_run') else ''}"]
    for name in ("hot", "normal", "idle", "unknown"):
        nodes = sorted(n for n, c in body["classes"].items() if c == name)
        if nodes:
            shown = [f"{n} ({body['unknown'][n]})" if n in body.get("unknown", {}) else n for n in nodes]
            lines.append(f"  {name + ':':8} {', '.join(shown)}")
    if body.get("draining"):
        lines.append(f"  {'draining:':8} {', '.join(body['draining'])}")
    lines.append("evictions:" if body["evictions"] else "evictions: none")
    for e in body["evictions"]:
        if e.get("kind") == "drain":
            why = f"drain, {e['metric']} {e['value']:.3f} < {e['threshold']:g}"
        else:
            why = f"{e['metric']} {e['value']:.3f} > {e['threshold']:g}"
        lines.append(
            f"  {e['pod']:40} from {e['node']}: {why}"
            f"  ({'batch, no place: yields' if e['target'] is None else 'target e.g. ' + e['target']})  {e['result']}"
        )
    skipped = body.get("skipped") or {}
    if skipped:
        lines.append("passed over: " + ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))
    return "\n".join(lines)


def render_explain(body: dict[str, Any]) -> str:
    """The decision as a person reads it: the outcome, then one line per node (best first, rejected last)."""
    result = body["result"]
    head = (
        f"{body['pod']}: scheduled to {result['node']}"
        if "node" in result
        else f"{body['pod']}: pending: {result['pending']}"
    )
    lines = [head]
    if result.get("numaZones"):
        zones = ", ".join(
            f"{z['name']} ({' '.join(f'{k}={v}' for k, v in z['capacity'].items())})" for z in result["numaZones"]
        )
        lines.append(f"NUMA zones: {zones}")
    gang = body.get("gang")
    if gang:
        lines.append(
            f"gang {gang['group']}: {gang['outcome']}: {len(gang['found'])} member(s) found places, "
            f"{gang['placedBefore']} placed before, minMember {gang['minMember']}"
        )
        lines += [f"  found    {m['pod']} -> {m['node']}" for m in gang["found"]]
        lines += [f"  missing  {m['pod']}: {m['reason']}" for m in gang["missing"]]
    lines.append(f"feasible nodes: {body['feasibleNodes']}")
    for n in body["nodes"]:
        load = n.get("load", {})
        metrics = load.get("metrics", {})
        usage = " ".join(
            f"{m}={v['usage']:.2f}" for m, v in metrics.items() if v.get("usage") is not None and m.endswith("avg_5m")
        )
        hot = load.get("hotValue", {})
        new = next((v["judgedBy"] for v in metrics.values() if "judgedBy" in v), None)  # a never-annotated node
        note = f"; {new}" if new else ""
        extra = f"  [{usage}{' hot=' + str(hot.get('total')) if hot else ''}{note}]" if load else ""
        if n["filter"] == "passed":
            scores = ", ".join(f"{k} {v}" for k, v in n.get("scores", {}).items())
            lines.append(f"  {n['node']:24} total {n.get('total', 0):>5}  {scores}{extra}")
        else:
            lines.append(f"  {n['node']:24} refused by {n['filter']['plugin']}: {n['filter']['reason']}{extra}")
    scoring = next((n["load"]["scoring"] for n in body["nodes"] if "scoring" in n.get("load", {})), None)
    if scoring is not None:  # the Dynamic score's strategy (spec.scoring)
        lines.append(f"load score: {scoring}")
    judged = next((n["load"] for n in body["nodes"] if "podClass" in n.get("load", {})), None)
    if judged is not None:  # the load policy's view of the pod: its class and its estimated usage
        est = judged["podEstimate"]
        lines.append(
            f"load: {judged['podClass']} pod, estimate {est['cpu']:.3g} cores / {est['memory'] / 2**30:.3g}Gi "
            f"({est['source']})"
        )
    return "\n".join(lines)


def _snapshot_of(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster's state now (``--kubeconfig``), with the ``--config`` and ``--policy`` files."""
    from crane_shared.kube import KubeSettings, make_api_client
    from cranectl.snapshot import load_document, policy_path_of, take

    config = load_document(args.config, "--config")
    policy = load_document(args.policy, "--policy")
    source = args.policy
    named = policy_path_of(config)
    if policy is None and named and os.path.isfile(named):  # the file the configuration names, readable here
        policy, source = load_document(named, "the configuration's Dynamic policyConfigPath"), named

    async def fetch() -> dict[str, Any]:
        api = await make_api_client(KubeSettings(kubeconfig=args.kubeconfig), request_timeout=args.timeout)
        try:
            found = await take(
                api, node_selector=args.node_selector, timeout=args.timeout, config=config, policy=policy
            )
            return found | {"policySource": source}
        finally:
            await api.close()

    return asyncio.run(fetch())


def _snapshot(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cranectl.snapshot import write

    try:
        document = _snapshot_of(args)
        write(document, Path(args.output))
    except Exception as err:  # one line for the user, not a traceback
        print(f"cannot take the snapshot: {err}", file=sys.stderr)
        return 2
    kinds: dict[str, int] = {}
    for obj in document["objects"]:
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
    counts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    print(f"snapshot at {document['takenAt']} written to {args.output}: {counts or 'nothing'}")
    print(f"policy: {document['policySource'] or 'none given (simulate uses the upstream default policy)'}")
    if document["notServed"]:
        print(f"not served by this cluster (skipped): {', '.join(document['notServed'])}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cranectl import whatif
    from cranectl.snapshot import load_document, read

    try:
        if args.snapshot and args.node_selector:
            raise ValueError(
                "--node-selector reads the live cluster's nodes; a snapshot has the nodes it was taken with "
                "(cranectl snapshot --node-selector)"
            )
        if args.snapshot:
            snapshot = read(Path(args.snapshot))
            if args.config or args.policy:  # as given, over the snapshot's
                snapshot["schedulerConfig"] = load_document(args.config, "--config") or snapshot["schedulerConfig"]
                snapshot["policy"] = load_document(args.policy, "--policy") or snapshot["policy"]
        else:
            snapshot = _snapshot_of(args)
        workload = whatif.expand(whatif.read_manifests(args.filename))
        base = whatif.base_setup(snapshot, "as is" if not args.compare else "snapshot")
        setups = [base]
        if args.compare:
            setups.append(whatif.setup_of(load_document(args.compare, "--compare"), base, Path(args.compare).stem))
        outcomes = [whatif.run(snapshot, workload, s, feasible=args.feasible) for s in setups]
        text = whatif.table(outcomes, limit=args.nodes)
        if args.plot or args.html:
            png = whatif.plot_png(outcomes, limit=args.plot_nodes)
            if args.plot:
                Path(args.plot).write_bytes(png)
            if args.html:
                Path(args.html).write_text(whatif.html_page(outcomes, png, text))
    except Exception as err:  # one line for the user, not a traceback
        print(f"cannot simulate: {err}", file=sys.stderr)
        return 2
    print(whatif.as_json(outcomes, snapshot) if args.output == "json" else text)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from crane_shared.policy import policy_or_default
    from cranectl import replay, traces
    from cranectl.snapshot import load_document

    try:
        if args.trace.startswith("builtin:"):
            name = args.trace.removeprefix("builtin:")
            if args.print_trace:
                print(yaml.safe_dump(traces.document(name, args.seed), sort_keys=False), end="")
                return 0
            trace = traces.builtin(name, args.seed)
        elif args.print_trace:
            raise ValueError("--print-trace prints a built-in trace (builtin:NAME)")
        else:
            trace = traces.read_trace(Path(args.trace).read_text(), args.trace)
        sides, judged = replay.sides(
            policy_or_default(args.policy),
            load_document(args.config, "--config"),
            policy_source=args.policy or "the default policy",
            descheduler_policy=args.descheduler_policy,
            descheduler=not args.no_descheduler,
            interval=args.descheduler_interval,
            compare=args.compare or (),
        )
        results = replay.replay(trace, sides, judged, seed=args.seed)
        text = replay.table(trace, results, args.every, args.nodes)
        if args.plot or args.html:
            png = replay.plot_png(results, args.plot_nodes)
            if args.plot:
                Path(args.plot).write_bytes(png)
            if args.html:
                Path(args.html).write_text(replay.html_page(trace, results, png, text))
    except Exception as err:  # one line for the user, not a traceback
        print(f"cannot replay: {err}", file=sys.stderr)
        return 2
    print(replay.as_json(trace, results) if args.output == "json" else text)
    return 0


def _cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG, in-cluster")
    parser.add_argument("--node-selector", help="only the nodes the scheduler sees (its --node-selector)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per API request (default 60)")
    parser.add_argument(
        "--config", help="the scheduler's KubeSchedulerConfiguration file (default: the default profile)"
    )
    parser.add_argument(
        "--policy",
        help="the DynamicSchedulerPolicy file (default: the one --config's Dynamic policyConfigPath names, else the "
        "upstream default policy)",
    )


def _seconds(text: str) -> float:
    """A duration flag (``90s``, ``5m``) in seconds."""
    from crane_shared.durations import DurationError, parse_duration

    try:
        value = parse_duration(text).total_seconds()
    except DurationError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(prog="cranectl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    nd = sub.add_parser("nodes", help="per node: real usage per policy metric, requests, hot value, freshness")
    nd.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG")
    nd.add_argument("--policy", help="DynamicSchedulerPolicy file (default: the upstream default policy)")
    nd.set_defaults(func=_nodes)
    ex = sub.add_parser("explain", help="why a pod was placed where it is, or why it is still pending")
    ex.add_argument("pod", help="NAMESPACE/NAME")
    ex.add_argument("--scheduler", default="http://127.0.0.1:10261", help="base URL of the scheduler's HTTP server")
    ex.add_argument("-o", "--output", choices=["text", "json"], default="text")
    ex.set_defaults(func=_explain)
    pl = sub.add_parser("plan", help="the descheduler's last round: node classes, evictions, pods passed over")
    pl.add_argument("--descheduler", default="http://127.0.0.1:8084", help="base URL of the descheduler's HTTP server")
    pl.add_argument("-o", "--output", choices=["text", "json"], default="text")
    pl.set_defaults(func=_plan)
    wd = sub.add_parser(
        "withdraw-batch",
        help="take back every node's batch loan: crane.io/batch-* to 0, then removed from node status, and the "
        "batch annotations removed (when no annotator is left to do it)",
    )
    wd.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG, else in-cluster")
    wd.add_argument("--dry-run", action="store_true", help="say what would be withdrawn, change nothing")
    wd.set_defaults(func=_withdraw_batch)
    st = sub.add_parser(
        "stop-annotator",
        help="scale the annotator to 0 and wait until its Lease is free (no annotator writes; the uninstall hook)",
    )
    st.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG, in-cluster")
    st.add_argument("--deployment", metavar="NS/NAME", required=True, help="the annotator's Deployment")
    st.add_argument("--lease", metavar="NS/NAME", help="its Lease (default: not waited for)")
    st.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the Lease (default 120)")
    st.set_defaults(func=_stop_annotator)
    lt = sub.add_parser("load-taint", help="the annotator's crane.io/load-hot taint")
    lt_sub = lt.add_subparsers(dest="action", required=True)
    clear = lt_sub.add_parser(
        "clear",
        help="lift crane.io/load-hot from every node (uninstall; the chart's pre-delete hook runs it)",
        description="Lift crane.io/load-hot from every node, after stopping the annotator so it cannot set it again.",
    )
    clear.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG, in-cluster")
    clear.add_argument("--stop-annotator", metavar="NS/DEPLOYMENT", help="scale the annotator to 0 first")
    clear.add_argument("--lease", metavar="NS/NAME", help="wait until the annotator's Lease is free first")
    clear.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the Lease (default 120)")
    clear.add_argument("--selector", help="only nodes matching this label selector")
    clear.set_defaults(func=_load_taint_clear)
    sn = sub.add_parser(
        "snapshot", help="write the state that decides placement to a file (JSON, or YAML by extension)"
    )
    _cluster_flags(sn)
    sn.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write it (.json, .yaml)")
    sn.set_defaults(func=_snapshot)
    sm = sub.add_parser(
        "simulate",
        help="where manifests' pods would go, what stays pending and why, each node's load before and after",
    )
    _cluster_flags(sm)
    sm.add_argument("--snapshot", metavar="FILE", help="a cranectl snapshot (default: the live cluster, read-only)")
    sm.add_argument("-f", "--filename", action="append", required=True, help="manifests (repeatable; - for stdin)")
    sm.add_argument("--compare", metavar="FILE", help="a second DynamicSchedulerPolicy or scheduler config to run")
    sm.add_argument("-o", "--output", choices=["table", "json"], default="table")
    sm.add_argument("--feasible", action="store_true", help="-o json: each pod's feasible nodes too")
    sm.add_argument("--plot", metavar="PNG", help="write per-node load before/after, thresholds drawn")
    sm.add_argument("--html", metavar="FILE", help="write the plot and the table as one self-contained page")
    sm.add_argument("--nodes", type=int, default=50, help="nodes in the table beyond which only changed ones show")
    sm.add_argument("--plot-nodes", type=int, default=40, help="nodes in the plot: those whose load grew most")
    sm.set_defaults(func=_simulate)
    rp = sub.add_parser(
        "replay",
        help="a trace (pods arriving and leaving, usage drifting) through the scheduler and the descheduler in "
        "virtual time: load per node, nodes over the thresholds, evictions, pending pods over time",
    )
    rp.add_argument(
        "--trace",
        default="builtin:seed",
        help="a CraneTrace file, or builtin:NAME (seed, seed-cpu, hotspot, random; default builtin:seed)",
    )
    rp.add_argument("--seed", type=int, default=0, help="the scheduler's tie-break, and builtin:random's trace")
    rp.add_argument("--policy", help="the DynamicSchedulerPolicy file (default: the upstream default policy)")
    rp.add_argument("--config", help="the scheduler's KubeSchedulerConfiguration file (default: the default profile)")
    rp.add_argument(
        "--descheduler-policy", help="the LoadAwareDeschedulerPolicy file (default: the descheduler's built-in one)"
    )
    rp.add_argument(
        "--descheduler-interval", type=_seconds, default=60.0, help="time between descheduler rounds (default 1m)"
    )
    rp.add_argument("--no-descheduler", action="store_true", help="the scheduler alone")
    rp.add_argument(
        "--compare",
        action="append",
        metavar="MODE|FILE",
        help="also run: requests (kube-scheduler's plugins alone), upstream (upstream crane's Dynamic), "
        "no-descheduler, or a DynamicSchedulerPolicy, KubeSchedulerConfiguration or LoadAwareDeschedulerPolicy "
        "file (repeatable)",
    )
    rp.add_argument("-o", "--output", choices=["table", "json"], default="table")
    rp.add_argument("--plot", metavar="PNG", help="write load per node over time, thresholds, pending, evictions")
    rp.add_argument("--html", metavar="FILE", help="write the plot and the table as one self-contained page")
    rp.add_argument("--every", type=_seconds, help="time between the table's rows (default: about ten rows)")
    rp.add_argument("--nodes", type=int, default=8, help="nodes in the table's columns (default 8)")
    rp.add_argument("--plot-nodes", type=int, default=12, help="nodes in the plot: those with the highest peak")
    rp.add_argument("--print-trace", action="store_true", help="print the built-in trace as YAML (to edit) and stop")
    rp.set_defaults(func=_replay)
    args = parser.parse_args()
    configure_logging("warning")
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
