"""Kubernetes' CEL environment for DRA device selectors (``k8s.io/dynamic-resource-allocation/cel``) on cel-cpp.

The library is ``cel-expr-python`` (the CEL project's own binding of cel-cpp, the C++ reference runtime): chosen
over ``cel-python`` (celpy, pure Python: ~1.2 ms per evaluation here, ~100 times slower) and
``common-expression-language`` (a binding of the Rust interpreter: fast with a reused context, ~48 us when a
context is built per device, and without a type checker or the strings/bindings extensions kube's environment
has). cel-cpp type-checks, has the ``strings`` and ``bindings`` extensions of kube's base environment, and
evaluates a selector in ~4-14 us (`tests/unit/scheduler/dynamicresources/test_celenv.py` states the figures).

What kube's environment has and is built here:

- ``device.driver``; ``device.allowMultipleAllocations`` (DRAConsumableCapacity's environment, on in 1.37);
  ``device.attributes[domain][id]`` (string, int, bool, version); ``device.capacity[domain][id]``
  (a Quantity). An attribute name without a domain belongs to the driver's domain. kube's outer maps answer an
  absent domain with an empty map (``mapper.Find``), so ``"x" in device.attributes["other.io"]`` is false, not an
  error: here every domain named by a string literal of the expression (and the driver's) is present, empty when
  the device has none (a domain computed at run time that no literal names is the one divergence).
- ``quantity(s)``, ``isQuantity(s)`` and Quantity's ``sign``, ``isGreaterThan``, ``isLessThan``, ``compareTo``,
  ``add``, ``sub``, ``asInteger``, ``isInteger``, ``asApproximateFloat``; ``semver(s[, normalize])``,
  ``isSemver(s[, normalize])`` and Semver's ``major``, ``minor``, ``patch``, ``isGreaterThan``, ``isLessThan``,
  ``compareTo`` (apiserver's ``library/quantity.go`` and ``library/semverlib.go``).

cel-cpp cannot carry a Python object through an expression, so a Quantity is the map ``{QUANTITY: <exact decimal,
normalized>}`` and a Semver ``{SEMVER: <version without build metadata>}``: equality of two of them is then kube's
(``Quantity.Equal`` compares values, Semver's equality ignores build metadata), and the member functions take them
apart. kube declares ``device`` as an object type, so a misspelt field is a compile error there and a runtime error
here; the API server validates selectors with kube's compiler, so such an expression never reaches a scheduler.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_strings

from crane_shared.quantity import parse_quantity

QUANTITY = "__k8s_quantity__"
SEMVER = "__k8s_semver__"

_DYN = cel.Type.DYN
_INT64 = (-(2**63), 2**63 - 1)


class CelError(Exception):
    """A selector that does not compile, or whose evaluation failed: the allocation aborts with it (kube: Error)."""


# ------------------------------------------------------------------------------------------------ quantities


def make_quantity(value: Decimal) -> dict[str, str]:
    normal = value.normalize()
    return {QUANTITY: "0" if normal.is_zero() else str(normal)}


def quantity_value(q: Any) -> Decimal:
    if isinstance(q, Mapping) and QUANTITY in q:
        return Decimal(q[QUANTITY])
    raise ValueError(f"no such overload: expected a Quantity, got {type(q).__name__}")


def _quantity(text: str) -> dict[str, str]:
    try:
        return make_quantity(parse_quantity(text))
    except ValueError as err:
        raise ValueError(f"quantities must match the regular expression: {err}") from None


def _is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


def _sign(q: Any) -> int:
    v = quantity_value(q)
    return (v > 0) - (v < 0)


def _int64(value: Decimal) -> int:
    as_int = int(value)
    if not _INT64[0] <= as_int <= _INT64[1]:
        raise ValueError("cannot convert value to integer: overflow")
    return as_int


def _plus(a: Any, b: Any, sign: int) -> dict[str, str]:
    other = Decimal(b) if isinstance(b, int) and not isinstance(b, bool) else quantity_value(b)
    return make_quantity(quantity_value(a) + sign * other)


def _as_integer(q: Any) -> int:
    v = quantity_value(q)
    if v != v.to_integral_value():
        raise ValueError("cannot convert value to integer")
    return _int64(v)


# ------------------------------------------------------------------------------------------------ semver

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@dataclass(frozen=True, slots=True)
class Version:
    """A semantic version (blang/semver v4 ``Parse``: strict 2.0.0); build metadata never compares."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...]

    def key(self) -> tuple[Any, ...]:
        # A release sorts after its pre-releases; numeric identifiers sort before alphanumeric ones.
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, not self.pre, pre)

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.pre)}" if self.pre else core


@functools.lru_cache(maxsize=1024)
def parse_version(text: str) -> Version:
    """``ValueError`` when ``text`` is not a strict semantic version."""
    m = _SEMVER.match(text)
    if m is None:
        raise ValueError(f"invalid semver {text!r}")
    pre = tuple(m.group(4).split(".")) if m.group(4) else ()
    return Version(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre)


def _normalize_version(text: str) -> str:
    # semverlib's normalize: an optional "v" prefix, missing minor/patch as 0, leading zeros dropped.
    text = text.removeprefix("v")
    m = re.match(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)$", text)
    if m is None:
        return text
    nums = [str(int(n)) if n is not None else "0" for n in m.group(1, 2, 3)]
    return ".".join(nums) + m.group(4)


def make_semver(version: Version) -> dict[str, str]:
    return {SEMVER: str(version)}


def semver_value(s: Any) -> Version:
    if isinstance(s, Mapping) and SEMVER in s:
        return parse_version(s[SEMVER])
    raise ValueError(f"no such overload: expected a Semver, got {type(s).__name__}")


def _semver(text: str, normalize: bool = False) -> dict[str, str]:
    try:
        return make_semver(parse_version(_normalize_version(text) if normalize else text))
    except ValueError:
        raise ValueError(f"could not parse semver: {text}") from None


def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_version(_normalize_version(text) if normalize else text)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------- member functions shared by both types


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, Mapping) and SEMVER in a:
        x, y = semver_value(a).key(), semver_value(b).key()
    else:
        x, y = quantity_value(a), quantity_value(b)  # type: ignore[assignment]
    return (x > y) - (x < y)


def _overload(name: str, params: list[Any], member: bool, impl: Callable[..., Any], ret: Any = _DYN) -> Any:
    return cel.Overload(name, ret, params, member, impl)


def _extension() -> Any:
    s, b, i, d = cel.Type.STRING, cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE
    decls = {
        "quantity": [_overload("k8s_quantity", [s], False, _quantity)],
        "isQuantity": [_overload("k8s_is_quantity", [s], False, _is_quantity, b)],
        "sign": [_overload("k8s_quantity_sign", [_DYN], True, _sign, i)],
        "add": [_overload("k8s_quantity_add", [_DYN, _DYN], True, lambda a, x: _plus(a, x, 1))],
        "sub": [_overload("k8s_quantity_sub", [_DYN, _DYN], True, lambda a, x: _plus(a, x, -1))],
        "asInteger": [_overload("k8s_quantity_as_integer", [_DYN], True, _as_integer, i)],
        "isInteger": [
            _overload("k8s_quantity_is_integer", [_DYN], True, lambda q: (v := quantity_value(q)) == int(v), b)
        ],
        "asApproximateFloat": [_overload("k8s_quantity_as_float", [_DYN], True, lambda q: float(quantity_value(q)), d)],
        "semver": [
            _overload("k8s_semver", [s], False, _semver),
            _overload("k8s_semver_normalize", [s, b], False, _semver),
        ],
        "isSemver": [
            _overload("k8s_is_semver", [s], False, _is_semver, b),
            _overload("k8s_is_semver_normalize", [s, b], False, _is_semver, b),
        ],
        "major": [_overload("k8s_semver_major", [_DYN], True, lambda v: semver_value(v).major, i)],
        "minor": [_overload("k8s_semver_minor", [_DYN], True, lambda v: semver_value(v).minor, i)],
        "patch": [_overload("k8s_semver_patch", [_DYN], True, lambda v: semver_value(v).patch, i)],
        "compareTo": [_overload("k8s_compare_to", [_DYN, _DYN], True, _compare, i)],
        "isGreaterThan": [_overload("k8s_is_greater_than", [_DYN, _DYN], True, lambda a, x: _compare(a, x) > 0, b)],
        "isLessThan": [_overload("k8s_is_less_than", [_DYN, _DYN], True, lambda a, x: _compare(a, x) < 0, b)],
    }
    return cel.CelExtension("k8s_dra", [cel.FunctionDecl(name, overloads) for name, overloads in decls.items()])


@functools.cache
def _env() -> Any:
    return cel.NewEnv(
        variables={"device": cel.Type.Map(cel.Type.STRING, _DYN)},
        extensions=[_extension(), ext_strings.ExtStrings(), ext_bindings.ExtBindings()],
    )


# ------------------------------------------------------------------------------------------------ devices


@dataclass(frozen=True, slots=True)
class DeviceView:
    """A device as CEL sees it: the driver and the attribute and capacity maps by domain, built once per device."""

    driver: str
    attributes: dict[str, dict[str, Any]]
    capacity: dict[str, dict[str, Any]]
    allow_multiple_allocations: bool = False


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _attribute_value(name: str, attr: Mapping[str, Any]) -> Any:
    for key in ("int", "bool", "string"):
        if key in attr and attr[key] is not None:
            return attr[key]
    if attr.get("version") is not None:
        try:
            return make_semver(parse_version(attr["version"]))
        except ValueError as err:
            raise CelError(f"attribute {name}: parse semantic version: {err}") from None
    raise CelError(f"attribute {name}: unsupported attribute value")


def device_view(driver: str, device: Mapping[str, Any]) -> DeviceView:
    """``device`` is a ResourceSlice's ``spec.devices[]`` entry (resource.k8s.io/v1)."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, attr in (device.get("attributes") or {}).items():
        domain, ident = _split(name, driver)
        attributes.setdefault(domain, {})[ident] = _attribute_value(name, attr or {})
    capacity: dict[str, dict[str, Any]] = {}
    for name, cap in (device.get("capacity") or {}).items():
        domain, ident = _split(name, driver)
        capacity.setdefault(domain, {})[ident] = make_quantity(parse_quantity((cap or {}).get("value", "0")))
    return DeviceView(driver, attributes, capacity, bool(device.get("allowMultipleAllocations")))


_LITERAL = re.compile(r"""(?:[rR]?)("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')""")


@dataclass(frozen=True, slots=True)
class Selector:
    """One compiled selector expression and the domains its string literals name."""

    expression: str
    program: Any
    domains: tuple[str, ...]

    def matches(self, view: DeviceView) -> bool:
        """The selector's verdict on ``view``; ``CelError`` for a runtime error or a non-bool result."""
        attributes, capacity = view.attributes, view.capacity
        missing = [d for d in (*self.domains, view.driver) if d not in attributes or d not in capacity]
        if missing:
            attributes = {**{d: {} for d in missing}, **attributes}
            capacity = {**{d: {} for d in missing}, **capacity}
        device = {
            "driver": view.driver,
            "allowMultipleAllocations": view.allow_multiple_allocations,
            "attributes": attributes,
            "capacity": capacity,
        }
        result = self.program.eval(data={"device": device})
        kind = result.type()
        if kind == cel.Type.BOOL:
            return bool(result.plain_value())
        if kind == cel.Type.ERROR:
            raise CelError(_go_text(str(result.plain_value())))
        raise CelError(f"CEL result of type {kind.name().lower()} could not be converted to bool")


_MISSING_KEY = re.compile(r'^NOT_FOUND: Key not found in map : "?(.*?)"?$')


def _go_text(text: str) -> str:
    """cel-cpp's text for a missing map key as cel-go words it (``no such key: <key>``: kube's hint keys on it)."""
    m = _MISSING_KEY.match(text)
    return f"no such key: {m.group(1)}" if m else text


@functools.lru_cache(maxsize=256)
def compile_selector(expression: str) -> Selector:
    """The compiled selector (cached by text, as kube's ``cel.Cache``); ``CelError`` when it does not compile."""
    try:
        program = _env().compile(expression)
    except RuntimeError as err:
        raise CelError(f"compilation failed: {err}") from None
    out = program.return_type()
    if out not in (cel.Type.BOOL, cel.Type.DYN):
        raise CelError(f"must evaluate to bool or the unknown type, not {out.name().lower()}")
    domains = tuple(dict.fromkeys(_unquote(m.group(1)) for m in _LITERAL.finditer(expression)))
    return Selector(expression, program, domains)


def _unquote(literal: str) -> str:
    return literal[1:-1]
