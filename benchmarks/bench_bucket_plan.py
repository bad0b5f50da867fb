"""Time the DDP bucket planner on 10,000 meta-tensor parameters (no asserts on time).

Run: python benchmarks/bench_bucket_plan.py
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from interactive_shard.buckets import ParamSpec, plan_buckets

N_PARAMS = 10_000
REPEATS = 7


def meta_params(n: int) -> list[tuple[str, torch.Tensor]]:
    rng = random.Random(0)
    shapes = [(1024,), (1024, 1024), (4096, 1024), (64,)]
    return [(f"layers.{i}.w", torch.empty(rng.choice(shapes), device="meta")) for i in range(n)]


def median_ms(fn: object, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    params = meta_params(N_PARAMS)
    specs = [(name, ParamSpec(tuple(t.shape))) for name, t in params]
    mixed = [
        (name, torch.empty(t.shape, dtype=[torch.float32, torch.bfloat16][i % 2], device="meta"))
        for i, (name, t) in enumerate(params)
    ]
    cases = {
        "meta tensors, default caps": lambda: plan_buckets(params),
        "meta tensors, bucket_cap_mb=1": lambda: plan_buckets(params, bucket_cap_mb=1),
        "meta tensors, find_unused_parameters": lambda: plan_buckets(
            params, find_unused_parameters=True
        ),
        "ParamSpec, bucket_cap_mb=1": lambda: plan_buckets(specs, bucket_cap_mb=1),
        "meta tensors, given ready_order": lambda: plan_buckets(
            params, bucket_cap_mb=1, ready_order=[name for name, _ in params]
        ),
        "meta fp32+bf16, bucket_cap_mb=1": lambda: plan_buckets(mixed, bucket_cap_mb=1),
    }
    for label, fn in cases.items():
        print(f"plan_buckets {N_PARAMS} params ({label}): median {median_ms(fn):.1f} ms")


if __name__ == "__main__":
    main()
