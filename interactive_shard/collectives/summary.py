"""The ledger in plain words: what each rank issued, the first divergence, who a hang
waits for (what a front end without widgets shows; ``ui/fallback.py``)."""

from __future__ import annotations

from interactive_shard.collectives.model import CollectivesModel


def summary(model: CollectivesModel) -> str:
    model.update()
    ranks = model.ranks
    if not ranks:
        return "no collectives recorded yet"
    lines = []
    for rank in ranks:
        mine = model.entries(rank)
        groups = sorted({e.group for e in mine})
        last = mine[-1] if mine else None
        said = f", the last #{last.seq} {last.op} by {last.caller or 'unknown'}" if last else ""
        lines.append(f"rank {rank}: {len(mine):,} collectives in {len(groups)} group(s){said}")
    findings = model.findings
    lines += [f"{f.kind}: {f.message}" for f in findings]
    if not findings:
        verdict = "the ranks agree" if model.over else "the ranks agree so far"
        lines.append(f"no divergence: {verdict}")
    for rank, entry in sorted(model.pending().items()):
        if entry is not None:
            lines.append(
                f"rank {rank} waits in #{entry.seq} {entry.op} by {entry.caller or 'unknown'}"
            )
    return "\n".join(lines)
