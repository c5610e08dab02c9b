"""Kubernetes resource quantities (``500m``, ``2``, ``1.5Gi``, ``1e3``), parsed exactly with decimals.

One parser for the scheduler (integer milli-CPU and bytes, rounded up like ``Quantity.MilliValue()`` /
``Value()``) and the sandbox (pod usage annotations).
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")


def parse_quantity(text: str | int | float) -> Decimal:
    """The exact value of a quantity; ``ValueError`` names the text when it is not one."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        if not math.isfinite(text):
            raise ValueError(f"invalid quantity {text!r}")
        return Decimal(str(text))
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"invalid quantity {text!r}")
    number, exponent, suffix = match.groups()
    try:
        return Decimal(number) * (Decimal(10) ** int(exponent[1:]) if exponent else _SUFFIX[suffix or ""])
    except InvalidOperation as err:  # pragma: no cover - the regex admits only valid decimals
        raise ValueError(f"invalid quantity {text!r}") from err


@functools.lru_cache(maxsize=4096)
def quantity(text: str | int | float, milli: bool = False) -> int:
    """A quantity as an integer, rounded up like ``Quantity.Value()`` (``MilliValue()`` if milli)."""
    value = parse_quantity(text)
    return math.ceil(value * 1000 if milli else value)
