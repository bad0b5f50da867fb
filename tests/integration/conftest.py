"""Every integration test module must leave no rank process behind (checked at its end,
after module-scoped clusters closed)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest

import interactive_shard as ish


def _children() -> list[psutil.Process]:
    # multiprocessing's resource tracker / forkserver helpers are not ranks.
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if "resource_tracker" not in " ".join(_cmdline(p))
        and "forkserver" not in " ".join(_cmdline(p))
    ]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.fixture(autouse=True, scope="module")
def no_orphans() -> Iterator[None]:
    yield
    deadline = time.monotonic() + 5
    while left := [p for p in _children() if p.is_running() and p.status() != "zombie"]:
        if time.monotonic() > deadline:
            pytest.fail(f"processes left behind: {[(p.pid, p.name()) for p in left]}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[ish.Cluster]:
    """The CPU ranks a module's tests share: two, with a 120 s collective timeout, unless
    the module says otherwise in ``CLUSTER`` (``Cluster``'s keyword arguments)."""
    options = {"nprocs": 2, "timeout": 120, **getattr(request.module, "CLUSTER", {})}
    with ish.Cluster(**options) as c:
        yield c
