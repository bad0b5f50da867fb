"""The DDP lifecycle in plain words: per DDP instance its settings and iterations, the
bytes sent per purpose, then the checks that fired and the advice (what a front end
without widgets shows; ``ui/fallback.py``)."""

from __future__ import annotations

from interactive_shard.ddp._instance import Finding
from interactive_shard.ddp.figures_strip import instance_label
from interactive_shard.ddp.model import LifecycleModel
from interactive_shard.ui.format import nbytes

MAX_INSTANCES = 6  # listed one a line; more are counted
MAX_FINDINGS = 4


def summary(model: LifecycleModel) -> str:
    ranks = model.ranks
    if not ranks:
        return "Waiting for ish.watch(ddp) on the ranks."
    rank = ranks[0]
    insts = model.instances_of(rank)
    lines = [f"{len(insts)} DDP instance(s) on rank {rank} (ranks {ranks})"]
    for inst in insts[:MAX_INSTANCES]:
        sent = model.bytes_by_purpose(rank, inst.serial)
        purposes = ", ".join(f"{p} {nbytes(n)}" for p, n in sent.items() if n)
        lines.append(
            f"{instance_label(inst)}: {inst.iteration_count} iteration(s), "
            f"{len(inst.hooks)} hooked parameter(s)" + (f"; sent {purposes}" if purposes else "")
        )
    if len(insts) > MAX_INSTANCES:
        lines.append(f"and {len(insts) - MAX_INSTANCES} more instances")
    findings = model.findings
    checks = sum(f.level == "error" for f in findings)
    lines.append(f"{checks} check(s) fired, {len(findings) - checks} advice")
    # One line per kind (a check fires once per iteration): the first, and how many more.
    kinds: dict[str, list[Finding]] = {}
    for f in findings:
        kinds.setdefault(f.kind, []).append(f)
    for same in list(kinds.values())[:MAX_FINDINGS]:
        more = f" (and {len(same) - 1} more like it)" if len(same) > 1 else ""
        lines.append(f"{same[0].level}: {same[0].message}{more}")
    return "\n".join(lines)
