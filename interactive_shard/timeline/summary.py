"""The timeline in plain words: what was watched, per rank the latest iteration's
phases, its backward's collectives and how much of them compute hid, and the findings
(what a front end without widgets shows; ``ui/fallback.py``)."""

from __future__ import annotations

from interactive_shard.timeline.model import TimelineModel

FINDINGS_WINDOW = 20  # a long run: the latest iterations checked (run.timeline.findings: all)


def summary(model: TimelineModel) -> str:
    ranks = model.ranks
    if not ranks:
        return "No timeline yet: watch a model with ish.watch(model, timeline=True)."
    watch = model.watch(ranks[0])
    count = model.count()
    what = f"{watch.target} · " if watch is not None else ""
    lines = [f"{what}{len(ranks)} rank(s) · {count:,} iteration(s)"]
    for rank in ranks:
        latest = model.latest(rank)
        if latest is None:
            continue
        phases = model.phases(rank, latest)
        times = ", ".join(
            f"{name} {(end - start) * 1e3:.3g} ms" for name, (start, end) in phases.items()
        )
        s = model.summary(rank, latest)
        lines.append(
            f"rank {rank}, iteration {latest}: {times}; backward: {s.collectives} collective(s), "
            f"{s.overlap:.0%} hidden by compute, {s.exposed * 1e3:.3g} ms exposed"
        )
    window = model.recent(FINDINGS_WINDOW) if count > FINDINGS_WINDOW else None
    findings = model.findings_of(window)
    checked = f" (in the latest {FINDINGS_WINDOW} iterations)" if window is not None else ""
    lines.append(f"findings{checked}: {len(findings)}" if findings else f"no findings{checked}")
    lines += [f.message for f in findings]
    return "\n".join(lines)
