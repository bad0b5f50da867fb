"""The DDP bucket planner against torch's own assignment function and DDP's size rules.

Pure and fast: meta tensors, no process group. ``tests/integration`` compares the
planner with real DDP buckets on 2 gloo ranks.
"""

from __future__ import annotations

import random
import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn

from interactive_shard.buckets import (
    Bucket,
    BucketPlan,
    ParamSpec,
    ReadyOrderSource,
    _assign,
    plan_buckets,
)
from interactive_shard.buckets._assign import Item, assign_by_size
from interactive_shard.example_models import LlamaConfig, llama_7b
from interactive_shard.probing.compat import ddp as compat_ddp

torch_assign = getattr(dist, "_compute_bucket_assignment_by_size", None)
needs_torch_assign = pytest.mark.skipif(torch_assign is None, reason="torch lacks the function")
needs_capacity_config = pytest.mark.skipif(
    torch_assign is None or not compat_ddp.BUCKET_CAPACITY_CONFIG,
    reason=compat_ddp.missing("_BucketCapacityConfig to check BucketCaps against"),
)
MIB = 1024 * 1024
COMMON = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# Enough keys for the reducer's hash map to leave reverse insertion order.
FLOAT8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
MANY = [*COMMON, torch.complex64, torch.complex128, *FLOAT8]


# -- helpers ---------------------------------------------------------------------------


def random_params(
    rng: random.Random, n: int, dtypes: list[torch.dtype]
) -> list[tuple[str, torch.Tensor]]:
    params = []
    for i in range(n):
        shape = tuple(rng.choice([1, 3, 8, 64, 300]) for _ in range(rng.randint(1, 2)))
        params.append((f"layer{i}.w", torch.empty(shape, dtype=rng.choice(dtypes), device="meta")))
    return params


def torch_reference(
    params: list[tuple[str, torch.Tensor]],
    ready: list[int],
    *,
    cap_mb: float | None = None,
    cap_list: list[float] | None = None,
    find_unused: bool = False,
    static_graph: bool = False,
) -> tuple[list[list[str]], list[list[str]]]:
    """What DDP computes, with torch's own config class and assignment function."""
    config_cls = torch.nn.parallel.distributed._BucketCapacityConfig
    config = config_cls.create(cap_mb, cap_list, use_python_reducer=False)
    first_limits, _ = config.compute_bucket_size_limits(static_graph, find_unused)
    tensors = [t for _, t in params]
    sparse = [False] * len(params)
    initial, _ = torch_assign(tensors, first_limits, sparse)
    first = [[params[i][0] for i in b] for b in reversed(initial)]
    if find_unused and not static_graph:
        return first, first
    limits = list(config.per_bucket_bytes_caps) or [
        config.first_bucket_bytes_cap,
        config.bucket_bytes_cap,
    ]
    rebuilt, _ = torch_assign([tensors[i] for i in ready], limits, sparse, ready)
    return first, [[params[i][0] for i in b] for b in rebuilt]


def fqns(buckets: list[Bucket]) -> list[list[str]]:
    return [b.fqns for b in buckets]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


# -- the greedy assignment equals torch's ------------------------------------------------


@needs_torch_assign
@pytest.mark.parametrize("seed", range(40))
def test_assign_by_size_equals_torch(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(10):
        n = rng.randint(1, 40)
        dtypes = rng.choice([COMMON[:1], COMMON, MANY])
        tensors = [t for _, t in random_params(rng, n, dtypes)]
        limits = [rng.choice([0, 1, 100, 1000, 5000, 50000, sys.maxsize])]
        limits += [rng.choice([0, 500, 4000, 70000]) for _ in range(rng.randint(0, 3))]
        sparse = [rng.random() < 0.1 for _ in range(n)]
        ready = rng.sample(range(n), n) if rng.random() < 0.7 else None
        order = ready if ready is not None else list(range(n))
        if ready is None:
            expected, expected_limits = torch_assign(tensors, limits, sparse)
        else:
            ordered = [tensors[i] for i in ready]
            expected, expected_limits = torch_assign(ordered, limits, sparse, ready)
        items = [
            Item(i, (t.dtype, t.device), t.numel() * t.element_size(), sparse[i])
            for i, t in ((i, tensors[i]) for i in order)
        ]
        got = assign_by_size(items, limits, gradient_ready_order=ready is not None)
        assert [b for b, _ in got] == expected, (limits, ready)
        assert [lim for _, lim in got] == expected_limits


@needs_torch_assign
@pytest.mark.parametrize("limits", [[0], [1], [64], [0, 100], [sys.maxsize], [16, 0, 40]])
def test_assign_with_empty_tensors_and_zero_limits_equals_torch(limits: list[int]) -> None:
    # The assignment searches running byte totals: empty tensors make equal totals,
    # and a zero limit closes a bucket at its first tensor.
    shapes = [(0,), (4,), (0,), (0,), (16,), (1,), (0, 3), (8,), (0,)]
    for dtypes in ([torch.float32], [torch.float32, torch.float16]):
        tensors = [
            torch.empty(shape, dtype=dtypes[i % len(dtypes)], device="meta")
            for i, shape in enumerate(shapes)
        ]
        for ready in (None, list(reversed(range(len(shapes))))):
            order = ready if ready is not None else list(range(len(shapes)))
            walk = [tensors[i] for i in order]
            args = (walk, limits, [False] * len(walk))
            expected = torch_assign(*args, ready) if ready else torch_assign(*args)
            items = [
                Item(i, (tensors[i].dtype, tensors[i].device), tensors[i].nbytes) for i in order
            ]
            got = assign_by_size(items, limits, gradient_ready_order=ready is not None)
            assert [b for b, _ in got] == expected[0] and [lim for _, lim in got] == expected[1]


@needs_torch_assign
def test_open_bucket_order_matches_torch_beyond_reverse_insertion() -> None:
    # With several dtypes std::unordered_map does not always return reverse insertion
    # order; the planner must still agree with torch.
    rng = random.Random(7)
    differs = 0
    for _ in range(200):
        keys = rng.sample(MANY, len(MANY))
        n = len(keys)
        tensors = [torch.empty(4, dtype=d, device="meta") for d in keys]
        expected, _ = torch_assign(tensors, [sys.maxsize], [False] * n, list(range(n)))
        items = [Item(i, (d, torch.device("meta")), 4 * d.itemsize) for i, d in enumerate(keys)]
        got = [b for b, _ in assign_by_size(items, [sys.maxsize], gradient_ready_order=True)]
        assert got == expected
        differs += got != [[i] for i in reversed(range(n))]
    assert differs > 0 or not FLOAT8  # the probe matters: reverse insertion alone would be wrong


def test_open_bucket_order_falls_back_without_torch_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(dist, "_compute_bucket_assignment_by_size", raising=False)
    _assign._open_bucket_order.cache_clear()
    try:
        keys = tuple((d, torch.device("cpu")) for d in COMMON)
        assert _assign._open_bucket_order(keys) == tuple(reversed(keys))
    finally:
        _assign._open_bucket_order.cache_clear()


# -- whole plans equal DDP's construction + rebuild ----------------------------------------


@needs_capacity_config
@pytest.mark.parametrize("seed", range(30))
def test_plan_equals_torch_reference(seed: int) -> None:
    rng = random.Random(1000 + seed)
    params = random_params(rng, rng.randint(1, 60), rng.choice([COMMON[:1], COMMON, MANY]))
    ready = rng.sample(range(len(params)), len(params))
    kwargs: dict = {
        "find_unused_parameters": rng.random() < 0.4,
        "static_graph": rng.random() < 0.3,
    }
    mode = rng.choice(["default", "cap", "list"])
    if mode == "cap":
        kwargs["bucket_cap_mb"] = rng.choice([0, 0.001, 0.01, 0.05, 0.2, 1])
    elif mode == "list":
        choices = [0.0005, 0.003, 0.02, 0.1]
        kwargs["bucket_cap_mb_list"] = [rng.choice(choices) for _ in range(rng.randint(1, 4))]
    plan = plan_buckets(params, ready_order=[params[i][0] for i in ready], **kwargs)
    first, rebuilt = torch_reference(
        params,
        ready,
        cap_mb=kwargs.get("bucket_cap_mb"),
        cap_list=kwargs.get("bucket_cap_mb_list"),
        find_unused=kwargs["find_unused_parameters"],
        static_graph=kwargs["static_graph"],
    )
    assert fqns(plan.first_iteration) == first
    assert fqns(plan.rebuilt) == rebuilt
    assert plan.ready_order_source is ReadyOrderSource.GIVEN


@needs_capacity_config
def test_ten_thousand_meta_parameters() -> None:
    rng = random.Random(3)
    params = random_params(rng, 10_000, [torch.float32])
    plan = plan_buckets(params, bucket_cap_mb=0.05)
    ready = list(reversed(range(len(params))))
    first, rebuilt = torch_reference(params, ready, cap_mb=0.05)
    assert fqns(plan.first_iteration) == first
    assert fqns(plan.rebuilt) == rebuilt
    assert len(plan.rebuilt) > 100
    assert sum(b.nbytes for b in plan.rebuilt) == sum(t.numel() * 4 for _, t in params)


# -- DDP's rules, stated ----------------------------------------------------------------------


@needs_capacity_config
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"bucket_cap_mb": 100}, {"find_unused_parameters": True}, {"static_graph": True}],
)
def test_seven_billion_meta_transformer_equals_torch(kwargs: dict) -> None:
    # A real layout (issue 12): 32 Llama blocks on the meta device, 291 parameters,
    # 6.7 B elements; the module and its (fqn, tensor) pairs plan alike.
    model = llama_7b()
    params = list(model.named_parameters())
    assert len(params) == LlamaConfig().parameters == 291
    assert sum(t.numel() for _, t in params) == LlamaConfig().elements > 6.7e9
    plan = plan_buckets(model, **kwargs)
    assert plan.param_order == [name for name, _ in params]
    ready = list(reversed(range(len(params))))  # DDP's guess before it has seen a backward
    first, rebuilt = torch_reference(
        params,
        ready,
        cap_mb=kwargs.get("bucket_cap_mb"),
        find_unused=kwargs.get("find_unused_parameters", False),
        static_graph=kwargs.get("static_graph", False),
    )
    assert fqns(plan.first_iteration) == first
    assert fqns(plan.rebuilt) == rebuilt
    assert fqns(plan_buckets(params, **kwargs).rebuilt) == rebuilt
    if plan.rebuilds:
        assert len(plan.rebuilt) > 100  # a 64 MiB projection already fills a 25 MiB bucket
        assert plan.rebuilt[0].fqns == ["lm_head.weight"]  # ready first, alone


@needs_capacity_config
def test_seven_billion_layout_with_the_forward_ready_order_equals_torch() -> None:
    params = list(llama_7b(torch.bfloat16).named_parameters())
    rng = random.Random(5)
    ready = rng.sample(range(len(params)), len(params))
    plan = plan_buckets(params, ready_order=[params[i][0] for i in ready], bucket_cap_mb=50)
    first, rebuilt = torch_reference(params, ready, cap_mb=50)
    assert fqns(plan.first_iteration) == first and fqns(plan.rebuilt) == rebuilt
    assert {b.dtype for b in plan.rebuilt} == {"torch.bfloat16"}


def test_iteration_one_is_one_bucket_in_registration_order() -> None:
    plan = plan_buckets(MLP(), bucket_cap_mb=0.001)
    order = ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]
    assert fqns(plan.first_iteration) == [order]
    assert plan.first_iteration[0].cap_bytes == sys.maxsize
    assert fqns(plan.rebuilt) == [
        ["c.bias", "c.weight"],
        ["b.bias", "b.weight"],
        ["a.bias", "a.weight"],
    ]
    assert plan.rebuilds and plan.rebuilt_from_iteration == 2
    assert plan.iteration(1) is plan.first_iteration and plan.iteration(2) is plan.rebuilt
    assert plan.ready_order_source is ReadyOrderSource.ASSUMED


def test_find_unused_parameters_buckets_by_size_and_never_rebuilds() -> None:
    plan = plan_buckets(MLP(), bucket_cap_mb=0.001, find_unused_parameters=True)
    assert not plan.rebuilds and plan.rebuilt_from_iteration is None
    assert plan.rebuilt == plan.first_iteration and plan.iteration(50) == plan.first_iteration
    # Sorted by lowest index, then reversed: bucket 0 holds the last registered params.
    assert fqns(plan.first_iteration) == [
        ["c.bias"],
        ["b.bias", "c.weight"],
        ["a.bias", "b.weight"],
        ["a.weight"],
    ]


def test_static_graph_rebuilds_one_iteration_later() -> None:
    plan = plan_buckets(MLP(), bucket_cap_mb=0.001, static_graph=True, find_unused_parameters=True)
    assert plan.rebuilds and plan.rebuilt_from_iteration == 3
    assert plan.iteration(2) is plan.first_iteration and plan.iteration(3) is plan.rebuilt
    assert len(plan.first_iteration) == 1


def test_first_bucket_cap_is_one_mib_only_by_default() -> None:
    big = [(f"l{i}", torch.empty(256, 256, device="meta")) for i in range(12)]  # 256 KiB each
    default = plan_buckets(big)
    assert default.caps.first_bucket_cap_bytes == dist._DEFAULT_FIRST_BUCKET_BYTES == MIB
    assert default.caps.bucket_cap_bytes == 25 * MIB
    assert [len(b.fqns) for b in default.rebuilt] == [4, 8]
    assert [b.cap_bytes for b in default.rebuilt] == [MIB, 25 * MIB]
    given = plan_buckets(big, bucket_cap_mb=25)
    assert given.caps.first_bucket_cap_bytes == 25 * MIB
    assert [len(b.fqns) for b in given.rebuilt] == [12]


def test_bucket_cap_mb_list_applies_per_bucket_in_both_phases() -> None:
    big = [(f"l{i}", torch.empty(256, 256, device="meta")) for i in range(6)]
    plan = plan_buckets(big, bucket_cap_mb_list=[0.2, 0.6])
    caps = (int(0.2 * MIB), int(0.6 * MIB))
    assert plan.caps.bucket_cap_bytes_list == caps
    assert plan.caps.bucket_cap_bytes == plan.caps.first_bucket_cap_bytes == caps[1]
    # Iteration 1: registration order, first cap on the first registered, then reversed.
    assert fqns(plan.first_iteration) == [["l4", "l5"], ["l1", "l2", "l3"], ["l0"]]
    assert [b.cap_bytes for b in plan.first_iteration] == [caps[1], caps[1], caps[0]]
    assert fqns(plan.rebuilt) == [["l5"], ["l4", "l3", "l2"], ["l1", "l0"]]
    assert [b.cap_bytes for b in plan.rebuilt] == [caps[0], caps[1], caps[1]]


def test_dtypes_split_buckets_and_sparse_gradients_get_their_own() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4, sparse=True)
            self.a = nn.Linear(4, 4)
            self.d = nn.Linear(4, 4).double()

    plan = plan_buckets(Model())
    assert fqns(plan.first_iteration) == [
        ["d.weight", "d.bias"],
        ["a.weight", "a.bias"],
        ["emb.weight"],
    ]
    assert plan.bucket_of("emb.weight").sparse and plan.bucket_of("emb.weight").cap_bytes == 0
    assert plan.bucket_of("d.bias").dtype == "torch.float64"
    # Reverse registration: d.bias, d.weight, a.bias, a.weight, emb.weight. A sparse
    # bucket is emitted when met; open dense buckets at the end, float32 (opened last)
    # first: the reducer's hash map yields keys in reverse insertion order here.
    assert fqns(plan.rebuilt) == [["emb.weight"], ["a.bias", "a.weight"], ["d.bias", "d.weight"]]


def test_module_parameters_as_ddp_collects_them() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.frozen = nn.Linear(4, 4).requires_grad_(False)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight  # tied: reduced once, under its first name
            self.extra = nn.Linear(4, 4)

    model = Model()
    model._ddp_params_and_buffers_to_ignore = ["extra.bias"]  # type: ignore[assignment]
    plan = plan_buckets(model)
    assert plan.param_order == ["emb.weight", "extra.weight"]


def test_bucket_fields_and_lookup() -> None:
    plan = plan_buckets(MLP(), bucket_cap_mb=0.001)
    bucket = plan.bucket_of("b.weight")
    assert bucket == plan.rebuilt[1]
    assert bucket.shapes == [(32,), (32, 32)] and bucket.numels == [32, 1024]
    assert bucket.dtypes == ["torch.float32"] * 2 and bucket.nbytes == 4 * 1056
    assert bucket.cap_bytes == int(0.001 * MIB) and bucket.device == "cpu"
    assert plan.bucket_of("b.weight", iteration=1) is plan.first_iteration[0]
    with pytest.raises(KeyError, match=r"did you mean \['b.weight'"):
        plan.bucket_of("b.weigth")
    with pytest.raises(ValueError, match="start at 1"):
        plan.iteration(0)


def test_meta_model_and_param_specs_plan_like_the_real_model() -> None:
    real = plan_buckets(MLP(), bucket_cap_mb=0.001)
    with torch.device("meta"):
        meta_model = MLP()
    meta = plan_buckets(meta_model, bucket_cap_mb=0.001)
    specs = [(n, ParamSpec(tuple(p.shape), "float32")) for n, p in MLP().named_parameters()]
    spec = plan_buckets(specs, bucket_cap_mb=0.001)
    assert fqns(meta.rebuilt) == fqns(real.rebuilt) == fqns(spec.rebuilt)
    assert [b.nbytes for b in spec.rebuilt] == [b.nbytes for b in real.rebuilt]


# -- delay_all_reduce_named_params ---------------------------------------------------------------

DELAYED = ["b.weight", "a.bias"]


class Rooted(MLP):
    """A root parameter (DDP's key ".pos") and a tied weight (two keys, one tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(3))
        self.head = nn.Linear(8, 32, bias=False)
        self.head.weight = self.a.weight


@needs_capacity_config
@pytest.mark.parametrize("cap", [None, 0.001, 0.01])
@pytest.mark.parametrize("flags", [{}, {"find_unused_parameters": True}, {"static_graph": True}])
def test_delayed_parameters_leave_every_bucket(cap: float | None, flags: dict) -> None:
    model = MLP()
    kwargs = {**flags, **({} if cap is None else {"bucket_cap_mb": cap})}
    named = dict(model.named_parameters())
    by_fqn = plan_buckets(model, delay_all_reduce_named_params=DELAYED, **kwargs)
    by_pair = plan_buckets(
        model,
        delay_all_reduce_named_params=[(n, named[n]) for n in DELAYED],
        param_to_hook_all_reduce=named["a.weight"],
        **kwargs,
    )
    for plan in (by_fqn, by_pair):
        for buckets in (plan.first_iteration, plan.rebuilt):
            assert not {f for b in buckets for f in b.fqns} & set(DELAYED)
    assert fqns(by_fqn.first_iteration) == fqns(by_pair.first_iteration)
    assert fqns(by_fqn.rebuilt) == fqns(by_pair.rebuilt)
    # The rest is bucketed as DDP does: its own assignment over the remaining parameters.
    rest = [(n, p) for n, p in model.named_parameters() if n not in DELAYED]
    ready = list(reversed(range(len(rest))))  # the planner's assumption
    first, rebuilt = torch_reference(
        rest,
        ready,
        cap_mb=cap,
        find_unused=flags.get("find_unused_parameters", False),
        static_graph=flags.get("static_graph", False),
    )
    assert fqns(by_fqn.first_iteration) == first and fqns(by_fqn.rebuilt) == rebuilt
    assert by_fqn.param_order == [n for n, _ in rest]
    # ... and as DDP's ignore list leaves them out (DDP adds the names to that list).
    ignoring = MLP()
    ignoring._ddp_params_and_buffers_to_ignore = DELAYED  # type: ignore[assignment]
    assert fqns(plan_buckets(ignoring, **kwargs).rebuilt) == rebuilt
    d = by_pair.delayed
    assert d is not None and by_fqn.delayed is not None
    assert d.fqns == DELAYED and d.shapes == [(32, 32), (32,)] and d.numels == [1024, 32]
    assert d.nbytes == 4 * 1056 and d.dtypes == ["torch.float32"] * 2
    assert d.hook == "a.weight" and by_fqn.delayed.hook is None and d.in_buckets == []


def test_delayed_names_are_matched_as_ddp_matches_them() -> None:
    # A root parameter by its fqn misses DDP's key ".pos": it stays in a bucket and is
    # delayed too; by its key it leaves.
    plan = plan_buckets(Rooted(), delay_all_reduce_named_params=["pos"])
    assert "pos" in plan.param_order
    assert plan.delayed is not None and plan.delayed.in_buckets == ["pos"]
    plan = plan_buckets(Rooted(), delay_all_reduce_named_params=[".pos"])
    assert "pos" not in plan.param_order
    assert plan.delayed is not None and plan.delayed.fqns == ["pos"]
    assert plan.delayed.in_buckets == []
    # A tied weight delayed under one name is reduced under its other one.
    plan = plan_buckets(Rooted(), delay_all_reduce_named_params=["a.weight"])
    assert plan.param_order[-1] == "head.weight" and "a.weight" not in plan.param_order
    assert plan.delayed is not None and plan.delayed.in_buckets == ["a.weight"]
    # Pairs of specs plan alike; the delayed ones may be in a given ready order.
    specs = [(n, ParamSpec(tuple(p.shape))) for n, p in MLP().named_parameters()]
    order = [n for n, _ in specs][::-1]
    plan = plan_buckets(specs, delay_all_reduce_named_params=DELAYED, ready_order=order)
    assert plan.ready_order == [f for f in order if f not in DELAYED]
    assert fqns(plan.rebuilt) == fqns(
        plan_buckets(MLP(), delay_all_reduce_named_params=DELAYED).rebuilt
    )


def test_every_parameter_delayed_leaves_no_bucket() -> None:
    names = [n for n, _ in MLP().named_parameters()]
    plan = plan_buckets(MLP(), delay_all_reduce_named_params=names, bucket_cap_mb=0.001)
    assert plan.first_iteration == plan.rebuilt == [] and plan.param_order == []
    assert plan.delayed is not None and plan.delayed.fqns == names


def test_delayed_parameter_errors() -> None:
    with pytest.raises(
        ValueError, match=r"'b.weigth' is not a trainable.*did you mean \['b.weight'"
    ):
        plan_buckets(MLP(), delay_all_reduce_named_params=["b.weigth"])
    frozen = MLP()
    frozen.c.requires_grad_(False)
    with pytest.raises(ValueError, match=r"'c\.bias' is not a trainable parameter"):
        plan_buckets(frozen, delay_all_reduce_named_params=["c.bias"])
    with pytest.raises(ValueError, match=r"names \['a\.bias'\] twice"):
        plan_buckets(MLP(), delay_all_reduce_named_params=["a.bias", "a.bias"])
    with pytest.raises(TypeError, match=r"list of fqns or of \(name, param\) pairs"):
        plan_buckets(MLP(), delay_all_reduce_named_params="a.bias")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs delay_all_reduce_named_params"):
        plan_buckets(MLP(), param_to_hook_all_reduce="a.weight")
    with pytest.raises(ValueError, match=r"param_to_hook_all_reduce: 'a\.wieght'.*did you mean"):
        plan_buckets(
            MLP(), delay_all_reduce_named_params=DELAYED, param_to_hook_all_reduce="a.wieght"
        )
    with pytest.raises(ValueError, match="param_to_hook_all_reduce is not a trainable"):
        plan_buckets(
            MLP(), delay_all_reduce_named_params=DELAYED, param_to_hook_all_reduce=torch.ones(1)
        )
    plan = plan_buckets(MLP(), delay_all_reduce_named_params=DELAYED)
    with pytest.raises(ValueError, match="delayed parameters in buckets"):
        BucketPlan(
            first_iteration=[],
            rebuilt=[],
            param_order=["b.weight"],
            ready_order=[],
            ready_order_source=plan.ready_order_source,
            caps=plan.caps,
            delayed=plan.delayed,
        )


# -- ready order from example inputs ------------------------------------------------------------


def test_example_inputs_observe_gradient_ready_order() -> None:
    class Reordered(nn.Module):  # registration order differs from use order
        def __init__(self) -> None:
            super().__init__()
            self.late = nn.Linear(8, 8)
            self.early = nn.Linear(4, 8)
            self.side = nn.Parameter(torch.ones(8))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.late(torch.relu(self.early(x)))
            return h, h * self.side

    model, x = Reordered(), torch.randn(2, 4)
    rng_before = torch.get_rng_state()
    plan = plan_buckets(model, example_inputs=(x,))
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert all(p.grad is None for p in model.parameters())  # ran on a copy
    assert plan.ready_order_source is ReadyOrderSource.OBSERVED
    assert plan.ready_order[0] == "side"
    assert set(plan.ready_order[-2:]) == {"early.bias", "early.weight"}
    assert plan.rebuilt[0].fqns == plan.ready_order


def test_example_inputs_unused_parameter() -> None:
    class WithUnused(MLP):
        def __init__(self) -> None:
            super().__init__()
            self.unused = nn.Linear(3, 3)

    x = (torch.randn(2, 16),)
    with pytest.raises(ValueError, match=r"unused.weight.*find_unused_parameters=True"):
        plan_buckets(WithUnused(), example_inputs=x)
    plan = plan_buckets(WithUnused(), example_inputs=x, static_graph=True)
    assert plan.unused == ["unused.weight", "unused.bias"]
    assert plan.ready_order[-2:] == ["unused.weight", "unused.bias"]  # DDP appends them
    plan = plan_buckets(WithUnused(), example_inputs=x, find_unused_parameters=True)
    assert plan.unused == ["unused.weight", "unused.bias"] and not plan.rebuilds


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bucket_cap_mb": -1}, r"bucket_cap_mb=-1: give a size in MiB >= 0"),
        ({"bucket_cap_mb": float("nan")}, r"bucket_cap_mb=nan"),
        ({"bucket_cap_mb": True}, r"bucket_cap_mb=True"),
        ({"bucket_cap_mb": 1, "bucket_cap_mb_list": [1]}, r"pass only one of them"),
        ({"bucket_cap_mb_list": []}, r"bucket_cap_mb_list=\[\]: give a non-empty list"),
        ({"bucket_cap_mb_list": [1, -2]}, r"bucket_cap_mb_list entry=-2"),
        ({"bucket_cap_mb_list": "25"}, r"bucket_cap_mb_list='25': give a non-empty list"),
        ({"ready_order": ["a.weight"], "example_inputs": (1,)}, r"not both"),
        ({"ready_order": "a.weight"}, r"list of fqn strings"),
        ({"example_inputs": {1: torch.randn(2, 16)}}, r"keys must be\s+strings"),
        ({"loss_fn": lambda out: out.sum()}, r"loss_fn is used with example_inputs"),
    ],
)
def test_argument_errors(kwargs: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        plan_buckets(MLP(), **kwargs)


def test_ready_order_errors_list_the_names() -> None:
    order = ["c.bias", "c.weight", "b.bias", "b.bias", "nope", "a.bias", "a.weight"]
    with pytest.raises(ValueError) as info:
        plan_buckets(MLP(), ready_order=order)
    message = str(info.value)
    assert "unknown: ['nope']" in message
    assert "duplicated: ['b.bias']" in message
    assert "missing: ['b.weight']" in message


def test_input_errors() -> None:
    with pytest.raises(ValueError, match="no trainable parameters"):
        plan_buckets(MLP().requires_grad_(False))
    with pytest.raises(ValueError, match="no trainable parameters"):
        plan_buckets([])
    with pytest.raises(ValueError, match="uninitialized"):
        plan_buckets(nn.LazyLinear(4))
    with pytest.raises(TypeError, match=r"needs an nn\.Module"):
        plan_buckets([("w", torch.empty(3))], example_inputs=(1,))
    with pytest.raises(TypeError, match="expected \\(fqn, tensor\\) pairs"):
        plan_buckets([torch.empty(3)])  # type: ignore[list-item]
    w = nn.Parameter(torch.empty(3))
    with pytest.raises(ValueError, match="given twice"):
        plan_buckets([("w", torch.empty(3)), ("w", torch.empty(2))])
    with pytest.raises(ValueError, match="same tensor"):
        plan_buckets([("w", w), ("v", w)])
    with pytest.raises(ValueError, match="sparse tensor"):
        plan_buckets([("s", torch.eye(3).to_sparse())])
    with pytest.raises(ValueError, match="unknown dtype 'float33'"):
        ParamSpec((3,), "float33")
    with pytest.raises(ValueError, match="non-negative ints"):
        ParamSpec((3, -1))


def test_plan_and_bucket_validate_themselves() -> None:
    plan = plan_buckets(MLP(), bucket_cap_mb=0.001)
    with pytest.raises(ValueError, match="exactly one bucket"):
        BucketPlan(
            first_iteration=plan.first_iteration,
            rebuilt=plan.rebuilt[:-1],
            param_order=plan.param_order,
            ready_order=plan.ready_order,
            ready_order_source=plan.ready_order_source,
            caps=plan.caps,
        )
    with pytest.raises(ValueError, match="mixes dtypes"):
        Bucket(0, ["a", "b"], [(1,), (1,)], ["torch.float32", "torch.float16"], [1, 1], 6, 0)
