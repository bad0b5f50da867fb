"""torch's own Flight Recorder dumps of real gloo ranks, read by ``ish.load_flight_recorder``,
give the collectives the live ledger of the same run holds, and name its planted
divergence; in both of torch's forms (pickle and JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import interactive_shard as ish


def train_and_dump(ctx: Any, folder: str) -> None:
    """DDP steps, one all_reduce whose shape differs on rank 1 (same bytes: gloo pairs
    them, so the run completes), then both dumps, named as torch names them."""
    import torch
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
    dist.all_reduce(torch.ones(4) if ctx.rank != 1 else torch.ones(2, 2))
    dist.all_reduce(torch.ones(3))
    Path(folder, "pickle").mkdir(exist_ok=True)
    Path(folder, "json").mkdir(exist_ok=True)
    Path(folder, "pickle", f"fr_dump_{ctx.rank}").write_bytes(c10d._dump_fr_trace())
    if hasattr(c10d, "_dump_fr_trace_json"):
        Path(folder, "json", f"fr_dump_{ctx.rank}").write_bytes(c10d._dump_fr_trace_json())


@pytest.fixture(scope="module")
def dumped(cluster: ish.Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp("fr")
    return cluster.run(train_and_dump, str(folder)), folder


@pytest.mark.parametrize("form", ["pickle", "json"])
def test_dumps_hold_what_the_live_ledger_holds(dumped: tuple[Any, Path], form: str) -> None:
    live, folder = dumped
    files = sorted((folder / form).glob("fr_dump_*"), reverse=True)  # ranks from the names
    if not files:
        pytest.skip(f"this torch has no _dump_fr_trace_json: no {form} dump")
    run = ish.load_flight_recorder(files)
    assert run.store.info.world_size == 2 and run.store.info.backend == "gloo"
    read = run.collectives
    assert read.ranks == [0, 1]
    for rank in (0, 1):
        seen = {(e.group, e.seq): e for e in live.collectives.entries(rank)}
        found = {(e.group, e.seq): e for e in read.entries(rank)}  # the ring may hold more
        assert seen
        for key, e in seen.items():
            assert (found[key].op, found[key].dtype) == (e.op, e.dtype), key
            # DDP's construction sync broadcasts coalesced: the live ledger notes the first
            # tensor's shape, torch's recorder the flat buffer it sends.
            if e.caller != "DDP construction sync":
                assert found[key].shape == e.shape, key
    d = read.divergence()
    assert d is not None and (d.kind, d.ranks) == ("shape", [1])
    assert d.per_rank[0] is not None and d.per_rank[0].shape == [4]
    assert d.per_rank[1] is not None and d.per_rank[1].shape == [2, 2]
    live_d = live.collectives.divergence()
    assert live_d is not None and (live_d.group, live_d.seq) == (d.group, d.seq)
    if form == "pickle":  # only the pickle holds stacks: the caller is named
        assert d.per_rank[1].caller.endswith(" in train_and_dump")
    assert ish.load([str(f) for f in files]).collectives.divergence() == d  # ish.load: a list
