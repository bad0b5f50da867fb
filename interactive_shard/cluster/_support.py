"""Pieces of a Cluster that hold no cluster state: how a call travels, what to release."""

from __future__ import annotations

import linecache
import logging
import weakref
from typing import Any

import cloudpickle

from interactive_shard.cluster.isolation import Rendezvous
from interactive_shard.cluster.procs import Generation
from interactive_shard.telemetry.channel import Collector

log = logging.getLogger(__name__)


def pickle_call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    # cloudpickle renames the code's file to "<dynamic-code>"; ship the source of fn's
    # file (often a notebook cell) under that name so rank tracebacks show code lines.
    code = getattr(fn, "__code__", None)
    lines = linecache.getlines(code.co_filename) if code is not None else []
    sources = {"<dynamic-code>": (sum(map(len, lines)), None, lines, "<dynamic-code>")}
    try:
        data: bytes = cloudpickle.dumps((fn, args, kwargs, sources))
        return data
    except Exception as exc:
        raise TypeError(
            f"cannot send {getattr(fn, '__qualname__', fn)!r} and its arguments to the ranks: "
            f"{exc}. Pass plain data, tensors or modules as arguments; create open files, "
            "locks or sockets inside the function."
        ) from exc


def preimport_for_fork() -> None:
    """Import what every DDP rank imports, once, in the kernel, before forking.

    ``DDP.__init__`` reads a dynamo setting, which imports torch._dynamo (about 480
    modules, 1-2 s) in each rank; imported here, forked ranks share it and reach their
    first step in tens of milliseconds. Done synchronously: forking while another
    thread is mid-import can deadlock the child.
    """
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # an optional speed-up: never a reason not to start
        log.debug("pre-importing torch._dynamo failed", exc_info=True)


def weak(method: Any) -> Any:
    """A callback that does not keep its Cluster alive (so garbage collection can stop it)."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*args)

    return call


class Resources:
    """What a Cluster must release; closing is idempotent and never raises."""

    def __init__(self, collector: Collector, rendezvous: Rendezvous) -> None:
        self.collector = collector
        self.rendezvous = rendezvous
        self.gen: Generation | None = None

    def close(self) -> None:
        gen, self.gen = self.gen, None
        if gen is not None:
            try:
                gen.stop(graceful=False)
            except Exception:
                log.exception("stopping ranks failed")
        try:
            self.collector.close()
        except Exception:
            log.exception("closing the telemetry collector failed")
        self.rendezvous.close()
