"""The graph splits in plain words: per rank, how many graphs DDPOptimizer compiled and
where it cut the newest (pieces, their parameters and bytes), next to DDP's runtime
buckets (what a front end without widgets shows; ``ui/fallback.py``)."""

from __future__ import annotations

from interactive_shard.splits.model import SplitsModel
from interactive_shard.ui.fallback import listed
from interactive_shard.ui.format import nbytes

MAX_PIECES = 8  # listed one a line; more are counted


def summary(model: SplitsModel) -> str:
    ranks = model.ranks
    if not ranks:
        return "Waiting for ish.watch(torch.compile(ddp)) on the ranks."
    lines = []
    for rank in ranks:
        comps = model.compilations(rank)
        nothing = model.nothing(rank)
        if not comps:
            lines.append(f"rank {rank}: nothing compiled" + (f": {nothing}" if nothing else ""))
            continue
        pieces = listed([str(len(c.partitions)) for c in comps], 10)
        lines.append(f"rank {rank}: {len(comps)} graph(s) compiled, split into {pieces} piece(s)")
    comp = model.latest(ranks[0])
    if comp is None:
        return "\n".join(lines)
    lines.append(
        f"rank {ranks[0]}, compile {comp.index} (newest): backend {comp.backend}, bucket cap "
        f"{nbytes(comp.bucket_bytes_cap)}, first bucket {nbytes(comp.first_bucket_bytes)}, "
        f"compiled in {comp.compile_s:.3g} s"
    )
    lines += [
        f"{p.name}: {len(p.calls)} call(s), {len(p.fqns)} parameter(s), {nbytes(p.nbytes)}"
        + (f": {listed(p.fqns, 3)}" if p.fqns else "")
        for p in comp.partitions[:MAX_PIECES]
    ]
    if len(comp.partitions) > MAX_PIECES:
        lines.append(f"and {len(comp.partitions) - MAX_PIECES} more pieces")
    lines += model.versus_runtime(ranks[0])[:3]
    return "\n".join(lines)
