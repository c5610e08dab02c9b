"""NodeResourcesFit's RequestedToCapacityRatio strategy (kube's broken-line scorer) and its argument checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from crane_scheduler.framework import ArgsError
from crane_scheduler.plugins.noderesources import FitArgs, NodeResourcesFit, broken_linear
from crane_scheduler.podinfo import parse_pod
from tests.support.scheduler import chosen, node, pod, table


def rtcr(shape: list[dict[str, int]], resources: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    strategy: dict[str, Any] = {"type": "RequestedToCapacityRatio", "requestedToCapacityRatio": {"shape": shape}}
    if resources is not None:
        strategy["resources"] = resources
    return {"scoringStrategy": strategy}


def config(args: dict[str, Any]) -> dict[str, Any]:
    return {
        "profiles": [
            {
                "schedulerName": "crane-scheduler",
                "plugins": {"multiPoint": {"enabled": [{"name": "NodeResourcesFit", "weight": 50}]}},
                "pluginConfig": [{"name": "NodeResourcesFit", "args": args}],
            }
        ]
    }


def test_bin_packing_shape_prefers_the_fuller_node() -> None:
    t = table(node("empty"), node("half"), bound=[pod("x", cpu="2", memory="4Gi", node_name="half")])
    packing = rtcr([{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}])
    spreading = rtcr([{"utilization": 0, "score": 10}, {"utilization": 100, "score": 0}])
    assert chosen(t, pod(cpu="500m"), config(packing)) == "half"
    assert chosen(t, pod(cpu="500m"), config(spreading)) == "empty"


def test_scores_match_kubes_integer_arithmetic() -> None:
    shape = ((0, 100), (50, 0), (100, 70))  # scores already scaled to 0..100
    # Go truncates toward zero: 100 + (0 - 100) * 33 / 50 = 100 - 66 = 34; 0 + 70 * 25 / 50 = 35
    assert list(broken_linear(shape, np.array([0, 33, 50, 75, 100]))) == [100, 34, 0, 35, 70]
    t = table(node("a", cpu="4", memory="8Gi"))
    args = FitArgs.parse(rtcr([{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]))
    p = parse_pod(pod(cpu="1", memory="2Gi"))
    # cpu 25 % -> 25, memory 25 % -> 25; weights 1 and 1 -> round(50 / 2) = 25
    assert list(NodeResourcesFit(args).score({}, p, t, t.live_rows())) == [25]


def test_resources_scoring_zero_do_not_count_in_the_average() -> None:
    t = table(node("a", cpu="4", memory="8Gi"))
    shape = [{"utilization": 10, "score": 0}, {"utilization": 100, "score": 10}]
    args = FitArgs.parse(rtcr(shape, [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 3}]))
    p = parse_pod(pod(cpu="2", memory="100Mi"))  # cpu 50 % -> 44; memory 1 % -> 0, left out
    assert list(NodeResourcesFit(args).score({}, p, t, t.live_rows())) == [44]


@pytest.mark.parametrize(
    ("shape", "problem"),
    [
        ([], "shape: at least one point must be specified"),
        ([{"utilization": 50, "score": 1}, {"utilization": 50, "score": 2}], "shape[1].utilization: values must be"),
        ([{"utilization": 101, "score": 1}], "shape[0].utilization: not in valid range [0, 100]"),
        ([{"utilization": 10, "score": 11}], "shape[0].score: not in valid range [0, 10]"),
    ],
)
def test_shape_is_validated_with_the_field_named(shape: list[dict[str, int]], problem: str) -> None:
    with pytest.raises(ArgsError) as err:
        FitArgs.parse(rtcr(shape))
    assert any(
        f"{path}: {msg}".startswith("scoringStrategy.requestedToCapacityRatio." + problem)
        for path, msg in err.value.problems
    ), err.value.problems
