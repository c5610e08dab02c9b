"""Consumable capacity (DRAConsumableCapacity, beta and on in 1.37): kube's ``consumable_capacity.go`` of the
"incubating" allocator over ``resource.Quantity`` values as the API's JSON spells them.

A device with ``allowMultipleAllocations`` can be shared by several claims; each share consumes, per capacity
of the device, what the request asks (``capacity.requests``) rounded up by the capacity's ``requestPolicy``
(``validRange`` min/step, ``validValues``), the policy's ``default`` or the whole value when it asks nothing.
The sum over the device's shares must stay within the capacity's value. A device without that flag is
checked the same way once (its request must fit the policy and the value).

``Quantity`` keeps what Go's ``resource.Quantity`` keeps that is observable here: the exact value, the format
(BinarySI, DecimalSI, DecimalExponent), and the representation Go's struct comparison sees (kube compares a
consumed value with the policy's default with ``==``, so ``10Gi`` equals a default ``10Gi`` but ``10240Mi``
does not); ``text`` is Go's canonical serialization (``Quantity.String()``), which the allocation result's
``consumedCapacity`` carries. DRAFractionalCapacityRange is off by default in 1.37 (the milli-value
arithmetic is not used): the integer path only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_UP, Decimal, localcontext
from typing import Any

BINARY_SI = "BinarySI"
DECIMAL_SI = "DecimalSI"
DECIMAL_EXPONENT = "DecimalExponent"

_QUANTITY = re.compile(r"^([+-]?)(\d*)(?:\.(\d*))?(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL.items()}
_BINARY_SUFFIX = {v // 10: k for k, v in _BINARY.items()}
_INT64_MAX = 2**63 - 1
_MAX_INT64_FACTORS = 18


class CapacityError(Exception):
    """kube aborts the allocation (an Error status): a request it cannot represent, a negative capacity."""


@dataclass(frozen=True, slots=True)
class Quantity:
    """A ``resource.Quantity``: ``value`` exact; ``fmt`` its format; ``rep`` the int64 fast path's (mantissa,
    scale) or None for Go's arbitrary-precision path; ``cached`` the string Go caches when parsing a canonical
    spelling (part of Go's struct equality)."""

    value: Decimal
    fmt: str = DECIMAL_SI
    rep: tuple[int, int] | None = None
    cached: str = ""

    @property
    def text(self) -> str:
        return self.cached or canonical(self.value, self.fmt)

    def same(self, other: Quantity) -> bool:
        """Go's ``==`` on two Quantity structs: never for the arbitrary-precision representation (a pointer)."""
        return self.rep is not None and self == other

    def plain(self, value: Decimal) -> Quantity:
        """``resource.NewQuantity(value, q.Format)``."""
        return Quantity(value, self.fmt, (int(value), 0) if value == value.to_integral_value() else None)


ZERO = Quantity(Decimal(0), DECIMAL_SI, (0, 0), "0")


def parse(text: Any) -> Quantity:
    """Go's ``ParseQuantity`` (``ValueError`` for what it refuses)."""
    s = str(text).strip()
    if s == "0":
        return ZERO
    m = _QUANTITY.match(s)
    if m is None or not (m.group(2) or m.group(3)):
        raise ValueError(f"quantities must match the regular expression: {text!r}")
    sign, num, denom, exp_text, suffix = m.group(1), m.group(2) or "", m.group(3) or "", m.group(4), m.group(5)
    positive = sign != "-"
    if exp_text is not None:
        fmt, base, exponent = DECIMAL_EXPONENT, 10, int(exp_text[1:])
    elif suffix in _BINARY:
        fmt, base, exponent = BINARY_SI, 2, _BINARY[suffix]
    else:
        fmt, base, exponent = DECIMAL_SI, 10, _DECIMAL[suffix or ""]
    num = num.lstrip("0") or ("0" if not denom else "")
    digits = num + denom
    value = Decimal(f"{'-' if not positive else ''}{num or '0'}.{denom or '0'}") * (
        Decimal(2) ** exponent if base == 2 else Decimal(10) ** exponent
    )
    if fmt == BINARY_SI:
        scale, mantissa = 0, 1
        if exponent >= 0 and not denom:
            mantissa = 1 << exponent
            precision = 15 - len(num) - int(exponent * 3 / 10) - 1
        else:
            precision = -1
    else:
        scale, mantissa, precision = exponent, 1, _MAX_INT64_FACTORS - (len(num) + len(denom))
    if precision >= 0:
        scale -= len(denom)
        if scale >= -9:
            shifted = int(digits or "0")
            result = shifted * mantissa
            if result <= _INT64_MAX:
                result = result if positive else -result
                cache = ""
                if fmt == BINARY_SI:
                    if exponent % 10 == 0 and shifted & 7 != 0:
                        cache = s
                elif scale % 3 == 0 and not digits.endswith("000") and digits[:1] != "0":
                    cache = s
                return Quantity(Decimal(result).scaleb(scale), fmt, (result, scale), cache)
    with localcontext() as ctx:
        ctx.prec = 200
        if value != 0:
            value = value.quantize(Decimal("1e-9"), rounding=ROUND_UP)
    if fmt == BINARY_SI and 0 < abs(value) < 1:
        fmt = DECIMAL_SI
    return Quantity(value, fmt)


def canonical(value: Decimal, fmt: str) -> str:
    """Go's ``Quantity.String()`` of an uncached quantity (``CanonicalizeBytes``)."""
    if value == 0:
        return "0"
    if fmt == BINARY_SI and (-1024 < value < 1024 or value != value.to_integral_value()):
        fmt = DECIMAL_SI
    if fmt == BINARY_SI:
        n, exp = int(value), 0
        while n % 1024 == 0 and exp < 6:
            n //= 1024
            exp += 1
        return f"{n}{_BINARY_SUFFIX.get(exp, '')}"
    # AsCanonicalBytes: the value rounded up to nano units, trailing zeros out, the exponent down to a multiple of 3
    with localcontext() as ctx:
        ctx.prec = 200
        nanos = (value * Decimal(10) ** 9).to_integral_value(rounding=ROUND_CEILING if value > 0 else ROUND_UP)
    mantissa, exponent = int(nanos), -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    shift = exponent % 3
    mantissa, exponent = mantissa * 10**shift, exponent - shift
    if fmt == DECIMAL_EXPONENT or exponent not in _DECIMAL_SUFFIX:
        return f"{mantissa}" if exponent == 0 else f"{mantissa}e{exponent}"
    return f"{mantissa}{_DECIMAL_SUFFIX[exponent]}"


# ------------------------------------------------------------------------------------------------ kube's checks

Capacities = Mapping[str, Any]
"""A device's ``capacity``: name -> {value, requestPolicy{default, validValues, validRange{min, max, step}}}."""


def _q(raw: Any) -> Quantity | None:
    return None if raw is None else parse(raw)


def consumed_for(requested: Quantity | None, capacity: Mapping[str, Any]) -> Quantity:
    """kube's ``calculateConsumedCapacity`` (integer path)."""
    policy = capacity.get("requestPolicy")
    if requested is None:
        default = _q((policy or {}).get("default"))
        return default if default is not None else parse(capacity.get("value", "0"))
    if policy is None:
        return requested
    valid_range = policy.get("validRange")
    minimum = _q((valid_range or {}).get("min"))
    if valid_range is not None and minimum is not None:
        if requested.value < minimum.value:
            return minimum
        step = _q(valid_range.get("step"))
        if step is None:
            return requested
        if requested.value > _INT64_MAX:
            raise CapacityError(
                "capacity request cannot be represented in the device's range arithmetic: request "
                f"{requested.text} exceeds MaxInt64"
            )
        req, st, mn = _ceil_int(requested.value), _ceil_int(step.value), _ceil_int(minimum.value)
        added = req - mn
        n = _go_div(added, st)
        if _go_mod(added, st) != 0:
            n += 1
        if mn >= 0 and n > _go_div(_INT64_MAX - mn, st):
            raise CapacityError(
                "capacity request cannot be represented in the device's range arithmetic: rounding request "
                f"{requested.text} up to the next step passes MaxInt64"
            )
        return step.plain(Decimal(mn + st * n))
    values = policy.get("validValues")
    if values is not None:
        for raw in values:
            candidate = parse(raw)
            if requested.value <= candidate.value:
                return candidate
        return requested
    return requested


def _ceil_int(value: Decimal) -> int:
    """Go's ``Quantity.Value()``: rounded up to an integer."""
    return math.ceil(value)


def _go_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _go_mod(a: int, b: int) -> int:
    return a - _go_div(a, b) * b


def violates_policy(consumed: Quantity, policy: Mapping[str, Any] | None) -> bool:
    """kube's ``violatesPolicy`` (integer path)."""
    if policy is None:
        return False
    default = _q(policy.get("default"))
    if default is not None and consumed.same(default):
        return False
    valid_range = policy.get("validRange")
    if valid_range is not None:
        maximum = _q(valid_range.get("max"))
        if maximum is not None and consumed.value > maximum.value:
            return True
        step = _q(valid_range.get("step"))
        if step is not None:
            minimum = _q(valid_range.get("min"))
            mn = _ceil_int(minimum.value) if minimum is not None else 0
            if _go_mod(_ceil_int(consumed.value) - mn, _ceil_int(step.value)) != 0:
                return True
        return False
    values = policy.get("validValues") or ()
    if values:
        return all(consumed.value != parse(v).value for v in values)
    return False


ConsumedTotals = Mapping[str, Decimal]
"""Per capacity name, the sum consumed by a device's shares."""


def consumed_map(requests: Mapping[str, Any] | None, capacities: Capacities) -> dict[str, Quantity]:
    """kube's ``GetConsumedCapacityFromRequest``: what one share consumes of each of the device's capacities."""
    out: dict[str, Quantity] = {}
    for name, cap in capacities.items():
        raw = (requests or {}).get(name)
        out[name] = consumed_for(None if raw is None else parse(raw), cap or {})
    return out


def fits_capacity(
    requests: Mapping[str, Any] | None,
    capacities: Capacities,
    allocated: ConsumedTotals | None = None,
    allocating: ConsumedTotals | None = None,
) -> bool:
    """kube's ``CmpRequestOverCapacity``: False when the device lacks a requested capacity, a consumed value
    violates its policy, or the shares would pass the capacity's value; ``CapacityError`` (kube aborts) when a
    request cannot be represented or a consumed value is negative."""
    if requests and any(name not in capacities for name in requests):
        return False
    consumed: dict[str, Quantity] = {}
    for name, cap in capacities.items():
        raw = (requests or {}).get(name)
        try:
            value = consumed_for(None if raw is None else parse(raw), cap or {})
        except CapacityError as err:
            raise CapacityError(f'capacity "{name}": {err}') from None
        if value.value < 0:
            raise CapacityError(f'capacity "{name}": capacity value is negative')
        consumed[name] = value
    for name, cap in capacities.items():
        value = consumed[name]
        if violates_policy(value, (cap or {}).get("requestPolicy")):
            return False
        total = value.value + (allocated or {}).get(name, Decimal(0)) + (allocating or {}).get(name, Decimal(0))
        if total > parse((cap or {}).get("value", "0")).value:
            return False
    return True


def add_consumed(totals: dict[str, Decimal], consumed: Mapping[str, Any], sign: int = 1) -> None:
    """Add (or take away) one share's ``consumedCapacity`` (quantity texts or Quantities) to per-name totals."""
    for name, raw in consumed.items():
        value = raw.value if isinstance(raw, Quantity) else parse(raw).value
        totals[name] = totals.get(name, Decimal(0)) + sign * value
