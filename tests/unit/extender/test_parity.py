"""The extender behaves as the in-process Dynamic plugin: DaemonSet pods are not ranked, malformed load
annotations are counted (once per annotation change, not per request) and logged once per metric."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from crane_extender.recent import RecentBindings
from crane_extender.server import Extender, ExtenderMetrics
from crane_shared.bindings import BindingRecord
from crane_shared.informer import Informer
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.logs import LogOnce
from crane_shared.policy import default_policy
from tests.support.extender import names_args, node, nodes_args, pod, usage

T = 1_800_000_000
NOW = datetime.fromtimestamp(T, UTC)
MALFORMED = "crane_extender_malformed_annotations_total"


class Recorder:
    """Stands in for a structlog logger: records warnings."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append(fields)


async def _no_list(**kw: Any) -> Any:
    raise AssertionError("not listed in unit tests")


def extender(clock: list[float], cache: dict[str, Any]) -> tuple[Extender, CollectorRegistry, Recorder]:
    informer = Informer("nodes", _no_list, cache=cache)
    informer.synced.set()
    registry = CollectorRegistry()
    ext = Extender(
        DynamicArgs(default_policy()),
        informer=informer,
        recent=RecentBindings(timedelta(minutes=5)),
        metrics=ExtenderMetrics.create(registry),
        clock=lambda: clock[0],
    )
    log = Recorder()
    ext._once = LogOnce(log)  # type: ignore[arg-type]
    return ext, registry, log


def ask(ext: Extender, verb: str, body: dict[str, Any]) -> Any:
    result, outcome = ext.answer(verb, json.dumps(body).encode())  # type: ignore[arg-type]
    assert outcome == "ok", result
    return result


def fleet() -> list[dict[str, Any]]:
    return [
        node("idle", usage(0.05, now=NOW)),
        node("busy", usage(0.6, now=NOW)),
        node("hot", usage(0.3, hot=4, now=NOW)),
    ]


# --- DaemonSet pods ---------------------------------------------------------------------------------------------


def test_daemonset_pods_get_the_same_priority_on_every_node_in_both_modes() -> None:
    nodes = fleet()
    ext, _, _ = extender([T + 1.0], {n["metadata"]["name"]: n for n in nodes})
    names = [n["metadata"]["name"] for n in nodes]
    for body in (nodes_args, lambda p, _: names_args(p, names)):
        ranked = ask(ext, "prioritize", body(pod(), nodes))
        assert len({h["Score"] for h in ranked}) > 1  # the fleet does rank an ordinary pod
        daemon = ask(ext, "prioritize", body(pod("ds", owner_kind="DaemonSet"), nodes))
        assert daemon == [{"Host": name, "Score": 0} for name in names]
        # and an ordinary pod after it is still ranked from the cached verdicts
        assert ask(ext, "prioritize", body(pod(), nodes)) == ranked


# --- malformed annotations --------------------------------------------------------------------------------------


def broken(name: str, text: str = "not-a-number,2026") -> dict[str, Any]:
    annotations = usage(0.2, now=NOW)
    annotations["cpu_usage_avg_5m"] = text
    annotations["node_hot_value"] = "garbage"
    return node(name, annotations)


def test_malformed_annotations_are_counted_once_per_change_and_logged_once_per_metric() -> None:
    clock = [T + 1.0]
    cache = {"a": broken("a"), "b": broken("b"), "ok": node("ok", usage(0.2, now=NOW))}
    ext, registry, log = extender(clock, cache)

    def count(metric: str) -> float:
        return registry.get_sample_value(MALFORMED, {"metric": metric}) or 0.0

    req = names_args(pod(), ["a", "b", "ok"])
    for _ in range(3):
        for verb in ("filter", "prioritize"):
            result = ask(ext, verb, req)
        clock[0] += 400  # past every freshness edge: the loads are recomputed, the annotations are the same
        assert ext.recent is not None
        ext.recent.add(BindingRecord(f"u{clock[0]}", "ns", "p", "a", clock[0] - 1, "default-scheduler"), now=clock[0])
    assert [h["Host"] for h in result] == ["a", "b", "ok"]  # malformed readings are skipped, not fatal
    assert count("cpu_usage_avg_5m") == 2 and count("node_hot_value") == 2
    assert count("mem_usage_avg_5m") == 0
    assert sorted(e["metric"] for e in log.events) == ["cpu_usage_avg_5m", "node_hot_value"]

    cache["a"] = broken("a", "still,broken")  # a new malformed text is a new occurrence
    ask(ext, "filter", req)
    assert count("cpu_usage_avg_5m") == 3 and count("node_hot_value") == 3
    assert len(log.events) == 2

    # nodes sent in the request (no node cache) count the same way: once per change of their texts
    for _ in range(2):
        ask(ext, "filter", nodes_args(pod(), [broken("c")]))
    assert count("cpu_usage_avg_5m") == 4
