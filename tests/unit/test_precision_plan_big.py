"""The precision planner on a 32-unit FSDP2 tree (issue 12): a 32-block transformer on the
meta device, one unit per block, planned without a process group as the planner's other
tests are (policies only, then with meta example inputs: one simulated forward)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

import interactive_shard as ish
from interactive_shard.precision.plan import PrecisionPlan
from interactive_shard.splits.examples import BLOCKS, Transformer, tokens, transformer

F32, BF16 = "torch.float32", "torch.bfloat16"
MIXED = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
UNITS = ["", *(f"blocks.{i}" for i in range(BLOCKS))]
BLOCK_PARAMS = [
    f"{m}.{w}" for m in ("ln1", "qkv", "proj", "ln2", "fc", "out") for w in ("weight", "bias")
]


def policies(root: MixedPrecisionPolicy = MIXED) -> dict[str, MixedPrecisionPolicy]:
    return {fqn: (root if fqn == "" else MIXED) for fqn in UNITS}


@pytest.fixture(scope="module")
def model() -> Transformer:
    return transformer()


@pytest.fixture(scope="module")
def simulated(model: Transformer) -> PrecisionPlan:
    return ish.plan_precision(model, policies(), example_inputs=tokens())


def test_every_unit_from_the_policies_alone(model: Transformer) -> None:
    plan = ish.plan_precision(model, policies())
    assert [u.fqn for u in plan.units] == UNITS and plan.wrapper == "fsdp2" and plan.ok
    root = plan.unit("")
    assert root.params == ["embed.weight", "norm.weight", "norm.bias", "head.weight", "head.bias"]
    for i in range(BLOCKS):
        u = plan.unit(f"blocks.{i}")
        assert u.parent == "" and u.module_type == "Block"
        assert u.params == [f"blocks.{i}.{p}" for p in BLOCK_PARAMS]
        assert u.numel == sum(p.numel() for p in model.blocks[i].parameters())
        assert u.dtypes == {
            "input": BF16,  # FSDP2 casts a unit's floating inputs to param_dtype
            "param": BF16,
            "grad": BF16,
            "reduce": F32,
            "sharded_param": F32,
            "sharded_grad": F32,
        }
    assert sum(u.numel for u in plan.units) == sum(p.numel() for p in model.parameters())


def test_a_simulated_forward_on_meta_reaches_every_unit(simulated: PrecisionPlan) -> None:
    assert simulated.simulated and simulated.device == "meta" and simulated.ok
    assert [u.fqn for u in simulated.units] == UNITS
    for i in range(BLOCKS):
        u = simulated.unit(f"blocks.{i}")
        assert u.ran and u.inputs == [BF16] and u.cast == [False]  # bf16 from the one before
        assert u.dtypes["output"] == BF16 and u.dtypes["reduce"] == F32
    root = simulated.unit("")
    assert root.ran and root.inputs == []  # token ids: no floating input to cast
    assert root.dtypes["output"] == BF16


def test_a_root_in_full_precision_fails_at_the_head_with_the_fix(model: Transformer) -> None:
    plan = ish.plan_precision(model, policies(MixedPrecisionPolicy()), example_inputs=tokens())
    (failure,) = plan.failures
    assert (failure.unit, failure.consumer, failure.producer) == ("", "head", "blocks.31")
    assert failure.kind == "output_boundary" and (failure.got, failure.expected) == (BF16, F32)
    assert failure.fix is not None and failure.fix["blocks.31"].output_dtype == torch.float32
    fixed = ish.plan_precision(model, failure.fix, example_inputs=tokens())
    assert fixed.ok and fixed.unit("blocks.31").dtypes["output"] == F32
