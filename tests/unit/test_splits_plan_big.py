"""The split planner on a 32-block transformer traced on the meta device (issue 12): the
partitions are those the bucket caps imply, worked out here from the parameters alone.

``ish.plan_splits`` traces the model once with dynamo (meta inputs: no memory, no
process group); ``SplitPlan.replan`` plans the same graph at other caps. The expected
buckets are DDPOptimizer's walk at the level of modules: in this model every node that
counts parameters is one module's call (linear, layer_norm, embedding: weight and bias
together) and every bucket has an output used later (the residual stream), so a bucket
closes before the first module that finds it holding the cap (the last bucket of the
forward: the first-bucket cap)."""

from __future__ import annotations

import pytest
import torch

import interactive_shard as ish
from interactive_shard.splits.examples import BLOCKS, Transformer, tokens, transformer
from interactive_shard.splits.plan import MIB, SplitPlan

CAPS_MB = (1, 2, 5, 25, 128)


@pytest.fixture(scope="module")
def model() -> Transformer:
    return transformer()


@pytest.fixture(scope="module")
def plan(model: Transformer) -> SplitPlan:
    return ish.plan_splits(model, (tokens(),), bucket_cap_mb=25)


def modules_in_forward_order(model: Transformer) -> list[torch.nn.Module]:
    blocks = [m for b in model.blocks for m in (b.ln1, b.qkv, b.proj, b.ln2, b.fc, b.out)]
    return [model.embed, *blocks, model.norm, model.head]


def expected_buckets(model: Transformer, cap: int, first: int) -> list[dict[str, int]]:
    """fqn -> bytes per bucket, in forward order, from the parameters alone."""
    names = {id(p): n for n, p in model.named_parameters()}
    found: list[dict[str, int]] = [{}]  # the open bucket first: the walk is in reverse
    for module in reversed(modules_in_forward_order(model)):
        size = sum(found[0].values())
        if size >= cap or (len(found) == 1 and size >= first):
            found.insert(0, {})
        for p in module.parameters():
            found[0][names[id(p)]] = p.numel() * p.element_size()
    return found


def test_the_model_is_on_meta_and_the_trace_needs_no_memory(model: Transformer) -> None:
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert len(model.blocks) == BLOCKS == 32


@pytest.mark.parametrize("cap_mb", CAPS_MB)
def test_partitions_are_the_buckets_the_caps_imply(
    model: Transformer, plan: SplitPlan, cap_mb: int
) -> None:
    planned = plan.replan(bucket_cap_mb=cap_mb) if cap_mb != 25 else plan
    expected = expected_buckets(model, cap_mb * MIB, MIB)
    got = planned.partitions
    assert len(planned.graphs) == 1 and len(got) == len(expected)
    for partition, bucket in zip(got, expected, strict=True):
        assert set(partition.fqns) == set(bucket)
        assert partition.nbytes == sum(bucket.values())
    # every parameter once, and the partitions in forward order
    order = [n for n, _ in model.named_parameters()]
    listed = [f for p in got for f in sorted(p.fqns, key=order.index)]
    assert listed == order


def test_replanning_is_planning_again_from_the_model(model: Transformer, plan: SplitPlan) -> None:
    again = ish.plan_splits(model, (tokens(),), bucket_cap_mb=5, first_bucket_cap_mb=2)
    replanned = plan.replan(bucket_cap_mb=5, first_bucket_cap_mb=2)
    assert replanned.partitions == again.partitions
    assert (replanned.bucket_bytes_cap, replanned.first_bucket_bytes) == (5 * MIB, 2 * MIB)


def test_the_default_cap_cuts_the_model_in_five(plan: SplitPlan) -> None:
    # 25.8 M fp32 parameters (98 MiB): the head and the norm hold just under the 1 MiB
    # first-bucket cap, so block 31's MLP output layer joins them; then three of 25 MiB
    # or a little more, and the rest.
    assert len(plan.partitions) == 5
    assert plan.partitions[-1].fqns == [
        "head.weight",
        "head.bias",
        "norm.weight",
        "norm.bias",
        "blocks.31.out.weight",
        "blocks.31.out.bias",
    ]
    assert all(25 * MIB <= p.nbytes < 26 * MIB for p in plan.partitions[1:-1])
