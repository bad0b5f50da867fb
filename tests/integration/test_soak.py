"""A short soak: five cycles of launch, rank failure, kill -9 of a rank (with a child
process), interrupt, and kill -9 of a kernel whose rank holds the GIL.

The full 100-cycle version is ``python benchmarks/soak.py``; both share its code.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow  # make check leaves it out; make test runs it

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ish_soak", SOAK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(240)
def test_five_soak_cycles_leave_nothing_behind() -> None:
    result = load_soak().soak(cycles=5, fresh_every=0)
    assert result["orphans"] == 0, result
    assert result["unreported_errors"] == [], result
    assert result["errors_over_2s"] == {"raise": 0, "kill": 0, "interrupt": 0}, result
    assert result["max_kernel_kill_cleanup_s"] < 3.0, result
