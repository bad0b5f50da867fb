"""The timeline probe's state on one rank: the iteration, the spans, their batches.

See Note [Timeline probe] in ``probe.py``. Hooks call ``add`` (a finished span) or
``open`` (a collective whose end a future will note); ``send`` emits what finished as one
``timeline_spans`` event per iteration.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from interactive_shard.probing import in_backward
from interactive_shard.probing.attachment import Attachment
from interactive_shard.timeline.events import Span, TimelineSpans, TimelineWatch

log = logging.getLogger(__name__)
clock = time.monotonic
SEND_AT = 4096  # spans held before a batch goes out early


class _Open:
    """A collective still running: its span is finished by its future's callback."""

    __slots__ = ("detail", "end", "iteration", "launch", "name", "noted", "start", "work")

    def __init__(self, iteration: int, name: str, start: float, detail: dict[str, Any]) -> None:
        self.iteration, self.name, self.start, self.detail = iteration, name, start, detail
        self.end: float | None = None
        self.work: Any = None
        self.noted: Any = None
        self.launch: Any = None  # a bucket all-reduce: the spy's Launch notes its end

    def note_end(self, _fut: Any) -> None:
        self.end = clock()

    def settle(self) -> None:
        """Let a finished collective's end-time callback run (it needs the GIL)."""
        if self.launch is not None:
            if self.launch.end_t is None and self.launch.work.done() and self.launch.noted:
                self.launch.noted.wait()
            self.end = self.launch.end_t
        elif self.end is None and self.work.done() and self.noted is not None:
            self.noted.wait()


class SpanRecorder(Attachment):
    """One watched model on one rank: ``probe.attach`` installs the hooks and appends
    their undo callables to ``undo`` (``probing.attachment.Attachment``)."""

    kind = "timeline probe"
    title = "TimelineProbe"
    feature = "timeline"

    def __init__(self, target: str, depth: int | None, modules: list[str]) -> None:
        self.target = target
        super().__init__()
        self.recorded = 0  # spans sent
        self._done: list[tuple[int, Span]] = []
        self._open: list[_Open] = []
        self._timed: list[tuple[int, str, str, Any, Any, dict[str, Any]]] = []  # CUDA events
        self._anchor: tuple[Any, float] | None = None  # (event, host time) on the device
        self.stamp: Callable[[], Any] = clock  # compute spans' clock: see use_cuda_events
        self._lock = threading.Lock()
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        self._watch = TimelineWatch(
            target=target,  # type: ignore[arg-type]
            depth=depth,
            modules=modules,
            world_size=world,
            host=socket.gethostname(),
            step_is_iteration=True,
        )
        self.params: set[int] = set()  # ids of the watched parameters (set by _install)
        self.closed = False  # the iteration's optimizer step is over (Note, step 6)
        self.watching(self._watch)

    def describe(self) -> str:
        return f"{self.target}, {len(self._watch.modules)} modules"

    # -- lifecycle ---------------------------------------------------------------------------
    def begin_iteration(self) -> bool:
        if not super().begin_iteration():
            return False
        self.closed = False  # a new iteration's optimizer step is still to come
        return True

    def current(self) -> bool:
        """Whether process-wide things (collectives) are this model's: its iteration is
        open (a forward began in the current ``cluster.run`` and its optimizer step has
        not ended). A model watched in an earlier run and never detached does not
        record the next run's, nor does a model record another one's collectives
        between its step and its next forward."""
        return self.attached and self.iteration >= 1 and not self.closed and self.in_announced_run()

    def use_cuda_events(self, device: Any) -> None:
        """Time compute spans on ``device`` with CUDA events: a hook runs when the work
        is queued, the event when the GPU gets there. One event recorded at a known host
        time (after a synchronize) anchors them on the host clock."""
        with torch.cuda.device(device):
            torch.cuda.synchronize()
            anchor = torch.cuda.Event(enable_timing=True)
            anchor.record()
            anchor.synchronize()
            self._anchor = (anchor, clock())

        def stamp() -> Any:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        self.stamp = stamp

    def _host_time(self, event: Any) -> float:
        anchor, t = self._anchor  # type: ignore[misc]
        return t + anchor.elapsed_time(event) / 1e3

    # -- recording ---------------------------------------------------------------------------
    def add(
        self, kind: str, name: str, start: Any, end: Any, detail: dict[str, Any] | None = None
    ) -> None:
        """A finished span of the current iteration."""
        self.add_at(self.iteration, kind, name, start, end, detail)

    def add_at(
        self,
        iteration: int,
        kind: str,
        name: str,
        start: Any,
        end: Any,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """A finished span of ``iteration`` (a backward span, timed after its forward)."""
        if iteration < 1 or not self.attached:
            return
        with self.meter:  # every span a hook or wrapper records: the probe's own cost
            if not isinstance(end, float):  # CUDA events: resolved once the GPU got there
                with self._lock:
                    self._timed.append((iteration, kind, name, start, end, detail or {}))
                return
            span = Span(kind=kind, name=name, start=start, end=end, detail=detail or {})  # type: ignore[arg-type]
            with self._lock:
                self._done.append((iteration, span))
                full = len(self._done) >= SEND_AT
            if full:
                self.send()

    def collective(
        self, op: str, start: float, end: float | None, detail: dict[str, Any], work: Any
    ) -> None:
        """A collective (``_collectives.Listener``): finished (``end``) or still running."""
        if not self.current():
            return
        with self.meter:
            self._collective(op, start, end, detail, work)

    def _collective(
        self, op: str, start: float, end: float | None, detail: dict[str, Any], work: Any
    ) -> None:
        detail = {"op": op, **detail, "backward": in_backward()}
        if end is not None:
            self.add("collective", op, start, end, detail)
            return
        entry = _Open(self.iteration, op, start, detail)
        if hasattr(work, "end_t"):  # the spy's Launch: no second callback on gloo's thread
            entry.launch = work
        else:
            fut = work.get_future() if hasattr(work, "get_future") else work
            entry.work = fut
            entry.noted = fut.then(entry.note_end)
        with self._lock:
            self._open.append(entry)

    def send(self) -> None:
        """Emit the finished spans, one ``timeline_spans`` per iteration."""
        with self._lock:
            done, self._done = self._done, []
            still: list[_Open] = []
            for entry in self._open:
                entry.settle()
                if entry.end is None:
                    still.append(entry)
                else:
                    span = Span(
                        kind="collective",
                        name=entry.name,
                        start=entry.start,
                        end=max(entry.end, entry.start),
                        detail=entry.detail,
                    )
                    done.append((entry.iteration, span))
            self._open = still
            waiting = []
            for it, kind, name, start, end, detail in self._timed:
                if not end.query():
                    waiting.append((it, kind, name, start, end, detail))
                    continue
                s, e = self._host_time(start), self._host_time(end)
                span = Span(kind=kind, name=name, start=s, end=max(e, s), detail=detail)  # type: ignore[arg-type]
                done.append((it, span))
            self._timed = waiting
        by_iteration: dict[int, list[Span]] = {}
        for it, span in done:
            by_iteration.setdefault(it, []).append(span)
        for it, spans in sorted(by_iteration.items()):
            spans.sort(key=lambda s: s.end)
            self.recorded += len(spans)
            # step = the iteration: the kernel files a batch by the event alone, without
            # reading its payload (100k batches: a third of a refresh's budget).
            self.emit(TimelineSpans(iteration=it, spans=spans), step=it)
