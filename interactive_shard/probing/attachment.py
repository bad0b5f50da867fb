"""What a probe installed on one model, and how it comes off: one base for every probe.

Every probe's handle (``PrecisionRecorder``, ``SpanRecorder``, ``LifecycleProbe``) is an
``Attachment``: it is ``attached`` until ``detach()``; the hooks and patches it installs
leave an undo callable each (``undo``, a list of callables run newest first); an
explicit flush (``ctx.flush()``, a run's end) calls its ``send`` so that what it holds
goes out; and a model watched in one ``cluster.run`` and trained in the next announces
itself again (``new_run()``), since each run's store is its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from interactive_shard.probing import in_backward
from interactive_shard.telemetry import rank as telemetry
from interactive_shard.telemetry.rank import current_run

log = logging.getLogger(__name__)


class Attachment:
    """Base of a probe's handle on one model (see the module docstring)."""

    kind = "probe"  # in the log line of an undo that failed

    def __init__(self) -> None:
        self.iteration = 0  # forwards of the watched model (numbered from 1)
        self.attached = True
        self.undo: list[Callable[[], object]] = [telemetry.before_flush(self.send)]
        self.announced_in = current_run()

    def send(self) -> None:
        """Send what the probe holds (an explicit flush, a detach); nothing by default."""

    def announce(self) -> None:
        """Say what is watched (its watch event) in a run that has not heard it."""

    def begin_iteration(self) -> bool:
        """A forward of the watched model began: send what the last iteration held, count
        this one, announce again in a new ``cluster.run``. False (nothing done) when
        detached or for a forward recomputed in backward (activation checkpointing)."""
        if in_backward() or not self.attached:
            return False
        self.send()
        self.iteration += 1
        if self.new_run():  # watched in one cluster.run, trained in the next
            self.announce()
        return True

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

    def detach(self) -> None:
        """Send what is held, then remove every hook and patch, newest first (one that
        fails is logged, the others still go): the model trains on exactly as before."""
        if not self.attached:
            return
        self.send()
        self.attached = False
        undo, self.undo = self.undo, []
        for fn in reversed(undo):
            try:
                fn()
            except Exception:  # pragma: no cover
                log.exception("%s: undoing %s failed", self.kind, fn)
