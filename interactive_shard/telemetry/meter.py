"""A probe's own cost: the time spent in its code, from its first call to its latest.

Each probe holds one (``probing.attachment.Attachment.meter``: every attachment of one
feature on a rank shares the process's ``of(feature)``), as do the collective ledger's
recorder and the channel's background flushes (``Emitter.sending``); ``Overhead``
events carry what they measured (``run.overhead``). A measurement is two
``perf_counter`` reads (~0.1 us) per call; a ``with meter:`` block costs ~0.35 us.

What a meter counts: the probe's code while the rank trains (its hooks and callbacks,
their event sending, a background thread's work), not what an explicit flush does
(``ctx.flush()``, a run's end): that runs outside the step, and counting it would
stretch the span over the time after training. Every meter restarts with each
``cluster.run`` (``restart_all``, from ``Emitter.start_run``): each run's store is its
own, and an idle gap between runs is no part of a step.

A background thread's meter (``steady``) counts its thread's CPU time (``thread_clock``,
``add``): its wall time would count its waits for the GIL, which the training thread
holds most of the time (measured: the channel's flushes read 3x their work). The
training thread's own hooks count wall time: what the step waits for.
"""

from __future__ import annotations

import time
from typing import Any

from interactive_shard.telemetry.run_events import Overhead

_clock = time.perf_counter
thread_clock = time.thread_time  # a background thread's own CPU seconds (~0.5 us a read)
REPORT_S = 1.0  # while training, a meter's numbers go out at most this often


class Meter:
    """Time spent inside ``with meter:`` blocks (nested blocks count once), the calls,
    and the span from the first block's start to the latest block's end.

    ``steady``: a background thread's meter (the channel's flushes, the ledger's ticks),
    which runs whether called or not: its span is from its (re)start to now, so that a
    run with one flush does not read as 100% busy. Its users count CPU time with
    ``add(thread_clock() - began)``, not ``with`` (the module docstring)."""

    __slots__ = ("_depth", "_since", "calls", "first", "last", "said", "spent", "steady")

    def __init__(self, *, steady: bool = False) -> None:
        self.steady = steady
        self.spent = 0.0
        self.calls = 0
        self.first: float | None = _clock() if steady else None
        self.last = 0.0
        self._depth = 0
        self._since = 0.0
        self.said = _clock()  # when its numbers last went out (``due``)

    def __enter__(self) -> Meter:
        self._depth += 1
        if self._depth == 1:
            self._since = _clock()
            if self.first is None:
                self.first = self._since
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.last = now = _clock()
            self.spent += now - self._since
            self.calls += 1

    def add(self, seconds: float, start: float | None = None) -> None:
        """Count ``seconds`` measured elsewhere (a wrapper that times around the call it
        wraps), ending now; ``start``: when they began (default: ``seconds`` ago)."""
        now = _clock()
        if self.first is None:
            self.first = now - seconds if start is None else start
        self.last = now
        self.spent += seconds
        self.calls += 1

    @property
    def active(self) -> float:
        """Seconds from the first call's start to the latest call's end (``steady``: from
        its start to now)."""
        if self.first is None:
            return 0.0
        return (_clock() if self.steady else self.last) - self.first

    def restart(self) -> None:
        """Count from zero again. A block in progress (on another thread) counts from
        its start: its end adds it."""
        self.spent = 0.0
        self.calls = 0
        self.first = _clock() if self.steady else self._since if self._depth else None
        self.last = 0.0
        self.said = _clock()

    def due(self) -> bool:
        """Whether its numbers are due to go out again (``REPORT_S`` since they last
        did, and something was measured); if so they count as sent now."""
        now = _clock()
        if not self.calls or now - self.said < REPORT_S:
            return False
        self.said = now
        return True

    def overhead(self, probe: str, iterations: int = 0) -> Overhead | None:
        """What it measured as ``probe``'s ``Overhead`` event (None: nothing yet)."""
        if not self.calls:
            return None
        self.said = _clock()
        return Overhead(
            probe=probe,
            spent_s=max(self.spent, 0.0),
            active_s=max(self.active, 0.0),
            calls=self.calls,
            iterations=max(iterations, 0),
        )


_METERS: dict[str, Meter] = {}


def of(name: str, *, steady: bool = False) -> Meter:
    """The process's meter of probe ``name``: every attachment of one feature on a rank
    shares it, so two watched models make one row of ``run.overhead``, not two that
    overwrite each other (``steady``: see ``Meter``)."""
    found = _METERS.get(name)
    if found is None:
        found = _METERS.setdefault(name, Meter(steady=steady))
    return found


def restart_all() -> None:
    """A new run: every meter of ``of`` counts from zero again."""
    for meter in list(_METERS.values()):
        meter.restart()
