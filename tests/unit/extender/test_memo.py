"""Node loads reused across requests: the same answers as computing every node afresh, at any time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from crane_extender.protocol import Decide, filter_nodes, parse_args, prioritize_nodes
from crane_extender.recent import RecentBindings
from crane_extender.server import Extender, ExtenderMetrics
from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.batch import BATCH_CPU_USAGE_KEY, BATCH_MEMORY_USAGE_KEY
from crane_shared.bindings import BindingRecord
from crane_shared.informer import Informer
from crane_shared.loadaware.dynamic import DynamicArgs, NodeCapacity, RecentBinding, node_load, valid_until
from crane_shared.policy import default_policy
from tests.support.extender import names_args, node, nodes_args, pod, usage
from tests.support.policy import UPSTREAM_METRICS as METRICS

ARGS = DynamicArgs(default_policy())
T = 1_800_000_000  # a whole second


hot_texts = st.one_of(st.none(), st.just("garbage"), st.integers(min_value=-400, max_value=400))


@settings(max_examples=400, deadline=None)
@given(
    ages=st.lists(st.one_of(st.none(), st.integers(min_value=-120, max_value=4 * 3600)), min_size=6, max_size=6),
    hot_age=hot_texts,
    bindings=st.lists(st.floats(min_value=-400, max_value=5), max_size=6),
    later=st.lists(st.floats(min_value=0, max_value=5 * 3600), min_size=1, max_size=8),
    batch_age=hot_texts,
    regular=st.booleans(),
)
def test_a_memoized_load_equals_node_load_at_every_time_until_it_expires(
    ages: list[int | None],
    hot_age: int | str | None,
    bindings: list[float],
    later: list[float],
    batch_age: int | str | None,
    regular: bool,
) -> None:
    t0 = T + 0.5
    at0 = datetime.fromtimestamp(t0, UTC)
    annotations = {
        m: encode_usage(0.5, at0 - timedelta(seconds=age))
        for m, age in zip(METRICS, ages, strict=True)
        if age is not None
    }
    if isinstance(hot_age, int):
        annotations["node_hot_value"] = encode_hot_value(1, at0 - timedelta(seconds=hot_age))
    elif hot_age is not None:
        annotations["node_hot_value"] = hot_age
    if isinstance(batch_age, int):  # the batch pods' usage: a regular pod's load changes when it turns stale
        annotations[BATCH_CPU_USAGE_KEY] = encode_usage(0.3, at0 - timedelta(seconds=batch_age))
    elif batch_age is not None:
        annotations[BATCH_MEMORY_USAGE_KEY] = batch_age
    recent = tuple(RecentBinding("n", t0 + offset, cpu=1) for offset in bindings)
    capacity = NodeCapacity(8, 2**34)
    first = node_load("n", annotations, ARGS, at0, recent, capacity, regular=regular)
    until = valid_until(first, annotations, ARGS, recent, t0)
    assert until > t0
    for dt in later:
        t = t0 + dt
        if t < until:
            at = datetime.fromtimestamp(t, UTC)
            assert node_load("n", annotations, ARGS, at, recent, capacity, regular=regular) == first


async def _no_list(**kw: Any) -> Any:
    raise AssertionError("not listed in unit tests")


def extender(clock: list[float], cache: dict[str, Any] | None = None) -> Extender:
    informer = Informer("nodes", _no_list, cache=cache or {})
    informer.synced.set()
    return Extender(
        ARGS,
        informer=informer,
        recent=RecentBindings(timedelta(minutes=5)),
        metrics=ExtenderMetrics.create(CollectorRegistry()),
        clock=lambda: clock[0],
    )


def fresh_fleet(now: datetime, n: int = 30) -> list[dict[str, Any]]:
    return [node(f"n{i}", usage({m: (i * 37 % 100) / 100 for m in METRICS}, now=now)) for i in range(n)]


def test_memoized_answers_equal_direct_computation() -> None:
    clock = [T + 0.25]
    fleet = fresh_fleet(datetime.fromtimestamp(T, UTC))
    ext = extender(clock)
    body = parse_args(nodes_args(pod(), fleet))
    direct = Decide(ARGS, datetime.fromtimestamp(clock[0], UTC))
    for _ in range(2):  # second round from the memo
        assert filter_nodes(body, ext.decide(clock[0])) == filter_nodes(body, direct)
        assert prioritize_nodes(body, ext.decide(clock[0])) == prioritize_nodes(body, direct)
    assert ext.memo.misses == len(fleet) and ext.memo.hits == 3 * len(fleet)


def test_a_load_is_recomputed_once_its_data_goes_stale() -> None:
    stamped = datetime.fromtimestamp(T, UTC)
    clock = [T + 1.0]
    ext = extender(clock, {"a": node("a", usage({"cpu_usage_avg_5m": 0.9}, now=stamped, age=timedelta(0)))})
    req = parse_args(names_args(pod(), ["a"]))
    assert filter_nodes(req, ext.decide(clock[0]))["FailedNodes"] != {}
    clock[0] = T + 8 * 60  # period 3m + 5m grace: stale, fail open
    assert filter_nodes(req, ext.decide(clock[0]))["NodeNames"] == ["a"]


def test_a_changed_annotation_within_the_same_second_is_seen() -> None:
    now = datetime.fromtimestamp(T, UTC)
    cache = {"a": node("a", usage(0.2, now=now))}
    clock = [T + 0.1]
    ext = extender(clock, cache)
    req = parse_args(names_args(pod(), ["a"]))
    assert filter_nodes(req, ext.decide(clock[0]))["NodeNames"] == ["a"]
    cache["a"] = node("a", usage({"cpu_usage_avg_5m": 0.9}, now=now))
    clock[0] = T + 0.2
    assert filter_nodes(req, ext.decide(clock[0]))["FailedNodes"] == {"a": "node(s) had cpu_usage_avg_5m above 0.65"}


def test_a_new_binding_within_the_same_second_is_seen() -> None:
    now = datetime.fromtimestamp(T, UTC)
    clock = [T + 0.1]
    ext = extender(clock, {"a": node("a", usage(0.2, now=now))})
    req = parse_args(names_args(pod(), ["a"]))
    before = prioritize_nodes(req, ext.decide(clock[0]))[0]["Score"]
    assert ext.recent is not None
    for uid in ("u1", "u2"):
        ext.recent.add(BindingRecord(uid, "ns", uid, "a", T - 1, "default-scheduler"), now=T)
    after = prioritize_nodes(req, ext.decide(clock[0]))[0]["Score"]
    assert after == before - 1


@settings(max_examples=150, deadline=None)
@given(
    loads=st.lists(st.floats(min_value=0, max_value=0.9), min_size=3, max_size=3),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["bind", "annotate", "wait", "pod"]),
            st.integers(min_value=0, max_value=2),
            st.floats(min_value=0, max_value=400),
        ),
        max_size=12,
    ),
    closed=st.booleans(),
)
def test_cached_verdicts_equal_direct_computation_through_changes(
    loads: list[float], steps: list[tuple[str, int, float]], closed: bool
) -> None:
    """Node cache mode: node updates, bindings (hot value, estimate, retention), the clock and pod sizes change
    between requests; every answer equals the one computed afresh from ``node_load``."""
    args = DynamicArgs(default_policy(), stale="fail-closed" if closed else "fail-open")
    start = datetime.fromtimestamp(T, UTC)
    cache = {f"n{i}": node(f"n{i}", usage(v, now=start, hot=i)) for i, v in enumerate(loads)}
    clock = [T + 0.5]
    ext = extender(clock, cache)
    ext.args = args
    recent = ext.recent
    assert recent is not None
    names = sorted(cache)
    the_pod = pod(cpu="500m", memory="1Gi")
    uid = 0
    for kind, i, amount in steps:
        if kind == "bind":
            uid += 1
            recent.remember(parse_args(names_args(pod(uid=f"u{uid}", cpu="2"), [])).pod)
            recent.add(BindingRecord(f"u{uid}", "ns", f"p{uid}", names[i], clock[0] - amount / 10, "s"), clock[0])
        elif kind == "annotate":
            at = datetime.fromtimestamp(clock[0] - amount, UTC)
            cache[names[i]] = node(names[i], usage(amount / 450, now=at, age=timedelta(0), hot=i))
        elif kind == "wait":
            clock[0] += amount
        else:
            the_pod = pod(cpu=f"{int(amount * 10)}m", memory=f"{int(amount)}Gi")
        req = parse_args(names_args(the_pod, names))
        direct = Decide(
            args,
            datetime.fromtimestamp(clock[0], UTC),
            ext.decide(clock[0]).resolve,
            lambda name: recent.for_node(name, clock[0]),
        )
        assert filter_nodes(req, ext.decide(clock[0])) == filter_nodes(req, direct)
        assert prioritize_nodes(req, ext.decide(clock[0])) == prioritize_nodes(req, direct)


def test_an_unchanged_node_is_a_hit_by_identity() -> None:
    clock = [T + 0.25]
    fleet = fresh_fleet(datetime.fromtimestamp(T, UTC))
    ext = extender(clock, {n["metadata"]["name"]: n for n in fleet})
    req = parse_args(names_args(pod(), [n["metadata"]["name"] for n in fleet]))
    for _ in range(3):
        filter_nodes(req, ext.decide(clock[0]))
    assert (ext.memo.misses, ext.memo.hits) == (len(fleet), 2 * len(fleet))
