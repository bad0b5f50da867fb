"""The planners at scale (issue 12): each one's time on a 32-block model, in the kernel.

* ``splits``: ``ish.plan_splits`` on a GPT-style 32-block transformer built on the meta
  device (``interactive_shard.splits.examples``): dynamo traces it once with meta
  inputs (no memory, no process group), the bucket walk cuts the graph; then the same
  graph planned at every cap of the view's sweep (``SplitPlan.replan``, no trace);
* ``precision``: ``ish.plan_precision`` on the same model with one FSDP2 unit per block
  (bf16 compute, fp32 reduce), planned without a process group as the planner's tests
  do: from the policies alone, with meta example inputs (one simulated forward), and a
  policy that fails (the root in fp32: the head gets block 31's bf16 output) so the
  planner also searches for the fix.

    python benchmarks/bench_planners.py [--blocks 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import interactive_shard as ish
from interactive_shard.splits.examples import tokens, transformer

SWEEP_MB = (1, 2, 4, 8, 16, 25, 32, 64, 128)


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def block_policies(blocks: int, root: Any, block: Any) -> dict[str, Any]:
    return {"": root, **{f"blocks.{i}": block for i in range(blocks)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from torch.distributed.fsdp import MixedPrecisionPolicy

    model, x = transformer(args.blocks), tokens()
    n = sum(p.numel() for p in model.parameters())
    print(f"bench_planners: {args.blocks}-block transformer on meta, {n / 1e6:.1f} M parameters")
    summary: dict[str, Any] = {"bench": "planners", "blocks": args.blocks}

    s, plan = timed(lambda: ish.plan_splits(model, (x,), bucket_cap_mb=25), args.repeats)
    print(f"  plan_splits (dynamo trace + plan)     {s * 1e3:9.1f} ms  {plan}")
    r, sweep = timed(lambda: [plan.replan(bucket_cap_mb=mb) for mb in SWEEP_MB], args.repeats)
    counts = [len(p.partitions) for p in sweep]
    print(f"  replan at {len(SWEEP_MB)} caps (no trace)          {r * 1e3:9.1f} ms  {counts}")
    summary["splits"] = {"plan_s": s, "replan_s": r, "partitions": len(plan.partitions)}

    bf16, fp32 = torch.bfloat16, torch.float32
    mixed = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    uniform = block_policies(args.blocks, mixed, mixed)
    failing = block_policies(args.blocks, MixedPrecisionPolicy(), mixed)
    cases = (
        ("plan_precision, policies only", uniform, None),
        ("plan_precision, meta inputs", uniform, x),
        ("plan_precision, failing + fix", failing, x),
    )
    for name, policies, inputs in cases:
        p, found = timed(
            lambda policies=policies, inputs=inputs: ish.plan_precision(
                model, policies, example_inputs=inputs
            ),
            args.repeats,
        )
        fix = found.failures[0].fix_note if found.failures else ""
        print(
            f"  {name:<36} {p * 1e3:9.1f} ms  {len(found.units)} units, "
            f"{len(found.failures)} failure(s) {fix}"
        )
        summary[name] = {"s": p, "units": len(found.units), "failures": len(found.failures)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
