"""``example_inputs`` means one thing to every planner (a tensor or any single argument,
a tuple of positional inputs, a dict of keyword inputs, ``ish.Inputs``), and
``plan_buckets(loss_fn=)`` starts the backward from the user's loss."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

import interactive_shard as ish
from interactive_shard.example_inputs import split


class Encoder(nn.Module):
    """Keyword inputs and two outputs, as a Hugging Face encoder: the pooler's output is
    what a loss on the hidden states ignores."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.body = nn.Linear(8, 8)
        self.pooler = nn.Linear(8, 8)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        h = self.body(self.embed(input_ids))
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        return {"last_hidden_state": h, "pooler_output": self.pooler(h[:, 0])}


IDS = torch.randint(0, 16, (2, 5))
MASK = torch.ones(2, 5)


def test_split_reads_each_form() -> None:
    x = torch.randn(2)
    assert split(x) == ((x,), {})
    assert split((x, 3)) == ((x, 3), {})
    assert split([x]) == (([x],), {})  # a list is one argument
    assert split({"input_ids": x}) == ((), {"input_ids": x})
    assert split(ish.Inputs((x,), {"mask": 1})) == ((x,), {"mask": 1})
    with pytest.raises(TypeError, match="is None"):
        split(None)
    with pytest.raises(TypeError, match="keys must be strings"):
        split({0: x})


FORMS: list[Any] = [
    IDS,
    (IDS,),
    {"input_ids": IDS},
    (IDS, MASK),
    {"input_ids": IDS, "attention_mask": MASK},
    ish.Inputs((IDS,), {"attention_mask": MASK}),
]


@pytest.mark.parametrize("inputs", FORMS, ids=["tensor", "tuple", "dict", "args", "kwargs", "both"])
def test_every_planner_takes_every_form(inputs: Any) -> None:
    buckets = ish.plan_buckets(Encoder(), example_inputs=inputs, bucket_cap_mb=0.0001)
    assert buckets.ready_order_source.value == "example_inputs"
    assert buckets.ready_order[:2] == ["pooler.bias", "pooler.weight"]  # summed outputs
    splits = ish.plan_splits(Encoder(), inputs, bucket_cap_mb=0.0001, first_bucket_cap_mb=0.0001)
    assert splits.partitions and not splits.nothing
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    precision = ish.plan_precision(Encoder(), {"": policy}, example_inputs=inputs)
    assert precision.simulated and precision.unit("").ran
    assert precision.unit("").dtypes["output"] == "torch.bfloat16"


def _hidden_loss(out: dict[str, torch.Tensor]) -> torch.Tensor:
    return out["last_hidden_state"].pow(2).mean()


def test_loss_fn_makes_what_the_loss_ignores_unused() -> None:
    inputs = {"input_ids": IDS}
    summed = ish.plan_buckets(Encoder(), example_inputs=inputs, find_unused_parameters=True)
    assert summed.unused == []  # every output summed: the pooler looks used
    plan = ish.plan_buckets(
        Encoder(), example_inputs=inputs, loss_fn=_hidden_loss, find_unused_parameters=True
    )
    assert plan.unused == ["pooler.weight", "pooler.bias"]
    # DDP without find_unused_parameters fails on this loss at iteration 2: so does the plan.
    with pytest.raises(ValueError, match=r"pooler\.weight"):
        ish.plan_buckets(Encoder(), example_inputs=inputs, loss_fn=_hidden_loss)


@pytest.mark.parametrize(
    ("loss_fn", "match"),
    [
        (lambda out: out["last_hidden_state"], r"shape \(2, 5, 8\)"),
        (lambda out: 1.0, "returned float"),
        (lambda out: out["last_hidden_state"].sum().detach(), "requires_grad=False"),
    ],
)
def test_a_loss_fn_that_is_no_loss_is_refused(loss_fn: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ish.plan_buckets(Encoder(), example_inputs=(IDS,), loss_fn=loss_fn)
