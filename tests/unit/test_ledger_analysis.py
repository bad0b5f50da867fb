"""The ledger's verdicts (collectives/analysis.py) on hand-made ledgers: each divergence
kind, named with the right ranks, sequence number and callers, and the hang's culprit."""

from __future__ import annotations

from interactive_shard.collectives.analysis import Still, divergence, waiting_for
from interactive_shard.collectives.events import LedgerEntry

G = "0"
Ledgers = dict[int, dict[tuple[str, int], LedgerEntry]]


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


def ledger(*per_rank: list[LedgerEntry]) -> Ledgers:
    return {r: {(e.group, e.seq): e for e in es} for r, es in enumerate(per_rank)}


def issued(led: Ledgers) -> dict[int, dict[str, int]]:
    return {r: {G: len(es)} for r, es in led.items()}


def test_a_healthy_ledger_has_no_divergence() -> None:
    led = ledger([entry(0), entry(1)], [entry(0), entry(1)])
    assert divergence(led, issued(led), {}, over=True) is None
    assert waiting_for(led, issued(led), {}) == []


def test_shape_dtype_and_op_name_the_rank_that_differs() -> None:
    led = ledger([entry(0), entry(1)], [entry(0), entry(1)], [entry(0), entry(1, shape=(5,))])
    d = divergence(led, issued(led), {}, over=True)
    assert d is not None and (d.kind, d.seq, d.ranks) == ("shape", 1, [2])
    assert "rank 2: all_reduce torch.float32 [5] from train.py:10 in step" in d.message
    assert "pad" in d.fix
    # Two ranks: the lowest rank's collective is the reference.
    led = ledger([entry(0)], [entry(0, dtype="torch.bfloat16")])
    d = divergence(led, issued(led), {}, over=True)
    assert d is not None and (d.kind, d.ranks) == ("dtype", [1])
    led = ledger([entry(0)], [entry(0)], [entry(0)], [entry(0, op="broadcast")])
    d = divergence(led, issued(led), {}, over=True)
    assert d is not None and (d.kind, d.seq, d.ranks) == ("op", 0, [3])


def test_an_extra_collective_on_one_rank_is_missing_on_the_others() -> None:
    extra = entry(1, caller="train.py:7 in step")  # `if rank == 0: dist.all_reduce(t)`
    led = ledger(
        [entry(0), extra, entry(2), entry(3)],
        [entry(0), entry(1), entry(2)],
    )
    d = divergence(led, issued(led), {}, over=True)
    assert d is not None and (d.kind, d.seq, d.ranks) == ("missing", 1, [1])
    assert d.per_rank[0] == extra
    assert "rank-conditional" in d.fix


def test_a_swapped_pair_is_order() -> None:
    a = entry(1, op="all_reduce", caller="train.py:20 in step")
    b = entry(1, op="broadcast", caller="train.py:21 in step")
    led = ledger(
        [entry(0), a, entry(2, op="broadcast", caller=b.caller)],
        [entry(0), b, entry(2, op="all_reduce", caller="train.py:31 in step")],  # an else
        [entry(0), a, entry(2, op="broadcast", caller=b.caller)],
    )
    d = divergence(led, issued(led), {}, over=True)
    assert d is not None and (d.kind, d.seq, d.ranks) == ("order", 1, [1])


def test_a_rank_that_never_arrives_is_missing_and_waited_for() -> None:
    led = ledger([entry(0), entry(1)], [entry(0), entry(1)], [entry(0)])
    still = {0: Still(3.0, True, ["train.py:12 in step"]), 1: Still(3.0, True, [])}
    live = divergence(led, issued(led), {}, over=False)
    assert live is None  # rank 2 may be behind: nobody waits yet
    d = divergence(led, issued(led), still, over=False)
    assert d is not None and (d.kind, d.seq, d.ranks) == ("missing", 1, [2])
    assert waiting_for(led, issued(led), still) == [2]
    assert d.per_rank[2] is None


def test_a_gap_is_not_a_divergence() -> None:
    # Rank 1's entry 0 is not recorded (the ring dropped it), yet it issued it.
    led = ledger([entry(0), entry(1)], [entry(1)])
    led[1] = {(G, 1): entry(1)}
    assert divergence(led, {0: {G: 2}, 1: {G: 2}}, {}, over=True) is None


def test_groups_are_aligned_separately() -> None:
    other = LedgerEntry(
        group="1", seq=0, op="all_reduce", dtype="torch.float32", shape=[2], state="completed"
    )
    led = ledger([entry(0), other], [entry(0)])
    iss = {0: {G: 1, "1": 1}, 1: {G: 1}}
    groups = {G: [0, 1], "1": [0]}
    assert divergence(led, iss, {}, over=True, groups=groups) is None
