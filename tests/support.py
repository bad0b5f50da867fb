"""Helpers the test folders share (pytest puts ``tests/`` on sys.path: ``import support``)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunInfo, RunStore

REPO_ROOT = Path(__file__).resolve().parents[1]


# A valid recording header, as run.save writes it: the starting point of hostile files.
RECORDING_HEADER: dict[str, Any] = {
    "format": "interactive_shard.recording",
    "schema_version": 1,
    "package_version": "0.1.0",
    "torch_version": "2.13.0",
    "world_size": 2,
    "backend": "gloo",
    "device_types": ["cpu"],
    "name": "",
    "extra": {},
    "results": None,
}


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds saying ``what``.

    The one way a test waits for something to happen (never a bare sleep that hopes)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or predicate!r}")
        time.sleep(0.01)


def gone(pids: Iterable[int]) -> bool:
    """Whether every process in ``pids`` has ended (a zombie has: only its entry is left)."""
    return all(not psutil.pid_exists(p) or psutil.Process(p).status() == "zombie" for p in pids)


def make_store(events: Iterable[Event] = (), *, world_size: int = 2, **info: Any) -> RunStore:
    """A 2-rank gloo CPU run's store holding ``events`` (``info`` overrides RunInfo fields)."""
    fields: dict[str, Any] = {"backend": "gloo", "device_types": ["cpu"], **info}
    store = RunStore(RunInfo(world_size=world_size, **fields))
    store.extend(events)
    return store


def notebooks_dir() -> Path:
    """``notebooks/``, or the folder ``ISH_NOTEBOOKS_DIR`` names."""
    return Path(os.environ.get("ISH_NOTEBOOKS_DIR") or REPO_ROOT / "notebooks").resolve()


def notebook_params() -> list[object]:
    """One pytest param per notebook; a skipped one that says why when there are none."""
    folder = notebooks_dir()
    found = sorted(folder.glob("*.ipynb")) if folder.is_dir() else []
    if found:
        return [pytest.param(path, id=path.name) for path in found]
    reason = (
        f"no notebooks in {folder}: add notebooks/NN-topic.ipynb, "
        "or set ISH_NOTEBOOKS_DIR to a folder of notebooks"
    )
    return [pytest.param(None, id="no-notebooks", marks=pytest.mark.skip(reason=reason))]


def kill_tree(pid: int, descendants: list[psutil.Process] | None = None) -> None:
    """Kill process group ``pid`` and every descendant (collected first if not given).

    Kernels run in sessions of their own, so killing the group alone would leave them
    (and their rank processes) behind.
    """
    if descendants is None:
        try:
            descendants = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(descendants, timeout=10)


def lifecycle_state(m: Any) -> dict[str, Any]:
    """Everything a ``LifecycleModel``'s public API says, for comparing two models."""
    out: dict[str, Any] = {"findings": m.findings, "ranks": m.ranks}
    for rank in m.ranks:
        out[f"bytes {rank}"] = m.bytes_by_purpose(rank)
        out[f"collectives {rank}"] = m.collectives(rank)
        for inst in m.instances_of(rank):
            out[f"{rank}/{inst.serial}"] = (inst.settings, inst.hooks, inst.iterations)
    return out


class _NoEvent:
    """SHIM (test only): a no-op ``torch.Event``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait(self, *args: Any, **kwargs: Any) -> None:
        pass


class _NoStream:
    """SHIM (test only): a no-op ``torch.Stream``, usable as a context manager."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoStream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass


@contextlib.contextmanager
def accelerator_shim() -> Iterator[None]:
    """SHIM (test only): no-op events and streams, so DDP's native mixed precision takes
    on a CPU the path it takes on a GPU (its dtypes, not its numbers). DDP makes a
    ``torch.Stream`` at construction (which a CUDA build of torch without a GPU refuses)
    and records ``torch.Event``s in forward (which the CPU build refuses). Restored on
    exit: the rank lives on."""
    import torch

    saved = torch.Event, torch.Stream, torch.accelerator.current_stream
    torch.Event, torch.Stream = _NoEvent, _NoStream  # type: ignore[misc, assignment]
    torch.accelerator.current_stream = lambda *a, **k: _NoStream()  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.Event, torch.Stream, torch.accelerator.current_stream = saved  # type: ignore[misc]
