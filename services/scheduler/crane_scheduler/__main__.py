"""crane-scheduler: a second Kubernetes scheduler for pods with ``spec.schedulerName: crane-scheduler``.

It honours what kube-scheduler honours (resources, taints, affinity, host ports, priority, backoff) so pods never
land where the kubelet would reject them, reports like kube-scheduler (events, PodScheduled condition, metrics)
and is configured with a KubeSchedulerConfiguration file. Load-aware plugins plug into the same framework.

Reading order: this file wires things up; ``scheduler.py`` is the service (informers, loop, binds);
``algorithm.py`` one decision; ``framework/`` the plugin API and the profile runtime; ``plugins/`` the
built-in plugins; ``nodetable.py`` and ``internal/`` (queue, cache) the state.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry

from crane_scheduler import explain, gangless
from crane_scheduler.config import ConfigError, SchedulerConfig, load_config
from crane_scheduler.deciders.cpus import default_workers, usable_cpus
from crane_scheduler.deciders.pool import DeciderPool
from crane_scheduler.framework import Handle, PluginMetrics, Registry
from crane_scheduler.framework.runtime import Profile, build_profiles
from crane_scheduler.listers import Listers
from crane_scheduler.metrics import SchedulerMetrics
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import plugin_registry
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler
from crane_scheduler.writer import ApiWriter, Connection
from crane_shared.kube import KubeSettings, env_proxy, make_api_client
from crane_shared.leader import LeaderElector, LeaseConfig, make_lease_client
from crane_shared.logs import configure_logging, get_logger
from crane_shared.service import Access, ServiceRuntime, until_stopped
from crane_shared.settings import EnvArgumentParser, add_common_flags, common_settings

DEFAULT_PORT = 10261
log = get_logger("crane.scheduler")


def decision_workers(value: str) -> int | None:
    """``--decision-workers``: a count (0 or more), or ``auto`` (None: from the usable CPUs)."""
    if value == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: a number of workers (0 or more) or 'auto'") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: a number of workers must be 0 or more")
    return count


def build_parser() -> EnvArgumentParser:
    parser = EnvArgumentParser(
        prog="crane-scheduler",
        description="A Kubernetes scheduler with kube-scheduler's semantics and a pluggable framework; pods opt in "
        "with spec.schedulerName. Without --config it runs one profile, 'crane-scheduler', with "
        "kube-scheduler's default plugins and weights.",
    )
    parser.add_argument(
        "--config",
        env="CRANE_SCHEDULER_CONFIG",
        default=None,
        help="KubeSchedulerConfiguration YAML (kubescheduler.config.k8s.io/v1): profiles, plugins, "
        "pluginConfig, percentageOfNodesToScore, backoff, clientConnection, leaderElection",
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="validate the configuration (including plugin args), print the problems, and exit",
    )
    parser.add_argument(
        "--bind-concurrency",
        env="CRANE_SCHEDULER_BIND_CONCURRENCY",
        type=int,
        default=1024,
        help="binding cycles (Permit, PreBind, Bind) in flight at once; the client QPS is the "
        "real limit, this only bounds memory (kube-scheduler does not bound it at all)",
    )
    parser.add_argument(
        "--event-concurrency",
        env="CRANE_SCHEDULER_EVENT_CONCURRENCY",
        type=int,
        default=64,
        help="event and pod-status writes in flight at once, on connections of their own (with their own rate "
        "limit, as kube-scheduler's event client): as many as the writer's bind connections, so Scheduled events "
        "keep pace with binds",
    )
    parser.add_argument(
        "--events-while-binds-wait",
        env="CRANE_SCHEDULER_EVENTS_WHILE_BINDS_WAIT",
        type=int,
        default=4,
        help="events in flight at most while binds wait for a connection (the API server is saturated) or "
        "preemption's writes are in flight: binds and evictions first; the other events wait, none is dropped, "
        "and go at --event-concurrency once neither holds (pod-status patches do not wait)",
    )
    parser.add_argument(
        "--writer-connections",
        env="CRANE_SCHEDULER_WRITER_CONNECTIONS",
        type=int,
        default=64,
        help="binds in flight at once in the writer process: that many keep-alive connections, so a burst does "
        "not open (and TLS-handshake) one per bind (events and status patches have --event-concurrency more)",
    )
    parser.add_argument(
        "--decision-workers",
        env="CRANE_SCHEDULER_DECISION_WORKERS",
        type=decision_workers,
        default="auto",
        help="decider worker processes (each with a replica of the node table) that decide pods in parallel, "
        "the scheduling process checking and assuming each answer; 0: decide in the scheduling process; 'auto': "
        "from the container's CPU limit (cgroup quota, not the host's count): 0 without a limit or up to 3 CPUs, "
        "else one per CPU beyond 2, at most 8",
    )
    parser.add_argument(
        "--node-selector",
        env="CRANE_SCHEDULER_NODE_SELECTOR",
        default=None,
        help="label selector: consider only these nodes (shard a fleet between schedulers)",
    )
    parser.add_argument(
        gangless.FLAG,
        env="CRANE_SCHEDULER_POD_GROUP_WITHOUT_GANG_PLUGIN",
        choices=gangless.MODES,
        default="refuse",
        help=f"a pod naming a PodGroup (label {gangless.POD_GROUP_LABEL}) in a profile without the Coscheduling "
        "plugin: 'refuse' it (unschedulable, the message names the profile and the plugin) or 'place-alone' (placed "
        "as any pod, with a Warning event); never placed silently as if the label were absent",
    )
    parser.add_argument(
        "--identity",
        env="CRANE_SCHEDULER_IDENTITY",
        default=None,
        help="leader-election identity (default: <hostname>_<random>)",
    )
    add_common_flags(parser, default_port=DEFAULT_PORT)
    return parser


@dataclass
class Loaded:
    """The validated configuration and its profiles, built once: serving uses these very plugin instances (their
    handles get the API client when it exists), so no plugin registers a column or a metric twice."""

    config: SchedulerConfig
    profiles: dict[str, Profile]
    table: NodeTable
    handles: list[Handle] = field(default_factory=list)
    listers: Listers = field(default_factory=Listers)

    def connect(self, api: object, writer: ApiWriter, may_bind: Callable[[], bool] = lambda: True) -> None:
        for handle in self.handles:
            handle.api = api
            handle.writer = writer
            handle.may_bind = may_bind


def load(args: argparse.Namespace, registry: Registry, metrics: CollectorRegistry | None = None) -> Loaded:
    """Configuration and profiles, validated together; raises ``ConfigError`` listing every problem."""
    config = load_config(args.config)
    table = NodeTable()
    plugin_metrics = PluginMetrics(metrics)
    handles: list[Handle] = []
    listers = Listers()

    def handle_for(name: str) -> Handle:
        handles.append(Handle(table, None, time.monotonic, name, plugin_metrics, listers=listers))
        return handles[-1]

    return Loaded(config, build_profiles(config, registry, handle_for), table, handles, listers)


def main(argv: list[str] | None = None, registry: Registry | None = None) -> int:
    args = build_parser().parse_args(argv)
    common = common_settings(args)
    configure_logging(common.log_level, common.log_format)
    registry = registry or plugin_registry()
    try:
        loaded = load(args, registry, None if args.check_config else REGISTRY)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    if args.check_config:
        print("configuration is valid")
        return 0
    return asyncio.run(serve(args, loaded))


async def serve(args: argparse.Namespace, loaded: Loaded) -> int:
    common = common_settings(args)
    config, profiles, table = loaded.config, loaded.profiles, loaded.table
    kube = KubeSettings(
        kubeconfig=config.kubeconfig or common.kube.kubeconfig,
        context=common.kube.context,
        qps=config.qps if config.qps is not None else common.kube.qps,
        burst=config.burst if config.burst is not None else common.kube.burst,
        request_timeout=common.kube.request_timeout,
    )
    api = await make_api_client(kube)
    # Refused here, at start, rather than ignored (environment) or by a writer process restarting forever.
    proxy = "proxy-url" if api.rest_client.proxy else env_proxy(api.configuration.host) and "HTTPS_PROXY/HTTP_PROXY"
    if proxy:
        await api.close()
        print(
            f"{proxy}: a proxy to the API server is not supported (the API writer connects to it directly; "
            "exempt it with NO_PROXY)",
            file=sys.stderr,
        )
        return 2
    identity = args.identity or f"{socket.gethostname()}_{uuid.uuid4()}"
    runtime = ServiceRuntime("crane-scheduler", common.listen_host, common.listen_port, registry=REGISTRY)
    runtime.configure_access(Access(common.metrics_access), Access(common.debug_access), common.kube)
    metrics = SchedulerMetrics(runtime.registry)
    # Binds, events and status patches leave through the writer process: its own connections, rate limit (as
    # kube-scheduler's event client) and core; the scheduler's client keeps the informers and the reads.
    writer = ApiWriter(
        Connection(
            kubeconfig=kube.kubeconfig,
            context=kube.context,
            qps=kube.qps,
            burst=kube.burst,
            request_timeout=kube.request_timeout,
            connections=args.writer_connections,
            report_connections=args.event_concurrency,
            reports_while_binds_wait=args.events_while_binds_wait,
        ),
        log_level=common.log_level,
        log_format=common.log_format,
        on_restart=metrics.writer_restarts.inc,
    )
    reporter = Reporter(writer, api, identity, workers=args.event_concurrency, metrics=metrics)
    count = args.decision_workers if args.decision_workers is not None else default_workers(usable_cpus())
    deciders = (
        DeciderPool(
            count,
            Path(args.config) if args.config else None,
            nodes_hint=lambda: table.num_nodes,
            log_level=common.log_level,
            log_format=common.log_format,
            on_restart=metrics.decider_restarts.inc,
            on_ready=metrics.decider_workers.set,
        )
        if count
        else None
    )
    scheduler = Scheduler(
        config=config,
        profiles=profiles,
        table=table,
        reporter=reporter,
        api=api,
        bind_concurrency=args.bind_concurrency,
        node_selector=args.node_selector,
        metrics=metrics,
        listers=loaded.listers,
        writer=writer,
        pod_group_without_gang_plugin=args.pod_group_without_gang_plugin,
        deciders=deciders,
    )
    loaded.connect(
        api, writer, scheduler.may_bind
    )  # the plugins built (and validated) in main() get the API client now
    runtime.add_readiness_check("caches-synced", scheduler.synced.is_set)
    # Ready once the writer process has built its client (its READY), not merely started: before that the first
    # decision waits for it (``WRITER_READY_TIMEOUT``), ~0.5 s after a start that /readyz already called ready.
    runtime.add_readiness_check("api-writer", writer.ready.is_set)
    explain.add_routes(
        runtime.app, scheduler.decisions, lambda name: list(profiles[name].plugins.values()) if name in profiles else []
    )
    le = config.leader_election
    log.info(
        "starting",
        identity=identity,
        profiles=sorted(profiles),
        qps=kube.qps,
        burst=kube.burst,
        lease=f"{le.resource_namespace}/{le.resource_name}" if le.leader_elect else None,
        pid=os.getpid(),
        decision_workers=count,
    )

    async def schedule() -> None:
        try:
            await lead_or_wait()
        finally:
            reporter.close()  # binds are drained: the reporter may finish once its queue is written

    async def lead_or_wait() -> None:
        """Without leader election: schedule. With it: schedule during each term; on losing the lease the binds
        not yet sent are dropped at once (``stop_binding``), then this replica is a clean standby contending
        again (kube-scheduler exits instead; our informers stay warm and the queue keeps every pending pod)."""
        if not le.leader_elect:
            runtime.leadership = "leader"
            await scheduler.run(runtime.stopping)
            return
        lease = LeaseConfig(
            le.resource_namespace, le.resource_name, identity, le.lease_duration, le.renew_deadline, le.retry_period
        )
        lease_api = await make_lease_client(kube, lease)  # own pool, rate limit and timeout, as kube-scheduler
        try:
            elector = LeaderElector(lease_api, lease, registry=runtime.registry)

            def on_change(leading: bool) -> None:
                runtime.leadership = "leader" if leading else "standby"
                if not leading:
                    scheduler.stop_binding()

            elector.on_change = on_change
            elector.on_renew = writer.renew  # writes queued in the writer process may leave until the new deadline
            runtime.leadership = "standby"
            await elector.run(lambda: scheduler.run(runtime.stopping, elector.term), runtime.stopping)
        finally:
            await lease_api.close()

    await writer.start()
    if deciders is not None:
        await deciders.start()  # on every replica: a standby's workers follow its cache, warm for its term
    try:
        return await runtime.run(
            scheduler.run_informers(runtime.stopping),
            reporter.run(runtime.stopping),
            schedule(),
            # a plugin's loop may end at once with nothing to watch (PodTopologySpread without default
            # constraints): that must not stop the service
            *(
                until_stopped(w.run(runtime.stopping), runtime.stopping)
                for profile in profiles.values()
                for w in profile.workers
            ),
            grace=20.0,
        )
    finally:
        if deciders is not None:
            await deciders.close()
        await writer.close()  # after the reporter: the events of the last binds are written
        await api.close()


if __name__ == "__main__":
    sys.exit(main())
