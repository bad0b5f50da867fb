"""The ledger's verdicts, pure: the first divergence between ranks, and who a hang waits for.

Note [Aligning ranks by sequence number]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~

Background: every rank of a process group numbers the collectives it issues in that
group 0, 1, 2, ...; a backend matches the k-th of one rank with the k-th of every other
(gloo and NCCL alike), so a healthy run has, for each (group, seq), one collective on
every rank with the same op, dtype and shape. A desync is the first seq where they
differ; a hang is a rank that never issues the seq the others wait in.

Algorithm: per group, walk the sequence numbers some rank recorded, ascending. At each,
a rank either has an entry, has not issued it yet (its position, the group's counter, is
not past it), or has issued it without a record (a gap: the ring dropped it, or it came
before this run's store began): gaps are not compared. The first seq whose entries differ
in op, dtype or shape, or whose callers differ while the neighbours say why, is the
divergence: ``order`` when two ranks hold each other's next collective (a data-dependent
branch), ``missing`` when one rank's entry at seq matches another's at seq + 1 (a
collective issued on some ranks only: the others miss it), else ``op``, ``dtype`` or
``shape`` against the collective most ranks issued (ties: the lowest rank's). A seq every
present rank agrees on but some rank never issued is ``missing`` once the ranks that
issued it stand still inside it (the hang this causes) or the run is over.

Caveats: a collective the ring dropped on every rank hides a divergence in it; the
verdict is the first one seen, and what follows a divergence is not analysed (the ranks
are out of step from there). Callers are compared only as evidence of a shift or a swap:
two ranks may issue the same collective from different lines on purpose.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from interactive_shard.collectives.events import LedgerEntry

Kind = Literal["missing", "op", "shape", "dtype", "order"]
Signature = tuple[str, str, tuple[int, ...]]

FIXES: dict[Kind, str] = {
    "missing": (
        "a collective ran on some ranks only: look for a rank-conditional call "
        "(`if rank == 0: dist.all_reduce(...)`), a data-dependent branch or early exit, or a "
        "parameter that got no gradient on one rank (DDP: find_unused_parameters=True)"
    ),
    "op": "the ranks called different collectives at this point (another call, or the "
    "same calls in another order): make every rank issue the same collectives in the same "
    "order",
    "dtype": "the ranks sent different dtypes: cast to one dtype on every rank (autocast or "
    "a mixed-precision setting that differs between ranks?)",
    "shape": "the ranks sent tensors of different shapes: pad or make the shapes equal on "
    "every rank (a data-dependent size, such as the last batch?)",
    "order": "two collectives ran in a different order on some ranks: look for a "
    "data-dependent branch or a dict/set iteration whose order differs between ranks",
}


@dataclass(frozen=True)
class Divergence:
    """The first point where the ranks' collectives differ."""

    kind: Kind
    group: str
    seq: int
    ranks: list[int]  # the ranks that differ from the others, or miss it
    per_rank: dict[int, LedgerEntry | None]  # what each rank issued at seq (None: nothing)
    fix: str

    @property
    def message(self) -> str:
        def said(rank: int) -> str:
            e = self.per_rank.get(rank)
            if e is None:
                return f"rank {rank}: nothing"
            shape = "×".join(map(str, e.shape)) or "scalar"
            by = f" from {e.caller}" if e.caller else ""
            return f"rank {rank}: {e.op} {e.dtype} [{shape}]{by}"

        who = ", ".join(map(str, self.ranks))
        what = {
            "missing": f"rank(s) {who} never issued it",
            "order": f"rank(s) {who} issued it in another order",
        }.get(self.kind, f"rank(s) {who} differ in {self.kind}")
        lines = "; ".join(said(r) for r in sorted(self.per_rank))
        return (
            f"group {self.group} collective #{self.seq}: {what} ({lines}). Likely fix: {self.fix}"
        )


@dataclass(frozen=True)
class Still:
    """A rank standing still: since when its position has not moved, where, whether it
    waits inside a collective."""

    seconds: float
    in_collective: bool
    stack: list[str] = field(default_factory=list)


def signature(e: LedgerEntry) -> Signature:
    return e.op, e.dtype, tuple(e.shape)


# One group's ledger: rank -> seq -> entry; and each rank's position (collectives issued).
Table = Mapping[int, Mapping[int, LedgerEntry]]


@dataclass(frozen=True)
class GroupState:
    """One process group as the analysis reads it: its members, each member's entries
    and position (None: the rank reported nothing of the group: unknown)."""

    name: str
    members: list[int]
    entries: Table
    at: Mapping[int, int | None]


def first_divergence(
    group: GroupState, still: Mapping[int, Still], *, over: bool, start: int = 0
) -> tuple[Divergence | None, int]:
    """The group's first divergence at or after ``start``, and the first sequence number
    not yet settled (every member past it, all agreeing): a later call starts there."""
    members = [r for r in group.members if group.at.get(r) is not None]
    if len(group.members) < 2 or len(members) < 1:
        return None, start
    at = {r: int(group.at[r] or 0) for r in members}
    mine = {r: group.entries.get(r, {}) for r in group.members}
    seqs = sorted({s for r in members for s in mine[r] if s >= start})
    settled = start
    unknown = len(members) < len(group.members)  # a member that said nothing: not settled
    for seq in seqs:
        here = {r: mine[r].get(seq) for r in group.members}
        present = {r: e for r, e in here.items() if e is not None}
        absent = [r for r in members if at[r] <= seq]  # not issued (yet)
        sigs = {signature(e) for e in present.values()}
        if len(sigs) > 1 or _callers_shifted(seq, present, mine):
            return _classify(group.name, seq, group.members, here, present, mine), settled
        if absent:
            waited = [r for r in present if r in still and still[r].in_collective]
            if over or (waited and _last(seq, present, mine)):
                per_rank = dict(here)
                missing = Divergence("missing", group.name, seq, absent, per_rank, FIXES["missing"])
                return missing, settled
        elif (
            not unknown
            and settled == seq
            and len(present) == len(members)
            and all(seq + 1 in mine[r] for r in members)
        ):
            settled = seq + 1  # all agree, and every next one arrived: settled for good
    return None, settled


def _last(seq: int, present: Mapping[int, LedgerEntry], mine: Table) -> bool:
    """``seq`` is the newest collective of every rank that issued it (where they wait)."""
    return all(seq + 1 not in mine[r] for r in present)


def _callers_shifted(seq: int, present: Mapping[int, LedgerEntry], mine: Table) -> bool:
    """Same collective, different callers, and one rank's next is another's this: a
    collective issued on some ranks only, paired by the backend with the others' next."""
    callers = {e.caller for e in present.values()}
    if len(callers) < 2 or "" in callers:
        return False
    return _shift(seq, present, mine) is not None


def _shift(
    seq: int, present: Mapping[int, LedgerEntry], mine: Table
) -> tuple[list[int], list[int]] | None:
    """(ranks with an extra collective at seq, the others) when an extra rank's entry at
    seq + 1 matches (signature and caller) the others' at seq."""
    for x in sorted(present):
        after = mine[x].get(seq + 1)
        if after is None or _same(present[x], after):
            continue
        rest = [r for r in present if _same(present[r], after)]
        extras = [r for r in present if r not in rest]
        nexts = [mine[e].get(seq + 1) for e in extras]
        if rest and all(n is not None and _same(n, after) for n in nexts):
            return extras, rest
    return None


def _same(a: LedgerEntry, b: LedgerEntry) -> bool:
    return signature(a) == signature(b) and (not a.caller or not b.caller or a.caller == b.caller)


def _classify(
    group: str,
    seq: int,
    members: list[int],
    here: Mapping[int, LedgerEntry | None],
    present: Mapping[int, LedgerEntry],
    mine: Table,
) -> Divergence:
    per_rank = {r: here[r] for r in members}
    # order: two ranks hold each other's next collective (their callers may differ: the
    # two branches of an if hold the two calls each)
    for a in present:
        for b in present:
            if a >= b or signature(present[a]) == signature(present[b]):
                continue
            na, nb = mine[a].get(seq + 1), mine[b].get(seq + 1)
            if (
                na is not None
                and nb is not None
                and signature(na) == signature(present[b])
                and signature(nb) == signature(present[a])
            ):
                like_b = {r for r in present if signature(present[r]) == signature(present[b])}
                odd = _minority(present, like_b)
                return Divergence("order", group, seq, odd, per_rank, FIXES["order"])
    shifted = _shift(seq, present, mine)
    if shifted is not None:  # an extra collective on some ranks: the others miss it
        _, missing = shifted
        return Divergence("missing", group, seq, sorted(missing), per_rank, FIXES["missing"])
    sigs = {r: signature(e) for r, e in present.items()}
    common = Counter(sigs.values()).most_common()
    top = [s for s, n in common if n == common[0][1]]
    reference = top[0] if len(top) == 1 else sigs[min(present)]
    odd = sorted(r for r, s in sigs.items() if s != reference)
    first = present[odd[0]]
    ref = next(e for e in present.values() if signature(e) == reference)
    kind: Kind = "op" if first.op != ref.op else "dtype" if first.dtype != ref.dtype else "shape"
    return Divergence(kind, group, seq, odd, per_rank, FIXES[kind])


def _minority(present: Mapping[int, LedgerEntry], one_side: set[int]) -> list[int]:
    """The smaller side of a split (ties: the side without the lowest rank)."""
    other = set(present) - one_side
    if len(one_side) != len(other):
        return sorted(one_side if len(one_side) < len(other) else other)
    return sorted(other if min(present) in one_side else one_side)


def waiting_for(group: GroupState, still: Mapping[int, Still]) -> list[int]:
    """The ranks the others wait for in ``group``: where some member stands still inside
    a collective at its position, the members that have not issued that collective."""
    at = {r: n for r, n in group.at.items() if n is not None}
    waiting = [r for r in at if r in still and still[r].in_collective]
    if not waiting:
        return []
    front = max(at[r] for r in waiting)  # the newest collective a waiting rank issued
    return sorted(r for r in group.members if r in at and at[r] < front and r not in waiting)
