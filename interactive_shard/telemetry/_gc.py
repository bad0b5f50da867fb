"""Decoding many events without the garbage collector's full collections.

Note [Pausing the collector's GC]
---------------------------------
Background: a run's events stay alive for the run, and nested payloads (spans, precision
batches, bucket records) are made of lists and dicts the garbage collector tracks: a
64-rank run reaches millions of them. CPython starts a collection every 700 new
container objects, every tenth a middle one and, once the old objects grew by a quarter,
a full one over everything alive. Decoding 100 MB of events with the collector on took
six times as long as with it off (bench_wide, bench_long_run), nearly all of it in
collections that found nothing: events form no cycles.

Algorithm: ``paused()`` disables the collector while one batch (or one recording) is
decoded and enables it again after. The new objects are then counted once, as one young
generation, instead of triggering ~1 young collection per 700 of them and the middle and
full collections those bring about.

Caveats: the switch is process-wide. A pause lasts one decode (milliseconds for a batch);
garbage made meanwhile is collected after it, not lost. If collection was off already
(the user's choice), it stays off. Two threads pausing at once may end one pause early:
harmless, the collector just runs sooner.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Garbage collection off for the block (see Note [Pausing the collector's GC])."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
