"""How numbers read on screen, one way everywhere: bytes and durations.

``nbytes(3 * 2**30)`` is ``3 GiB`` in every figure, hover, summary and table (the
features once had six formatters that showed it as ``3.07e+03 MiB``, ``3 GiB`` and
``3,072.0 MiB``). Three significant digits, never an exponent, trailing zeros dropped.
"""

from __future__ import annotations

__all__ = ["byte_unit", "duration_ms", "nbytes", "short"]

_BYTE_UNITS = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def short(value: float) -> str:
    """``value`` in about three significant digits, without an exponent: 3, 3.07, 30.7,
    307, 3,072."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    size = abs(value)
    digits = 0 if size >= 100 else 1 if size >= 10 else 2
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def byte_unit(largest: float) -> tuple[int, str]:
    """The (scale, name) of the unit that shows ``largest`` bytes best (an axis's unit)."""
    return next((s, u) for s, u in _BYTE_UNITS if max(largest, 1) >= s)


def nbytes(n: float) -> str:
    """``12.5 KiB``, ``3 GiB``, ``640 B``: a byte count a reader takes in at a glance."""
    scale, name = byte_unit(abs(n))
    return f"{short(n / scale)} {name}" if scale > 1 else f"{n:,.0f} B"


def duration_ms(seconds: float) -> str:
    """``1.25 ms``, ``1,230 ms``: a duration in milliseconds."""
    return f"{short(seconds * 1e3)} ms"
