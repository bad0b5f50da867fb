"""Rank-side access to the channel, for probes and for ranks not started by a Cluster.

A Cluster's worker connects on start-up. A process started by ``torchrun`` streams to
a notebook with ``connect(address, token)`` (the values of ``cluster.telemetry``), or
with ``connect_from_env()`` under ``ish.listen``.
"""

from __future__ import annotations

import os
from typing import Any

from interactive_shard.telemetry.emitter import Emitter, before_flush

__all__ = [
    "before_flush",
    "close",
    "connect",
    "connect_from_env",
    "current_run",
    "emit",
    "emitter",
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
