"""Kubernetes resource quantities ("500m", "2", "1Gi", "1.5G") as exact numbers."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal(10**3),
            "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15),
            "E": Decimal(10**18)}


def parse(text: str | int | float) -> Decimal:
    s = str(text).strip()
    for suffix, factor in _BINARY.items():
        if s.endswith(suffix):
            return _number(s[: -len(suffix)], text) * factor
    if s and s[-1] in _DECIMAL and not s[-1].isdigit():
        return _number(s[:-1], text) * _DECIMAL[s[-1]]
    return _number(s, text)


def _number(s: str, original: object) -> Decimal:
    try:
        value = Decimal(s)
    except InvalidOperation:
        raise ValueError(f"not a quantity: {original!r}") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"not a non-negative quantity: {original!r}")
    return value


def milli(text: str | int | float) -> int:
    return int((parse(text) * 1000).to_integral_value())


def mebi(text: str | int | float) -> int:
    return int((parse(text) / 2**20).to_integral_value(rounding="ROUND_CEILING"))
