"""``ish.watch`` on real 2-rank gloo CPU runs with mixed precision: FSDP2 (uniform,
nested policies, a nested failure), FSDP1 nested wrappers, DDP native mixed precision.

The model is ``Sequential(Linear(8, 16), Inner(16), Inner(16), Linear(16, 4))`` with
``Inner = Linear + relu``; the units are ``1``, ``2`` and the root (which owns ``0`` and
``3``). Events are read from ``run.store`` and decoded into their Structs.
"""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest
import torch
import torch.distributed as dist
from support import accelerator_shim
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.parallel.distributed import _MixedPrecision

import interactive_shard as ish
from interactive_shard.precision.events import (
    PrecisionBatch,
    PrecisionFailure,
    PrecisionSeen,
    PrecisionWatch,
)
from interactive_shard.probing.compat import device as compat_device
from interactive_shard.probing.compat import fsdp as compat_fsdp

BF16, FP16, FP32 = "torch.bfloat16", "torch.float16", "torch.float32"


def _rs(low: str, nbytes: int) -> tuple[str, int]:
    """FSDP2's reduce-scatter of fp32 parameters computed in ``low`` with no reduce_dtype:
    in ``low`` up to torch 2.14, in fp32 (twice the bytes) from 2.15 (compat.fsdp)."""
    if compat_fsdp.reduce_dtype_rule() == "original":
        return FP32, 2 * nbytes
    return low, nbytes


bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
MP = MixedPrecisionPolicy
DTYPE_ERROR = "mat1 and mat2 must have the same dtype"


CLUSTER = {"timeout": 60}  # the shared fixture's options (conftest.py)


# -- rank code ---------------------------------------------------------------------------
class Inner(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), Inner(16), Inner(16), nn.Linear(16, 4))


def _fsdp2(policies: tuple[Any, Any, Any]) -> nn.Module:
    mesh = init_device_mesh("cpu", (2,))
    model = _model()
    root, first, second = policies
    fully_shard(model[1], mesh=mesh, mp_policy=first)
    fully_shard(model[2], mesh=mesh, mp_policy=second)
    fully_shard(model, mesh=mesh, mp_policy=root)
    return model


def _fsdp1(root: Any, first: Any, second: Any, head: Any = "none") -> nn.Module:
    cpu = torch.device("cpu")
    model = _model()
    if head != "none":
        model[3] = FSDP(model[3], mixed_precision=head, device_id=cpu)
    model[1] = FSDP(model[1], mixed_precision=first, device_id=cpu)
    model[2] = FSDP(model[2], mixed_precision=second, device_id=cpu)
    return FSDP(model, mixed_precision=root, device_id=cpu)


def _train(ctx: Any, model: nn.Module, steps: int, watch: bool, x: Any = None) -> dict[str, Any]:
    handle = ish.watch(model) if watch else None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(10 + ctx.rank)
    for _ in ctx.steps(steps):
        inp = torch.randn(4, 8, generator=gen) if x is None else x
        model(inp).float().pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    params = [
        (p.to_local() if hasattr(p, "to_local") else p).detach().clone() for p in model.parameters()
    ]
    return {
        "params": params,
        "probes": None if handle is None else sorted(handle.probes),
        "repr": repr(handle),
    }


def _fsdp2_run(ctx: Any, policies: Any, steps: int = 2, watch: bool = True) -> dict[str, Any]:
    return _train(ctx, _fsdp2(policies), steps, watch)


def _fsdp1_run(ctx: Any, *policies: Any, steps: int = 2, watch: bool = True) -> dict[str, Any]:
    return _train(ctx, _fsdp1(*policies), steps, watch)


# -- reading the store -------------------------------------------------------------------
def _decoded(run: ish.Run, rank: int, struct: Any) -> list[Any]:
    return [
        msgspec.convert(e.payload, struct) for e in run.store.of_kind(struct.KIND) if e.rank == rank
    ]


def _batched(run: ish.Run, rank: int, key: str) -> list[Any]:
    return [r for b in _decoded(run, rank, PrecisionBatch) for r in getattr(b, key)]


def _seen(run: ish.Run, rank: int = 0, iteration: int = 1) -> dict[tuple[str, str], PrecisionSeen]:
    """(unit, phase) -> the last record (it lists every dtype seen so far)."""
    found: dict[tuple[str, str], PrecisionSeen] = {}
    for s in _batched(run, rank, "seen"):
        if s.iteration == iteration:
            found[(s.unit, s.phase)] = s
    return found


def _collectives(run: ish.Run, rank: int = 0, iteration: int = 1) -> list[tuple[Any, ...]]:
    return [
        (c.unit, c.op, c.dtype, c.nbytes, c.backward)
        for c in _batched(run, rank, "collectives")
        if c.iteration == iteration
    ]


def _dtypes(seen: dict[tuple[str, str], PrecisionSeen], unit: str) -> dict[str, list[str]]:
    return {phase: s.dtypes for (u, phase), s in seen.items() if u == unit}


def _matches_plan(run: ish.Run, model: nn.Module, policies: dict[str, Any]) -> None:
    """Planned (``ish.plan_precision``, in the kernel) == observed, every unit and phase."""
    plan = ish.plan_precision(model, policies, example_inputs=torch.randn(4, 8))
    comparison = run.precision.compare(plan)
    assert comparison.matches, comparison.differences


def _units(policies: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(["", "1", "2", "3"], policies, strict=False))


def _inputs(seen: dict[tuple[str, str], PrecisionSeen], unit: str) -> list[tuple[str, str, bool]]:
    s = seen[(unit, "input")]
    return list(zip(s.before, s.dtypes, s.cast, strict=True))


# -- FSDP2 -------------------------------------------------------------------------------
def test_fsdp2_uniform_bf16(cluster: ish.Cluster) -> None:
    run = cluster.run(_fsdp2_run, (MP(param_dtype=bf16),) * 3)
    assert [r["probes"] for r in run.results] == [["precision"], ["precision"]]
    for rank in range(2):
        (watch,) = _decoded(run, rank, PrecisionWatch)
        assert (watch.wrapper, watch.world_size) == ("fsdp2", 2)
        assert [(u.fqn, u.parent, u.module_type, u.numel) for u in watch.units] == [
            ("", None, "Sequential", 212),
            ("1", "", "Inner", 272),
            ("2", "", "Inner", 272),
        ]
        assert watch.units[0].params == ["0.weight", "0.bias", "3.weight", "3.bias"]
        assert watch.units[1].params == ["1.lin.weight", "1.lin.bias"]
        assert watch.units[1].param_dtypes == [FP32, FP32]
        assert watch.units[1].policy.param_dtype == BF16
        for it in (1, 2):
            seen = _seen(run, rank, it)
            # Cast once, at the root; the inner units get the very same bf16 tensor.
            assert _inputs(seen, "") == [(FP32, BF16, True)]
            assert _inputs(seen, "1") == [(BF16, BF16, False)]
            assert _inputs(seen, "2") == [(BF16, BF16, False)]
            for unit in ("", "1", "2"):
                assert _dtypes(seen, unit) == {
                    "input": [BF16],
                    "param": [BF16],
                    "output": [BF16],
                    "grad": [BF16],
                    "sharded_param": [FP32],
                    "sharded_grad": [FP32],
                }
            assert sorted(_collectives(run, rank, it)) == sorted(
                [
                    ("", "all_gather", BF16, 212, False),
                    ("1", "all_gather", BF16, 272, False),
                    ("2", "all_gather", BF16, 272, False),
                    ("1", "all_gather", BF16, 272, True),  # resharded after forward
                    ("2", "all_gather", BF16, 272, True),
                    ("", "reduce_scatter", *_rs(BF16, 424), True),
                    ("1", "reduce_scatter", *_rs(BF16, 544), True),
                    ("2", "reduce_scatter", *_rs(BF16, 544), True),
                ]
            )
        assert _decoded(run, rank, PrecisionFailure) == []
    # Six records per unit and iteration and eight collectives, in one batch per iteration.
    batches = _decoded(run, 0, PrecisionBatch)
    assert [(len(b.seen), len(b.collectives)) for b in batches] == [(18, 8), (18, 8)]
    _matches_plan(run, _model(), _units((MP(param_dtype=bf16),) * 3))
    assert run.precision.cast_inputs("", rank=1, iteration=2) == [True]
    assert run.precision.cast_inputs("2", rank=1, iteration=2) == [False]


def _by_hooks(ctx: Any, policies: Any) -> dict[str, Any]:
    from interactive_shard.precision import _probe_fsdp2

    saved, _probe_fsdp2.WRAP_CAST = _probe_fsdp2.WRAP_CAST, False  # as before torch 2.13
    try:
        return _fsdp2_run(ctx, policies)
    finally:
        _probe_fsdp2.WRAP_CAST = saved


def test_fsdp2_input_casts_seen_from_hooks_where_torch_casts_inline(cluster: ish.Cluster) -> None:
    policies = (MP(), MP(param_dtype=bf16), MP(param_dtype=bf16, output_dtype=fp32))
    run = cluster.run(_by_hooks, policies)
    seen = _seen(run, 1, 2)
    assert _inputs(seen, "") == [(FP32, FP32, False)]
    assert _inputs(seen, "1") == [(FP32, BF16, True)]
    assert _inputs(seen, "2") == [(BF16, BF16, False)]  # a view of the same data


def test_fsdp2_inner_bf16_and_fp16_under_fp32_root_with_output_dtype(cluster: ish.Cluster) -> None:
    policies = (MP(), MP(param_dtype=bf16), MP(param_dtype=fp16, output_dtype=fp32))
    run = cluster.run(_fsdp2_run, policies)
    _matches_plan(run, _model(), _units(policies))
    seen = _seen(run, 1)
    assert _inputs(seen, "") == [(FP32, FP32, False)]  # MP(): no param_dtype, no cast
    assert _inputs(seen, "1") == [(FP32, BF16, True)]
    assert _inputs(seen, "2") == [(BF16, FP16, True)]
    assert seen[("2", "output")].before == [FP16] and seen[("2", "output")].dtypes == [FP32]
    assert {u: _dtypes(seen, u)["param"] for u in ("", "1", "2")} == {
        "": [FP32],
        "1": [BF16],
        "2": [FP16],
    }
    assert {u: _dtypes(seen, u)["grad"] for u in ("", "1", "2")} == {
        "": [FP32],
        "1": [BF16],
        "2": [FP16],
    }
    reductions = {c[0]: c[1:4] for c in _collectives(run, 1) if c[1] == "reduce_scatter"}
    assert reductions == {
        "": ("reduce_scatter", FP32, 848),
        "1": ("reduce_scatter", *_rs(BF16, 544)),
        "2": ("reduce_scatter", *_rs(FP16, 544)),
    }


def _fsdp2_crash(ctx: Any, policies: Any) -> None:
    model = _fsdp2(policies)
    ish.watch(model)
    model(torch.randn(4, 8)).sum().backward()  # raises in forward: the run fails


def test_fsdp2_fp16_under_bf16_root_fails_at_the_head_and_keeps_what_came_before(
    cluster: ish.Cluster,
) -> None:
    policies = (MP(param_dtype=bf16), MP(param_dtype=fp16), MP(param_dtype=fp16))
    run = cluster.run(_fsdp2_crash, policies, wait=False)
    with pytest.raises(ish.RankError, match=DTYPE_ERROR):
        run.wait()
    _matches_plan(run, _model(), _units(policies))  # the planner predicted this failure
    (finding,) = [f for f in run.precision.findings if f.kind == "failure"]
    assert (finding.unit, finding.consumer, finding.ranks) == ("", "3", (0, 1))
    assert "run.precision.plan = ish.plan_precision" in finding.fix  # how to get one checked
    # Given the plan, the observed failure carries the fix the planner checked.
    plan = ish.plan_precision(_model(), _units(policies), example_inputs=torch.randn(4, 8))
    run.precision.plan = plan
    (finding,) = [f for f in run.precision.findings if f.kind == "failure"]
    assert plan.failures[0].fix is not None and plan.failures[0].fix_note
    assert finding.fix.startswith(plan.failures[0].fix_note)
    for rank in range(2):
        (failure,) = _decoded(run, rank, PrecisionFailure)
        # The root-owned head ("3", a bf16 Linear) got unit 2's fp16 output.
        assert (failure.iteration, failure.unit, failure.consumer) == (1, "", "3")
        assert DTYPE_ERROR in failure.message and "Half and BFloat16" in failure.message
        seen = _seen(run, rank)
        assert _inputs(seen, "1") == [(BF16, FP16, True)]
        assert _inputs(seen, "2") == [(FP16, FP16, False)]
        assert seen[("2", "output")].dtypes == [FP16]
        assert _dtypes(seen, "")["param"] == [BF16]
        assert ("", "output") not in seen and ("", "grad") not in seen


def test_fsdp2_failure_inside_a_unit_that_does_not_cast(cluster: ish.Cluster) -> None:
    no_cast = MP(param_dtype=bf16, cast_forward_inputs=False)
    run = cluster.run(
        _fsdp2_crash, (MP(), no_cast, MP(param_dtype=bf16, output_dtype=fp32)), wait=False
    )
    with pytest.raises(ish.RankError, match="Float and BFloat16"):
        run.wait()
    (failure,) = _decoded(run, 0, PrecisionFailure)
    assert (failure.unit, failure.consumer) == ("1", "1.lin")
    assert _inputs(_seen(run), "1") == [(FP32, FP32, False)]  # not cast: fp32 reaches bf16


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, *, extra: torch.Tensor) -> torch.Tensor:
        return self.lin(x + extra) * ids.to(x.dtype)


def _same_tensor(ctx: Any) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = TwoInputs()
    fully_shard(model, mesh=mesh, mp_policy=MP(param_dtype=bf16))
    ish.watch(model)
    x = torch.randn(2, 8, dtype=bf16)
    got: list[torch.Tensor] = []
    model.lin.register_forward_pre_hook(lambda m, a: got.append(a[0]))
    model(x, torch.ones(2, 8, dtype=torch.int64), extra=torch.zeros(2, 8)).sum().backward()
    return {"extra_cast": got[0].dtype == bf16}


def test_fsdp2_cast_skipped_when_the_dtype_matches(cluster: ish.Cluster) -> None:
    run = cluster.run(_same_tensor)
    # x (bf16) passed through as the same tensor; the int64 ids are not floating; the
    # fp32 keyword input was cast.
    assert _inputs(_seen(run), "") == [(BF16, BF16, False), (FP32, BF16, True)]


def test_fsdp2_reduce_dtype_float32_under_bfloat16(cluster: ish.Cluster) -> None:
    policies = (MP(param_dtype=bf16, reduce_dtype=fp32),) * 3
    run = cluster.run(_fsdp2_run, policies)
    _matches_plan(run, _model(), _units(policies))
    assert run.precision.observed("1", rank=1, iteration=2)["reduce"] == FP32
    for rank in range(2):
        seen, collectives = _seen(run, rank, 2), _collectives(run, rank, 2)
        assert {c[0]: c[2:4] for c in collectives if c[1] == "reduce_scatter"} == {
            "": (FP32, 848),  # 212 elements, fp32
            "1": (FP32, 1088),  # 272 elements, fp32
            "2": (FP32, 1088),
        }
        assert {c[2] for c in collectives if c[1] == "all_gather"} == {BF16}
        assert all(_dtypes(seen, u)["grad"] == [BF16] for u in ("", "1", "2"))
        assert all(_dtypes(seen, u)["sharded_grad"] == [FP32] for u in ("", "1", "2"))


def _no_step(ctx: Any) -> int:
    # Forward and backward without an optimizer: no step ends the iteration, so its
    # records leave at the run's end (the worker's flush), not at a next forward.
    model = _fsdp2((MP(param_dtype=bf16),) * 3)
    watch = ish.watch(model)
    model(torch.randn(4, 8)).sum().backward()
    return watch.probes["precision"].emitted  # the watch only: the batch is still held


def test_fsdp2_records_held_at_the_runs_end_arrive(cluster: ish.Cluster) -> None:
    run = cluster.run(_no_step)
    assert run.results == [1, 1]
    for rank in range(2):
        (batch,) = _decoded(run, rank, PrecisionBatch)
        assert {s.iteration for s in batch.seen} == {1} and len(batch.collectives) == 8
        assert run.precision.observed("1", rank=rank)["grad"] == BF16
        assert "sharded_grad" not in run.precision.observed("1", rank=rank)


def _hsdp(ctx: Any) -> None:
    # Replicated over the 2 ranks, sharded over 1: no all-gather and no reduce-scatter,
    # one dist.all_reduce per unit.
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    model = _model()
    policy = MP(param_dtype=bf16, reduce_dtype=fp32)
    for unit in (model[1], model[2], model):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    watch = ish.watch(model)
    model(torch.randn(4, 8)).sum().backward()
    watch.detach()


def test_fsdp2_hsdp_all_reduce_per_unit(cluster: ish.Cluster) -> None:
    run = cluster.run(_hsdp)
    assert sorted(_collectives(run, 1)) == [
        ("", "all_reduce", FP32, 4 * 212, True),
        ("1", "all_reduce", FP32, 4 * 272, True),
        ("2", "all_reduce", FP32, 4 * 272, True),
    ]


@pytest.mark.parametrize(
    "policies",
    [
        (MP(param_dtype=bf16, reduce_dtype=fp32),) * 3,
        (MP(), MP(param_dtype=bf16), MP(param_dtype=fp16, output_dtype=fp32)),
    ],
    ids=["uniform", "nested"],
)
def test_fsdp2_training_is_bit_identical_with_the_probe(
    cluster: ish.Cluster, policies: Any
) -> None:
    plain = cluster.run(_fsdp2_run, policies, 3, False).results
    probed = cluster.run(_fsdp2_run, policies, 3, True).results
    for a, b in zip(plain, probed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))


# -- FSDP1 -------------------------------------------------------------------------------
def test_fsdp1_nested_wrappers_cast_their_own_inputs(cluster: ish.Cluster) -> None:
    # PR 90523: every wrapper casts with cast_forward_inputs; the fp32 head unit casts
    # unit 2's fp16 output back (FSDP1 has no output_dtype).
    policies = (
        None,
        MixedPrecision(param_dtype=bf16, cast_forward_inputs=True),
        MixedPrecision(param_dtype=fp16, cast_forward_inputs=True),
        MixedPrecision(param_dtype=fp32, cast_forward_inputs=True),
    )
    run = cluster.run(_fsdp1_run, *policies)
    _matches_plan(run, _model(), _units(policies))
    for rank in range(2):
        (watch,) = _decoded(run, rank, PrecisionWatch)
        assert watch.wrapper == "fsdp1"
        assert [(u.fqn, u.parent, u.module_type, u.numel) for u in watch.units] == [
            ("", None, "Sequential", 16 * 8 + 16),
            ("1", "", "Inner", 272),
            ("2", "", "Inner", 272),
            ("3", "", "Linear", 68),
        ]
        assert watch.units[1].params == ["1.lin.weight", "1.lin.bias"]
        seen = _seen(run, rank, 2)
        assert _inputs(seen, "") == [(FP32, FP32, False)]
        assert _inputs(seen, "1") == [(FP32, BF16, True)]
        assert _inputs(seen, "2") == [(BF16, FP16, True)]
        assert _inputs(seen, "3") == [(FP16, FP32, True)]
        expected = {"": FP32, "1": BF16, "2": FP16, "3": FP32}
        for unit, dtype in expected.items():
            assert _dtypes(seen, unit) == {
                "input": [dtype],
                "param": [dtype],
                "output": [dtype],
                "grad": [dtype],
                "sharded_param": [FP32],
                "sharded_grad": [FP32],
            }, unit
        collectives = _collectives(run, rank, 2)
        assert {c[0]: c[2:4] for c in collectives if c[1] == "reduce_scatter"} == {
            "": (FP32, 4 * 144),
            "1": (BF16, 2 * 272),
            "2": (FP16, 2 * 272),
            "3": (FP32, 4 * 68),
        }
        gathers = {(c[0], c[4]): c[2:4] for c in collectives if c[1] == "all_gather"}
        assert gathers[("1", False)] == (BF16, 272) and gathers[("2", False)] == (FP16, 272)
        assert gathers[("1", True)] == (BF16, 272)  # unsharded again for backward


def _fsdp1_crash(ctx: Any) -> str:
    model = _fsdp1(
        None,
        MixedPrecision(param_dtype=bf16, cast_forward_inputs=True),
        MixedPrecision(param_dtype=fp16, cast_forward_inputs=True),
    )
    ish.watch(model)
    try:
        model(torch.randn(4, 8))
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_fsdp1_fp16_unit_output_into_the_fp32_head_is_located(cluster: ish.Cluster) -> None:
    run = cluster.run(_fsdp1_crash)
    assert all("Half and Float" in r for r in run.results)
    (failure,) = _decoded(run, 0, PrecisionFailure)
    assert (failure.unit, failure.consumer) == ("", "3")
    assert _dtypes(_seen(run), "2")["output"] == [FP16]


def test_fsdp1_training_is_bit_identical_with_the_probe(cluster: ish.Cluster) -> None:
    policies = (MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, cast_forward_inputs=True),) * 3
    plain = cluster.run(_fsdp1_run, *policies, steps=3, watch=False).results
    probed = cluster.run(_fsdp1_run, *policies, steps=3, watch=True).results
    for a, b in zip(plain, probed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))


# -- DDP native mixed precision ----------------------------------------------------------
def _ddp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _ddp_on_cpu(ctx: Any) -> dict[str, Any]:
    mp = _MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)
    try:  # a CUDA build of torch without a GPU refuses already here (torch.Stream())
        ddp = DDP(_ddp_model(), mixed_precision=mp)
    except RuntimeError as exc:
        return {"error": str(exc), "at": "construction"}
    watch = ish.watch(ddp)  # the bucket probe leaves DDP native mixed precision alone
    try:
        ddp(torch.randn(4, 8))
        error = "no error"
    except RuntimeError as exc:
        error = str(exc)
    plain = ish.watch(DDP(_ddp_model()))
    probes = sorted(watch.probes), sorted(plain.probes)
    return {"error": error, "at": "forward", "probes": probes}


@pytest.mark.skipif(
    compat_device.accelerator_available(), reason="DDP mixed precision runs with a GPU"
)
def test_ddp_native_mixed_precision_fails_on_cpu_and_is_reported(cluster: ish.Cluster) -> None:
    run = cluster.run(_ddp_on_cpu)
    for rank, result in enumerate(run.results):
        assert result["at"] == compat_device.ddp_mixed_precision_fails_at()
        if result["at"] == "construction":  # nothing to watch: DDP never existed
            assert run.store.of_kind(PrecisionWatch.KIND) == []
            continue
        assert "cpu backend doesn't support events" in result["error"]
        assert result["probes"] == (["ddp", "precision"], ["buckets", "ddp"])
        (watch,) = _decoded(run, rank, PrecisionWatch)
        assert watch.wrapper == "ddp" and watch.units[0].policy.kind == "_MixedPrecision"
        assert watch.units[0].policy.reduce_dtype == FP32
        (failure,) = _decoded(run, rank, PrecisionFailure)
        assert (failure.unit, failure.consumer) == ("", "")
        assert "doesn't support events" in failure.message


def _ddp_shimmed(ctx: Any, watch: bool) -> list[torch.Tensor]:
    # SHIM (accelerator_shim): no-op events and streams. The gradients of the first
    # backward are uninitialized memory on CPU; no step after it, so the second one's
    # gradients are comparable.
    with accelerator_shim():
        mp = _MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)
        ddp = DDP(_ddp_model(), mixed_precision=mp)
        if watch:
            ish.watch(ddp)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(10 + ctx.rank)
        for _ in ctx.steps(2):
            opt.zero_grad()
            ddp(torch.randn(4, 8, generator=gen)).float().pow(2).sum().backward()
        grads = [p.grad.clone() for p in ddp.parameters()]
        opt.step()
        return grads


def test_ddp_native_mixed_precision_with_gpu_semantics_cpu_shim(cluster: ish.Cluster) -> None:
    """SHIM: no-op torch.Event and current_stream on the ranks (see _ddp_shimmed)."""
    run = cluster.run(_ddp_shimmed, True)
    _matches_plan(run, _ddp_model(), {"": _MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)})
    for rank in range(2):
        for it in (1, 2):
            seen = _seen(run, rank, it)
            assert _inputs(seen, "") == [(FP32, BF16, True)]
            stepped = {"sharded_param": [FP32], "sharded_grad": [FP32]} if it == 2 else {}
            assert _dtypes(seen, "") == {
                "input": [BF16],
                "param": [BF16],
                "output": [BF16],
                "grad": [BF16],
                **stepped,  # fp32 again: swapped back by DDP's comm hook
            }
            # One bucket, cast to reduce_dtype before the all-reduce: 212 fp32 elements.
            assert _collectives(run, rank, it) == [("", "all_reduce", FP32, 848, True)]
    plain = cluster.run(_ddp_shimmed, False).results
    for a, b in zip(plain, run.results, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# -- detach --------------------------------------------------------------------------------
def _hooks(modules: list[nn.Module]) -> list[int]:
    return [len(m._forward_pre_hooks) + len(m._forward_hooks) for m in modules]


def _detach_all(ctx: Any) -> dict[str, Any]:
    from torch.distributed.fsdp import _flat_param, _runtime_utils
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    from interactive_shard.precision import _probe_common
    from interactive_shard.precision._probe_fsdp1 import _PATCHES

    # Probes earlier tests left attached release their patches when collected; a model
    # whose FSDP1 forward failed is not (FSDP1's hooks stay registered with autograd).
    gc.collect()
    users = [p._users for p in _PATCHES]
    original = (_runtime_utils._post_backward_hook, _runtime_utils.dist, _flat_param.dist)
    out: dict[str, Any] = {}
    fsdp2 = _fsdp2((MP(param_dtype=bf16),) * 3)
    fsdp1 = _fsdp1(*(MixedPrecision(param_dtype=bf16),) * 3)
    with accelerator_shim():  # SHIM, as above
        ddp = DDP(_ddp_model(), mixed_precision=_MixedPrecision(param_dtype=bf16))
        reducer = ddp.reducer
        for name, model in (("fsdp2", fsdp2), ("fsdp1", fsdp1), ("ddp", ddp)):
            modules = list(model.modules())
            before = _hooks(modules)
            watch = ish.watch(model)
            attached = _hooks(modules)
            watch.detach()
            probe = watch.probes["precision"]
            count = probe.emitted
            model(torch.randn(4, 8)).float().sum().backward()
            out[name] = {
                "restored": _hooks(modules) == before != attached,
                "silent": probe.emitted == count and probe.iteration == 0,
            }
        state = fsdp2._get_fsdp_state()
        (group,) = compat_fsdp.param_groups(fsdp2[1]._get_fsdp_state())
        out["fsdp2_state"] = (
            "_cast_forward_inputs" not in state.__dict__
            and type(group._all_gather_comm).__name__ == "DefaultAllGather"
            and "post_backward" not in group.__dict__
        )
        now = (_runtime_utils._post_backward_hook, _runtime_utils.dist, _flat_param.dist)
        unpatched = now[1] is now[2] is dist or any(users)
        out["fsdp1_globals"] = (
            now == original and unpatched and [p._users for p in _PATCHES] == users
        )
        out["hsdp"] = _fsdp_collectives.dist is dist
        out["reducer"] = ddp.reducer is reducer
        mine = (fsdp2, fsdp1, ddp)
        out["stepping"] = [r for r in _probe_common._STEPPING if any(r.root is m for m in mine)]
    return out


def test_detach_removes_every_hook_and_patch(cluster: ish.Cluster) -> None:
    result = cluster.run(_detach_all).results[0]
    for name in ("fsdp2", "fsdp1", "ddp"):
        assert result[name] == {"restored": True, "silent": True}, name
    assert result["fsdp2_state"] and result["fsdp1_globals"] and result["reducer"]
    assert result["hsdp"]
    assert result["stepping"] == []  # none of them still reads optimizer steps
