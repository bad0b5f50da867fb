"""What the run's own probes cost its ranks: the ``Overhead`` events, read once per store.

``run.overhead`` (the ``overhead`` feature), the badge on every view (``ui.view_base``)
and the report read it; one reader per store (``of``) serves every view of a run. The
rank side: ``telemetry/meter.py``.

Note [Share of the step]
~~~~~~~~~~~~~~~~~~~~~~~~

Background: each probe (a feature's hooks on one rank, ``sending`` the channel's
background flushes, ``collectives`` the ledger) reports two cumulative numbers: the
seconds ``spent`` in its own code and the ``active`` seconds over which it spent them
(from its first callback to its latest; for the background ones from the run's start).
Their ratio is the probe's share: of every second in which it was active, the fraction
that was its own work. For a hook-based probe the active span is the training loop, so
the share is what it adds to a step.

Algorithm: a rank's share adds its probes' shares. The probes of one watch observe the
same steps, and in each step each of them costs its own share of it: the costs add up.
Dividing the summed ``spent`` by the union of the spans instead would count the hooks'
seconds, spent only while training, against a span the background probes stretch over
the whole run (building the model, loading data), and understate what a step pays. The
run's share (``share()``) is the mean of its ranks'; ``most()`` names the rank that pays
the most, which in data parallel sets everyone's pace. A probe's share across ranks is
its summed ``spent`` over its summed ``active`` (the ranks' spans weigh in).

Caveats: probes active at different times (a timeline watch on one model, then a
precision watch on another) each count in full: the sum overstates, up to the largest
of them. What the engine does to reach a Python hook (~1 us a call: pybind, the GIL)
is outside the probes' clocks, and a share says nothing of what a hook prevents (a
comm hook's lost fusion): ``benchmarks/bench_probe_overhead.py`` compares the
self-reported share with a paired step-time ratio.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, cast

from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.run_events import Overhead
from interactive_shard.telemetry.store import RunStore

__all__ = ["Overhead", "OverheadModel", "Row", "of", "percent"]

LAST = ("sending",)  # listed after the features' probes: every probe shares it


@dataclass(frozen=True, slots=True)
class Row:
    """One probe on one rank, as its latest ``Overhead`` said."""

    probe: str
    rank: int
    spent: float  # seconds in its own code
    active: float  # seconds over which it spent them
    calls: int
    iterations: int

    @property
    def share(self) -> float:
        """``spent / active``: the fraction of its active time that was its own work (at
        most 1: callbacks on several threads may overlap)."""
        if self.active <= 0.0:
            return 0.0
        return min(self.spent / self.active, 1.0)


class OverheadModel:
    """The latest ``Overhead`` of every (probe, rank) of ``store``; Note [Share of the
    step]. ``update()`` reads what is new; ``revision`` grows with it."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self._cursor = Cursor(store, {Overhead.KIND: Overhead})
        self._rows: dict[tuple[str, int], Row] = {}
        self.revision = 0

    @property
    def skipped(self) -> int:
        """Events that did not decode."""
        return self._cursor.skipped

    def update(self) -> bool:
        """Read the new ``Overhead`` events; True when any arrived. Each is cumulative:
        only the newest of each (probe, rank) is decoded (a long run's 100k reports cost
        a dict lookup each), an older one only where a newer does not fit."""
        events = self._cursor.take_events()
        done: set[tuple[str, int]] = set()
        for event in reversed(events):
            probe = event.payload.get("probe")
            key = (probe if isinstance(probe, str) else "", event.rank)  # hostile: unhashable
            if key in done:
                continue
            record = self._cursor.decode(event)
            if record is None:
                continue  # skipped and counted: an older report of its probe may fit
            done.add(key)
            self._rows[(record.probe, event.rank)] = Row(
                record.probe,
                event.rank,
                record.spent_s,
                record.active_s,
                record.calls,
                record.iterations,
            )
        if events:
            self.revision += 1
        return bool(events)

    # -- what was recorded -------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        return sorted({rank for _, rank in self._rows})

    @property
    def probes(self) -> list[str]:
        """The probes that reported, in name order, ``sending`` last."""
        names = {probe for probe, _ in self._rows}
        return sorted(names, key=lambda p: (p in LAST, p))

    def rows(self) -> list[Row]:
        """Every (probe, rank), by rank then probe (``probes`` order)."""
        order = {p: i for i, p in enumerate(self.probes)}
        return sorted(self._rows.values(), key=lambda r: (r.rank, order[r.probe]))

    def row(self, probe: str, rank: int) -> Row | None:
        return self._rows.get((probe, rank))

    def table(self) -> list[dict[str, Any]]:
        """``rows()`` as plain dicts (probe, rank, spent_s, active_s, share, calls,
        iterations): what a notebook puts in a DataFrame."""
        return [
            {
                "probe": r.probe,
                "rank": r.rank,
                "spent_s": r.spent,
                "active_s": r.active,
                "share": r.share,
                "calls": r.calls,
                "iterations": r.iterations,
            }
            for r in self.rows()
        ]

    # -- shares (Note [Share of the step]) ---------------------------------------------------
    def share(self, probe: str | None = None, rank: int | None = None) -> float:
        """The share of the step: of ``probe`` on ``rank``; of every probe on ``rank``
        (their shares added); of ``probe`` over every rank (summed spent over summed
        active); of the run (the mean of its ranks'). 0.0 when nothing was recorded."""
        if probe is not None and rank is not None:
            found = self._rows.get((probe, rank))
            return 0.0 if found is None else found.share
        if rank is not None:
            return sum(r.share for r in self._rows.values() if r.rank == rank)
        if probe is not None:
            mine = [r for r in self._rows.values() if r.probe == probe]
            active = sum(r.active for r in mine)
            return min(sum(r.spent for r in mine) / active, 1.0) if active > 0 else 0.0
        ranks = self.ranks
        return sum(self.share(rank=r) for r in ranks) / len(ranks) if ranks else 0.0

    def spent(self, probe: str | None = None, rank: int | None = None) -> float:
        """Seconds spent by ``probe`` (every probe) on ``rank`` (every rank)."""
        return sum(
            r.spent
            for r in self._rows.values()
            if (probe is None or r.probe == probe) and (rank is None or r.rank == rank)
        )

    def most(self) -> int | None:
        """The rank whose probes cost it the largest share (None: nothing recorded)."""
        ranks = self.ranks
        return max(ranks, key=lambda r: (self.share(rank=r), -r)) if ranks else None

    def badge(self, label: Any = str) -> str:
        """One line for a view's status: ``"probes: 1.8% of the step (most: rank 1,
        2.1%)"``; empty when nothing was recorded. ``label``: how a rank is named."""
        ranks = self.ranks
        if not ranks:
            return ""
        text = f"probes: {percent(self.share())} of the step"
        most = self.most()
        if len(ranks) > 1 and most is not None:
            text += f" (most: rank {label(most)}, {percent(self.share(rank=most))})"
        return text


def percent(share: float) -> str:
    """``1.8%``, ``0.12%``, ``<0.01%``: a share read at a glance."""
    value = share * 100
    if value <= 0:
        return "0%"
    if value < 0.01:
        return "<0.01%"
    digits = 0 if value >= 10 else 1 if value >= 1 else 2
    return f"{value:.{digits}f}%"


_READERS: weakref.WeakKeyDictionary[RunStore, OverheadModel] = weakref.WeakKeyDictionary()


def of(store: RunStore) -> OverheadModel:
    """The one reader of ``store`` (the views' badges share it), brought up to date."""
    found = _READERS.get(store)
    if found is None:
        # The store through a weak proxy: a value of ``_READERS`` that held its key would
        # keep every run's store (all its events) alive for the kernel's life.
        found = _READERS[store] = OverheadModel(cast(RunStore, weakref.proxy(store)))
    found.update()
    return found
