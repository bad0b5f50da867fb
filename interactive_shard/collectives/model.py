"""CollectivesModel: the collective ledger of a run (``run.collectives``).

Consumes the ``ledger`` events of a ``RunStore`` (``events.py``) with a cursor, so it
serves a live run, a loaded recording and a Flight Recorder dump alike. Per rank, the
latest entry for each (group, seq) holds (a state never goes back); the verdicts are
``analysis.py``'s. A view's refresh reads under a time budget (``budget``: 100k new
collectives cost more than a refresh may take) and its poller reads the rest between
ticks (``backlog`` counts it); the public API reads everything. No widgets, no torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import msgspec

from interactive_shard.collectives import analysis
from interactive_shard.collectives.analysis import Divergence, GroupState, Still
from interactive_shard.collectives.events import Ledger, LedgerEntry
from interactive_shard.telemetry.consume import Budget, Cursor
from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.telemetry.run_events import State
from interactive_shard.telemetry.schema import Event
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

HANG_S = 5.0  # a collective pending this long while a rank never issued it: flagged live
CHUNK = 64  # ledger events read between two looks at the clock under a budget
_RANK = {"issued": 0, "pending": 1, "completed": 2}  # a state never goes back
_ENDED = frozenset({RankState.FINISHED, RankState.FAILED})


@dataclass(frozen=True)
class Finding:
    """What the ledger says, in a line: ``kind`` is ``divergence``, ``hang`` or
    ``unreported``."""

    kind: str
    message: str
    ranks: list[int]


class CollectivesModel(ShowsView):
    """Every collective each rank issued, per process group, in order.

    >>> c = run.collectives                          # doctest: +SKIP
    >>> [(e.seq, e.op, e.caller) for e in c.entries(0)][:3]
    >>> c.divergence()            # the first point where the ranks differ, or None
    >>> c.pending(), c.waiting_for()
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.revision = 0
        self.backlog = 0  # ledger events taken from the store, not read yet
        self.budget = Budget()
        self._cursor = Cursor(store, {Ledger.KIND: Ledger})
        self._states = Cursor(store, {State.KIND: State})
        self._backlog: deque[Event] = deque()
        self._version = -1
        self._tables: dict[str, dict[int, dict[int, LedgerEntry]]] = {}  # group -> rank -> seq
        self._top: dict[str, dict[int, int]] = {}  # group -> rank -> last seq + 1
        self._low: dict[str, int] = {}  # group -> lowest seq recorded
        self._issued: dict[int, dict[str, int]] = {}
        self._still: dict[int, Still] = {}
        self._still_since: dict[int, float] = {}  # when each still rank stopped moving
        self._members: dict[str, list[int]] = {}  # as the ranks announced them
        self._ended: set[int] = set()
        self._latest = 0.0  # the newest event time seen (the model's "now")
        self._settled: dict[str, int] = {}  # group -> first seq not known to agree for good
        self._verdict: tuple[tuple[object, ...], Divergence | None] | None = None

    # -- consuming events --------------------------------------------------------------------
    def update(self) -> bool:
        """Read new events (all of them, outside ``budget``); True when the ledger changed."""
        new: list[Event] = []
        if self.store.version != self._version:
            self._version = self.store.version
            new = self._cursor.take_events()
            self._backlog.extend(new)
            self.backlog += len(new)
            for e, state in zip(*self._states.take_records(), strict=True):
                if state.state in _ENDED:
                    self._ended.add(e.rank)
        # New events: some progress (a chunk) even when the budget is spent; then read
        # until it is (outside a budget: everything).
        changed = bool(new) and self._read()
        while self._backlog and not self.budget.spent:
            changed = self._read() or changed
        if changed:
            self.revision += 1
        return changed

    def _read(self) -> bool:
        """The backlog's first ``CHUNK`` events under a budget, else all of it."""
        n = min(CHUNK, len(self._backlog)) if self.budget.limited else len(self._backlog)
        chunk = [self._backlog.popleft() for _ in range(n)]
        self.backlog -= n
        for e, ledger in zip(chunk, self._decode(chunk), strict=True):
            if ledger is not None:
                self._add(e.rank, e.t, ledger)
        return n > 0

    def _decode(self, events: list[Event]) -> list[Ledger | None]:
        try:
            decoded: list[Ledger | None] = msgspec.convert(
                [e.payload for e in events], list[Ledger]
            )
            return decoded
        except (msgspec.ValidationError, TypeError):
            return [self._cursor.decode(e) for e in events]

    def _add(self, rank: int, t: float, ledger: Ledger) -> None:
        for entry in ledger.entries:
            mine = self._tables.setdefault(entry.group, {}).setdefault(rank, {})
            known = mine.get(entry.seq)
            if known is None or _RANK[entry.state] >= _RANK[known.state]:
                mine[entry.seq] = entry if entry.caller or known is None else _named(entry, known)
            top = self._top.setdefault(entry.group, {})
            if entry.seq >= top.get(rank, 0):
                top[rank] = entry.seq + 1
            if entry.seq < self._low.get(entry.group, entry.seq + 1):
                self._low[entry.group] = entry.seq
        if ledger.issued:
            moved = self._issued.get(rank) != ledger.issued
            self._issued[rank] = dict(ledger.issued)
            if moved and ledger.still_s is None:
                self._still.pop(rank, None)
        if ledger.still_s is not None:
            self._still[rank] = Still(ledger.still_s, ledger.in_collective, list(ledger.stack))
            self._still_since[rank] = t - ledger.still_s
        for g in ledger.groups:
            self._members[g.name] = list(g.ranks)
        self._latest = max(self._latest, t)

    @property
    def skipped(self) -> int:
        """Events that could not be read: logged, not kept."""
        self.update()
        return self._cursor.skipped

    # -- what was recorded ------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted({r for per in self._tables.values() for r in per} | set(self._issued))

    @property
    def groups(self) -> dict[str, list[int]]:
        """Process group -> its ranks (as announced; else the ranks that reported it)."""
        self.update()
        names = set(self._tables) | {g for per in self._issued.values() for g in per}
        return {g: self._group(g).members for g in sorted(names)}

    def counts(self) -> dict[str, int]:
        """Process group -> entries recorded in it (all ranks)."""
        self.update()
        return {g: sum(map(len, per.values())) for g, per in self._tables.items()}

    def busiest(self) -> list[str]:
        """The groups with entries, the most used first (what the view and report show)."""
        counts = self.counts()
        return sorted(counts, key=lambda g: (-counts[g], g))

    def table(self, group: str) -> dict[int, dict[int, LedgerEntry]]:
        """``group``'s entries as rank -> seq -> entry (the model's own: do not change)."""
        self.update()
        return self._tables.get(group, {})

    def seq_range(self, group: str) -> tuple[int, int] | None:
        """The lowest and highest sequence number recorded in ``group`` (None: none)."""
        self.update()
        low = self._low.get(group)
        return None if low is None else (low, max(self._top[group].values()) - 1)

    def entries(self, rank: int, group: str | None = None) -> list[LedgerEntry]:
        """``rank``'s collectives in order (by group, then sequence number)."""
        self.update()
        names = sorted(self._tables) if group is None else [group]
        out: list[LedgerEntry] = []
        for g in names:
            mine = self._tables.get(g, {}).get(rank, {})
            out += [mine[s] for s in sorted(mine)]
        return out

    def __len__(self) -> int:
        self.update()
        return sum(self.counts().values())

    def _group(self, name: str) -> GroupState:
        table = self._tables.get(name, {})
        reported = set(table) | {r for r, per in self._issued.items() if name in per}
        members = self._members.get(name) or sorted(reported)
        at = {
            r: max(self._issued.get(r, {}).get(name, 0), self._top.get(name, {}).get(r, 0))
            if r in reported
            else None
            for r in members
        }
        return GroupState(name, members, table, at)

    # -- verdicts ---------------------------------------------------------------------------
    @property
    def over(self) -> bool:
        """Every rank that reported has ended (finished, failed or gone)."""
        self.update()
        ranks = set(self.ranks)
        return bool(ranks) and ranks <= self._ended

    def divergence(self) -> Divergence | None:
        """The first point where the ranks' collectives differ, or None."""
        self.update()
        key = (self.revision, self.over, tuple(sorted(self._still)))
        if self._verdict is None or self._verdict[0] != key:
            found = []
            for name in sorted(self._tables):
                d, settled = analysis.first_divergence(
                    self._group(name), self._still, over=self.over, start=self._settled.get(name, 0)
                )
                self._settled[name] = settled
                if d is not None:
                    found.append(d)
            best = min(found, key=lambda d: (d.seq, d.group)) if found else None
            self._verdict = (key, best)
        return self._verdict[1]

    def still(self) -> dict[int, Still]:
        """The ranks standing still: how long, whether in a collective, where."""
        self.update()
        return dict(self._still)

    def pending(self) -> dict[int, LedgerEntry | None]:
        """Rank -> the collective it waits in (None: it waits in none)."""
        self.update()
        out: dict[int, LedgerEntry | None] = {}
        for rank in self.ranks:
            still = self._still.get(rank)
            out[rank] = self._waits_in(rank, still) if still and still.in_collective else None
        return out

    def _waits_in(self, rank: int, still: Still) -> LedgerEntry:
        newest: LedgerEntry | None = None
        for group, n in self._issued.get(rank, {}).items():
            e = self._tables.get(group, {}).get(rank, {}).get(n - 1)
            if e is not None and e.state != "completed":
                if newest is None or (e.start or 0.0) >= (newest.start or 0.0):
                    newest = e
        if newest is not None:
            return newest
        # Issued from Python and never returned: not noted yet (Flight Recorder not read).
        group, n = max(self._issued.get(rank, {"?": 0}).items(), key=lambda kv: kv[1])
        where = still.stack[-1] if still.stack else ""
        return LedgerEntry(group=group, seq=max(n - 1, 0), op="?", caller=where, state="pending")

    def waiting_for(self) -> list[int]:
        """The ranks the others wait for (empty: nobody waits, or all wait in one)."""
        self.update()
        names = set(self._tables) | {g for per in self._issued.values() for g in per}
        out = {r for g in names for r in analysis.waiting_for(self._group(g), self._still)}
        return sorted(out)

    def unreported(self) -> list[int]:
        """Ranks of the run that sent nothing while others sent their ledgers."""
        reported = set(self.ranks)
        if not reported:
            return []
        return sorted(set(range(self.store.info.world_size)) - reported)

    @property
    def findings(self) -> list[Finding]:
        self.update()
        out = []
        d = self.divergence()
        if d is not None:
            out.append(Finding("divergence", d.message, list(d.ranks)))
        silent = self.unreported()
        if silent:
            out.append(
                Finding(
                    "unreported",
                    f"rank(s) {', '.join(map(str, silent))} sent no ledger while the others "
                    "did: it ended before its recorder could send (a crash such as a "
                    "backend's abort on mismatched sizes kills it at once: see its output)",
                    silent,
                )
            )
        late = self.waiting_for()
        if late:
            waiting = sorted(r for r, e in self.pending().items() if e is not None)
            where = "; ".join(
                f"rank {r} is at {(self._still[r].stack or ['?'])[-1]}"
                for r in late
                if r in self._still
            )
            out.append(
                Finding(
                    "hang",
                    f"rank(s) {', '.join(map(str, waiting))} wait in a collective that rank(s) "
                    f"{', '.join(map(str, late))} never issued" + (f" ({where})" if where else ""),
                    late,
                )
            )
        return out

    def hang_flagged(self, threshold: float = HANG_S) -> bool:
        """A collective has been pending on some ranks, and not issued on others, for at
        least ``threshold`` seconds (what the view flags live)."""
        self.update()
        if not self.waiting_for():
            return False
        return any(
            self._latest - since >= threshold
            for r, since in self._still_since.items()
            if r in self._still and self._still[r].in_collective
        )

    def __repr__(self) -> str:
        d = self.divergence()
        said = f", divergence {d.kind} at #{d.seq}" if d is not None else ""
        return f"CollectivesModel({len(self)} entries, ranks {self.ranks}{said})"


def _named(entry: LedgerEntry, known: LedgerEntry) -> LedgerEntry:
    """``entry`` with the caller an earlier report of it named."""
    return msgspec.structs.replace(entry, caller=known.caller)
