"""Metric rounds: one instant query per due metric for all nodes, one merge patch per node.

Upstream queried per node and per metric (up to three queries each: IP, IP:port, name) with one worker; at 1000
nodes a round outlasted the sync period. Here a round costs one PromQL request per due metric however many nodes
there are, the answer is mapped to nodes in memory (``matching``), and each node gets one patch carrying every
due metric plus its current hot value. Rounds run one after another (``schedule``), so they never overlap.

With batch capacity (``spec.reclaim.batchMetrics``), a due metric's batch share is queried in the same round,
concurrently, and written in the same patch with the same timestamp (``batch.crane.io/<metric>``), only for the
nodes the metric itself has in this round: readers take it out of the metric only when the two timestamps match,
so a share whose query failed is never paired with a newer metric. Its failure does not fail the metric.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from crane_annotator import schedule
from crane_annotator.batchround import BatchCapacity
from crane_annotator.matching import (
    AddressIndex,
    MatchResult,
    NodeAddresses,
    Series,
    address_index,
    match_series,
)
from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.patches import DEFAULT_STAMP, Stamp, metric_annotations
from crane_annotator.values import Converted, DropReason, convert
from crane_annotator.writer import HotSupplier, Patcher, PatchReport
from crane_shared.batch import batch_metric_key
from crane_shared.durations import format_duration
from crane_shared.logs import LogOnce, get_logger
from crane_shared.prometheus import PrometheusError, QueryClient, QueryResult
from crane_shared.retry import sleep_unless
from crane_shared.settings import PartialResponse

log = get_logger("crane.annotator.rounds")

LOGGED_NAMES = 20


@dataclass(frozen=True)
class MetricSpec:
    name: str
    """metric name in Prometheus (also the PromQL query)"""
    key: str
    """annotation key it is written under"""
    period: float
    """sync period, seconds"""

    @property
    def period_label(self) -> str:
        return format_duration(timedelta(seconds=self.period))


@dataclass
class RoundReport:
    metrics: tuple[str, ...]
    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    queries: int = 0
    patches: PatchReport = field(default_factory=PatchReport)
    duration: float = 0.0
    query_seconds: float = 0.0
    patch_seconds: float = 0.0
    matched: dict[str, int] = field(default_factory=dict)
    batch_written: int = 0
    """``nodes/status`` patches of the batch capacity (``spec.reclaim``)"""

    def outcome(self) -> tuple[list[str], list[str]]:
        """(synced, to retry soon): a metric whose query matched no node wrote nothing, like a failed one, so it is
        retried before its period. That is the case of a stack that has just started (Prometheus's recording rules
        not evaluated yet, nodes not registered yet): without it the first annotations would wait a whole period
        (3 h for the 1-day metrics of the default policy)."""
        synced = [m for m in self.succeeded if self.matched.get(m, 0) > 0]
        return synced, [*self.failed, *(m for m in self.succeeded if self.matched.get(m, 0) == 0)]


@dataclass
class MetricView:
    """What the last query of a metric gave, kept for the debug endpoint and the unmatched log."""

    result: MatchResult
    dropped: dict[str, DropReason]
    at: float


class MetricRounds:
    def __init__(
        self,
        specs: Sequence[MetricSpec],
        prometheus: QueryClient,
        nodes: Callable[[], Mapping[str, NodeAddresses]],
        patcher: Patcher,
        metrics: AnnotatorMetrics,
        *,
        hot: HotSupplier | None = None,
        refresh_hot: Callable[[Sequence[str]], Awaitable[object]] | None = None,
        batch: BatchCapacity | None = None,
        instance_label: str = "instance",
        stamp: Stamp = DEFAULT_STAMP,
        retry_base: float = 5.0,
        partial_response: PartialResponse = "reject",
        latency_offset: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.specs = {s.name: s for s in specs}
        self._prometheus = prometheus
        self._nodes = nodes
        self._patcher = patcher
        self._metrics = metrics
        self._hot = hot
        self._refresh_hot = refresh_hot
        self.batch = batch
        self._label = instance_label
        self._stamp = stamp
        self._retry_base = retry_base
        self._partial_response = partial_response
        self._latency_offset = latency_offset
        self._clock = clock
        self._wall_clock = wall_clock
        self._index: tuple[frozenset[NodeAddresses], AddressIndex] | None = None
        self._log_once = LogOnce(log)
        self.views: dict[str, MetricView] = {}
        self.last_success: dict[str, float] = dict.fromkeys(self.specs, 0.0)
        self.first_round_done = asyncio.Event()
        """set after the first round, which wrote every node's hot value along with its metrics"""
        self.after_round: Callable[[], None] = lambda: None
        """told after every round (the load taint counts new samples)"""

    async def run(self, stopping: asyncio.Event) -> None:
        """Rounds until ``stopping``, each with the metrics due at its start (see ``schedule``); a round under
        way finishes first (its patches stop at the writer once the term is over)."""
        plan = schedule.start({s.name: s.period for s in self.specs.values()}, self._clock())
        while not stopping.is_set():
            now = self._clock()
            due = schedule.due(plan, now)
            if not due:
                await sleep_unless(stopping, schedule.wake_at(plan) - now)
                continue
            report = await self.run_round(due)
            synced, retried = report.outcome()
            plan = schedule.after_round(plan, now, self._clock(), synced, retried, retry_base=self._retry_base)

    async def run_round(self, due: Sequence[str]) -> RoundReport:
        """Query, match, patch. Off the patch path: each metric's answer is matched as soon as it arrives (while
        the other queries are still out), and hot values the writer lacks are counted meanwhile too."""
        started = self._clock()
        report = RoundReport(tuple(due))
        nodes = self._nodes()
        index = self._address_index(nodes)
        hot = asyncio.ensure_future(_best_effort(self._refresh_hot(list(nodes)))) if self._refresh_hot else None
        batch = self.batch
        if batch is not None:
            batch.reload()
        measuring = asyncio.ensure_future(batch.measure()) if batch is not None and batch.wants(due) else None
        shares = batch.shares_of(due) if batch is not None else {}
        try:
            answers = await asyncio.gather(
                *(self._query_and_match(name, index, nodes, report) for name in (*due, *shares.values()))
            )
            results, share_results = answers[: len(due)], dict(zip(shares, answers[len(due) :], strict=True))
            pods_measured = await measuring if measuring is not None else False
        except BaseException:
            for task in (hot, measuring):
                if task is not None:
                    task.cancel()
            raise
        if hot is not None:
            await hot
        report.query_seconds = self._clock() - started
        at = self._wall_clock()
        # The backend answers as of now minus its latency offset (VictoriaMetrics hides the newest 30 s): stamped
        # that much older, the values show their real age to every freshness check.
        stamped = at - self._latency_offset
        values: dict[str, dict[str, float]] = {}
        for name, result in zip(due, results, strict=True):
            if result is None:
                report.failed.append(name)
                continue
            report.succeeded.append(name)
            self.last_success[name] = at
            self.views[name] = MetricView(result[0], result[1].dropped, at)
            values[self.specs[name].key] = result[1].fractions
            share = share_results.get(name)
            if share is not None:  # the batch pods' share of this metric, for the nodes the metric has this round
                values[batch_metric_key(name)] = {
                    node: value for node, value in share[1].fractions.items() if node in result[1].fractions
                }
        self._metrics.prometheus_up.set(1 if results and all(r is not None for r in results) else 0)
        patches = metric_annotations(values, datetime.fromtimestamp(stamped, UTC), self._stamp)
        if batch is not None:
            batch.record(values, pods_measured, stamped)
            if pods_measured:  # on the patches the round sends anyway: no node gets a patch for these alone
                for node, extra in batch.annotations(patches, datetime.fromtimestamp(stamped, UTC)).items():
                    patches[node].update(extra)
        patching = self._clock()
        report.patches = await self._patcher.patch_many(patches, hot=self._hot)
        if batch is not None:
            published = await batch.publish()
            report.batch_written = len(published.written)
        report.patch_seconds = self._clock() - patching
        report.duration = self._clock() - started
        self._record(report)
        self.first_round_done.set()
        self.after_round()
        return report

    async def _query_and_match(
        self, name: str, index: AddressIndex, nodes: Mapping[str, NodeAddresses], report: RoundReport
    ) -> tuple[MatchResult, Converted] | None:
        series = await self._query(name, report)
        return None if series is None else self._digest(name, series, index, nodes, report)

    async def _query(self, name: str, report: RoundReport) -> list[Series] | None:
        try:
            result = await self._prometheus.query(name)
        except PrometheusError as err:
            report.queries += err.attempts
            self._metrics.queries.labels(name).inc(err.attempts)
            self._metrics.prometheus_errors.labels(name, err.kind).inc(err.attempts)
            self._log_once.warning(
                f"query-{name}-{err.kind}", "query failed", metric=name, error_kind=err.kind, error=str(err)
            )
            return None
        report.queries += result.attempts
        self._metrics.queries.labels(name).inc(result.attempts)
        if result.attempts > 1:
            self._metrics.prometheus_errors.labels(name, "retried").inc(result.attempts - 1)
        return self._screen(name, result)

    def _screen(self, name: str, result: QueryResult) -> list[Series] | None:
        """What an answer may change. Warnings and infos are counted and logged once; a partial answer (some
        store did not answer) never erases a value, as no answer does: nodes missing from it keep their last
        good one. With ``--prometheus-partial-response=reject`` it updates no node either (the metric is
        retried soon, like a failed query); with ``accept`` the nodes present in it are updated."""
        for kind, messages in (("warning", result.warnings), ("info", result.infos)):
            if messages:
                self._metrics.query_warnings.labels(name, kind).inc(len(messages))
                self._log_once.warning(
                    f"query-{kind}-{name}", f"Prometheus answered with {kind}s", metric=name, messages=messages[:3]
                )
        if not result.partial:
            return result.series
        handling = self._partial_response
        self._metrics.partial_responses.labels(name, "rejected" if handling == "reject" else "accepted").inc()
        self._log_once.warning(
            f"partial-{name}",
            "partial answer: some of the backend's stores did not answer; nodes missing from it keep their last "
            + (
                "value, and no node is updated from it (--prometheus-partial-response=reject)"
                if handling == "reject"
                else "value; the others are updated (--prometheus-partial-response=accept)"
            ),
            metric=name,
            series=len(result.series),
            warnings=result.warnings[:3],
        )
        return None if handling == "reject" else result.series

    def _address_index(self, nodes: Mapping[str, NodeAddresses]) -> AddressIndex:
        key = frozenset(nodes.values())
        if self._index is None or self._index[0] != key:
            self._index = (key, address_index(nodes.values()))
        return self._index[1]

    def _digest(
        self,
        name: str,
        series: Sequence[Series],
        index: AddressIndex,
        nodes: Mapping[str, NodeAddresses],
        report: RoundReport,
    ) -> tuple[MatchResult, Converted]:
        result = match_series(series, index, self._label)
        chosen = {n: m for n, m in result.chosen.items() if n in nodes}
        converted = convert(chosen)
        for reason in converted.dropped.values():
            self._metrics.values_dropped.labels(name, reason).inc()
        unmatched_nodes = sorted(set(nodes) - set(chosen))
        report.matched[name] = len(chosen)
        self._metrics.nodes_matched.labels(name).set(len(chosen))
        self._metrics.nodes_unmatched.labels(name).set(len(unmatched_nodes))
        self._metrics.series_unmatched.labels(name).set(len(result.unmatched_instances))
        several = sorted(n for n in result.shadowed if n in nodes)
        self._metrics.nodes_with_several_series.labels(name).set(len(several))
        if several:
            first = several[0]
            self._log_once.warning(
                f"several-series-{name}",
                "several series for one node (HA replicas without deduplication, two scrape jobs?): the best "
                "match is kept, then the highest value (see the matching rules); Thanos: dedup=true with "
                "--query.replica-label",
                metric=name,
                nodes=len(several),
                example_node=first,
                chosen=result.chosen[first].instance,
                others=[m.instance for m in result.shadowed[first][:3]],
            )
        if not series:
            self._log_once.warning(
                f"no-series:{name}",
                "Prometheus has no series for this metric: are the recording rules loaded?",
                metric=name,
            )
        elif unmatched_nodes:
            self._log_unmatched(name, unmatched_nodes, result, series)
        return result, converted

    def _log_unmatched(
        self, name: str, unmatched_nodes: list[str], result: MatchResult, series: Sequence[Series]
    ) -> None:
        seen = result.unmatched_instances or tuple(sorted({s.labels.get(self._label, "") for s in series}))
        self._log_once.warning(
            "unmatched-nodes",
            "nodes without a Prometheus series: their load is not annotated. The series' "
            f"'{self._label}' label must be the node's InternalIP, IP:port, hostname or node name "
            "(see --instance-label)",
            metric=name,
            unmatched_nodes=unmatched_nodes[:LOGGED_NAMES],
            unmatched_count=len(unmatched_nodes),
            instance_labels_seen=list(seen[:LOGGED_NAMES]),
            instance_labels_unmatched=len(result.unmatched_instances),
            series_without_label=result.without_label,
        )

    def _record(self, report: RoundReport) -> None:
        patches = self._metrics.patches
        patches.labels("metrics", "ok").inc(len(report.patches.ok))
        patches.labels("metrics", "missing").inc(len(report.patches.missing))
        patches.labels("metrics", "error").inc(len(report.patches.failed))
        for period in sorted({self.specs[m].period_label for m in report.metrics}):
            self._metrics.round_duration.labels(period).observe(report.duration)
            self._metrics.round_queries.labels(period).set(report.queries)
            self._metrics.round_patches.labels(period).set(report.patches.sent)
        for name in report.succeeded:
            self._metrics.last_success.labels(name).set(self.last_success[name])
        log.info(
            "round done",
            metrics=list(report.metrics),
            failed=report.failed,
            queries=report.queries,
            patches=report.patches.sent,
            batch_status_patches=report.batch_written,
            patch_errors=len(report.patches.failed),
            seconds=round(report.duration, 3),
            query_seconds=round(report.query_seconds, 3),
            patch_seconds=round(report.patch_seconds, 3),
        )


async def _best_effort(awaitable: Awaitable[object]) -> None:
    """Await a refresh whose failure must not stop the round (the writer then uses the last known value)."""
    try:
        await awaitable
    except Exception as err:
        log.warning("hot value refresh before patching failed; using the last known values", error=str(err))
