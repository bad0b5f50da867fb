"""The bucket planner against real DDP: 2 gloo ranks on CPU, buckets seen by a comm hook.

One ``ish.launch`` runs every case (3 iterations each) and returns what the hook saw:
per iteration, per bucket, the fqns of ``bucket.parameters()`` in order and the buffer
size. Each case is then its own test comparing that with ``plan_buckets``. The list of
parameters DDP reduces (planner and probe share it) is checked in this process, in a
one-rank gloo group, against DDP's own ``_build_params_for_reducer``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

import interactive_shard as ish
from interactive_shard.buckets import plan_buckets
from interactive_shard.buckets._params import reducer_params
from interactive_shard.probing.compat import ddp as compat_ddp

ITERATIONS = 3
HAS_CAP_LIST = (
    "bucket_cap_mb_list"
    in inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
)

# Ranks may be spawned: ship this module's models and functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- models: small, seconds on 2 cores ---------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class TinyTransformer(nn.Module):
    """Embeddings, layernorms, attention and MLP linears, a tied output head."""

    def __init__(self, d: int = 32, vocab: int = 50) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(8, d))
        self.ln1 = nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids) + self.pos[: ids.shape[1]]
        x = self.ln1(h)
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / x.shape[-1] ** 0.5
        h = h + self.o(torch.softmax(scores, -1) @ self.v(x))
        h = h + self.down(torch.relu(self.up(self.ln2(h))))
        return self.head(self.lnf(h))


class WithUnused(nn.Module):
    """``skip`` never takes part in forward; ``frozen`` is not trainable."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.skip = nn.Linear(32, 32)
        self.c = nn.Linear(32, 8)
        self.frozen = nn.Linear(4, 4).requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.a(x)))


class Wide(nn.Module):
    """3 MiB of float32 parameters: large enough for the 1 MiB first-bucket rule."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(256, 256) for _ in range(12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class MixedKinds(nn.Module):
    """A float64 layer (buckets split by dtype) and a sparse-gradient embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 16, sparse=True)
        self.a = nn.Linear(16, 32)
        self.d = nn.Linear(32, 32).double()
        self.c = nn.Linear(32, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(self.emb(ids)))
        return self.c(torch.relu(self.d(h.double())).float()).sum(1)


MODELS: dict[str, tuple[type[nn.Module], Any]] = {
    "mlp": (MLP, lambda: (torch.randn(4, 16),)),
    "transformer": (TinyTransformer, lambda: (torch.randint(0, 50, (2, 8)),)),
    "unused": (WithUnused, lambda: (torch.randn(4, 16),)),
    "wide": (Wide, lambda: (torch.randn(4, 256),)),
    "mixed": (MixedKinds, lambda: (torch.randint(0, 40, (2, 8)),)),
}

FLAGS = {
    "plain": {},
    "find_unused": {"find_unused_parameters": True},
    "static": {"static_graph": True},
}


def _cases() -> dict[str, tuple[str, dict[str, Any]]]:
    cases: dict[str, tuple[str, dict[str, Any]]] = {}
    for model in ("mlp", "transformer"):
        for cap in (None, 0.001, 0.01, 0.05):
            for flag, flag_kwargs in FLAGS.items():
                cap_kwargs = {} if cap is None else {"bucket_cap_mb": cap}
                cases[f"{model}-cap{cap}-{flag}"] = (model, {**cap_kwargs, **flag_kwargs})
        for flag, flag_kwargs in FLAGS.items():
            caps = {"bucket_cap_mb_list": [0.002, 0.006, 0.001]}
            cases[f"{model}-list-{flag}"] = (model, {**caps, **flag_kwargs})
    small_unused = {"bucket_cap_mb": 0.001, "find_unused_parameters": True}
    cases["unused-cap0.001-find_unused"] = ("unused", small_unused)
    cases["unused-capNone-find_unused"] = ("unused", {"find_unused_parameters": True})
    cases["unused-cap0.001-static"] = ("unused", {"bucket_cap_mb": 0.001, "static_graph": True})
    cases["wide-capNone-plain"] = ("wide", {})
    cases["wide-capNone-find_unused"] = ("wide", {"find_unused_parameters": True})
    cases["wide-cap1-plain"] = ("wide", {"bucket_cap_mb": 1})
    cases["wide-list-plain"] = ("wide", {"bucket_cap_mb_list": [0.3, 0.1, 0.6]})
    cases["mixed-capNone-plain"] = ("mixed", {})
    cases["mixed-cap0.001-plain"] = ("mixed", {"bucket_cap_mb": 0.001})
    cases["mixed-cap0.001-find_unused"] = ("mixed", small_unused)
    # delay_all_reduce_named_params: fqns here, (name, param) pairs for DDP (_ddp_kwargs).
    mlp_delay: dict[str, Any] = {
        "delay_all_reduce_named_params": ["b.weight", "b.bias"],
        "param_to_hook_all_reduce": "a.weight",  # its gradient is the last: the mean is right
    }
    for flag, flag_kwargs in FLAGS.items():
        cases[f"mlp-delay-cap0.001-{flag}"] = (
            "mlp",
            {"bucket_cap_mb": 0.001, **mlp_delay, **flag_kwargs},
        )
    for label, names in {
        "key": ["q.weight", "ln2.bias", ".pos"],  # ".pos": DDP's key for the root "pos"
        "root": ["pos"],  # misses DDP's key: stays in its bucket, and is delayed too
        "tied": ["emb.weight"],  # reduced under its other name, head.weight
    }.items():
        for flag in ("plain", "static"):
            delay = {
                "delay_all_reduce_named_params": names,
                "param_to_hook_all_reduce": "ln1.weight",
            }
            cases[f"transformer-delay-{label}-cap0.01-{flag}"] = (
                "transformer",
                {"bucket_cap_mb": 0.01, **delay, **FLAGS[flag]},
            )
    if not HAS_CAP_LIST:  # torch < 2.13
        cases = {k: v for k, v in cases.items() if "bucket_cap_mb_list" not in v[1]}
    return cases


CASES = _cases()
# torch 2.11 passes a float bucket_cap_mb to _broadcast_coalesced with delayed parameters.
DELAY_BUG = compat_ddp.DELAY_ALL_REDUCE_NEEDS_INT_CAP
SKIP_DELAY = pytest.mark.skipif(
    DELAY_BUG,
    reason="torch 2.11's DDP passes bucket_cap_mb unconverted to _broadcast_coalesced with "
    "delay_all_reduce_named_params (TypeError; fixed in 2.12): compat.ddp",
)
RUNNABLE = {
    case: v
    for case, v in CASES.items()
    if not (DELAY_BUG and "delay_all_reduce_named_params" in v[1])
}

# iteration -> buckets in hook-call order: (fqns, buffer bytes or None if sparse, index())
Observed = dict[int, list[tuple[list[str], int | None, int]]]


# -- rank side -------------------------------------------------------------------------------


def _observe(ctx: Any, model_name: str, ddp_kwargs: dict[str, Any]) -> Observed:
    from torch.nn.parallel import DistributedDataParallel as DDP

    build, make_inputs = MODELS[model_name]
    torch.manual_seed(0)
    model = build()
    ddp = DDP(model, **_ddp_kwargs(model, ddp_kwargs))
    # The planner unwraps a DDP module and names parameters as the module does.
    assert plan_buckets(ddp, **ddp_kwargs).rebuilt == plan_buckets(model, **ddp_kwargs).rebuilt
    # Names as the Reducer has them (a tied weight delayed under one name is reduced
    # under the other). Its buckets before any backward are the planner's iteration 1.
    names = {id(r.param): r.fqn for r in reducer_params(ddp)}
    if "delay_all_reduce_named_params" in ddp_kwargs:
        built = sorted(ddp.reducer._get_zeros_like_grad_buckets(), key=lambda b: b.index())
        first = plan_buckets(model, **ddp_kwargs).first_iteration
        assert [[names[id(p)] for p in b.parameters()] for b in built] == [b.fqns for b in first]
    seen: Observed = {}
    state = {"iteration": 0}

    # No annotations: DDP rejects a ``bucket`` annotation that is not dist.GradBucket
    # itself, and ``from __future__ import annotations`` would make it a string.
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        buffer = bucket.buffer()
        nbytes = None if buffer.is_sparse else buffer.numel() * buffer.element_size()
        fqns = [names[id(p)] for p in bucket.parameters()]
        seen.setdefault(state["iteration"], []).append((fqns, nbytes, bucket.index()))
        work = dist.all_reduce(buffer, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0] / ctx.world_size)

    ddp.register_comm_hook(state, hook)
    for iteration in range(1, ITERATIONS + 1):
        state["iteration"] = iteration
        torch.manual_seed(100 * iteration + ctx.rank)  # ranks see different data
        out = ddp(*make_inputs())
        out.sum().backward()
    return seen


def _ddp_kwargs(model: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """DDP's arguments: the delayed fqns as its (name, param) pairs, the hook a tensor."""
    names = kwargs.get("delay_all_reduce_named_params")
    if names is None:
        return kwargs
    # Every name a key (".pos") or a module's name ("pos"): the tensor DDP is given.
    by_key = {
        f"{m}.{n}": p
        for m, sub in model.named_modules()
        for n, p in sub.named_parameters(recurse=False)
    }
    tensor = {**{k.removeprefix("."): p for k, p in by_key.items()}, **by_key}
    return {
        **kwargs,
        "delay_all_reduce_named_params": [(n, tensor[n]) for n in names],
        "param_to_hook_all_reduce": tensor[kwargs["param_to_hook_all_reduce"]],
    }


def _observe_all(ctx: Any, cases: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Observed]:
    import warnings

    warnings.filterwarnings("ignore", message=".*find_unused_parameters=True.*")
    return {case: _observe(ctx, model, kwargs) for case, (model, kwargs) in cases.items()}


# -- tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def observed() -> dict[str, Observed]:
    run = ish.launch(_observe_all, RUNNABLE, nprocs=2, timeout=60, backend="gloo", device="cpu")
    rank0, rank1 = run.results
    assert rank0 == rank1, "both ranks must see the same buckets (rank 0's order is broadcast)"
    return rank0


@pytest.mark.parametrize(
    "case", [c if c in RUNNABLE else pytest.param(c, marks=SKIP_DELAY) for c in CASES]
)
def test_plan_matches_real_ddp(observed: dict[str, Observed], case: str) -> None:
    model_name, kwargs = CASES[case]
    build, make_inputs = MODELS[model_name]
    torch.manual_seed(0)
    model = build()
    torch.manual_seed(100)
    plan = plan_buckets(model, example_inputs=make_inputs(), **kwargs)
    seen = observed[case]
    assert sorted(seen) == list(range(1, ITERATIONS + 1))
    for iteration in range(1, ITERATIONS + 1):
        planned = plan.iteration(iteration)
        got = seen[iteration]
        assert [b.fqns for b in planned] == [fqns for fqns, _, _ in got], f"iteration {iteration}"
        for bucket, (_, nbytes, index) in zip(planned, got, strict=True):
            assert nbytes is None or bucket.nbytes == nbytes
            # static_graph's first iteration reduces every bucket at the end of backward
            # (Reducer::delay_all_reduce) and each then reports index() 0.
            delayed = kwargs.get("static_graph") and iteration == 1
            assert index == (0 if delayed else bucket.index)


def test_rebuild_timing_facts(observed: dict[str, Observed]) -> None:
    """The facts the planner encodes, stated on raw observations."""
    one = [["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"]]
    rebuilt = [["c.bias", "c.weight"], ["b.bias", "b.weight"], ["a.bias", "a.weight"]]
    plain = observed["mlp-cap0.001-plain"]
    assert [b[0] for b in plain[1]] == one and [b[0] for b in plain[2]] == rebuilt
    static = observed["mlp-cap0.001-static"]
    assert [b[0] for b in static[2]] == one and [b[0] for b in static[3]] == rebuilt
    find_unused = observed["mlp-cap0.001-find_unused"]
    assert find_unused[1] == find_unused[2] == find_unused[3] and len(find_unused[1]) == 4


# -- which parameters DDP reduces, in which order ---------------------------------------------


class Shared(nn.Module):
    """A root parameter, a tied weight, a frozen layer and layers to ignore."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(3))
        self.emb = nn.Embedding(10, 4, sparse=sparse)
        self.frozen = nn.Linear(4, 4).requires_grad_(False)
        self.a = nn.Linear(4, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # reduced once, under its first name
        self.ignored = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


@pytest.fixture
def one_rank() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("this process already has a process group")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize(
    "ignore",
    [[], ["ignored.weight", ".pos"], ["pos", "inner.1.bias", "a.weight"]],
    ids=["none", "dotted-root", "plain-root"],  # DDP's key for a root parameter is ".pos"
)
def test_reducer_params_are_the_ones_ddp_reduces(
    one_rank: None, sparse: bool, ignore: list[str]
) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = Shared(sparse)
    if ignore:
        DDP._set_params_and_buffers_to_ignore_for_model(model, ignore)
    ddp = DDP(model)
    expected, expect_sparse = ddp._build_params_for_reducer()
    for source in (ddp, model):  # the probe passes the DDP model, the planner its module
        rows = reducer_params(source)
        assert [id(r.param) for r in rows] == [id(p) for p in expected]
        assert [r.sparse_grad for r in rows] == expect_sparse
    assert plan_buckets(model).param_order == [r.fqn for r in rows]
    if sparse:
        return  # the Reducer cannot list a sparse bucket before its first gradient
    # The Reducer's own numbering: its one initial bucket holds every parameter by index.
    index = {id(r.param): i for i, r in enumerate(rows)}
    (bucket,) = ddp.reducer._get_zeros_like_grad_buckets()
    assert [index[id(p)] for p in bucket.parameters()] == list(range(len(rows)))


# -- delay_all_reduce_named_params ------------------------------------------------------------


@SKIP_DELAY
def test_delayed_parameters_are_in_no_bucket(observed: dict[str, Observed]) -> None:
    """The facts the planner encodes, on raw observations: a delayed name leaves every
    bucket in every iteration, unless DDP's key misses it (a root one by its fqn)."""
    for case, (model_name, kwargs) in CASES.items():
        names = kwargs.get("delay_all_reduce_named_params")
        if names is None:
            continue
        reduced = {f for buckets in observed[case].values() for b in buckets for f in b[0]}
        gone = {n.removeprefix(".") for n in names if n != "pos"}
        assert not reduced & gone, case
        if model_name == "transformer":  # its root parameter "pos"
            assert ("pos" in reduced) == (".pos" not in names), case
    tied = observed["transformer-delay-tied-cap0.01-plain"]
    assert "head.weight" in {f for b in tied[1] for f in b[0]}  # the tensor stays, renamed


CLUSTER = {"timeout": 60}  # the shared fixture's options (conftest.py)


def _watched(ctx: Any, model_name: str, ddp_kwargs: dict[str, Any]) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    build, make_inputs = MODELS[model_name]
    torch.manual_seed(0)
    model = build()
    ddp = DDP(model, **_ddp_kwargs(model, ddp_kwargs))
    ish.watch(ddp)
    for iteration in range(1, ITERATIONS + 1):
        torch.manual_seed(100 * iteration + ctx.rank)
        ddp(*make_inputs()).sum().backward()


@pytest.mark.parametrize(
    "case",
    [
        "mlp-delay-cap0.001-plain",
        "transformer-delay-key-cap0.01-plain",
        "transformer-delay-root-cap0.01-static",
    ],
)
@SKIP_DELAY
def test_watched_run_plans_the_delayed_parameters(cluster: ish.Cluster, case: str) -> None:
    model_name, kwargs = CASES[case]
    run = cluster.run(_watched, model_name, kwargs)
    bm = run.buckets
    names = kwargs["delay_all_reduce_named_params"]
    info = bm.info
    assert info is not None and info.delayed is not None
    assert info.delayed.fqns == names  # as given to DDP, read back from it
    assert info.delayed.hook == kwargs["param_to_hook_all_reduce"]
    plan = bm.plan()
    assert plan.delayed is not None
    assert plan.delayed.fqns == [n.removeprefix(".") for n in names]
    assert plan.delayed.in_buckets == (["pos"] if names == ["pos"] else [])
    for rank in (0, 1):
        for iteration in range(1, ITERATIONS + 1):
            comparison = bm.compare(iteration, rank)
            assert comparison.matches, (iteration, rank, comparison.summary)
    # The re-plan from the recording is the planner's plan of the model itself.
    build, make_inputs = MODELS[model_name]
    torch.manual_seed(0)
    model = build()
    torch.manual_seed(100)
    direct = plan_buckets(model, example_inputs=make_inputs(), **kwargs)
    assert [b.fqns for b in direct.rebuilt] == [b.fqns for b in plan.rebuilt]


@pytest.mark.parametrize("root", [".pos", "pos"])
def test_probe_reads_the_delayed_parameters_from_ddp(one_rank: None, root: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from interactive_shard.buckets._probe_checks import check_watchable
    from interactive_shard.buckets._probe_data import delayed_params

    model = Shared(sparse=False)
    names = ["a.weight", root, "inner.0.bias"]
    kwargs = {"delay_all_reduce_named_params": names, "param_to_hook_all_reduce": "inner.1.weight"}
    ddp = DDP(model, **_ddp_kwargs(model, kwargs))
    expected, _ = ddp._build_params_for_reducer()
    rows = reducer_params(ddp)  # the probe's list: DDP's parameters_to_ignore holds the names
    assert [id(r.param) for r in rows] == [id(p) for p in expected]
    assert ("pos" in [r.fqn for r in rows]) == (root == "pos")
    assert plan_buckets(model, **kwargs).param_order == [r.fqn for r in rows]
    delayed = delayed_params(ddp)
    assert delayed is not None and delayed.fqns == names
    assert delayed.modules == ["a", "", "inner.0"]
    assert delayed.module_types == ["Linear", "Shared", "Linear"]
    assert delayed.shapes == [(4, 4), (3,), (4,)] and delayed.hook == "inner.1.weight"
    # Every trainable parameter delayed: DDP builds no Reducer, nothing to watch.
    everything = [
        f"{m}.{n}"
        for m, sub in model.named_modules()
        for n, p in sub.named_parameters(recurse=False)
        if p.requires_grad
    ]
    alone = DDP(
        model, **_ddp_kwargs(model, {**kwargs, "delay_all_reduce_named_params": everything})
    )
    with pytest.raises(ValueError, match="DDP built no Reducer"):
        check_watchable(alone, "off", None, None)


def test_the_spy_forwards_every_collective_of_the_reducer_from_python(
    one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Note [A spy's collectives go through Python]: a collective the Reducer calls on
    the spy that the spy does not override runs with the GIL held up to gloo's queue
    lock, and deadlocks against a gloo worker that frees a work under that lock. So
    each one the Reducer issues must land in a Python method of the spy (whose call of
    the inner group releases the GIL): its bucket all-reduces and, at iteration 2,
    the broadcast of the rebuilt bucket indices."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from interactive_shard.probing import spy as _spy

    called: list[str] = []
    for name in ("allreduce", "broadcast"):
        assert name in vars(_spy.SpyGroup), f"SpyGroup must forward {name} from Python"
        forward = getattr(_spy.SpyGroup, name)

        def spied(self: Any, *args: Any, _name: str = name, _f: Any = forward) -> Any:
            called.append(_name)
            return _f(self, *args)

        monkeypatch.setattr(_spy.SpyGroup, name, spied)
    for find_unused in (False, True):
        called.clear()
        torch.manual_seed(0)
        ddp = DDP(
            nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)), find_unused_parameters=find_unused
        )
        assert _spy.attach(ddp, lambda launch: None) is not None
        for _ in range(3):
            ddp(torch.randn(4, 8)).sum().backward()
        # Rebuilt once (its indices, then its bucket sizes), except with unused
        # parameters, where DDP never rebuilds and all-reduces a used map each iteration.
        assert called.count("broadcast") == (0 if find_unused else 2)
        assert called.count("allreduce") == (6 if find_unused else 3)
