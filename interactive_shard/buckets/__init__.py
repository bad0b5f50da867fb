"""DDP gradient buckets: the reference planner (what DDP should do, without running)."""

from __future__ import annotations

from interactive_shard.buckets._params import ParamSpec
from interactive_shard.buckets.plan import (
    Bucket,
    BucketCaps,
    BucketPlan,
    DelayedParams,
    ReadyOrderSource,
    plan_buckets,
)

__all__ = [
    "Bucket",
    "BucketCaps",
    "BucketPlan",
    "DelayedParams",
    "ParamSpec",
    "ReadyOrderSource",
    "plan_buckets",
]
