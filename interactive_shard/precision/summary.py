"""Mixed precision in plain words: the wrapper, each unit's policy and the dtypes it
was seen in at the latest iteration, failures and findings with their fix (what a
front end without widgets shows; ``ui/fallback.py``)."""

from __future__ import annotations

from interactive_shard.precision.analysis import describe_policy
from interactive_shard.precision.compare import short
from interactive_shard.precision.model import PrecisionModel

MAX_UNITS = 8  # listed one a line; more are counted
MAX_FINDINGS = 4


def summary(model: PrecisionModel) -> str:
    ranks = model.ranks
    if not ranks:
        return "Waiting for ish.watch(model) on the ranks (FSDP2, FSDP1 or DDP)."
    rank = ranks[0]
    units = model.units(rank)
    latest = model.latest(rank) or 0
    lines = [
        f"{model.wrapper(rank)} · {len(units)} unit(s) · world size {model.world_size} · "
        f"{latest} iteration(s) on ranks {ranks}"
    ]
    for unit in units[:MAX_UNITS]:
        name = "root" if unit.fqn == "" else unit.fqn
        seen = model.observed(unit.fqn, rank=rank, iteration=latest) if latest else {}
        dtypes = ", ".join(f"{phase} {short(dtype)}" for phase, dtype in seen.items())
        lines.append(
            f"{name} ({unit.module_type}): {describe_policy(unit.policy)}"
            + (f"; seen in iteration {latest}: {dtypes}" if dtypes else "")
        )
    if len(units) > MAX_UNITS:
        lines.append(f"and {len(units) - MAX_UNITS} more units")
    if model.failures:
        lines.append(f"{len(model.failures)} failure(s) raised on the ranks")
    findings = model.findings_read()
    lines.append(f"findings: {len(findings)}" if findings else "no findings")
    lines += [f"{f.level}: {f.message} Fix: {f.fix}" for f in findings[:MAX_FINDINGS]]
    return "\n".join(lines)
