"""A real Prometheus for tests and the sandbox: config, recording rules, history backfill, and queries.

Prometheus runs from the Debian package as a ``ManagedProcess``. History for the ``*_max_avg_1h|1d`` rules
comes from ``backfill`` (``promtool tsdb create-blocks-from openmetrics``) before Prometheus starts, so those
metrics can be tested in seconds instead of hours.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import aiohttp
import yaml

from crane_sandbox.procs import ManagedProcess, Server, StartupError, free_port

RulesVariant = Literal["upstream", "fast"]
PROMETHEUS_BIN = "/usr/bin/prometheus"
PROMTOOL_BIN = "/usr/bin/promtool"
SCRAPE_JOB = "fleet"


def rules_path(variant: RulesVariant) -> Path:
    """The recording-rules file shipped with the package (wheel) or lying in the source tree."""
    here = Path(__file__).resolve().parent
    name = f"rules-{variant}.yml"
    for candidate in (here / "prometheus" / name, here.parent / "prometheus" / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"recording rules {name} not found next to {here}")


class Sample(NamedTuple):
    """One element of an instant-query result."""

    labels: dict[str, str]
    value: float


class PrometheusError(RuntimeError):
    """Prometheus answered a query with an error (bad PromQL, timeout)."""


def render_config(
    targets: Sequence[tuple[str, str]],
    rules_file: Path,
    *,
    scrape_interval: str = "1s",
    evaluation_interval: str = "1s",
    external_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """prometheus.yml for scraping exporter shards.

    ``honor_labels`` keeps the exporter's ``instance`` (the node) rather than renaming it
    ``exported_instance``. Each shard is its own target group with its own ``__metrics_path__`` and a distinct
    target ``instance`` (address + path): shards share one address, and without distinct labels their ``up``
    series would collide.
    """
    groups = [
        {"targets": [address], "labels": {"__metrics_path__": path, "instance": f"{address}{path}"}}
        for address, path in targets
    ]
    settings: dict[str, Any] = {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval}
    if external_labels:
        settings["external_labels"] = dict(external_labels)  # an HA replica's identity, as Thanos requires
    return {
        "global": settings,
        "rule_files": [str(rules_file)],
        "scrape_configs": [
            {
                "job_name": SCRAPE_JOB,
                "honor_labels": True,
                "scrape_timeout": scrape_interval,
                "static_configs": groups,
            }
        ],
    }


class PrometheusServer(Server):
    """One Prometheus process on a free loopback port, logging into ``run_dir``."""

    def __init__(
        self,
        run_dir: Path,
        targets: Sequence[tuple[str, str]] = (),
        *,
        rules: RulesVariant | Path = "fast",
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        data_dir: Path | None = None,
        port: int | None = None,
        retention: str = "15d",
        binary: str = PROMETHEUS_BIN,
        external_labels: Mapping[str, str] | None = None,
        name: str = "prometheus",
    ) -> None:
        self.run_dir = run_dir
        self.targets = list(targets)
        self.rules_file = rules if isinstance(rules, Path) else rules_path(rules)
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.external_labels = dict(external_labels or {})
        self.data_dir = data_dir or run_dir / f"{name}-data"
        self.config_path = run_dir / f"{name}.yml"
        self.port = port or free_port()
        self.process = ManagedProcess(
            name=name,
            argv=[
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.data_dir}",
                f"--storage.tsdb.retention.time={retention}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            log_path=run_dir / f"{name}.log",
        )
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_config(self) -> None:
        config = render_config(
            self.targets,
            self.rules_file,
            scrape_interval=self.scrape_interval,
            evaluation_interval=self.evaluation_interval,
            external_labels=self.external_labels,
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    async def start(self, timeout: float = 30.0) -> None:
        self.write_config()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        await self.process.start()
        await self.process.wait_ready(self._ready, timeout=timeout)

    async def stop(self) -> None:
        await self.process.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def set_targets(self, targets: Sequence[tuple[str, str]]) -> None:
        """Rewrite the config and hot-reload it (the fleet grew, an exporter moved)."""
        self.targets = list(targets)
        self.write_config()
        async with self._http.post(f"{self.url}/-/reload") as resp:
            if resp.status != 200:
                raise PrometheusError(f"reload failed: {resp.status} {await resp.text()}")

    async def query(self, promql: str) -> list[Sample]:
        """Instant query; vectors give one Sample per series, a scalar gives one Sample without labels."""
        async with self._http.get(f"{self.url}/api/v1/query", params={"query": promql}) as resp:
            body = await resp.json(content_type=None)
        return parse_query_response(body)

    async def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[Sample]], bool],
        timeout: float = 30.0,
        interval: float = 0.25,
    ) -> list[Sample]:
        """Poll ``promql`` until ``predicate`` holds on its result; the timeout names the last result seen."""
        deadline = time.monotonic() + timeout
        last: list[Sample] | str = "no answer"
        while True:
            try:
                result = await self.query(promql)
            except (aiohttp.ClientError, PrometheusError) as e:
                last = repr(e)
            else:
                if predicate(result):
                    return result
                last = result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{promql!r} did not satisfy the condition in {timeout:.0f}s; last: {last}")
            await asyncio.sleep(interval)

    @property
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("PrometheusServer is not started")
        return self._session

    async def _ready(self) -> bool:
        async with self._http.get(f"{self.url}/-/ready") as resp:
            return resp.status == 200


def parse_query_response(body: Mapping[str, Any]) -> list[Sample]:
    if body.get("status") != "success":
        raise PrometheusError(f"{body.get('errorType')}: {body.get('error')}")
    data = body["data"]
    if data["resultType"] == "vector":
        return [Sample(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]
    if data["resultType"] == "scalar":
        return [Sample({}, float(data["result"][1]))]
    raise PrometheusError(f"unsupported result type {data['resultType']} (use an instant vector)")


# ---------------------------------------------------------------------------------------------- backfill

SeriesHistory = tuple[str, Mapping[str, str], Sequence[tuple[float, float]]]
"""(metric name, labels, [(unix seconds, value)])"""

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics_text(series: Iterable[SeriesHistory]) -> str:
    """Gauges in OpenMetrics text with explicit timestamps, one family per metric name (families must not
    interleave) and samples in time order, as ``promtool tsdb create-blocks-from openmetrics`` requires."""
    families: dict[str, list[str]] = {}
    for name, labels, samples in series:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        bad = [k for k in labels if not _LABEL_NAME.match(k)]
        if bad:
            raise ValueError(f"invalid label names {bad}")
        selector = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        lines = families.setdefault(name, [])
        for ts, value in sorted(samples):
            if not (math.isfinite(ts) and math.isfinite(value)):
                raise ValueError(f"non-finite sample ({ts}, {value}) in {name}")
            lines.append(f"{name}{{{selector}}} {value!r} {ts!r}")
    out: list[str] = []
    for name, lines in families.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"


async def backfill(
    data_dir: Path,
    series: Iterable[SeriesHistory],
    *,
    promtool: str = PROMTOOL_BIN,
    work_dir: Path | None = None,
) -> None:
    """Write history into ``data_dir`` as TSDB blocks. Run it BEFORE Prometheus starts on that directory, keep
    samples older than the server's ``retention`` out (those blocks are deleted at startup), and end the
    history before "now" so it does not overlap the live head."""
    work_dir = work_dir or data_dir.parent
    source = work_dir / "backfill.om"
    # Hours of samples for thousands of nodes are megabytes of text: build and write them off the event loop.
    await asyncio.to_thread(_write_source, source, data_dir, series)
    argv = [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_dir)]
    code, output = await run_tool("promtool-backfill", argv, work_dir / "promtool-backfill.log")
    if code != 0:
        raise StartupError(f"promtool backfill failed:\n{output}")


def _write_source(source: Path, data_dir: Path, series: Iterable[SeriesHistory]) -> None:
    source.parent.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    source.write_text(openmetrics_text(series))


async def check_rules(path: Path, log_dir: Path, *, promtool: str = PROMTOOL_BIN) -> tuple[bool, str]:
    """``promtool check rules``: (ok, output), offline validation of a rules file."""
    code, output = await run_tool("promtool-check", [promtool, "check", "rules", str(path)], log_dir / "promtool.log")
    return code == 0, output


async def run_tool(name: str, argv: Sequence[str], log_path: Path) -> tuple[int, str]:
    """Run a one-shot command as a ManagedProcess; (exit code, end of its log)."""
    proc = ManagedProcess(name=name, argv=argv, log_path=log_path)
    await proc.start()
    assert proc.proc is not None
    code = await proc.proc.wait()
    return code, proc.tail()
