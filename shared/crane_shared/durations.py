"""Go duration strings (``300ms``, ``3m``, ``1h30m``), because upstream policy files are written in them.

Parsing follows Go's ``time.ParseDuration`` grammar, minus what makes no sense for configuration: negative
durations and precision finer than a microsecond (``timedelta`` cannot hold it) are rejected instead of being
silently mangled.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

__all__ = ["DurationError", "format_duration", "parse_duration"]

_NS_PER_UNIT: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 MICRO SIGN, as Go prints it
    "μs": 1_000,  # U+03BC GREEK SMALL LETTER MU, also accepted by Go
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_UNITS_HELP = "ns, us, ms, s, m, h"
# One "<number><unit>" component; the unit is anything non-numeric so that unknown units get a precise error.
_COMPONENT = re.compile(r"([0-9]*(?:\.[0-9]*)?)([^0-9.]*)", re.ASCII)
_NS_PER_US = 1_000


class DurationError(ValueError):
    """A string is not a (non-negative, microsecond-precise) Go duration; the message says why."""


def parse_duration(text: str) -> timedelta:
    """Parse a Go duration such as ``"1h30m"`` or ``"1.5h"``; ``"0"`` is the only value without a unit."""
    if text == "":
        raise DurationError('invalid duration \'\': empty (write e.g. "30s" or "3m")')
    body = text[1:] if text.startswith("+") else text
    if body.startswith("-"):
        raise DurationError(f"invalid duration {text!r}: negative durations are not allowed")
    if body == "0":
        return timedelta(0)
    if body == "":
        raise DurationError(f"invalid duration {text!r}: missing number")
    total_ns = 0
    pos = 0
    while pos < len(body):
        match = _COMPONENT.match(body, pos)
        assert match is not None  # every part of the pattern is optional, so it always matches
        number, unit = match.group(1), match.group(2)
        if number in ("", "."):
            raise DurationError(f"invalid duration {text!r}: expected a number at {body[pos:]!r}")
        if unit == "":
            raise DurationError(f'invalid duration {text!r}: missing unit after {number!r} (e.g. "{number}s")')
        if unit == "d":
            raise DurationError(
                f'invalid duration {text!r}: Go durations have no "d" unit; write days as hours, e.g. "24h"'
            )
        if unit not in _NS_PER_UNIT:
            raise DurationError(f"invalid duration {text!r}: unknown unit {unit!r} (valid: {_UNITS_HELP})")
        total_ns += int(Decimal(number) * _NS_PER_UNIT[unit])
        pos = match.end()
    return _from_nanoseconds(total_ns, text)


def _from_nanoseconds(total_ns: int, text: str) -> timedelta:
    if total_ns % _NS_PER_US:
        raise DurationError(f"invalid duration {text!r}: finer than a microsecond")
    try:
        return timedelta(microseconds=total_ns // _NS_PER_US)
    except OverflowError:
        raise DurationError(f"invalid duration {text!r}: too large") from None


def format_duration(value: timedelta) -> str:
    """Render ``value`` as the shortest Go duration that parses back to it (``3m``, ``1h30m``, ``1.5s``).

    Go's ``Duration.String`` would write ``3m0s``; both parse the same, and the short form matches how
    policy files are written by hand.
    """
    total_us = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    if total_us == 0:
        return "0s"
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    hours, rest = divmod(total_us, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    parts = [sign]
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if rest:
        if hours or minutes or rest >= 1_000_000:
            parts.append(_decimal(rest, 1_000_000) + "s")
        elif rest >= 1_000:
            parts.append(_decimal(rest, 1_000) + "ms")
        else:
            parts.append(f"{rest}us")
    return "".join(parts)


def _decimal(amount: int, per_unit: int) -> str:
    """``amount / per_unit`` written exactly, without trailing zeros (1_500_000 / 1_000_000 -> ``1.5``)."""
    whole, frac = divmod(amount, per_unit)
    if not frac:
        return str(whole)
    digits = len(str(per_unit)) - 1
    return f"{whole}.{frac:0{digits}d}".rstrip("0")
