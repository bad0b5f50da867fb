"""Planned vs captured partitions, and compile-time splits vs DDP's runtime buckets, in words.

Pure: reads the records of ``events.py`` and ``plan.py``; no torch, no widgets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from interactive_shard.splits.events import Partition, SplitCompile
from interactive_shard.splits.plan import GraphPlan
from interactive_shard.ui.format import nbytes


@dataclass(frozen=True)
class Comparison:
    """``matches``: every planned partition equals its captured one; ``differences``: what
    did not, one line each."""

    matches: bool
    differences: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        if self.matches:
            return "Comparison(matches: planned == captured)"
        return "Comparison(differs:\n  " + "\n  ".join(self.differences) + ")"


def compare_partition(where: str, planned: Partition, captured: Partition) -> list[str]:
    at = f"{where}, partition {captured.index} ({captured.name})"
    out = []
    if planned.fqns != captured.fqns:
        out.append(f"{at}: parameters planned {planned.fqns}, captured {captured.fqns}")
    if planned.nbytes != captured.nbytes:
        out.append(f"{at}: {planned.nbytes} bytes planned, {captured.nbytes} captured")
    if planned.targets != captured.targets:
        pairs = zip(planned.targets, captured.targets, strict=False)
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        if first is None:
            first = min(len(planned.targets), len(captured.targets))
        p = planned.targets[first] if first < len(planned.targets) else "(end)"
        c = captured.targets[first] if first < len(captured.targets) else "(end)"
        out.append(
            f"{at}: calls differ from call {first}: planned {p}, captured {c} "
            f"({len(planned.targets)} planned, {len(captured.targets)} captured)"
        )
    if planned.regions != captured.regions:
        out.append(
            f"{at}: regions planned {[r.describe() for r in planned.regions]}, "
            f"captured {[r.describe() for r in captured.regions]}"
        )
    return out


def compare_graph(where: str, planned: GraphPlan, captured: SplitCompile) -> list[str]:
    out = []
    if (planned.bucket_bytes_cap, planned.first_bucket_bytes) != (
        captured.bucket_bytes_cap,
        captured.first_bucket_bytes,
    ):
        out.append(
            f"{where}: caps planned {nbytes(planned.bucket_bytes_cap)} (first "
            f"{nbytes(planned.first_bucket_bytes)}), DDPOptimizer used "
            f"{nbytes(captured.bucket_bytes_cap)} (first {nbytes(captured.first_bucket_bytes)})"
        )
    if len(planned.partitions) != len(captured.partitions):
        out.append(
            f"{where}: {len(planned.partitions)} partition(s) planned, "
            f"{len(captured.partitions)} captured"
        )
    for p, c in zip(planned.partitions, captured.partitions, strict=False):
        out += compare_partition(where, p, c)
    return out


def versus_runtime(comp: SplitCompile, runtime: Sequence[Any], info: Any) -> list[str]:
    """Why DDPOptimizer's partitions and DDP's runtime buckets need not agree, and where
    they do not here. ``runtime``: the bucket map's observed buckets (``.fqns``,
    ``.nbytes``), ``info``: its ``WatchInfo`` (DDP's caps) or None."""
    lines = [
        f"DDPOptimizer (compile time): {len(comp.partitions)} partition(s), cap "
        f"{nbytes(comp.bucket_bytes_cap)}, first bucket {nbytes(comp.first_bucket_bytes)} (always "
        "1 MiB unless set), parameters counted in reverse graph order."
    ]
    if not runtime:
        lines.append("DDP (run time): no bucket observed yet (watch the model and run a backward).")
        return lines
    first = f"{nbytes(info.first_bucket_bytes)}" if info is not None else "?"
    cap = f"{nbytes(info.bucket_bytes_cap)}" if info is not None else "?"
    lines.append(
        f"DDP (run time): {len(runtime)} bucket(s), cap {cap}, first bucket {first}, "
        "parameters in the order their gradients became ready."
    )
    compiled = [set(p.fqns) for p in comp.partitions]
    observed = [set(b.fqns) for b in runtime]
    # DDP's bucket 0 is the first reduced: the *last* partition's gradients.
    if sorted(map(sorted, compiled)) == sorted(map(sorted, observed)):
        lines.append("Same groups of parameters: each partition's gradients fill one DDP bucket.")
    else:
        where = {f: i for i, s in enumerate(compiled) for f in s}
        for i, s in enumerate(observed):
            parts = sorted({where[f] for f in s if f in where})
            if len(parts) > 1:
                lines.append(
                    f"DDP bucket {i} holds gradients of partitions {parts}: it waits for the "
                    "last of them."
                )
        lines.append(
            "The groups differ: DDP reduces a bucket when its last gradient is ready, so a "
            "bucket spanning partitions starts only after the later partition's backward."
        )
    return lines
