"""What a probe installed on one model, and how it comes off: one base for every probe.

Every probe's handle (``PrecisionRecorder``, ``SpanRecorder``, ``LifecycleProbe``, the
buckets' ``Probe``) is an ``Attachment``: it is ``attached`` until ``detach()``; the hooks
and patches it installs leave an undo callable each (``undo``, a list of callables run
newest first; ``installing()`` runs them at once when installing fails half way); an
explicit flush (``ctx.flush()``, a run's end) calls its ``send`` so that what it holds
goes out; its events go out through ``emit`` (counted in ``emitted``); and a model
watched in one ``cluster.run`` and trained in the next announces itself again
(``watching(event)`` names the watch event, ``new_run()`` / ``announce()`` send it
again), since each run's store is its own.

Its own cost: ``meter`` (``telemetry.meter``, one per feature and process) times the
probe's callbacks, their event sending included: a hook registered as
``self.timed(fn)`` (guarded and timed), a method body in ``with self.meter:``, a wrapper
around a real call ``self.meter.add(...)`` for its own parts only. ``report_cost`` sends
it as an ``Overhead`` event named ``feature``: at every explicit send (a flush, a
detach) and at most once a second from ``begin_iteration``, so a live view sees it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from interactive_shard.probing import guarded, in_backward
from interactive_shard.telemetry import meter as meters
from interactive_shard.telemetry import rank as telemetry
from interactive_shard.telemetry.rank import current_run

log = logging.getLogger(__name__)


class Attachment:
    """Base of a probe's handle on one model (see the module docstring)."""

    kind = "probe"  # in the log line of an undo that failed
    title = ""  # the name its repr shows (default: the class's)
    feature = ""  # the feature whose probe it is: its ``Overhead`` name ("": none sent)

    def __init__(self) -> None:
        self.iteration = 0  # iterations of the watched model (numbered from 1)
        self.attached = True
        self.emitted = 0  # events sent through ``emit``
        self.watched: msgspec.Struct | None = None  # the watch event (``watching``)
        self.meter = meters.of(self.feature) if self.feature else meters.Meter()
        self.undo: list[Callable[[], object]] = [telemetry.before_flush(self._flushed)]
        self.announced_in = current_run()

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        what = self.describe()
        return (
            f"{self.title or type(self).__name__}({what}{', ' if what else ''}"
            f"iteration={self.iteration}, {state})"
        )

    def describe(self) -> str:
        """What is watched, in a few words, for the repr (``"6 params"``)."""
        return ""

    # -- events ------------------------------------------------------------------------------
    def emit(self, event: msgspec.Struct, step: int | None = None) -> None:
        """Send one event now (a no-op when the rank is not connected)."""
        self.emitted += 1
        telemetry.emit(event.KIND, msgspec.to_builtins(event), step)  # type: ignore[attr-defined]

    def send(self) -> None:
        """Send what the probe holds (an explicit flush, a detach); nothing by default."""

    def _flushed(self) -> None:
        self.send()
        self.report_cost(now=True)

    # -- its own cost ------------------------------------------------------------------------
    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a hook that never breaks the step (``probing.guarded``) and whose time
        counts to the probe's own cost (``meter``)."""
        return guarded(fn, self.meter)

    def report_cost(self, *, now: bool = False) -> None:
        """Send what the probe's feature has cost this rank in this run (``Overhead``):
        ``now``, or when due (at most once a second). Not counted in ``emitted``."""
        if self.feature and (now or self.meter.due()):
            event = self.meter.overhead(self.feature, self.iteration)
            if event is not None:
                telemetry.emit(event.KIND, msgspec.to_builtins(event))

    def watching(self, event: msgspec.Struct) -> None:
        """Say what is watched: send its watch ``event`` now and ``announce`` it again in
        every later ``cluster.run`` the model works in."""
        self.watched = event
        self.emit(event)

    def announce(self) -> None:
        """Say what is watched (its watch event) in a run that has not heard it."""
        if self.watched is not None:
            self.emit(self.watched)

    # -- iterations --------------------------------------------------------------------------
    def begin_iteration(self) -> bool:
        """A forward of the watched model began: send what the last iteration held, count
        this one, announce again in a new ``cluster.run``. False (nothing done) when
        detached or for a forward recomputed in backward (activation checkpointing)."""
        if in_backward() or not self.attached:
            return False
        self.send()
        self.report_cost()
        self.iteration += 1
        if self.new_run():  # watched in one cluster.run, trained in the next
            self.announce()
        return True

    def begin_forward(self) -> None:
        """A forward of the watched model began: ``begin_iteration`` for a forward
        pre-hook, which must return None (a value would replace the forward's arguments)."""
        self.begin_iteration()

    def new_run(self) -> bool:
        """Whether a ``cluster.run`` began since the probe last announced itself (it then
        counts as announced in this one)."""
        run = current_run()
        if run == self.announced_in:
            return False
        self.announced_in = run
        return True

    def in_announced_run(self) -> bool:
        """Whether the current ``cluster.run`` is the one the probe announced itself in."""
        return self.announced_in == current_run()

    # -- attach and detach -------------------------------------------------------------------
    @contextmanager
    def installing(self) -> Iterator[None]:
        """Around the code that installs the probe's hooks and patches (each one appends
        its undo to ``undo``): if it raises, what it installed comes off again (``detach``)
        before the error goes on."""
        try:
            yield
        except BaseException:
            self.detach()
            raise

    def detach(self) -> None:
        """Send what is held, then remove every hook and patch, newest first (one that
        fails is logged, the others still go): the model trains on exactly as before."""
        if not self.attached:
            return
        try:
            self.send()
            self.report_cost(now=True)
        except Exception:  # pragma: no cover - a probe bug: what it installed still goes
            log.exception("%s: sending what it held failed", self.kind)
        self.attached = False
        undo, self.undo = self.undo, []
        for fn in reversed(undo):
            try:
                fn()
            except Exception:  # one step failing must not leave the others on
                log.exception("%s: undoing %s failed", self.kind, fn)
