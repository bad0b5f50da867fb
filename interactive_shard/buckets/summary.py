"""The bucket map in plain words: DDP's settings, the buckets of the first and the latest
iteration (parameters and bytes), and the findings (what a front end without widgets
shows; ``ui/fallback.py``)."""

from __future__ import annotations

from interactive_shard.buckets.model import BucketMap, late_watch
from interactive_shard.buckets.records import ObservedBucket, WatchInfo
from interactive_shard.ui.fallback import listed
from interactive_shard.ui.format import nbytes

MAX_BUCKETS = 8  # listed one a line; more are counted
HEALTH_SECONDS = 0.05  # a display looks for findings this long at most on a long run


def summary(model: BucketMap) -> str:
    info = model.info
    if info is None:
        return "Waiting for ish.watch(ddp) on the ranks."
    lines = [_settings(info)]
    late = late_watch(info)
    if late:
        lines.append(f"Watched late: {late}.")
    its = model.iterations
    if not its:
        return "\n".join([*lines, "No iteration observed yet."])
    rank = model.ranks[0] if model.ranks else 0
    lines.append(f"{len(its):,} iteration(s), {its[0]} to {its[-1]}, on ranks {model.ranks}")
    first, latest = model.observed(its[0], rank), model.observed(its[-1], rank)
    initial = "initial buckets" if info.first_iteration == 1 else "first watched"
    lines.append(f"iteration {its[0]} ({initial}): {_sizes(first)}")
    if len(its) > 1 and _layout(first) != _layout(latest):
        lines.append(f"iteration {its[-1]} (latest, rebuilt): {_sizes(latest)}")
    lines += [
        f"bucket {b.index}: {len(b.fqns)} parameter(s), {nbytes(b.nbytes)}: {listed(b.fqns, 4)}"
        for b in latest[:MAX_BUCKETS]
    ]
    if len(latest) > MAX_BUCKETS:
        lines.append(f"and {len(latest) - MAX_BUCKETS} more buckets")
    complete = model.check_health(HEALTH_SECONDS)
    findings = model.health_so_far
    done, total = model.health_checked
    partly = "" if complete else f" (in {done:,} of {total:,} iteration records looked at)"
    lines.append(f"findings: {len(findings)}{partly}" if findings else f"no findings{partly}")
    lines += [f.message for f in findings[:3]]
    return "\n".join(lines)


def _settings(info: WatchInfo) -> str:
    caps = info.caps_text
    delayed = f" + {len(info.delayed.fqns)} delayed" if info.delayed is not None else ""
    return (
        f"{len(info.fqns)} parameters{delayed} · DDP {caps}, find_unused_parameters="
        f"{info.find_unused_parameters}, static_graph={info.static_graph} · world size "
        f"{info.world_size}"
    )


def _layout(buckets: list[ObservedBucket]) -> list[list[str]]:
    return [b.fqns for b in buckets]


def _sizes(buckets: list[ObservedBucket]) -> str:
    sizes = listed([nbytes(b.nbytes) for b in buckets], MAX_BUCKETS)
    return f"{len(buckets)} bucket(s) of {sizes}"
