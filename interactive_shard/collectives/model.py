"""CollectivesModel: the collective ledger of a run (``run.collectives``).

Consumes the ``ledger`` events of a ``RunStore`` (``events.py``) with a cursor, so it
serves a live run, a loaded recording and a Flight Recorder dump alike. Per rank, the
latest entry for each (group, seq) holds; the verdicts are ``analysis.py``'s. No widgets,
no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from interactive_shard.collectives import analysis
from interactive_shard.collectives.analysis import Divergence, Still
from interactive_shard.collectives.events import Ledger, LedgerEntry
from interactive_shard.telemetry.consume import Cursor
from interactive_shard.telemetry.rank_state import RankState
from interactive_shard.telemetry.run_events import State
from interactive_shard.telemetry.store import RunStore
from interactive_shard.ui.live import ShowsView

HANG_S = 5.0  # a collective pending this long while a rank never issued it: flagged live
_RANK = {"issued": 0, "pending": 1, "completed": 2}  # a state never goes back
_ENDED = frozenset({RankState.FINISHED, RankState.FAILED})


@dataclass(frozen=True)
class Finding:
    """What the ledger says, in a line: ``kind`` is ``divergence`` or ``hang``."""

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
        self._cursor = Cursor(store, {Ledger.KIND: Ledger})
        self._states = Cursor(store, {State.KIND: State})
        self._version = -1
        self._entries: dict[int, dict[tuple[str, int], LedgerEntry]] = {}
        self._issued: dict[int, dict[str, int]] = {}
        self._still: dict[int, Still] = {}
        self._still_at: dict[int, float] = {}  # when each still rank said so (event time)
        self._groups: dict[str, list[int]] = {}
        self._ended: set[int] = set()
        self._latest = 0.0  # the newest event time seen (the model's "now")
        self._verdict: tuple[int, Divergence | None] | None = None

    def update(self) -> bool:
        """Consume new events; True when the ledger changed."""
        if self.store.version == self._version:
            return False
        self._version = self.store.version
        events, records = self._cursor.take_records()
        for e, ledger in zip(events, records, strict=True):
            self._add(e.rank, e.t, ledger)
        for e, state in zip(*self._states.take_records(), strict=True):
            if state.state in _ENDED:
                self._ended.add(e.rank)
        if events:
            self.revision += 1
        return bool(events)

    def _add(self, rank: int, t: float, ledger: Ledger) -> None:
        mine = self._entries.setdefault(rank, {})
        for entry in ledger.entries:
            key = (entry.group, entry.seq)
            known = mine.get(key)
            if known is None or _RANK[entry.state] >= _RANK[known.state]:
                mine[key] = entry if entry.caller or known is None else _named(entry, known)
        if ledger.issued:
            before = self._issued.get(rank)
            self._issued[rank] = dict(ledger.issued)
            if before != self._issued[rank] and ledger.still_s is None:
                self._still.pop(rank, None)  # it moved
        if ledger.still_s is not None:
            self._still[rank] = Still(ledger.still_s, ledger.in_collective, list(ledger.stack))
            self._still_at[rank] = t - ledger.still_s
        for g in ledger.groups:
            self._groups[g.name] = list(g.ranks)
        self._latest = max(self._latest, t)

    @property
    def skipped(self) -> int:
        """Events that could not be read: logged, not kept."""
        return self._cursor.skipped

    # -- what was recorded ------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        self.update()
        return sorted(set(self._entries) | set(self._issued))

    @property
    def groups(self) -> dict[str, list[int]]:
        """Process group -> its ranks (as the ranks announced them)."""
        self.update()
        return dict(self._groups)

    def entries(self, rank: int, group: str | None = None) -> list[LedgerEntry]:
        """``rank``'s collectives in order (by group, then sequence number)."""
        self.update()
        mine = self._entries.get(rank, {})
        keys = sorted(k for k in mine if group is None or k[0] == group)
        return [mine[k] for k in keys]

    def __len__(self) -> int:
        self.update()
        return sum(map(len, self._entries.values()))

    # -- verdicts ---------------------------------------------------------------------------
    @property
    def over(self) -> bool:
        """Every rank that reported has ended (finished, failed or gone)."""
        self.update()
        ranks = set(self._entries) | set(self._issued)
        return bool(ranks) and ranks <= self._ended

    def divergence(self) -> Divergence | None:
        """The first point where the ranks' collectives differ, or None."""
        self.update()
        if self._verdict is None or self._verdict[0] != self.store.version:
            found = analysis.divergence(
                self._entries, self._issued, self._still, over=self.over, groups=self._groups
            )
            self._verdict = (self.store.version, found)
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
        mine = self._entries.get(rank, {})
        newest: tuple[float, LedgerEntry] | None = None
        for group, n in self._issued.get(rank, {}).items():
            e = mine.get((group, n - 1))
            if e is not None and e.state != "completed":
                key = (e.start or 0.0, e)
                newest = key if newest is None or key[0] >= newest[0] else newest
        if newest is not None:
            return newest[1]
        # Issued from Python and never returned: not noted yet (Flight Recorder not read).
        group, n = max(self._issued.get(rank, {"?": 0}).items(), key=lambda kv: kv[1])
        where = next((f for f in reversed(still.stack) if "torch" not in f), "")
        return LedgerEntry(group=group, seq=max(n - 1, 0), op="?", caller=where, state="pending")

    def waiting_for(self) -> list[int]:
        """The ranks the others wait for (empty: nobody waits, or all wait in one)."""
        self.update()
        return analysis.waiting_for(self._entries, self._issued, self._still, self._groups)

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

    def unreported(self) -> list[int]:
        """Ranks of the run that sent nothing while others sent their ledgers."""
        reported = set(self.ranks)
        if not reported:
            return []
        return sorted(set(range(self.store.info.world_size)) - reported)

    def hang_flagged(self, threshold: float = HANG_S) -> bool:
        """A collective has been pending on some ranks, and not issued on others, for at
        least ``threshold`` seconds (what the view flags live)."""
        self.update()
        if not self.waiting_for():
            return False
        return any(
            self._latest - since >= threshold
            for r, since in self._still_at.items()
            if r in self._still and self._still[r].in_collective
        )

    def __repr__(self) -> str:
        d = self.divergence()
        said = f", divergence {d.kind} at #{d.seq}" if d is not None else ""
        return f"CollectivesModel({len(self)} entries, ranks {self.ranks}{said})"


def _named(entry: LedgerEntry, known: LedgerEntry) -> LedgerEntry:
    """``entry`` with the caller an earlier report of it named."""
    return msgspec.structs.replace(entry, caller=known.caller)
