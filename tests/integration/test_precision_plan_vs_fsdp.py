"""The precision planner against the real engines, in this process, on one gloo rank.

FSDP2 (``fully_shard`` on a 1-rank CPU mesh) and FSDP1 (``FullyShardedDataParallel``
with ``device_id=cpu``) wrap a fresh model per case; one forward and backward run, and
what the engine did is read back: the dtypes each unit's input and output really had
(module hooks registered after wrapping, so after FSDP's casts), the engine's own dtype
state (``FSDPParam.param_dtype / reduce_dtype / orig_dtype``, FSDP1's
``FlatParamHandle._fwd_bwd_param_dtype / _reduce_dtype / _orig_param_dtype``), the
unsharded gradient at the post-backward, the dtype of the reduction buffer and the
sharded gradient the optimizer would read. Every unit and phase must equal the plan.
A predicted failure must raise with the predicted message in the predicted module,
and the plan's fix must run with every dtype as planned.

One rank: FSDP2 skips the collective itself but still allocates the reduce-scatter
buffer in the reduce dtype (read there); FSDP1 switches to ``NO_SHARD`` and all-reduces.
The process group lives for this module only and is destroyed at its end.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import accelerator_shim
from torch import nn

import interactive_shard as ish
from interactive_shard.precision._simulate import walk
from interactive_shard.probing.compat import fsdp as compat_fsdp

bf, fp16, f32 = torch.bfloat16, torch.float16, torch.float32


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if dist.is_initialized():
        pytest.skip("this process already has a process group")
    from torch.distributed.device_mesh import init_device_mesh

    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP1's NO_SHARD switch, FSDP1 deprecation
        yield


# -- models ---------------------------------------------------------------------------------


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def seq() -> nn.Module:
    """FINDINGS' model: root-owned head and tail, two inner units."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), Inner(), Inner(), nn.Linear(16, 4))


class Scaled(nn.Module):
    """A bf16 unit times an fp32 buffer promotes the activation."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) * self.scale)


def norm() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 4))


class Box:
    """Holds a tensor where FSDP's input cast does not look."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x


class TakesBox(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, box: Box) -> torch.Tensor:
        return self.out(self.lin(box.x))


class Holder(nn.Module):
    """No parameters of its own: FSDP1 does not cast its inputs, whatever the policy."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


def holder() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), Holder(), nn.Linear(8, 4))


X = torch.randn(4, 8)


# -- running the real engines and reading what they did ---------------------------------------


def _dts(obj: Any) -> list[str]:
    return list(
        dict.fromkeys(
            str(t.dtype) for _, t, hidden in walk(obj) if hidden is None and t.is_floating_point()
        )
    )


@dataclasses.dataclass
class Observed:
    dtypes: dict[str, dict[str, str]]
    cast: dict[str, list[bool]]
    error: str | None = None
    consumer: str | None = None


def _locate(modules: dict[str, nn.Module]) -> tuple[list[Any], list[str]]:
    """always_call forward hooks on every module: the innermost that raised comes first."""
    raised: list[str] = []
    handles = []
    for fqn, m in modules.items():

        def hook(mod: nn.Module, args: Any, out: Any, fqn: str = fqn) -> None:
            if sys.exc_info()[1] is not None and not raised:
                raised.append(fqn)

        handles.append(m.register_forward_hook(hook, always_call=True))
    return handles, raised


def _phase_hooks(
    fqn: str, module: nn.Module, obs: Observed, before: dict[str, list[str]]
) -> list[Any]:
    def pre_first(mod: nn.Module, args: Any, kwargs: Any) -> None:
        before[fqn] = [
            str(t.dtype) for _, t, h in walk((args, kwargs)) if h is None and t.is_floating_point()
        ]

    def pre(mod: nn.Module, args: Any, kwargs: Any) -> None:
        after = [
            str(t.dtype) for _, t, h in walk((args, kwargs)) if h is None and t.is_floating_point()
        ]
        if after:
            obs.dtypes[fqn]["input"] = ", ".join(dict.fromkeys(after))
        obs.cast[fqn] = [b != a for b, a in zip(before.get(fqn, after), after, strict=True)]

    def post(mod: nn.Module, args: Any, out: Any) -> None:
        found = _dts(out)
        if found:
            obs.dtypes[fqn]["output"] = ", ".join(found)

    return [pre_first, pre, post]


def run_fsdp2(mesh: Any, model: nn.Module, policies: dict[str, Any], x: Any) -> Observed:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    modules = dict(model.named_modules())
    order = [fqn for fqn in modules if fqn in policies]
    obs = Observed({fqn: {} for fqn in order}, {})
    before: dict[str, list[str]] = {}
    handles = []
    for fqn in reversed(order):  # bottom-up, as FSDP2 wants
        fully_shard(modules[fqn], mesh=mesh, mp_policy=policies[fqn] or MixedPrecisionPolicy())
    for fqn in order:
        # after fully_shard: prepended, the input as it arrives (before FSDP's pre-forward);
        # appended, after its input cast (and for outputs, after output_dtype)
        pre_first, pre, post = _phase_hooks(fqn, modules[fqn], obs, before)
        handles.append(
            modules[fqn].register_forward_pre_hook(pre_first, with_kwargs=True, prepend=True)
        )
        handles.append(modules[fqn].register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(modules[fqn].register_forward_hook(post))
    groups = {}
    for fqn in order:
        group = modules[fqn]._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
        if group is None:
            continue
        groups[fqn] = group
        _record_group(fqn, group, obs)
    loc, raised = _locate(modules)
    handles += loc
    try:
        _forward_backward(model, x)
    except RuntimeError as err:
        obs.error, obs.consumer = str(err), raised[0]
        return obs
    finally:
        for h in handles:
            h.remove()
    for fqn, group in groups.items():
        params = group.fsdp_params
        d = obs.dtypes[fqn]
        d["param"] = _one(str(p.param_dtype or p.orig_dtype) for p in params)
        assert _one(str(p._unsharded_param.dtype) for p in params) == d["param"]
        d["sharded_param"] = _one(str(p.orig_dtype) for p in params)
        assert _one(str(p.sharded_param.dtype) for p in params) == d["sharded_param"]
        d["sharded_grad"] = _one(str(p.sharded_param.grad.dtype) for p in params)
        engine_reduce = _one(str(compat_fsdp.param_reduce_dtype(p)) for p in params)
        assert d["reduce"] == engine_reduce  # the buffer as allocated == FSDPParam's state
    return obs


def _record_group(fqn: str, group: Any, obs: Observed) -> None:
    """Per instance: the unsharded grads at post-backward, the reduce buffer's dtype."""
    post_backward = group.post_backward

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        grads = [p.unsharded_param.grad for p in group.fsdp_params]
        obs.dtypes[fqn]["grad"] = _one(str(g.dtype) for g in grads if g is not None)
        return post_backward(*args, **kwargs)

    group.post_backward = wrapped
    comm = group._reduce_scatter_comm
    allocate = comm.allocate

    def allocating(*args: Any, **kwargs: Any) -> Any:
        obs.dtypes[fqn]["reduce"] = str(kwargs["dtype"])
        return allocate(*args, **kwargs)

    comm.allocate = allocating


def run_fsdp1(model: nn.Module, policies: dict[str, Any], x: Any) -> Observed:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import _runtime_utils

    modules = dict(model.named_modules())
    order = [fqn for fqn in modules if fqn in policies]
    obs = Observed({fqn: {} for fqn in order}, {})
    before: dict[str, list[str]] = {}
    wrappers: dict[str, Any] = {}
    cpu = torch.device("cpu")
    for fqn in reversed(order):
        if fqn == "":
            continue
        parent, _, name = fqn.rpartition(".")
        wrappers[fqn] = FSDP(modules[fqn], mixed_precision=policies[fqn], device_id=cpu)
        setattr(modules[parent], name, wrappers[fqn])
    root = model
    if "" in policies:
        root = wrappers[""] = FSDP(model, mixed_precision=policies[""], device_id=cpu)
    handles = []
    for fqn in order:  # the wrapper sees the input as it arrives, the wrapped module after
        pre_first, pre, post = _phase_hooks(fqn, modules[fqn], obs, before)
        handles.append(wrappers[fqn].register_forward_pre_hook(pre_first, with_kwargs=True))
        handles.append(modules[fqn].register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(modules[fqn].register_forward_hook(post))
    loc, raised = _locate(modules)
    handles += loc
    handle_of = {fqn: w._handle for fqn, w in wrappers.items() if w._handle is not None}
    unit_of = {id(h): fqn for fqn, h in handle_of.items()}
    hook = _runtime_utils._post_backward_hook

    def post_backward(state: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
        obs.dtypes[unit_of[id(handle)]]["grad"] = str(handle.flat_param.grad.dtype)
        return hook(state, handle, *args, **kwargs)

    all_reduce = dist.all_reduce
    reducing: list[str] = []

    def recording(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        reducing.append(str(tensor.dtype))
        return all_reduce(tensor, *args, **kwargs)

    _runtime_utils._post_backward_hook = post_backward
    dist.all_reduce = recording
    try:
        _forward_backward(root, x)
    except RuntimeError as err:
        obs.error, obs.consumer = str(err), raised[0]
        return obs
    finally:
        _runtime_utils._post_backward_hook = hook
        dist.all_reduce = all_reduce
        for h in handles:
            h.remove()
    for fqn, handle in handle_of.items():
        d = obs.dtypes[fqn]
        d["param"] = str(handle._fwd_bwd_param_dtype)
        d["reduce"] = str(handle._reduce_dtype)
        d["sharded_param"] = str(handle._orig_param_dtype)
        assert str(handle.flat_param.dtype) == d["sharded_param"]
        d["sharded_grad"] = str(handle.flat_param.grad.dtype)
    # NO_SHARD all-reduces every unit's gradient in its reduce dtype
    assert sorted(reducing) == sorted(d["reduce"] for d in obs.dtypes.values() if "reduce" in d)
    return obs


def _forward_backward(model: nn.Module, x: Any) -> None:
    args = x if isinstance(x, tuple) else (x,)
    out = model(*args)
    out.float().sum().backward()


def _one(values: Iterator[str] | Any) -> str:
    found = set(values)
    assert len(found) == 1, found
    return found.pop()


def _planned(plan: Any) -> dict[str, dict[str, str]]:
    return {u.fqn: dict(sorted(u.dtypes.items())) for u in plan.units}


def _check_runs_as_planned(observed: Observed, plan: Any) -> None:
    assert observed.error is None, observed.error
    assert {k: dict(sorted(v.items())) for k, v in observed.dtypes.items()} == _planned(plan)
    assert observed.cast == {u.fqn: u.cast for u in plan.units}


Runner = Callable[[nn.Module, dict[str, Any], Any], Observed]


@pytest.fixture
def fsdp2(group: Any) -> Runner:
    return lambda model, policies, x: run_fsdp2(group, model, policies, x)


@pytest.fixture
def fsdp1(group: Any) -> Runner:
    return run_fsdp1


def _failing_then_fixed(
    run: Runner, make: Callable[[], nn.Module], policies: dict[str, Any], x: Any, fragment: str
) -> Any:
    plan = ish.plan_precision(make(), policies, example_inputs=x)
    assert plan.failures, "the plan predicts no failure"
    first = plan.failures[0]
    assert fragment in first.error
    observed = run(make(), policies, x)
    assert observed.error is not None, "the real run did not fail"
    assert first.error in observed.error  # the predicted message, as torch raised it
    assert observed.consumer == first.consumer
    assert first.fix is not None
    fixed = ish.plan_precision(make(), first.fix, example_inputs=x)
    assert fixed.failures == []
    _check_runs_as_planned(run(make(), first.fix, x), fixed)
    return plan


# -- FSDP2 ------------------------------------------------------------------------------------


def _p2(**kw: Any) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(**kw)


def _p1(**kw: Any) -> Any:
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(**kw)


FSDP2_CLEAN = {
    "B nested fp32 / bf16 / fp16+output_dtype": {
        "": _p2(),
        "1": _p2(param_dtype=bf),
        "2": _p2(param_dtype=fp16, output_dtype=f32),
    },
    "D bf16 root, fp16 units, output_dtype": {
        "": _p2(param_dtype=bf),
        "1": _p2(param_dtype=fp16),
        "2": _p2(param_dtype=fp16, output_dtype=bf),
    },
    "E uniform bf16, reduce fp32": {
        fqn: _p2(param_dtype=bf, reduce_dtype=f32) for fqn in ("", "1", "2")
    },
    "F uniform bf16": {fqn: _p2(param_dtype=bf) for fqn in ("", "1", "2")},
    "H all fp32, a unit without its own params": {"": _p2(), "1": _p2(), "1.lin": _p2()},
    "reduce only": {"": _p2(reduce_dtype=bf), "2": _p2(param_dtype=bf, output_dtype=f32)},
}


@pytest.mark.parametrize("name", list(FSDP2_CLEAN))
def test_fsdp2_runs_as_planned(fsdp2: Runner, name: str) -> None:
    policies = FSDP2_CLEAN[name]
    plan = ish.plan_precision(seq(), policies, example_inputs=X)
    assert plan.failures == []
    _check_runs_as_planned(fsdp2(seq(), policies, X), plan)


def test_fsdp2_same_dtype_input_passes_through(fsdp2: Runner) -> None:
    policies = {"": _p2(param_dtype=bf), "1": _p2(param_dtype=bf)}
    x = X.to(bf)
    plan = ish.plan_precision(seq(), policies, example_inputs=x)
    assert plan.unit("").cast == [False] and plan.unit("1").cast == [False]
    _check_runs_as_planned(fsdp2(seq(), policies, x), plan)


@pytest.mark.parametrize(
    ("policies", "fragment"),
    [
        (
            {"": _p2(), "1": _p2(param_dtype=bf), "2": _p2(param_dtype=fp16)},
            "mat1 and mat2 must have the same dtype, but got Half and Float",
        ),
        (
            {"": _p2(param_dtype=bf), "1": _p2(param_dtype=fp16), "2": _p2(param_dtype=fp16)},
            "mat1 and mat2 must have the same dtype, but got Half and BFloat16",
        ),
        (
            {"": _p2(), "1": _p2(param_dtype=bf, cast_forward_inputs=False)},
            "mat1 and mat2 must have the same dtype, but got Float and BFloat16",
        ),
    ],
    ids=["A-fp16-under-fp32", "C-fp16-under-bf16", "G-no-input-cast"],
)
def test_fsdp2_predicted_failure_fails_and_the_fix_runs(
    fsdp2: Runner, policies: dict[str, Any], fragment: str
) -> None:
    _failing_then_fixed(fsdp2, seq, policies, X, fragment)


def test_fsdp2_buffer_promotes_the_activation(fsdp2: Runner) -> None:
    plan = _failing_then_fixed(
        fsdp2,
        Scaled,
        {"": _p2(param_dtype=bf)},
        X,
        "mat1 and mat2 must have the same dtype, but got Float and BFloat16",
    )
    assert plan.failures[0].kind == "buffer"


def test_fsdp2_batchnorm_running_stats(fsdp2: Runner) -> None:
    plan = _failing_then_fixed(
        fsdp2, norm, {"": _p2(param_dtype=bf)}, X, "expected scalar type BFloat16 but found Float"
    )
    assert plan.failures[0].kind == "buffer" and plan.failures[0].consumer == "1"


def test_fsdp2_input_hidden_in_an_object(fsdp2: Runner) -> None:
    box = (Box(torch.randn(4, 8)),)
    plan = _failing_then_fixed(
        fsdp2,
        TakesBox,
        {"": _p2(param_dtype=bf)},
        box,
        "mat1 and mat2 must have the same dtype, but got Float and BFloat16",
    )
    assert plan.failures[0].kind == "hidden_input"


# -- FSDP1 ------------------------------------------------------------------------------------

FSDP1_CLEAN = {
    "uniform bf16 cast_forward_inputs": {
        fqn: _p1(param_dtype=bf, cast_forward_inputs=True) for fqn in ("", "1", "2")
    },
    "root bf16 only (inner units inherit nothing, but the input is bf16 already)": {
        "": _p1(param_dtype=bf),
        "1": _p1(param_dtype=bf),
        "2": _p1(param_dtype=bf),
    },
    "I head wrapped fp32": {
        "": None,
        "1": _p1(param_dtype=bf, cast_forward_inputs=True),
        "2": _p1(param_dtype=fp16, cast_forward_inputs=True),
        "3": _p1(param_dtype=f32, cast_forward_inputs=True),
    },
    "reduce fp32 under bf16": {
        "": _p1(param_dtype=bf, reduce_dtype=f32),
        "1": _p1(param_dtype=bf, reduce_dtype=f32, cast_forward_inputs=True),
    },
}


@pytest.mark.parametrize("name", list(FSDP1_CLEAN))
def test_fsdp1_runs_as_planned(fsdp1: Runner, name: str) -> None:
    policies = FSDP1_CLEAN[name]
    plan = ish.plan_precision(seq(), policies, example_inputs=X)
    assert plan.failures == []
    _check_runs_as_planned(fsdp1(seq(), policies, X), plan)


def test_fsdp1_unit_without_parameters_does_not_cast(fsdp1: Runner) -> None:
    policies = {"": None, "1": _p1(param_dtype=bf, cast_forward_inputs=True)}
    plan = ish.plan_precision(holder(), policies, example_inputs=X)
    assert plan.unit("1").dtypes == {"input": "torch.float32", "output": "torch.float32"}
    _check_runs_as_planned(fsdp1(holder(), policies, X), plan)


@pytest.mark.parametrize(
    ("policies", "fragment"),
    [
        (
            {
                "": None,
                "1": _p1(param_dtype=bf, cast_forward_inputs=True),
                "2": _p1(param_dtype=fp16, cast_forward_inputs=True),
            },
            "mat1 and mat2 must have the same dtype, but got Half and Float",
        ),
        (
            {"": None, "1": _p1(param_dtype=bf), "2": _p1(param_dtype=fp16)},
            "mat1 and mat2 must have the same dtype, but got Float and BFloat16",
        ),
        (
            {
                "": _p1(param_dtype=bf, cast_forward_inputs=True),
                "1": _p1(param_dtype=fp16, cast_forward_inputs=True),
                "2": _p1(param_dtype=fp16, cast_forward_inputs=True),
            },
            "mat1 and mat2 must have the same dtype, but got Half and BFloat16",
        ),
        (
            {"": _p1(param_dtype=bf, cast_root_forward_inputs=False)},
            "mat1 and mat2 must have the same dtype, but got Float and BFloat16",
        ),
        (
            {
                "": None,
                "1": _p1(param_dtype=bf, cast_forward_inputs=True),
                "2": _p1(param_dtype=bf, cast_forward_inputs=True),
            },
            "mat1 and mat2 must have the same dtype, but got BFloat16 and Float",
        ),
        (
            {"1": _p1(param_dtype=bf), "2": _p1(param_dtype=fp16)},  # no root unit
            "mat1 and mat2 must have the same dtype, but got Half and Float",
        ),
    ],
    ids=["A", "B-no-cast", "C", "F-no-root-cast", "H", "top-level-units-are-roots"],
)
def test_fsdp1_predicted_failure_fails_and_the_fix_runs(
    fsdp1: Runner, policies: dict[str, Any], fragment: str
) -> None:
    _failing_then_fixed(fsdp1, seq, policies, X, fragment)


def test_fsdp1_buffer_dtype_fix(fsdp1: Runner) -> None:
    plan = _failing_then_fixed(
        fsdp1,
        Scaled,
        {"": _p1(param_dtype=bf)},
        X,
        "mat1 and mat2 must have the same dtype, but got Float and BFloat16",
    )
    assert plan.failures[0].fix[""].buffer_dtype == bf  # type: ignore[index]


# -- DDP: construction only on CPU (its forward needs events a CPU stream lacks) -------------


def test_ddp_mixed_precision_setup_matches_the_plan(group: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.nn.parallel.distributed import _MixedPrecision

    policy = _MixedPrecision(param_dtype=bf, reduce_dtype=f32, buffer_dtype=bf)
    plan = ish.plan_precision(norm(), {"": policy})
    assert plan.unit("").dtypes == {
        "input": "torch.bfloat16",
        "param": "torch.bfloat16",
        "grad": "torch.bfloat16",
        "reduce": "torch.float32",
        "sharded_param": "torch.float32",
        "sharded_grad": "torch.float32",
    }
    with accelerator_shim():  # a CUDA build of torch without a GPU refuses torch.Stream()
        ddp = DDP(norm(), mixed_precision=policy)
    assert {str(p._mp_param.dtype) for p in ddp.module.parameters()} == {"torch.bfloat16"}
    assert {str(p.dtype) for p in ddp.module.parameters()} == {"torch.float32"}
    # _cast_buffers casts every buffer, the integer num_batches_tracked included
    assert {str(b.dtype) for b in ddp.module.buffers()} == {"torch.bfloat16"}


def test_a_ddp_model_is_planned_as_its_module(group: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.nn.parallel.distributed import _MixedPrecision

    policy = _MixedPrecision(param_dtype=bf)
    plan = ish.plan_precision(DDP(seq()), {"": policy}, example_inputs=X)
    assert plan.ok and plan.unit("").params[0] == "0.weight"
    assert plan.unit("").dtypes["output"] == "torch.bfloat16"
