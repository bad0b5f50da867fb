"""One way numbers read on screen (ui/format.py): 3 GiB is 3 GiB in every view."""

from __future__ import annotations

import pytest

from interactive_shard.ui.format import byte_unit, duration_ms, nbytes, short


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (0, "0 B"),
        (640, "640 B"),
        (1024, "1 KiB"),
        (12.5 * 1024, "12.5 KiB"),
        (3 * 2**30, "3 GiB"),  # was 3.07e+03 MiB (buckets, splits) and 3,072.0 MiB (fallback)
        (1000 * 2**20, "1,000 MiB"),
        (2**41, "2 TiB"),
    ],
)
def test_bytes_read_alike_and_never_as_an_exponent(n: float, shown: str) -> None:
    assert nbytes(n) == shown


def test_durations_units_and_short_numbers() -> None:
    assert duration_ms(0.00125) == "1.25 ms" and duration_ms(1.23) == "1,230 ms"
    assert byte_unit(5 * 2**20) == (2**20, "MiB") and byte_unit(0) == (1, "B")
    assert [short(v) for v in (3.0, 3.071, 30.71, 307.1, 3071.0)] == [
        "3",
        "3.07",
        "30.7",
        "307",
        "3,071",
    ]


def test_every_feature_formats_bytes_through_the_one_helper() -> None:
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "interactive_shard"
    own = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.name != "format.py" and ('"GiB"' in p.read_text() or '"MiB")' in p.read_text())
    ]
    assert not own, f"byte units spelled outside ui/format.py: {own}"
