"""The collective ledger on real gloo ranks (2 and 4): every planted fault is named, with
the right kind, ranks, sequence number and caller, and a hang names the rank the others
wait for within the cluster's timeout plus 2 s, leaving no process behind."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import interactive_shard as ish

TIMEOUT = 6.0  # the clusters' collective timeout: a hang ends in a RankError after it


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def ranks(request: pytest.FixtureRequest) -> Iterator[ish.Cluster]:
    with ish.Cluster(nprocs=request.param, timeout=TIMEOUT) as c:
        yield c


def _line(fn: Any, text: str) -> str:
    """``fn``'s source line number holding ``text`` (the caller a finding names)."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return str(first + next(i for i, line in enumerate(lines) if text in line))


def _run(cluster: ish.Cluster, fn: Any) -> tuple[Any, float]:
    start = time.monotonic()
    run = cluster.run(fn, wait=False)
    try:
        run.wait()
    except ish.RankError:
        pass
    return run, time.monotonic() - start


def healthy(ctx: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)))
    for _ in range(3):
        loss = model(torch.randn(8, 16)).sum()
        loss.backward()
        dist.all_reduce(loss.detach())  # the user's own: named by its line


def test_a_healthy_ddp_run_agrees_and_names_its_callers(ranks: ish.Cluster) -> None:
    ledger = ranks.run(healthy).collectives
    assert ledger.divergence() is None and ledger.findings == []
    assert ledger.ranks == list(range(ranks.nprocs))
    mine = ledger.entries(0)
    assert [e.seq for e in mine] == list(range(len(mine)))  # nothing missed
    callers = {e.caller for e in mine}
    assert "DDP construction sync" in callers
    assert "DDP gradient bucket (C++ Reducer)" in callers
    assert any(c.endswith(f":{_line(healthy, 'dist.all_reduce')} in healthy") for c in callers)
    assert all(e.state != "pending" for e in mine)  # completed, or its end not seen
    for r in ledger.ranks:  # every rank issued the same collectives
        theirs = ledger.entries(r)
        assert [(e.op, e.dtype, e.shape) for e in theirs] == [
            (e.op, e.dtype, e.shape) for e in mine
        ]


def extra_on_last_rank(ctx: Any) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    for i in range(3):
        if ctx.rank == ctx.world_size - 1 and i == 1:
            dist.all_reduce(t)  # rank-conditional
        dist.all_reduce(t)


def test_a_rank_conditional_all_reduce_is_missing_on_the_others(ranks: ish.Cluster) -> None:
    run, took = _run(ranks, extra_on_last_rank)
    d = run.collectives.divergence()
    last = ranks.nprocs - 1
    assert d is not None and d.kind == "missing"
    assert d.ranks == list(range(last))  # they miss it
    first = run.collectives.entries(last)[0].seq
    assert d.seq == first + 1
    extra = d.per_rank[last]
    assert extra is not None and extra.caller.endswith(
        f":{_line(extra_on_last_rank, 'rank-conditional')} in extra_on_last_rank"
    )
    assert "rank-conditional" in d.fix
    assert took < TIMEOUT + 10


def shape_on_rank_one(ctx: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4) if ctx.rank != 1 else torch.ones(2, 2))  # same bytes


def dtype_on_rank_one(ctx: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4) if ctx.rank != 1 else torch.ones(4, dtype=torch.int32))


@pytest.mark.parametrize(
    ("fn", "kind"), [(shape_on_rank_one, "shape"), (dtype_on_rank_one, "dtype")]
)
def test_a_different_shape_or_dtype_names_the_rank(ranks: ish.Cluster, fn: Any, kind: str) -> None:
    run, _ = _run(ranks, fn)
    d = run.collectives.divergence()
    assert d is not None and (d.kind, d.ranks) == (kind, [1])
    other = d.per_rank[0]
    assert other is not None and other.shape == [4]
    assert d.per_rank[1] is not None and d.per_rank[1].caller.endswith(f" in {fn.__name__}")


def other_op_on_rank_one(ctx: Any) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    if ctx.rank == 1:
        dist.broadcast(t, 0)  # another collective: the others all-reduce; both wait
    else:
        dist.all_reduce(t)


@pytest.mark.slow
def test_another_op_is_named_and_every_rank_waits(ranks: ish.Cluster) -> None:
    run, took = _run(ranks, other_op_on_rank_one)
    d = run.collectives.divergence()
    assert d is not None and (d.kind, d.ranks) == ("op", [1])
    theirs = d.per_rank[1]
    assert theirs is not None and theirs.op == "broadcast"
    assert theirs.caller.endswith(
        f":{_line(other_op_on_rank_one, 'another collective')} in other_op_on_rank_one"
    )
    assert run.collectives.waiting_for() == []  # nobody is behind: they disagree
    assert took < TIMEOUT + 10


def swapped(ctx: Any) -> None:
    import torch
    import torch.distributed as dist

    a, b = torch.ones(4), torch.ones(2, 2)  # the same bytes: gloo pairs them silently
    if ctx.rank % 2 == 0:  # a data-dependent branch
        dist.all_reduce(a)
        dist.all_reduce(b)
    else:
        dist.all_reduce(b)
        dist.all_reduce(a)


def test_a_swapped_pair_is_order(ranks: ish.Cluster) -> None:
    run, _ = _run(ranks, swapped)
    d = run.collectives.divergence()
    assert d is not None and d.kind == "order"
    assert d.ranks == [r for r in range(ranks.nprocs) if r % 2 == 1]


def never_arrives(ctx: Any) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    dist.all_reduce(t)
    if ctx.rank == 1:
        time.sleep(60)  # never arrives
    dist.all_reduce(t)


@pytest.mark.slow
def test_a_hang_names_the_rank_the_others_wait_for(ranks: ish.Cluster) -> None:
    run = ranks.run(never_arrives, wait=False)
    others = [r for r in range(ranks.nprocs) if r != 1]
    ledger = run.collectives

    def named() -> bool:  # each rank reports once it stood still for a second
        waiting = sorted(r for r, e in ledger.pending().items() if e is not None)
        return ledger.waiting_for() == [1] and waiting == others and 1 in ledger.still()

    deadline = time.monotonic() + TIMEOUT + 2
    while time.monotonic() < deadline and not named():
        time.sleep(0.2)
    assert ledger.waiting_for() == [1]  # live, before the timeout ended the run
    assert sorted(r for r, e in ledger.pending().items() if e is not None) == others
    here = ledger.still()[1].stack[-1]
    assert here.endswith(f":{_line(never_arrives, 'never arrives')} in never_arrives")
    with pytest.raises(ish.RankError):
        run.wait()
    d = run.collectives.divergence()
    assert d is not None and (d.kind, d.ranks) == ("missing", [1])
    assert any(f.kind == "hang" for f in run.collectives.findings)
    assert ranks.run(healthy).collectives.divergence() is None  # the ranks work again


def three_all_reduces(ctx: Any) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    for _ in range(3):
        dist.all_reduce(t)


def test_a_forked_rank_reads_none_of_its_parents_flight_recorder(tmp_path: Any) -> None:
    """A kernel that ran collectives itself (a notebook's single-process group) forks
    ranks that inherit its Flight Recorder ring; their ledgers hold only their own."""
    import os

    import torch
    import torch.distributed as dist

    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2048")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for _ in range(12):
            dist.broadcast(torch.ones(2), 0)
    finally:
        dist.destroy_process_group()
    with ish.Cluster(2, start_method="fork") as cluster:
        run = cluster.run(three_all_reduces).wait(timeout=120)
    ledger = run.collectives
    for rank in range(2):
        entries = ledger.entries(rank)
        assert [e.op for e in entries] == ["all_reduce"] * 3, entries
