"""Outcome: when a run is finished or failed, decided in one place.

Note [Run outcome]
------------------
Background: a run is over when every rank replied *and* the events it sent before
replying have arrived; or when one rank failed and the others had time to report.
Ranks that never reply then are stuck (typically in a collective with the failed
rank) and must be killed, and a run whose process group failed leaves ranks that
cannot be trusted with another collective.

Algorithm:
1. ``reply(rank, kind, sent)`` records each rank's first reply (later ones are
   ignored) and how many events the rank sent in the run.
2. ``received(rank, n)`` counts the run's events that arrived from a rank;
   ``stream_closed(rank)`` records that the rank's event stream ended (its ``final``
   batch arrived), so no event of the run is still in flight.
3. ``decided()``:
   * while some rank has not replied: True once ``failure_grace_s`` passed since
     the first failure (never without a failure: a long run is not stuck);
   * once every rank replied: True when every stream of a rank that is still alive
     closed, or when no event nor reply arrived for ``stream_grace_s`` (a stream that
     never closes must not hold the notebook forever; one that is still delivering,
     600k events behind, is not given up on).
4. ``verdict()`` says which ranks are stuck and whether the ranks must restart;
   ``missing()`` how many events each rank sent that never arrived.

The clock is injected, so the timing rules are unit-tested without waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

# After one rank fails, wait this long for the others to report before deciding.
FAILURE_GRACE_S = 1.0
# After every rank replied, give up on their event streams closing once nothing arrived
# for this long.
STREAM_GRACE_S = 5.0


class Reply(str, Enum):
    """How a rank ended its part of a run."""

    DONE = "done"  # returned a result
    ERROR = "error"  # raised; its process group is still usable
    BROKEN = "broken"  # raised because its process group failed
    DIED = "died"  # the process exited (killed by a signal, or crashed)

    @property
    def failed(self) -> bool:
        return self is not Reply.DONE

    @property
    def breaks_group(self) -> bool:
        return self in (Reply.BROKEN, Reply.DIED)


@dataclass(frozen=True)
class Verdict:
    """What the cluster must do once a run is decided."""

    stuck: list[int]  # never replied: kill them
    failed: list[int]  # replied with a failure (or died)
    restart: bool  # the ranks cannot be reused: a group failed, a rank died or was stuck


class Outcome:
    """Replies and closed streams of one run, and the decision when it is over.

    Thread-safe: the cluster's supervisor and collector threads report, the notebook's
    main thread decides and waits (``wait_for_change``).
    """

    def __init__(
        self,
        world_size: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        failure_grace_s: float = FAILURE_GRACE_S,
        stream_grace_s: float = STREAM_GRACE_S,
    ) -> None:
        self.world_size = world_size
        self._clock = clock
        self._failure_grace_s = failure_grace_s
        self._stream_grace_s = stream_grace_s
        self._cond = threading.Condition()
        self._replies: dict[int, Reply] = {}
        self._streams_closed: set[int] = set()
        self._sent: dict[int, int] = {}  # rank -> events it says it sent in the run
        self._received = [0] * world_size
        self._first_failure: float | None = None
        self._last_news = 0.0  # the last reply, or the last event that arrived after it

    # -- reports ----------------------------------------------------------------------------
    def reply(self, rank: int, kind: Reply, sent: int | None = None) -> bool:
        """Record ``rank``'s reply (``sent``: the events it sent in the run, if it could
        say); False (and ignored) when it had replied already."""
        with self._cond:
            if rank in self._replies:
                return False
            now = self._clock()
            self._replies[rank] = kind
            if sent is not None:
                self._sent[rank] = sent
            self._last_news = now
            if kind.failed and self._first_failure is None:
                self._first_failure = now
            self._cond.notify_all()
            return True

    def received(self, rank: int, n: int) -> None:
        with self._cond:
            self._received[rank] += n
            self._last_news = self._clock()

    def stream_closed(self, rank: int) -> None:
        with self._cond:
            self._streams_closed.add(rank)
            self._cond.notify_all()

    # -- state --------------------------------------------------------------------------------
    @property
    def replies(self) -> dict[int, Reply]:
        with self._cond:
            return dict(self._replies)

    @property
    def pending(self) -> list[int]:
        """Ranks that have not replied yet."""
        with self._cond:
            return [r for r in range(self.world_size) if r not in self._replies]

    def decided(self) -> bool:
        """Whether the run is over (Note [Run outcome], step 3)."""
        with self._cond:
            now = self._clock()
            if len(self._replies) < self.world_size:
                failed_at = self._first_failure
                return failed_at is not None and now - failed_at >= self._failure_grace_s
            dead = {r for r, kind in self._replies.items() if kind is Reply.DIED}
            open_streams = set(self._replies) - self._streams_closed - dead
            return not open_streams or now - self._last_news >= self._stream_grace_s

    def missing(self) -> dict[int, int]:
        """Per rank, the events it said it sent that have not arrived (none: left out)."""
        with self._cond:
            short = {r: n - self._received[r] for r, n in self._sent.items()}
            return {r: n for r, n in sorted(short.items()) if n > 0}

    def verdict(self) -> Verdict:
        with self._cond:
            stuck = [r for r in range(self.world_size) if r not in self._replies]
            failed = sorted(r for r, kind in self._replies.items() if kind.failed)
            broken = any(kind.breaks_group for kind in self._replies.values())
            return Verdict(stuck=stuck, failed=failed, restart=bool(stuck) or broken)

    def wait_for_change(self, timeout: float) -> None:
        """Block until a report arrives or ``timeout`` seconds pass."""
        with self._cond:
            self._cond.wait(timeout)
