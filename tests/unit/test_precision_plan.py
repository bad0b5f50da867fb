"""The precision planner on its own: rules, validation, the simulated run and its fixes.

The failure cases are FINDINGS' scenarios (FSDP2 §1.4, FSDP1 §2.3, containers §4,
buffers): each is predicted with torch's exact words, and each fix is planned again and
must come out clean. ``tests/integration/test_precision_plan_vs_fsdp.py`` runs the same
cases through the real engines.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecision as P1
from torch.distributed.fsdp import MixedPrecisionPolicy as P2
from torch.nn.parallel.distributed import _MixedPrecision as PD
from torch.nn.utils.rnn import pack_padded_sequence

import interactive_shard as ish
from interactive_shard.precision import _rules
from interactive_shard.precision._policy import (
    default_policy,
    dtype_of,
    policy_object,
    policy_of,
)
from interactive_shard.precision.events import PHASES, Policy
from interactive_shard.precision.plan import Boundary, PrecisionPlan, plan_precision
from interactive_shard.probing.compat import fsdp as compat_fsdp

bf, fp16, f32 = torch.bfloat16, torch.float16, torch.float32
BF, HALF, FLOAT = "torch.bfloat16", "torch.float16", "torch.float32"


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def seq() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), Inner(), Inner(), nn.Linear(16, 4))


X = torch.randn(4, 8)


def clean(model: nn.Module, fix: dict[str, Any] | None, x: Any) -> PrecisionPlan:
    assert fix is not None
    replanned = plan_precision(model, fix, example_inputs=x)
    assert replanned.failures == [], [f.message for f in replanned.failures]
    return replanned


# -- policies as plain data ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (None, Policy(kind="none")),
        (P2(), Policy(kind="MixedPrecisionPolicy", cast_forward_inputs=True)),
        (
            P2(param_dtype=bf, reduce_dtype=f32, output_dtype=fp16, cast_forward_inputs=False),
            Policy(
                kind="MixedPrecisionPolicy",
                param_dtype=BF,
                reduce_dtype=FLOAT,
                output_dtype=HALF,
                cast_forward_inputs=False,
            ),
        ),
        (
            P1(),
            Policy(
                kind="MixedPrecision",
                cast_forward_inputs=False,
                cast_root_forward_inputs=True,
                keep_low_precision_grads=False,
            ),
        ),
        (
            P1(param_dtype=fp16, buffer_dtype=bf, cast_forward_inputs=True),
            Policy(
                kind="MixedPrecision",
                param_dtype=HALF,
                buffer_dtype=BF,
                cast_forward_inputs=True,
                cast_root_forward_inputs=True,
                keep_low_precision_grads=False,
            ),
        ),
        (
            PD(param_dtype=bf, reduce_dtype=f32),
            Policy(kind="_MixedPrecision", param_dtype=BF, reduce_dtype=FLOAT),
        ),
    ],
    ids=["none", "fsdp2-default", "fsdp2", "fsdp1-default", "fsdp1", "ddp"],
)
def test_policy_of_and_back(obj: Any, expected: Policy) -> None:
    assert policy_of(obj) == expected
    assert policy_object(expected) == obj
    assert policy_of(expected) is expected


def test_policy_object_keeps_what_plain_data_does_not_carry() -> None:
    like = P1(param_dtype=bf, _module_classes_to_ignore=(nn.LayerNorm,))
    back = policy_object(Policy(kind="MixedPrecision", param_dtype=HALF), like)
    assert back.param_dtype == fp16 and back._module_classes_to_ignore == (nn.LayerNorm,)


def test_policy_of_refuses_other_objects() -> None:
    with pytest.raises(TypeError, match=r"builtins\.str.*MixedPrecisionPolicy.*_MixedPrecision"):
        policy_of("bf16")
    with pytest.raises(TypeError, match=r"torch\.dtype"):
        policy_of(P2(param_dtype="bf16"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a torch dtype"):
        dtype_of("torch.bfloat17")


def test_default_policies_are_what_the_engines_store() -> None:
    assert default_policy("fsdp2") == policy_of(P2())
    assert default_policy("fsdp1") == policy_of(P1())
    assert default_policy("ddp") == Policy(kind="none")


# -- the rules ------------------------------------------------------------------------------


def _static(family: Any, obj: Any, *, root: bool = True, orig: str | None = FLOAT) -> Any:
    return _rules.static_dtypes(family, policy_of(obj), root=root, orig=orig, trainable=True)


@pytest.mark.parametrize(
    ("family", "obj", "root", "expected"),
    [
        (
            "fsdp2",
            P2(param_dtype=bf, reduce_dtype=f32, output_dtype=f32),
            False,
            {
                "input": BF,
                "param": BF,
                "output": FLOAT,
                "grad": BF,
                "reduce": FLOAT,
                "sharded_param": FLOAT,
                "sharded_grad": FLOAT,
            },
        ),
        (
            "fsdp2",
            P2(param_dtype=bf, cast_forward_inputs=False),
            True,
            {"param": BF, "grad": BF, "reduce": BF, "sharded_param": FLOAT, "sharded_grad": FLOAT},
        ),
        (
            "fsdp2",
            P2(reduce_dtype=bf),  # no param_dtype: nothing to cast inputs to
            True,
            {
                "param": FLOAT,
                "grad": FLOAT,
                "reduce": BF,
                "sharded_param": FLOAT,
                "sharded_grad": FLOAT,
            },
        ),
        (
            "fsdp1",
            P1(param_dtype=bf),  # a root casts (cast_root_forward_inputs defaults to True)
            True,
            {
                "input": BF,
                "param": BF,
                "grad": BF,
                "reduce": BF,
                "sharded_param": FLOAT,
                "sharded_grad": FLOAT,
            },
        ),
        (
            "fsdp1",
            P1(param_dtype=bf),  # a non-root unit casts only with cast_forward_inputs
            False,
            {"param": BF, "grad": BF, "reduce": BF, "sharded_param": FLOAT, "sharded_grad": FLOAT},
        ),
        (
            "fsdp1",
            P1(
                param_dtype=bf,
                reduce_dtype=f32,
                cast_forward_inputs=True,
                keep_low_precision_grads=True,
            ),
            False,
            {
                "input": BF,
                "param": BF,
                "grad": BF,
                "reduce": FLOAT,
                "sharded_param": FLOAT,
                "sharded_grad": BF,
            },
        ),
        (
            "ddp",
            PD(param_dtype=fp16),
            True,
            {
                "input": HALF,
                "param": HALF,
                "grad": HALF,
                "reduce": HALF,
                "sharded_param": FLOAT,
                "sharded_grad": FLOAT,
            },
        ),
    ],
    ids=[
        "fsdp2-all",
        "fsdp2-no-cast",
        "fsdp2-reduce-only",
        "fsdp1-root",
        "fsdp1-nonroot",
        "fsdp1-keep",
        "ddp",
    ],
)
def test_static_rules(family: Any, obj: Any, root: bool, expected: dict[str, str]) -> None:
    got = _static(family, obj, root=root)
    assert got == expected
    assert list(got) == [p for p in PHASES if p in got]


@pytest.mark.parametrize("family", ["fsdp2", "fsdp1", "ddp"])
def test_reduce_rule_of_torch_2_15(family: Any) -> None:
    """torch 2.15's FSDP2 reduces in the parameters' original dtype when the policy sets
    no reduce_dtype; FSDP1 and DDP still reduce in the compute dtype."""
    obj = {"fsdp2": P2, "fsdp1": P1, "ddp": PD}[family](param_dtype=bf)
    rules = {
        rule: _rules.static_dtypes(
            family, policy_of(obj), root=True, orig=FLOAT, trainable=True, reduce_rule=rule
        )
        for rule in ("compute", "original")
    }
    assert rules["compute"]["reduce"] == BF
    assert rules["original"]["reduce"] == (FLOAT if family == "fsdp2" else BF)
    assert {k: v for k, v in rules["original"].items() if k != "reduce"} == {
        k: v for k, v in rules["compute"].items() if k != "reduce"
    }
    explicit = P2(param_dtype=bf, reduce_dtype=fp16) if family == "fsdp2" else None
    if explicit is not None:  # a reduce_dtype set wins under either rule
        got = _rules.static_dtypes(
            family,
            policy_of(explicit),
            root=True,
            orig=FLOAT,
            trainable=True,
            reduce_rule="original",
        )
        assert got["reduce"] == HALF


def test_the_plan_follows_the_running_torchs_reduce_rule() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    plan = ish.plan_precision(model, {"": P2(param_dtype=bf)})
    expected = FLOAT if compat_fsdp.reduce_dtype_rule() == "original" else BF
    assert plan.unit("").dtypes["reduce"] == expected


def test_fsdp1_unit_without_parameters_never_casts() -> None:
    policy = policy_of(P1(param_dtype=bf, cast_forward_inputs=True))
    assert _rules.input_cast("fsdp1", policy, root=False, has_params=False) is None
    assert "no parameters" in _rules.why_uncast("fsdp1", policy, root=False, has_params=False)
    assert (
        _static("fsdp1", P1(param_dtype=bf, cast_forward_inputs=True), root=False, orig=None) == {}
    )


# -- plans without a run ---------------------------------------------------------------------


def test_units_params_and_phases_without_example_inputs() -> None:
    plan = ish.plan_precision(
        seq(), {"": P2(), "1": P2(param_dtype=bf, output_dtype=f32), "1.lin": None}
    )
    assert [u.fqn for u in plan.units] == ["", "1", "1.lin"]
    assert [u.parent for u in plan.units] == [None, "", "1"]
    root, one, lin = plan.units
    assert root.params == ["0.weight", "0.bias", "2.lin.weight", "2.lin.bias", "3.weight", "3.bias"]
    assert one.params == [] and one.numel == 0
    assert lin.params == ["1.lin.weight", "1.lin.bias"] and lin.numel == 272
    assert one.dtypes == {"input": BF, "output": FLOAT}  # no params of its own
    assert "input" not in root.dtypes and "output" not in root.dtypes  # unknown without a run
    assert lin.policy == policy_of(P2())  # None: fully_shard's default
    assert plan.wrapper == "fsdp2" and not plan.simulated and plan.ok and plan.failures == []
    event = lin.event()
    assert event.fqn == "1.lin" and event.param_dtypes == [FLOAT, FLOAT]


def test_unit_lookup_names_the_units() -> None:
    plan = plan_precision(seq(), {"": P2(), "1": P2()})
    with pytest.raises(KeyError, match=r"'2' is not a unit.*\['', '1'\]"):
        plan.unit("2")


def test_frozen_parameters_have_no_gradient_phases() -> None:
    model = seq()
    model[1].requires_grad_(False)
    plan = plan_precision(model, {"": P2(), "1": P2(param_dtype=bf)})
    assert plan.unit("1").dtypes == {"input": BF, "param": BF, "sharded_param": FLOAT}


def test_ddp_without_mixed_precision() -> None:
    plan = plan_precision(seq(), {"": None})
    assert plan.wrapper is None
    assert plan.unit("").dtypes == {
        "param": FLOAT,
        "grad": FLOAT,
        "reduce": FLOAT,
        "sharded_param": FLOAT,
        "sharded_grad": FLOAT,
    }


# -- validation ----------------------------------------------------------------------------------


def test_unknown_fqns_are_named_with_close_names() -> None:
    with pytest.raises(ValueError, match=r"'1.lni' \(did you mean \['1.lin'") as info:
        plan_precision(seq(), {"": P2(), "1.lni": P2(), "nope": P2()})
    assert "'nope'" in str(info.value)


def test_mixed_engines_are_refused() -> None:
    with pytest.raises(ValueError, match=r"mix engines.*'': fsdp2.*'1': fsdp1"):
        plan_precision(seq(), {"": P2(), "1": P1()})


def test_ddp_policy_is_for_the_root_alone() -> None:
    with pytest.raises(ValueError, match="root alone"):
        plan_precision(seq(), {"1": PD(param_dtype=bf)})
    with pytest.raises(ValueError, match="root alone"):
        plan_precision(seq(), {"": PD(param_dtype=bf), "1": None})


def test_bad_policies_argument() -> None:
    with pytest.raises(TypeError, match=r"policies\['1'\].*builtins.str"):
        plan_precision(seq(), {"": P2(), "1": "bf16"})
    with pytest.raises(TypeError, match="dict"):
        plan_precision(seq(), [("", P2())])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        plan_precision(seq(), {})
    with pytest.raises(TypeError, match=r"nn\.Module"):
        plan_precision("model", {"": P2()})  # type: ignore[arg-type]


def test_a_unit_with_several_parameter_dtypes_is_refused() -> None:
    model = seq()
    model[3].to(torch.float64)
    with pytest.raises(ValueError, match="uniform original parameter dtype"):
        plan_precision(model, {"": P2()})


# -- predicted failures (FINDINGS §1.4 and §2.3), each fix planned clean -------------------------


FAILURES = {
    "fsdp2-A": (
        {"": P2(), "1": P2(param_dtype=bf), "2": P2(param_dtype=fp16)},
        "mat1 and mat2 must have the same dtype, but got Half and Float",
        ("", "3", "output_boundary", "2"),
    ),
    "fsdp2-C": (
        {"": P2(param_dtype=bf), "1": P2(param_dtype=fp16), "2": P2(param_dtype=fp16)},
        "mat1 and mat2 must have the same dtype, but got Half and BFloat16",
        ("", "3", "output_boundary", "2"),
    ),
    "fsdp2-G": (
        {"": P2(), "1": P2(param_dtype=bf, cast_forward_inputs=False)},
        "mat1 and mat2 must have the same dtype, but got Float and BFloat16",
        ("1", "1.lin", "uncast_input", None),
    ),
    "fsdp1-A": (
        {
            "": None,
            "1": P1(param_dtype=bf, cast_forward_inputs=True),
            "2": P1(param_dtype=fp16, cast_forward_inputs=True),
        },
        "mat1 and mat2 must have the same dtype, but got Half and Float",
        ("", "3", "output_boundary", "2"),
    ),
    "fsdp1-B": (
        {"": None, "1": P1(param_dtype=bf), "2": P1(param_dtype=fp16)},
        "mat1 and mat2 must have the same dtype, but got Float and BFloat16",
        ("1", "1.lin", "uncast_input", None),
    ),
    "fsdp1-C": (
        {
            "": P1(param_dtype=bf, cast_forward_inputs=True),
            "1": P1(param_dtype=fp16, cast_forward_inputs=True),
            "2": P1(param_dtype=fp16, cast_forward_inputs=True),
        },
        "mat1 and mat2 must have the same dtype, but got Half and BFloat16",
        ("", "3", "output_boundary", "2"),
    ),
    "fsdp1-F": (
        {"": P1(param_dtype=bf, cast_root_forward_inputs=False)},
        "mat1 and mat2 must have the same dtype, but got Float and BFloat16",
        ("", "0", "uncast_input", None),
    ),
    "fsdp1-H": (
        {
            "": None,
            "1": P1(param_dtype=bf, cast_forward_inputs=True),
            "2": P1(param_dtype=bf, cast_forward_inputs=True),
        },
        "mat1 and mat2 must have the same dtype, but got BFloat16 and Float",
        ("", "3", "output_boundary", "2"),
    ),
}


@pytest.mark.parametrize("name", list(FAILURES))
def test_failure_predicted_and_fixed(name: str) -> None:
    policies, error, (unit, consumer, kind, producer) = FAILURES[name]
    plan = plan_precision(seq(), policies, example_inputs=X)
    first = plan.failures[0]
    assert first.error == error
    assert first.message.startswith(error + "\n") and len(first.message) > len(error) + 40
    assert (first.unit, first.consumer, first.kind, first.producer) == (
        unit,
        consumer,
        kind,
        producer,
    )
    assert first.first and not any(f.first for f in plan.failures[1:])
    assert first.op == "linear"
    assert not plan.ok
    clean(seq(), first.fix, X)
    for f in plan.failures:
        clean(seq(), f.fix, X)


def test_fsdp2_fix_is_output_dtype_on_the_producer() -> None:
    policies = FAILURES["fsdp2-A"][0]
    plan = plan_precision(seq(), policies, example_inputs=X)
    fix = plan.failures[0].fix
    assert fix is not None
    assert fix["2"] == P2(param_dtype=fp16, output_dtype=f32)
    assert fix[""] is policies[""] and fix["1"] is policies["1"]  # unchanged: the caller's
    assert "output_dtype=torch.float32" in plan.failures[0].fix_note
    assert "'3' is not a unit" in plan.failures[0].message


def test_fsdp1_fix_wraps_the_consumer() -> None:
    plan = plan_precision(seq(), FAILURES["fsdp1-A"][0], example_inputs=X)
    fix = plan.failures[0].fix
    assert fix is not None and list(fix) == ["", "1", "2", "3"]
    assert fix["3"] == P1(param_dtype=f32, cast_forward_inputs=True)
    assert "FSDP1 has no output_dtype" in plan.failures[0].message


def test_fsdp2_uncast_input_fix_turns_the_cast_on() -> None:
    plan = plan_precision(seq(), FAILURES["fsdp2-G"][0], example_inputs=X)
    first, second = plan.failures  # the real run stops at the first
    assert "cast_forward_inputs=False" in first.message
    assert (second.unit, second.consumer, second.kind, second.producer) == (
        "",
        "2.lin",
        "output_boundary",
        "1",
    )
    assert first.fix == second.fix
    assert first.fix is not None and first.fix["1"] == P2(param_dtype=bf, output_dtype=f32)


def test_fsdp1_root_without_root_cast() -> None:
    plan = plan_precision(seq(), FAILURES["fsdp1-F"][0], example_inputs=X)
    assert "cast_root_forward_inputs=False" in plan.failures[0].message
    assert plan.failures[0].fix == {"": P1(param_dtype=bf)}


def test_fixed_plans_run_clean() -> None:
    for policies in (
        {"": P2(), "1": P2(param_dtype=bf), "2": P2(param_dtype=fp16, output_dtype=f32)},
        {
            "": P2(param_dtype=bf),
            "1": P2(param_dtype=fp16),
            "2": P2(param_dtype=fp16, output_dtype=bf),
        },
    ):
        plan = plan_precision(seq(), policies, example_inputs=X)
        assert plan.ok and plan.simulated and plan.device == "cpu"
        assert all(u.ran for u in plan.units)


def test_planned_dtypes_in_a_nested_run() -> None:
    plan = plan_precision(
        seq(),
        {"": P2(), "1": P2(param_dtype=bf), "2": P2(param_dtype=fp16, output_dtype=f32)},
        example_inputs=X,
    )
    assert {u.fqn: (u.dtypes["input"], u.dtypes["output"], u.cast) for u in plan.units} == {
        "": (FLOAT, FLOAT, [False]),
        "1": (BF, BF, [True]),
        "2": (HALF, FLOAT, [True]),
    }
    assert [(b.unit, b.producer, b.before, b.after, b.cast) for b in plan.boundaries] == [
        ("1", None, FLOAT, BF, True),
        ("2", "1", BF, HALF, True),
    ]


def test_same_dtype_passes_through() -> None:
    policies = {fqn: P2(param_dtype=bf) for fqn in ("", "1", "2")}
    plan = plan_precision(seq(), policies, example_inputs=X.to(bf))
    assert [u.cast for u in plan.units] == [[False], [False], [False]]
    plan = plan_precision(seq(), policies, example_inputs=X)
    assert [u.cast for u in plan.units] == [[True], [False], [False]]
    assert plan.boundaries == [Boundary("", None, FLOAT, BF, True)]


# -- containers (FINDINGS §4) --------------------------------------------------------------------


Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    b: torch.Tensor


class Anything(nn.Module):
    """Sums every floating tensor it gets (after casting them to the weight's dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        from interactive_shard.precision._simulate import walk

        out = self.lin(torch.zeros(1, 4, dtype=self.lin.weight.dtype))
        for _, t, _ in walk((args, kwargs)):
            if t.is_floating_point():
                out = out + t.to(out.dtype).sum()
        return out


@pytest.mark.parametrize(
    "inputs",
    [
        (torch.ones(2),),
        ((torch.ones(2), torch.ones(2, dtype=torch.float64)),),
        ([torch.ones(2)],),
        ({"x": torch.ones(2)},),
        (collections.OrderedDict(x=torch.ones(2)),),
        (Pair(torch.ones(2), torch.ones(2)),),
        (Frozen(torch.ones(2), torch.ones(2)),),
        ({torch.ones(2)},),
        ([{"x": (torch.ones(2),)}],),
        {"x": torch.ones(2), "y": [torch.ones(2)]},
    ],
    ids=[
        "tensor",
        "tuple-f64",
        "list",
        "dict",
        "ordereddict",
        "namedtuple",
        "dataclass",
        "set",
        "nested",
        "kwargs",
    ],
)
def test_containers_fsdp_walks_are_cast(inputs: Any) -> None:
    plan = plan_precision(Anything(), {"": P2(param_dtype=bf)}, example_inputs=inputs)
    unit = plan.unit("")
    assert unit.cast and all(unit.cast) and unit.hidden == []
    assert unit.dtypes["input"] == BF


def test_integer_and_complex_inputs_are_untouched() -> None:
    plan = plan_precision(
        Anything(),
        {"": P2(param_dtype=bf)},
        example_inputs=(torch.ones(2, dtype=torch.int64), torch.ones(2) * 1j),
    )
    assert plan.unit("").cast == [] and "input" not in plan.unit("").dtypes


class Box:
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x


class TakesBox(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, box: Box) -> torch.Tensor:
        return self.out(self.lin(box.x))


@pytest.mark.parametrize("policy", [P2(param_dtype=bf), P1(param_dtype=bf)], ids=["fsdp2", "fsdp1"])
def test_input_hidden_in_an_object_is_not_cast(policy: Any) -> None:
    box = (Box(torch.randn(2, 8)),)
    plan = plan_precision(TakesBox(), {"": policy}, example_inputs=box)
    assert plan.unit("").hidden == [f"args[0].x ({FLOAT}, in a {__name__}.Box)"]
    (failure,) = plan.failures
    assert failure.kind == "hidden_input" and failure.consumer == "lin"
    assert failure.error == "mat1 and mat2 must have the same dtype, but got Float and BFloat16"
    assert "_apply_to_tensors does not walk" in failure.message
    fixed = clean(TakesBox(), failure.fix, box)
    assert "lin" in [u.fqn for u in fixed.units]  # the consumer casts what it is given


class Packed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(8, 8)

    def forward(self, packed: Any) -> torch.Tensor:
        return self.rnn(packed)[1]


def test_packed_sequence_is_not_cast() -> None:
    packed = (pack_padded_sequence(torch.randn(3, 2, 8), [3, 2]),)
    plan = plan_precision(Packed(), {"": P2(param_dtype=bf)}, example_inputs=packed)
    (failure,) = plan.failures
    assert failure.kind == "hidden_input" and failure.consumer == "rnn"
    assert failure.error.startswith("RNN input dtype (torch.float32) does not match weight dtype")
    assert "PackedSequence" in failure.message
    clean(Packed(), failure.fix, packed)


# -- buffers -------------------------------------------------------------------------------------


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) * self.scale)


@pytest.mark.parametrize(
    ("policy", "says", "fix"),
    [
        (P2(param_dtype=bf), "FSDP2 never casts buffers", P2(param_dtype=f32)),
        (P1(param_dtype=bf), "buffer_dtype is None", P1(param_dtype=bf, buffer_dtype=bf)),
        (PD(param_dtype=bf), "buffer_dtype is None", PD(param_dtype=bf, buffer_dtype=bf)),
    ],
    ids=["fsdp2", "fsdp1", "ddp"],
)
def test_buffer_promotes_the_activation(policy: Any, says: str, fix: Any) -> None:
    plan = plan_precision(Scaled(), {"": policy}, example_inputs=X)
    (failure,) = plan.failures
    assert failure.kind == "buffer" and failure.consumer == "b"
    assert failure.error == "mat1 and mat2 must have the same dtype, but got Float and BFloat16"
    assert "buffer 'scale'" in failure.message and says in failure.message
    assert failure.fix == {"": fix}
    clean(Scaled(), failure.fix, X)


def test_buffer_dtype_planned_clean() -> None:
    assert plan_precision(Scaled(), {"": P1(param_dtype=bf, buffer_dtype=bf)}, example_inputs=X).ok


def test_batchnorm_in_a_bf16_fsdp2_unit() -> None:
    def norm() -> nn.Module:
        return nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 4))

    plan = plan_precision(norm(), {"": P2(param_dtype=bf)}, example_inputs=X)
    (failure,) = plan.failures
    assert failure.error == "expected scalar type BFloat16 but found Float"
    assert (failure.kind, failure.consumer, failure.op) == ("buffer", "1", "batch_norm")
    assert failure.fix is not None
    assert failure.fix["1"] == P2(param_dtype=f32, output_dtype=bf)  # BN in fp32, bf16 out
    clean(norm(), failure.fix, X)


# -- the meta device -----------------------------------------------------------------------------


def test_meta_model_plans_on_meta() -> None:
    with torch.device("meta"):
        model = seq()
    policies = FAILURES["fsdp2-A"][0]
    plan = plan_precision(model, policies, example_inputs=X)
    assert plan.device == "meta"
    assert (
        plan.failures[0].error == "mat1 and mat2 must have the same dtype, but got Half and Float"
    )
    assert plan.failures[0].consumer == "3"
    clean(model, plan.failures[0].fix, X)
    assert all(p.is_meta and p.dtype == f32 for p in model.parameters())


# -- the caller's state is left alone --------------------------------------------------------------


def test_model_inputs_and_global_state_untouched() -> None:
    model = Scaled()
    before = {k: (v.dtype, v.clone()) for k, v in model.state_dict().items()}
    x = torch.randn(4, 8)
    x0 = x.clone()
    with torch.no_grad(), torch.autocast("cpu", dtype=bf):
        plan = plan_precision(model, {"": P2(param_dtype=bf)}, example_inputs=x)
        assert not torch.is_grad_enabled() and torch.is_autocast_enabled("cpu")
    assert plan.failures
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    after = model.state_dict()
    assert all(after[k].dtype == d and torch.equal(after[k], v) for k, (d, v) in before.items())
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert torch.equal(x, x0) and x.dtype == f32


def test_other_errors_propagate_with_a_note() -> None:
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        plan_precision(seq(), {"": P2()}, example_inputs=torch.randn(2, 5))
    assert any("plan_precision" in note for note in info.value.__notes__)


def test_public_api() -> None:
    assert ish.plan_precision is plan_precision
    assert "plan_precision" in ish.__all__


def test_no_root_unit() -> None:
    plan = plan_precision(
        seq(), {"1": P2(param_dtype=bf), "2": P2(param_dtype=fp16)}, example_inputs=X
    )
    (failure,) = plan.failures
    assert (failure.unit, failure.consumer, failure.producer) == ("", "3", "2")
    assert "outside every unit" in failure.message
    assert failure.fix is not None and failure.fix["2"].output_dtype == f32
    clean(seq(), failure.fix, X)


def test_fsdp1_top_level_units_are_roots() -> None:
    # each outermost FSDP1 wrapper is a root of its own and casts with
    # cast_root_forward_inputs (default True), without cast_forward_inputs
    plan = plan_precision(
        seq(), {"1": P1(param_dtype=bf), "2": P1(param_dtype=fp16)}, example_inputs=X
    )
    assert [u.parent for u in plan.units] == [None, None]
    assert [(u.dtypes["input"], u.cast) for u in plan.units] == [(BF, [True]), (HALF, [True])]


def test_repr_is_a_table() -> None:
    plan = plan_precision(seq(), FAILURES["fsdp2-A"][0], example_inputs=X)
    text = repr(plan)
    assert text.splitlines()[0] == "PrecisionPlan(fsdp2, 3 units, simulated on cpu)"
    assert "sharded_grad" in text.splitlines()[1]
    assert "failure at unit '', in '3': mat1 and mat2" in text


def test_plain_data_policies_are_accepted() -> None:
    policies = {"": policy_of(P2()), "2": policy_of(P2(param_dtype=fp16))}
    plan = plan_precision(seq(), policies, example_inputs=X)
    (failure,) = plan.failures
    assert failure.fix == {"": P2(), "2": P2(param_dtype=fp16, output_dtype=f32)}
    assert all(isinstance(p, P2) for p in failure.fix.values())  # real torch policies


def test_fsdp2_fix_has_a_policy_object_for_every_unit() -> None:
    plan = plan_precision(
        seq(), {"": None, "1": P2(param_dtype=bf), "2": P2(param_dtype=fp16)}, example_inputs=X
    )
    fix = plan.failures[0].fix
    assert fix is not None and fix[""] == P2()  # fully_shard(mp_policy=None) would not run
    fsdp1 = plan_precision(seq(), FAILURES["fsdp1-A"][0], example_inputs=X).failures[0].fix
    assert fsdp1 is not None and fsdp1[""] is None  # FSDP1 takes mixed_precision=None


@pytest.mark.skipif(
    not compat_fsdp.PARAM_DTYPE_OVERRIDE,
    reason="torch before 2.15 has no MixedPrecisionPolicy.param_dtype_override_fn",
)
def test_a_per_parameter_dtype_override_is_refused_with_the_parameters_named() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    keep_norm = P2(
        param_dtype=bf,
        param_dtype_override_fn=lambda p: p.dtype if p.dim() == 1 and p.numel() == 4 else None,
    )
    with pytest.raises(ValueError, match=r"keeps \['0.bias', '1.weight', '1.bias'\]"):
        ish.plan_precision(model, {"": keep_norm})
    same = P2(param_dtype=bf, param_dtype_override_fn=lambda p: None)  # overrides nothing
    assert ish.plan_precision(model, {"": same}).unit("").dtypes["param"] == BF
