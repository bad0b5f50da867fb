"""The ledger's verdicts (collectives/analysis.py) on hand-made ledgers: each divergence
kind, named with the right ranks, sequence number and callers, and the hang's culprit."""

from __future__ import annotations

from interactive_shard.collectives.analysis import (
    Divergence,
    GroupState,
    Still,
    first_divergence,
    waiting_for,
)
from interactive_shard.collectives.events import LedgerEntry

G = "0"


def entry(
    seq: int,
    op: str = "all_reduce",
    shape: tuple[int, ...] = (4,),
    dtype: str = "torch.float32",
    caller: str = "train.py:10 in step",
) -> LedgerEntry:
    return LedgerEntry(
        group=G, seq=seq, op=op, dtype=dtype, shape=list(shape), caller=caller, state="completed"
    )


def group(*per_rank: list[LedgerEntry], at: dict[int, int | None] | None = None) -> GroupState:
    table = {r: {e.seq: e for e in es} for r, es in enumerate(per_rank)}
    positions = at or {r: max(t, default=-1) + 1 for r, t in table.items()}
    return GroupState(G, list(range(len(per_rank))), table, positions)


def verdict(
    g: GroupState, still: dict[int, Still] | None = None, over: bool = True
) -> Divergence | None:
    return first_divergence(g, still or {}, over=over)[0]


def test_a_healthy_ledger_has_no_divergence_and_settles() -> None:
    g = group([entry(0), entry(1), entry(2)], [entry(0), entry(1), entry(2)])
    assert first_divergence(g, {}, over=True) == (None, 2)  # #2's next has not come
    assert waiting_for(g, {}) == []


def test_shape_dtype_and_op_name_the_rank_that_differs() -> None:
    d = verdict(group([entry(0), entry(1)], [entry(0), entry(1)], [entry(0), entry(1, shape=(5,))]))
    assert d is not None and (d.kind, d.seq, d.ranks) == ("shape", 1, [2])
    assert "rank 2: all_reduce torch.float32 [5] from train.py:10 in step" in d.message
    assert "pad" in d.fix
    # Two ranks: the lowest rank's collective is the reference.
    d = verdict(group([entry(0)], [entry(0, dtype="torch.bfloat16")]))
    assert d is not None and (d.kind, d.ranks) == ("dtype", [1])
    d = verdict(group([entry(0)], [entry(0)], [entry(0)], [entry(0, op="broadcast")]))
    assert d is not None and (d.kind, d.seq, d.ranks) == ("op", 0, [3])


def test_an_extra_collective_on_one_rank_is_missing_on_the_others() -> None:
    extra = entry(1, caller="train.py:7 in step")  # `if rank == 0: dist.all_reduce(t)`
    d = verdict(group([entry(0), extra, entry(2), entry(3)], [entry(0), entry(1), entry(2)]))
    assert d is not None and (d.kind, d.seq, d.ranks) == ("missing", 1, [1])
    assert d.per_rank[0] == extra
    assert "rank-conditional" in d.fix


def test_a_swapped_pair_is_order() -> None:
    a = entry(1, op="all_reduce", caller="train.py:20 in step")
    b = entry(1, op="broadcast", caller="train.py:21 in step")
    d = verdict(
        group(
            [entry(0), a, entry(2, op="broadcast", caller=b.caller)],
            [entry(0), b, entry(2, op="all_reduce", caller="train.py:31 in step")],  # an else
            [entry(0), a, entry(2, op="broadcast", caller=b.caller)],
        )
    )
    assert d is not None and (d.kind, d.seq, d.ranks) == ("order", 1, [1])


def test_a_rank_that_never_arrives_is_missing_and_waited_for() -> None:
    g = group([entry(0), entry(1)], [entry(0), entry(1)], [entry(0)])
    still = {0: Still(3.0, True, ["train.py:12 in step"]), 1: Still(3.0, True, [])}
    assert verdict(g, over=False) is None  # rank 2 may be behind: nobody waits yet
    d = verdict(g, still, over=False)
    assert d is not None and (d.kind, d.seq, d.ranks) == ("missing", 1, [2])
    assert waiting_for(g, still) == [2]
    assert d.per_rank[2] is None


def test_a_gap_is_not_a_divergence_and_an_unknown_rank_is_not_missing() -> None:
    # Rank 1's entry 0 is not recorded (the ring dropped it), yet it issued it.
    g = group([entry(0), entry(1)], [entry(1)], at={0: 2, 1: 2})
    assert verdict(g) is None
    # Rank 1 reported nothing of the group (it died at once): not "missing".
    g = group([entry(0), entry(1)], [], at={0: 2, 1: None})
    assert verdict(g) is None and first_divergence(g, {}, over=True)[1] == 0


def test_a_later_call_starts_where_the_ranks_settled() -> None:
    g = group([entry(0), entry(1), entry(2)], [entry(0), entry(1), entry(2, shape=(5,))])
    d, settled = first_divergence(g, {}, over=True)
    assert d is not None and d.seq == 2 and settled == 2
    assert first_divergence(g, {}, over=True, start=settled)[0] == d
