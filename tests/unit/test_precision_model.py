"""PrecisionModel on synthetic events (``testing.FakePrecision``, as the probe emits them).

The scenarios are those measured on real ranks (``/tmp/mp``: 2 ranks, gloo, torch 2.13):
``Sequential(Linear(8,16), Inner, Inner, Linear(16,4))``, root 212 elements, each
``Inner`` 272, with nested FSDP2 / FSDP1 policies; the byte counts asserted are those
the measurements printed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import msgspec
import pytest
from support import make_store

from interactive_shard.precision.analysis import CATEGORIES, Held, itemsize, short
from interactive_shard.precision.compare import Comparison
from interactive_shard.precision.events import PHASES, PrecisionSeen, PrecisionWatch
from interactive_shard.precision.model import PrecisionModel
from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import (
    FakePrecision,
    ddp_policy,
    fsdp1_policy,
    fsdp2_policy,
    mp_net,
    payload_types,
    precision_batch,
)

F32, BF16, F16 = "torch.float32", "torch.bfloat16", "torch.float16"

# Root fp32, unit 1 bf16, unit 2 fp16: unit 2's fp16 output reaches the root's head "3".
FAILING = {"": fsdp2_policy(), "1": fsdp2_policy("bf16"), "2": fsdp2_policy("fp16")}
# The fix: unit 2 outputs fp32.
FIXED = {**FAILING, "2": fsdp2_policy("fp16", output="fp32")}
UNIFORM = {k: fsdp2_policy("bf16", "fp32") for k in ("", "1", "2")}


def model_of(policies: dict[str, Any], **kw: Any) -> PrecisionModel:
    return PrecisionModel(make_store(FakePrecision(mp_net(policies), **kw).events()))


class _PlanUnit:
    def __init__(self, fqn: str, dtypes: dict[str, str], cast: list[bool] | None = None):
        self.fqn, self.dtypes, self.cast = fqn, dtypes, cast or []


class _PlanFailure:
    def __init__(self, unit: str, consumer: str, message: str = "boom") -> None:
        self.unit, self.consumer, self.message = unit, consumer, message


class _Plan:
    """The part of a ``PrecisionPlan`` compare reads."""

    def __init__(self, units: list[_PlanUnit], failures: list[_PlanFailure] | None = None):
        self.units, self.failures = units, failures or []


def plan_as_observed(m: PrecisionModel, iteration: int = 1) -> _Plan:
    return _Plan([_PlanUnit(u.fqn, m.observed(u.fqn, iteration=iteration)) for u in m.units()])


# -- what was observed ------------------------------------------------------------------------
def test_uniform_bf16_with_fp32_reduce_every_phase_and_collective() -> None:
    m = model_of(UNIFORM)
    assert m.ranks == [0, 1] and m.iterations == [1, 2] and m.skipped == 0
    assert [u.fqn for u in m.units()] == ["", "1", "2"]
    assert [m.depth(f) for f in ("", "1", "2")] == [0, 1, 1]
    assert m.wrapper() == "fsdp2" and m.world_size == 2
    for fqn in ("", "1", "2"):
        assert m.observed(fqn, iteration=2) == {
            "input": BF16,
            "param": BF16,
            "output": BF16,
            "grad": BF16,
            "reduce": F32,  # from the reduce-scatter's dtype
            "sharded_param": F32,
            "sharded_grad": F32,
        }
    # The root casts the fp32 input once; the inner units get bf16 and pass it through.
    assert m.cast_inputs("") == [True]
    assert m.cast_inputs("1") == m.cast_inputs("2") == [False]
    assert m.inputs("1") == [(BF16, BF16, False)]
    # Bytes as measured: root all-gather 212 B in (106 bf16 elements), inner
    # reduce-scatters in float32 1088 B (272 x 4), root's 848 B.
    sent = {(c.unit, c.op, c.backward): (c.dtype, c.nbytes) for c in m.collectives(iteration=1)}
    assert sent[("", "all_gather", False)] == (BF16, 212)
    assert sent[("1", "reduce_scatter", True)] == (F32, 1088)
    assert sent[("", "reduce_scatter", True)] == (F32, 848)
    assert sent[("1", "all_gather", True)] == (BF16, 272)  # re-gathered for backward
    assert ("", "all_gather", True) not in sent  # the root stays unsharded
    assert m.findings == [] and m.failures == []


def test_a_failing_nested_policy_stops_at_the_unit_with_its_fix() -> None:
    m = model_of(FAILING)
    assert m.iterations == [1]  # the rank raised in the first forward
    [f0, f1] = m.failures
    assert (f0.rank, f0.unit, f0.consumer) == (0, "", "3")
    assert f1.rank == 1
    assert "got Half and Float" in f0.message
    # Observed up to the crash: unit 2 cast bf16 -> fp16 and output fp16; no backward.
    assert m.observed("2") == {"input": F16, "param": F16, "output": F16}
    assert m.observed("") == {"input": F32, "param": F32}
    assert m.inputs("2") == [(BF16, F16, True)]
    failure = next(f for f in m.findings if f.kind == "failure")
    assert failure.level == "error" and failure.unit == "" and failure.consumer == "3"
    assert failure.ranks == (0, 1) and failure.iterations == (1,)
    assert "unit '2'" in failure.fix and "output_dtype=torch.float32" in failure.fix
    # bf16 rounded, then fp16: a note at unit 2.
    twice = [f for f in m.findings if f.kind == "cast_twice"]
    assert [(f.unit, f.level) for f in twice] == [("2", "note")]
    assert m.findings[0] is not None and m.findings[0].kind == "failure"  # errors first


def test_the_fixed_policy_runs_with_output_dtype_applied() -> None:
    m = model_of(FIXED)
    assert m.failures == [] and m.iterations == [1, 2]
    seen = {s.phase: s for s in m.seen("2", iteration=2)}
    assert seen["output"].dtypes == [F32] and seen["output"].before == [F16]
    assert m.observed("2", iteration=2)["reduce"] == F16
    assert m.observed("1", iteration=2)["reduce"] == BF16
    assert [f.kind for f in m.findings] == ["cast_twice"]


def test_an_uncast_input_fails_inside_the_unit_and_the_fix_turns_the_cast_on() -> None:
    m = model_of({"": fsdp2_policy(), "1": fsdp2_policy("bf16", cast_forward_inputs=False)})
    [failure] = [f for f in m.findings if f.kind == "failure"]
    assert (failure.unit, failure.consumer) == ("1", "1.lin")
    assert "got Float and BFloat16" in failure.message
    assert "cast_forward_inputs=True" in failure.fix
    [uncast] = [f for f in m.findings if f.kind == "uncast_input"]
    assert uncast.unit == "1" and "fp32" in uncast.message and "bf16" in uncast.message


def test_fsdp1_root_without_the_root_cast() -> None:
    m = model_of({"": fsdp1_policy("bf16", cast_root_forward_inputs=False)}, wrapper="fsdp1")
    assert m.wrapper() == "fsdp1"
    [failure] = [f for f in m.findings if f.kind == "failure"]
    assert (failure.unit, failure.consumer) == ("", "0")
    assert "cast_root_forward_inputs=True" in failure.fix
    assert m.cast_inputs("") == [False]


def test_fsdp1_nested_failure_fix_wraps_the_consumer() -> None:
    policies = {
        "": fsdp1_policy(),
        "1": fsdp1_policy("bf16", cast_forward_inputs=True),
        "2": fsdp1_policy("fp16", cast_forward_inputs=True),
    }
    m = model_of(policies, wrapper="fsdp1")
    [failure] = [f for f in m.findings if f.kind == "failure"]
    assert failure.consumer == "3" and "no output_dtype" in failure.fix
    assert "MixedPrecision(param_dtype=torch.float32, cast_forward_inputs=True)" in failure.fix


def test_policy_asks_for_low_precision_but_the_unit_computes_in_full() -> None:
    m = model_of(UNIFORM, alter={("1", "param"): F32})
    [f] = [f for f in m.findings if f.kind == "full_precision"]
    assert f.unit == "1" and f.level == "warning"
    assert "param_dtype=bf16" in f.message and "fp32" in f.message


def test_low_precision_without_a_policy_asking_for_it() -> None:
    m = model_of({"": fsdp2_policy()}, alter={("", "param"): BF16})
    [f] = [f for f in m.findings if f.kind == "low_precision"]
    assert f.unit == "" and "no param_dtype" in f.message and "bf16" in f.message


def test_a_phase_that_saw_two_dtypes_is_joined_and_differs_from_one() -> None:
    m = model_of(UNIFORM)
    events = FakePrecision(mp_net(UNIFORM)).events()
    extra = PrecisionSeen(iteration=1, unit="1", phase="param", dtypes=[BF16, F32])
    store = make_store([*events, precision_batch([extra], t=2e3)])
    two = PrecisionModel(store)
    assert two.observed("1")["param"] == f"{BF16}, {F32}"
    assert short(two.observed("1")["param"]) == "bf16+fp32"
    cmp = two.compare(plan_as_observed(m), rank=0, iteration=1)
    assert cmp.cells == {(0, "1", "param"): (BF16, f"{BF16}, {F32}")}
    # Order does not matter when both sides list the same dtypes.
    again = _Plan([_PlanUnit("1", {"param": f"{F32}, {BF16}"})])
    assert "param" not in str(two.compare(again, rank=0, iteration=1).differences)


# -- planned vs observed ----------------------------------------------------------------------
def test_compare_matches_a_plan_equal_to_the_observation() -> None:
    m = model_of(FIXED)
    cmp = m.compare(plan_as_observed(m, 2))
    assert isinstance(cmp, Comparison) and cmp.matches, cmp.differences
    assert cmp.iterations == {0: 2, 1: 2}  # each rank's latest
    assert "matches" in repr(cmp)


def test_compare_lists_every_differing_phase_and_the_units_on_one_side() -> None:
    m = model_of(FIXED)
    units = plan_as_observed(m, 2).units
    units[1].dtypes = {**units[1].dtypes, "param": F32, "reduce": F32}
    plan = _Plan([*units[:2], _PlanUnit("extra", {"param": F32})])  # unit '2' left out
    cmp = m.compare(plan, iteration=2)
    assert not cmp.matches
    assert set(cmp.cells) == {(r, "1", p) for r in (0, 1) for p in ("param", "reduce")}
    assert cmp.cells[(0, "1", "param")] == (F32, BF16)
    text = "\n".join(cmp.differences)
    assert "unit '1' (param): planned fp32, observed bf16" in text
    assert "unit 'extra' is planned but is not a unit on the rank" in text
    assert "unit '2' is a unit on the rank but not in the plan" in text
    only_rank_1 = m.compare(plan, rank=1, iteration=2)
    assert {c[0] for c in only_rank_1.cells} == {1}


def test_compare_checks_failures_and_input_casts() -> None:
    m = model_of(FAILING)
    plan = plan_as_observed(m)
    assert not m.compare(plan).matches  # the run failed; the plan predicts nothing
    assert "the plan predicts no failure" in m.compare(plan).differences[-1]
    plan.failures = [_PlanFailure("", "3")]
    assert m.compare(plan).matches
    # A run stops at its first failure: later planned ones cannot be seen.
    plan.failures = [_PlanFailure("", "3"), _PlanFailure("x", "x.lin")]
    assert m.compare(plan).matches
    plan.failures = [_PlanFailure("1", "1.lin"), _PlanFailure("", "3")]
    assert m.compare(plan, rank=0).differences == [
        "rank 0: failed at unit '' (in `3`); the plan's first failure is at unit '1' (in `1.lin`)"
    ]
    plan.failures = [_PlanFailure("", "0")]
    assert "the plan's first failure is at unit '' (in `0`)" in m.compare(plan).differences[0]
    fixed = model_of(FIXED)
    cmp = fixed.compare(_Plan(plan_as_observed(fixed, 2).units, [_PlanFailure("", "3")] * 2))
    assert cmp.differences[0] == (
        "rank 0: the plan predicts a failure at unit '' (in `3`) (2 planned in all); the "
        "rank did not fail"
    )
    plan = plan_as_observed(m)
    plan.failures = [_PlanFailure("", "3")]
    plan.units[1].cast = [False]  # the plan says unit 1 passes its input through
    cmp = m.compare(plan, rank=0)
    assert cmp.differences == [
        "rank 0, iteration 1, unit '1' (input): planned [passed through], observed [cast]"
    ]


def test_compare_before_anything_arrived() -> None:
    cmp = PrecisionModel(make_store()).compare(_Plan([]))
    assert not cmp.matches and "no rank reported" in cmp.differences[0]


# -- bytes ------------------------------------------------------------------------------------
def test_bytes_held_per_unit_category_and_dtype() -> None:
    m = model_of(FIXED)
    held = {(h.unit, h.category): h for h in m.bytes_held(iteration=2)}
    # Sharded: ceil(numel / 2) fp32 elements; unsharded: numel in the compute dtype.
    assert held[("1", "sharded_param")] == Held("1", "sharded_param", F32, 136 * 4)
    assert held[("1", "param")] == Held("1", "param", BF16, 272 * 2)
    assert held[("2", "param")] == Held("2", "param", F16, 272 * 2)
    assert held[("", "param")] == Held("", "param", F32, 212 * 4)
    assert held[("", "sharded_grad")] == Held("", "sharded_grad", F32, 106 * 4)
    total = m.total_bytes(iteration=2)
    assert total[("sharded_param", F32)] == (106 + 136 + 136) * 4
    assert total[("param", BF16)] == total[("param", F16)] == 544
    assert {c for c, _ in total} == set(CATEGORIES)


def test_bytes_before_the_first_step_count_what_was_seen() -> None:
    m = model_of(FAILING)  # forward only: no gradients, no optimizer step
    cats = {(h.unit, h.category) for h in m.bytes_held()}
    assert ("1", "param") in cats and ("1", "sharded_param") in cats  # from the watch
    assert not any(c == "sharded_grad" for _, c in cats)


def test_ddp_native_mixed_precision_replicates_and_all_reduces() -> None:
    m = model_of({"": ddp_policy("bf16", "fp32")}, wrapper="ddp")
    assert m.observed("", iteration=1) == {
        "input": BF16,
        "param": BF16,
        "output": BF16,
        "grad": BF16,
        "reduce": F32,
        "sharded_param": F32,
        "sharded_grad": F32,
    }
    [reduce] = [c for c in m.collectives("") if c.op == "all_reduce"]
    numel = 144 + 272 + 272 + 68  # one DDP "unit": the whole model, on every rank
    assert reduce.nbytes == numel * 4 and reduce.dtype == F32  # upcast before the all-reduce
    held = {h.category: h.nbytes for h in m.bytes_held()}
    assert held == {"sharded_param": numel * 4, "param": numel * 2, "sharded_grad": numel * 4}


def test_itemsize_from_dtype_names() -> None:
    assert [itemsize(d) for d in (F32, BF16, "torch.float8_e4m3fn", "torch.bool")] == [4, 2, 1, 1]


# -- consuming events -------------------------------------------------------------------------
def test_malformed_events_are_skipped_and_counted() -> None:
    good = FakePrecision(mp_net(UNIFORM), world_size=1, iterations=1).events()
    watch = msgspec.to_builtins(FakePrecision(mp_net(UNIFORM)).watch())
    orphan = {**watch, "units": [{**watch["units"][1], "parent": "nowhere"}]}
    bad = [
        batch({"iteration": 1, "unit": "1"}),  # no phase, no dtypes
        batch({"iteration": 0, "unit": "1", "phase": "param", "dtypes": []}),
        batch({"iteration": 1, "unit": "1", "phase": "flux", "dtypes": []}),
        batch(  # input lists of different lengths
            {"iteration": 1, "unit": "1", "phase": "input", "dtypes": [F32], "cast": [True, False]}
        ),
        batch({"iteration": 1, "unit": "1", "op": "send"}, key="collectives"),
        batch(*[{"iteration": 1, "unit": "1", "phase": "param", "dtypes": [F32]}] * 4097),
        Event("precision_batch", 0, 1, 1.0, {"seen": {"iteration": 1}}),  # not a list
        Event("precision_failure", 0, 1, 1.0, {"iteration": 1, "unit": 3}),
        Event("precision_watch", 1, 0, 1.0, orphan),
    ]
    m = PrecisionModel(make_store([*good[:1], *bad, *good[1:]]))
    assert m.update() and m.skipped == 2  # the watch and the failure: batches wait to be read
    assert m.ranks == [0] and m.observed("1")["param"] == BF16
    assert m.iterations == [1] and m.skipped == len(bad)  # iteration 1 read, and every batch
    assert payload_types(PrecisionWatch)["units"] is list


def batch(*records: dict[str, object], key: str = "seen") -> Event:
    return Event("precision_batch", 0, 1, 1.0, {key: list(records)})


def test_updates_are_incremental_and_revision_counts_changes() -> None:
    events = FakePrecision(mp_net(FAILING)).events()
    assert [e.kind for e in events[:4]] == ["precision_watch"] * 2 + ["precision_batch"] * 2
    store = make_store(events[:4])
    m = PrecisionModel(store)
    assert m.update() and m.revision == 1
    assert not m.update() and m.revision == 1
    assert m.failures == [] and not [f for f in m.findings if f.kind == "failure"]
    store.extend(events[4:])
    assert m.update() and m.revision == 2
    whole = model_of(FAILING)
    assert m.findings == whole.findings and len(m.failures) == 2
    assert [m.observed(u.fqn) for u in m.units()] == [whole.observed(u.fqn) for u in whole.units()]


def test_watching_again_starts_the_rank_over() -> None:
    first = FakePrecision(mp_net(FAILING), world_size=1).events()
    second = FakePrecision(mp_net(FIXED), world_size=1, t0=2000.0).events()
    m = PrecisionModel(make_store([*first, *second]))
    assert m.failures == [] and m.iterations == [1, 2]
    assert m.unit("2") is not None and m.unit("2").policy.output_dtype == F32  # type: ignore[union-attr]
    assert [f.kind for f in m.findings] == ["cast_twice"]


def test_units_reported_but_not_in_the_watch_are_listed() -> None:
    lone = PrecisionSeen(iteration=1, unit="ghost", phase="param", dtypes=[F32])
    m = PrecisionModel(make_store([precision_batch([lone])]))
    [ghost] = m.units()
    assert ghost.fqn == "ghost" and ghost.module_type == "?"
    assert m.observed("ghost") == {"param": F32} and m.bytes_held() == []


# -- against the real planner -----------------------------------------------------------------
_PLANNER = importlib.util.find_spec("interactive_shard.precision.plan") is not None


@pytest.mark.skipif(not _PLANNER, reason="precision/plan.py not there yet")
@pytest.mark.parametrize(
    ("name", "wrapper"),
    [
        ("failing", "fsdp2"),
        ("fixed", "fsdp2"),
        ("uniform", "fsdp2"),
        ("uncast", "fsdp2"),
        ("fsdp1_failing", "fsdp1"),
        ("fsdp1", "fsdp1"),
        ("ddp", "ddp"),
    ],
)
def test_the_fake_run_matches_the_planner(name: str, wrapper: str) -> None:
    """The synthetic events follow the planner's rules (both follow the measurements)."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from interactive_shard.precision._policy import policy_object
    from interactive_shard.precision.plan import plan_precision

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.lin(x))

    fsdp1 = {
        "": fsdp1_policy(),
        "1": fsdp1_policy("bf16", cast_forward_inputs=True),
        "2": fsdp1_policy("fp16", cast_forward_inputs=True),
        "3": fsdp1_policy("fp32", cast_forward_inputs=True),
    }
    policies = {
        "failing": FAILING,
        "fixed": FIXED,
        "uniform": UNIFORM,
        # Unit 1 does not cast: it fails; the planner goes on and finds unit 2's too.
        "uncast": {
            "": fsdp2_policy(),
            "1": fsdp2_policy("bf16", cast_forward_inputs=False),
            "2": fsdp2_policy(),
        },
        "fsdp1_failing": {k: v for k, v in fsdp1.items() if k != "3"},
        "fsdp1": fsdp1,
        "ddp": {"": ddp_policy("bf16", "fp32")},
    }[name]
    net = nn.Sequential(nn.Linear(8, 16), Inner(), Inner(), nn.Linear(16, 4))
    real = {k: policy_object(p) for k, p in policies.items()}
    plan = plan_precision(net, real, example_inputs=(torch.randn(4, 8),))
    from interactive_shard.probing.compat import fsdp as compat_fsdp

    m = model_of(policies, wrapper=wrapper, reduce_rule=compat_fsdp.reduce_dtype_rule())
    cmp = m.compare(plan)
    assert cmp.matches, cmp.differences
    assert [u.fqn for u in plan.units] == [u.fqn for u in m.units()]
    assert all(set(u.dtypes) <= set(PHASES) for u in plan.units)


@pytest.mark.parametrize(("rule", "reduced"), [("compute", BF16), ("original", F32)])
def test_each_rank_is_judged_by_its_own_torchs_reduce_rule(rule: str, reduced: str) -> None:
    """torch 2.15's FSDP2 reduces in the original dtype without a reduce_dtype: a run that
    did so (its watch says reduce_rule="original") is no finding, and reads as it ran."""
    m = model_of({k: fsdp2_policy("bf16") for k in ("", "1", "2")}, reduce_rule=rule)
    assert m.reduce_rule() == rule
    assert m.observed("1", iteration=2)["reduce"] == reduced
    assert m.findings == []


def test_a_watch_with_an_unknown_reduce_rule_is_skipped_not_believed() -> None:
    fake = FakePrecision(mp_net({k: fsdp2_policy("bf16") for k in ("", "1", "2")}))
    events = fake.events()
    bad = [
        Event(e.kind, e.rank, e.step, e.t, {**e.payload, "reduce_rule": "fastest"})
        if e.kind == PrecisionWatch.KIND
        else e
        for e in events
    ]
    m = PrecisionModel(make_store(bad))
    m.update()
    assert m.watch(0) is None and m.skipped >= 1
