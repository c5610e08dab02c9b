"""DRA selectors in Kubernetes' CEL environment: the expressions of kube's DRA docs and tests, with kube's answers
(``k8s.io/dynamic-resource-allocation/cel`` on cel-go; here cel-cpp through cel-expr-python)."""

from __future__ import annotations

import pytest

from crane_scheduler.plugins.dynamicresources.celenv import CelError, compile_selector, device_view
from tests.support.dra import DRIVER, device

GPU = device_view(
    DRIVER,
    {
        **device(
            "gpu-0",
            capacity={"memory": "40Gi", "other.io/slots": "4"},
            model="A100",
            index=3,
            healthy=True,
            driverVersion={"version": "1.2.3"},
            **{"numa.example.com/node": 1},
        )
    },
)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f'device.driver == "{DRIVER}"', True),
        ('device.driver == "other"', False),
        (f'device.attributes["{DRIVER}"].model == "A100"', True),
        (f'device.attributes["{DRIVER}"].index >= 3', True),
        (f'device.attributes["{DRIVER}"].healthy', True),
        ('device.attributes["numa.example.com"].node == 1', True),
        (f'"model" in device.attributes["{DRIVER}"]', True),
        ('"model" in device.attributes["absent.example.com"]', False),  # kube: an absent domain is an empty map
        (f'has(device.attributes["{DRIVER}"].model)', True),
        (f'device.attributes["{DRIVER}"].model.startsWith("A")', True),
        (f'device.attributes["{DRIVER}"].model.lowerAscii() == "a100"', True),
        (f'device.attributes["{DRIVER}"].model.matches("^A[0-9]+$")', True),
        (f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) == 0', True),
        (f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("32Gi"))', True),
        (f'device.capacity["{DRIVER}"].memory.isLessThan(quantity("32Gi"))', False),
        (f'device.capacity["{DRIVER}"].memory == quantity("40960Mi")', True),
        (f'device.capacity["{DRIVER}"].memory.asInteger() == 42949672960', True),
        (f'device.capacity["{DRIVER}"].memory.add(quantity("24Gi")) == quantity("64Gi")', True),
        ('device.capacity["other.io"].slots.sub(1).asInteger() == 3', True),
        ('quantity("500m").isInteger()', False),
        ('quantity("1.5").asApproximateFloat() == 1.5', True),
        ('quantity("-1").sign() == -1', True),
        ('isQuantity("1Gi") && !isQuantity("1 Gi")', True),
        (f'device.attributes["{DRIVER}"].driverVersion.isGreaterThan(semver("1.2.3-rc.1"))', True),
        (f'device.attributes["{DRIVER}"].driverVersion == semver("1.2.3+build.5")', True),
        (f'device.attributes["{DRIVER}"].driverVersion.major() == 1', True),
        (f'device.attributes["{DRIVER}"].driverVersion.compareTo(semver("1.10.0")) < 0', True),
        ('semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1"))', True),
        ('semver("1.0.0-alpha.beta").isLessThan(semver("1.0.0-beta"))', True),
        ('semver("1.0.0-2").isLessThan(semver("1.0.0-11"))', True),
        ('isSemver("1.2.3") && !isSemver("v1.2") && isSemver("v1.2", true)', True),
        ('cel.bind(m, device.attributes["numa.example.com"], m.node == 1)', True),
        ('false && device.attributes["x.io"].missing == 1', False),  # an error on the other side of && is dropped
    ],
)
def test_selectors_answer_as_kube(expression: str, expected: bool) -> None:
    assert compile_selector(expression).matches(GPU) is expected


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        (f'device.attributes["{DRIVER}"].missing == "x"', "missing"),
        ('quantity("1 Gi").sign() == 1', "quantities must match"),
        ('semver("1.2") == semver("1.2.0")', "could not parse semver: 1.2"),
        (f'device.attributes["{DRIVER}"].model', "CEL result of type string could not be converted to bool"),
    ],
)
def test_runtime_errors(expression: str, error: str) -> None:
    with pytest.raises(CelError, match=error):
        compile_selector(expression).matches(GPU)


@pytest.mark.parametrize(
    ("expression", "error"),
    [("device.driver ==", "compilation failed"), ("1 + 2", "must evaluate to bool or the unknown type, not int")],
)
def test_compile_errors(expression: str, error: str) -> None:
    with pytest.raises(CelError, match=error):
        compile_selector(expression)


def test_an_unparsable_version_attribute_is_an_error_when_a_selector_reads_the_device() -> None:
    with pytest.raises(CelError, match="parse semantic version"):
        device_view(DRIVER, device("bad", driverVersion={"version": "01.2.3"}))
