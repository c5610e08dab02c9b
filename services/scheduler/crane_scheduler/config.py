"""The scheduler's configuration file: a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) subset.

Operators already know this format, so a kube-scheduler profile moves over by changing ``schedulerName``. What
we honour: ``profiles[]`` (schedulerName, plugins per extension point with enabled/disabled/weight, pluginConfig,
percentageOfNodesToScore), the global ``percentageOfNodesToScore``, ``podInitialBackoffSeconds``,
``podMaxBackoffSeconds``, ``clientConnection`` (kubeconfig, qps, burst) and ``leaderElection``. Unknown fields
are errors, not silently ignored. Validation collects every problem, each naming its field path
(``profiles[0].plugins.score.enabled[1].weight: must be >= 0``), and the scheduler refuses to start.

The lease defaults to ``kube-system/crane-scheduler``; ``kube-system/kube-scheduler`` is refused, because taking
the default scheduler's lease stops it (upstream crane's shipped manifest did exactly that).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from crane_shared.durations import DurationError, parse_duration

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"
DEFAULT_SCHEDULER_NAME = "crane-scheduler"
PLUGIN_SET_KEYS = (
    "multiPoint",
    "queueSort",
    "preEnqueue",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
)
_IGNORED_TOP_LEVEL = {"parallelism", "enableProfiling", "enableContentionProfiling", "delayCacheUntilActive"}


class ConfigError(ValueError):
    """Every problem found in a configuration, one ``<field path>: <message>`` line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid scheduler configuration:\n  " + "\n  ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class PluginRef:
    name: str
    weight: int | None = None


@dataclass(frozen=True)
class PluginSet:
    enabled: tuple[PluginRef, ...] = ()
    disabled: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProfileConfig:
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    plugins: Mapping[str, PluginSet] = field(default_factory=dict)
    plugin_config: Mapping[str, tuple[int, Mapping[str, Any]]] = field(default_factory=dict)  # name -> (index, args)
    percentage_of_nodes_to_score: int | None = None


@dataclass(frozen=True)
class LeaderElectionConfig:
    leader_elect: bool = True
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    resource_name: str = DEFAULT_SCHEDULER_NAME
    resource_namespace: str = "kube-system"


@dataclass(frozen=True)
class SchedulerConfig:
    profiles: tuple[ProfileConfig, ...] = (ProfileConfig(),)
    percentage_of_nodes_to_score: int = 0
    pod_initial_backoff: float = 1.0
    pod_max_backoff: float = 10.0
    kubeconfig: str | None = None
    qps: float | None = None  # None: the command-line flag decides
    burst: int | None = None
    leader_election: LeaderElectionConfig = LeaderElectionConfig()


class _Checker:
    """Collects problems while reading untyped YAML."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def mapping(self, value: Any, path: str, known: set[str]) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(path, "must be a mapping")
            return {}
        for key in value:
            if key not in known:
                self.add(f"{path}.{key}" if path else str(key), "unknown field")
        return value

    def sequence(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(path, "must be a list")
            return []
        return value

    def named(self, value: Any, path: str, known: set[str]) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
        """The entries of a list of mappings with a required ``name``, as (index, name, entry); an entry without
        a name is a problem and skipped."""
        for i, item in enumerate(self.sequence(value, path)):
            entry = self.mapping(item, f"{path}[{i}]", known)
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                self.add(f"{path}[{i}].name", "required")
                continue
            yield i, name, entry

    def integer(self, value: Any, path: str, lo: int | None = None, hi: int | None = None) -> int | None:
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            self.add(path, f"must be an integer, got {value!r}")
            return None
        if lo is not None and hi is not None and not lo <= value <= hi:
            self.add(path, f"must be in range [{lo}, {hi}], got {value}")
            return None
        if lo is not None and value < lo:
            self.add(path, f"must be >= {lo}, got {value}")
            return None
        return value

    def number(self, value: Any, path: str) -> float | None:
        if value is None:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool):
            self.add(path, f"must be a number, got {value!r}")
            return None
        return float(value)

    def duration(self, value: Any, path: str, default: float) -> float:
        if value is None:
            return default
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration(str(value)).total_seconds()
            except DurationError as err:
                self.add(path, str(err))
                return default
        if seconds <= 0:
            self.add(path, "must be greater than 0")
            return default
        return seconds


def parse_config(data: Any) -> SchedulerConfig:
    """A validated ``SchedulerConfig`` from parsed YAML; raises ``ConfigError`` listing every problem.

    Plugin names, extension points and plugin args are checked later, against the plugin registry, by
    ``profile.build_profiles``."""
    c = _Checker()
    top_known = {
        "apiVersion",
        "kind",
        "profiles",
        "percentageOfNodesToScore",
        "podInitialBackoffSeconds",
        "podMaxBackoffSeconds",
        "clientConnection",
        "leaderElection",
        *_IGNORED_TOP_LEVEL,
    }
    top = c.mapping(data, "", top_known)
    if top.get("apiVersion", API_VERSION) != API_VERSION:
        c.add("apiVersion", f"must be {API_VERSION}, got {top.get('apiVersion')!r}")
    if top.get("kind", KIND) != KIND:
        c.add("kind", f"must be {KIND}, got {top.get('kind')!r}")
    if "parallelism" in top:
        c.integer(top["parallelism"], "parallelism", lo=1)
    pct = c.integer(top.get("percentageOfNodesToScore"), "percentageOfNodesToScore", 0, 100)
    initial = c.integer(top.get("podInitialBackoffSeconds"), "podInitialBackoffSeconds", lo=1)
    maximum = c.integer(top.get("podMaxBackoffSeconds"), "podMaxBackoffSeconds", lo=1)
    if initial is not None and maximum is not None and maximum < initial:
        c.add("podMaxBackoffSeconds", f"must be >= podInitialBackoffSeconds ({initial}), got {maximum}")

    conn = c.mapping(
        top.get("clientConnection"),
        "clientConnection",
        {"kubeconfig", "qps", "burst", "contentType", "acceptContentTypes"},
    )
    qps = c.number(conn.get("qps"), "clientConnection.qps")
    if qps is not None and qps < 0:
        c.add("clientConnection.qps", f"must be >= 0, got {qps:g}")
    burst = c.integer(conn.get("burst"), "clientConnection.burst", lo=1)

    leader = _leader_election(c, top.get("leaderElection"))

    profiles: list[ProfileConfig] = []
    raw_profiles = c.sequence(top.get("profiles"), "profiles")
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_profiles):
        profile = _profile(c, raw, f"profiles[{i}]")
        if profile.scheduler_name in seen:
            c.add(
                f"profiles[{i}].schedulerName",
                f"duplicate {profile.scheduler_name!r} (also profiles[{seen[profile.scheduler_name]}])",
            )
        seen.setdefault(profile.scheduler_name, i)
        profiles.append(profile)
    if c.problems:
        raise ConfigError(c.problems)
    return SchedulerConfig(
        profiles=tuple(profiles) or (ProfileConfig(),),
        percentage_of_nodes_to_score=pct or 0,
        pod_initial_backoff=float(initial or 1),
        pod_max_backoff=float(maximum or 10),
        kubeconfig=conn.get("kubeconfig") or None,
        qps=qps,
        burst=burst,
        leader_election=leader,
    )


def _leader_election(c: _Checker, raw: Any) -> LeaderElectionConfig:
    p = "leaderElection"
    le = c.mapping(
        raw,
        p,
        {
            "leaderElect",
            "leaseDuration",
            "renewDeadline",
            "retryPeriod",
            "resourceLock",
            "resourceName",
            "resourceNamespace",
        },
    )
    d = LeaderElectionConfig()
    elect = le.get("leaderElect", True)
    if not isinstance(elect, bool):
        c.add(f"{p}.leaderElect", f"must be true or false, got {elect!r}")
        elect = True
    if le.get("resourceLock", "leases") != "leases":
        c.add(f"{p}.resourceLock", f"only 'leases' is supported, got {le.get('resourceLock')!r}")
    lease = c.duration(le.get("leaseDuration"), f"{p}.leaseDuration", d.lease_duration)
    renew = c.duration(le.get("renewDeadline"), f"{p}.renewDeadline", d.renew_deadline)
    retry = c.duration(le.get("retryPeriod"), f"{p}.retryPeriod", d.retry_period)
    if lease <= renew:
        c.add(f"{p}.leaseDuration", f"must be greater than renewDeadline ({renew:g}s), got {lease:g}s")
    if renew <= 1.2 * retry:
        c.add(f"{p}.renewDeadline", f"must be greater than 1.2 x retryPeriod ({retry:g}s), got {renew:g}s")
    name = le.get("resourceName", d.resource_name)
    namespace = le.get("resourceNamespace", d.resource_namespace)
    for key, value in (("resourceName", name), ("resourceNamespace", namespace)):
        if not isinstance(value, str) or not value:
            c.add(f"{p}.{key}", "must be a non-empty string")
    if (namespace, name) == ("kube-system", "kube-scheduler"):
        c.add(
            f"{p}.resourceName",
            "kube-system/kube-scheduler is the default scheduler's lease; taking it would stop kube-scheduler "
            "(use e.g. crane-scheduler)",
        )
    return LeaderElectionConfig(elect, lease, renew, retry, str(name), str(namespace))


def _profile(c: _Checker, raw: Any, p: str) -> ProfileConfig:
    prof = c.mapping(raw, p, {"schedulerName", "plugins", "pluginConfig", "percentageOfNodesToScore"})
    name = prof.get("schedulerName")
    if not isinstance(name, str) or not name:
        c.add(f"{p}.schedulerName", "required")
        name = ""
    pct = c.integer(prof.get("percentageOfNodesToScore"), f"{p}.percentageOfNodesToScore", 0, 100)
    plugins_raw = c.mapping(prof.get("plugins"), f"{p}.plugins", set(PLUGIN_SET_KEYS))
    plugins = {
        point: _plugin_set(c, plugins_raw[point], f"{p}.plugins.{point}", point)
        for point in PLUGIN_SET_KEYS
        if point in plugins_raw
    }
    plugin_config: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for j, pname, e in c.named(prof.get("pluginConfig"), f"{p}.pluginConfig", {"name", "args"}):
        if pname in plugin_config:
            c.add(f"{p}.pluginConfig[{j}].name", f"duplicate plugin {pname!r}")
            continue
        args = e.get("args") or {}
        if not isinstance(args, Mapping):
            c.add(f"{p}.pluginConfig[{j}].args", "must be a mapping")
            args = {}
        plugin_config[pname] = (j, dict(args))
    return ProfileConfig(name, plugins, plugin_config, pct)


def _plugin_set(c: _Checker, raw: Any, p: str, point: str) -> PluginSet:
    ps = c.mapping(raw, p, {"enabled", "disabled"})
    enabled: list[PluginRef] = []
    names: set[str] = set()
    for k, name, e in c.named(ps.get("enabled"), f"{p}.enabled", {"name", "weight"}):
        if name in names:
            c.add(f"{p}.enabled[{k}].name", f"plugin {name!r} enabled twice")
        names.add(name)
        weight = None
        if "weight" in e:
            if point not in ("score", "multiPoint"):
                c.add(f"{p}.enabled[{k}].weight", "only score plugins take a weight")
            weight = c.integer(e["weight"], f"{p}.enabled[{k}].weight", lo=0)
        enabled.append(PluginRef(name, weight))
    disabled = tuple(name for _, name, _ in c.named(ps.get("disabled"), f"{p}.disabled", {"name"}))
    return PluginSet(tuple(enabled), disabled)


def load_config(path: str | Path | None) -> SchedulerConfig:
    """Read and validate the file; no file means the default profile ``crane-scheduler``."""
    if path is None:
        return SchedulerConfig()
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ConfigError([f"{path}: {err.strerror}"]) from err
    except yaml.YAMLError as err:
        raise ConfigError([f"{path}: not valid YAML: {err}"]) from err
    return parse_config(data)
