"""A probe's own cost: the time spent in its code, from its first call to its latest.

Each probe (``probing.attachment.Attachment.meter``) and the channel's background
flushes (``Emitter.sending``) hold one; ``Overhead`` events carry what they measured
(``run.overhead``). A measurement is two ``perf_counter`` reads (~0.1 us) per call.
"""

from __future__ import annotations

import time
from typing import Any

_clock = time.perf_counter


class Meter:
    """Time spent inside ``with meter:`` blocks (nested blocks count once), the calls,
    and the span from the first block's start to the latest block's end."""

    __slots__ = ("_depth", "_since", "calls", "first", "last", "spent")

    def __init__(self) -> None:
        self.spent = 0.0
        self.calls = 0
        self.first: float | None = None
        self.last = 0.0
        self._depth = 0
        self._since = 0.0

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
        """Seconds from the first call's start to the latest call's end."""
        return 0.0 if self.first is None else self.last - self.first
