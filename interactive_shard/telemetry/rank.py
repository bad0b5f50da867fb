"""Rank-side access to the channel, for probes and for ranks not started by a Cluster.

A Cluster's worker connects on start-up. A process started by ``torchrun`` streams to
a notebook with ``connect(address, token)`` (the values of ``cluster.telemetry``), or
with ``connect_from_env()`` under ``ish.listen``, or records to its own file with
``record(directory)`` (``ISH_RECORD``). ``ish.watch`` calls ``from_env()``: a script
under ``ISH_TELEMETRY`` or ``ISH_RECORD`` needs nothing else of ours.
"""

from __future__ import annotations

import atexit
import os
import sys
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any

from interactive_shard.telemetry.emitter import Emitter, before_flush
from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.telemetry.run_events import State, payload

__all__ = [
    "before_flush",
    "close",
    "connect",
    "connect_from_env",
    "current_run",
    "emit",
    "emitter",
    "from_env",
    "record",
]

_emitter: Emitter | None = None


def set_emitter(emitter: Emitter | None) -> None:
    global _emitter
    _emitter = emitter


def emitter() -> Emitter | None:
    """The process's emitter, or None when nothing is connected."""
    return _emitter


def current_run() -> int | None:
    """The ``cluster.run`` this process is in (None: not connected). Probes compare it
    to tell a model trained in this run from one watched in an earlier run."""
    return None if _emitter is None else _emitter.run


def emit(kind: str, payload: dict[str, Any], step: int | None = None) -> None:
    """Send an event if connected; probes call this and cost nothing when unconnected."""
    if _emitter is not None:
        _emitter.emit(kind, payload, step)


def connect(address: str, token: str, rank: int | None = None) -> Emitter:
    """Connect this process (e.g. a torchrun rank) to a notebook's collector."""
    if rank is None:
        rank = int(os.environ.get("RANK", "0"))
    emitter = Emitter(address, token, rank)
    set_emitter(emitter)
    emitter.announce()
    return emitter


def connect_from_env() -> Emitter:
    """Connect using ``ISH_TELEMETRY`` / ``ISH_TOKEN`` (see ``ish.listen``) and ``RANK``."""
    try:
        address, token = os.environ["ISH_TELEMETRY"], os.environ["ISH_TOKEN"]
    except KeyError as missing:
        raise RuntimeError(
            f"{missing} is not set: export the values of listener.command_env() in the "
            "environment of every rank (e.g. before torchrun)."
        ) from None
    return connect(address, token)


def close(final: bool = True) -> None:
    """Flush what is buffered, close the stream (``final``) and disconnect.

    Bounded even when no notebook listens any more: sends wait at most
    ``SEND_TIMEOUT_S`` and the rest is dropped and counted (``Emitter.dropped``).
    """
    global _emitter
    emitter, _emitter = _emitter, None  # probes stop emitting into a closing channel
    if emitter is not None:
        try:
            emitter.flush(final=final)
        finally:
            emitter.close()


def record(
    directory: str | os.PathLike[str], rank: int | None = None, world_size: int | None = None
) -> Emitter:
    """Record this process's events to its own file under ``directory`` (``ISH_RECORD``):
    ``telemetry/rank_file.py``. ``rank`` / ``world_size``: torchrun's ``RANK`` and
    ``WORLD_SIZE``, else the process group's, else 0 of 1."""
    from interactive_shard.telemetry.rank_file import FileEmitter

    rank, world_size, torch_version, backend = _where(rank, world_size)
    emitter = FileEmitter(directory, rank, world_size, torch_version=torch_version, backend=backend)
    set_emitter(emitter)
    emitter.announce()
    return emitter


def from_env() -> Emitter | None:
    """Connect as the environment says, once: ``ISH_RECORD=DIR`` records to a file,
    ``ISH_TELEMETRY`` / ``ISH_TOKEN`` stream to a listener; None when neither is set (or
    this process is connected already: its emitter). The stream closes at exit, saying
    whether the script ended with an uncaught error."""
    from interactive_shard.telemetry.rank_file import RECORD_ENV

    if _emitter is not None:
        return _emitter
    folder = os.environ.get(RECORD_ENV, "").strip()
    if folder:
        emitter = record(Path(folder))
    elif os.environ.get("ISH_TELEMETRY"):
        emitter = connect_from_env()
    else:
        return None
    emitter.emit(State.KIND, payload(State(state=RankState.RUNNING)))
    _close_at_exit()
    return emitter


_failure: list[str] = []  # the uncaught error's last line, set by the excepthook


def _close_at_exit() -> None:
    previous = sys.excepthook

    def note(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        _failure.append(traceback.format_exception_only(kind, value)[-1].strip())
        previous(kind, value, tb)

    sys.excepthook = note
    atexit.register(_end)


def _end() -> None:
    """At exit: say how the script ended, flush, close the stream."""
    emitter = _emitter
    if emitter is None:
        return
    if _failure:
        state = State(state=RankState.FAILED, detail=_failure[-1])
    else:
        state = State(state=RankState.FINISHED)
    emitter.flush()  # while connected: the probes' flush hooks send what they hold
    emitter.emit(State.KIND, payload(state), step=emitter.step)
    close(final=True)


def _where(rank: int | None, world_size: int | None) -> tuple[int, int, str, str]:
    """This process's rank and world size, torch's version and the group's backend."""
    backend = torch_version = ""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch_version = str(torch.__version__)
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            backend = str(dist.get_backend())
            rank = dist.get_rank() if rank is None and "RANK" not in os.environ else rank
            if world_size is None and "WORLD_SIZE" not in os.environ:
                world_size = dist.get_world_size()
    if rank is None:
        rank = _env("RANK", 0)
    if world_size is None:
        world_size = _env("WORLD_SIZE", 1)
    return rank, world_size, torch_version, backend


def _env(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer (torchrun sets it).") from None
