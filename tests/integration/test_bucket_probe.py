"""``ish.watch(ddp)`` on real 2-rank (and one 3-rank) gloo DDP runs on CPU.

The rank functions build everything from a seed, so a run with the probe and one
without see the same model and data and can be compared bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

import interactive_shard as ish
from interactive_shard import demo
from interactive_shard.buckets._probe_data import checksums
from interactive_shard.buckets.events import BucketReduced, DdpIteration, DdpWatch
from interactive_shard.buckets.figures import figure_bucket_map
from interactive_shard.buckets.figures_timeline import figure_bucket_timeline
from interactive_shard.probing.compat import ddp as compat_ddp
from interactive_shard.testing import payload_types

WATCH_FIELDS = payload_types(DdpWatch)
# Stricter than the Structs: every reduction finishes, and every backward has gradients.
BUCKET_FIELDS = {**payload_types(BucketReduced), "end_t": float}
ITERATION_FIELDS = {
    **payload_types(DdpIteration),
    "backward_start": float,
    "backward_end": float,
}
WATCH, BUCKET, ITERATION = DdpWatch.KIND, BucketReduced.KIND, DdpIteration.KIND
MLP_FQNS = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]


CLUSTER = {"timeout": 60}  # the shared fixture's options (conftest.py)


# -- rank code ---------------------------------------------------------------------------
def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)
    )


def _train(
    ctx: Any,
    mode: str,
    steps: int = 3,
    gabv: bool = False,
    set_to_none: bool = True,
    hook: Any = None,
    **ddp_kwargs: Any,
) -> dict[str, Any]:
    """``mode``: "plain" (no probe; ``hook`` registered directly) or "probe"."""
    model = _mlp()
    ddp = DDP(model, bucket_cap_mb=0.002, gradient_as_bucket_view=gabv, **ddp_kwargs)
    seen: list[list[str]] = []  # what DDP handed to the user's hook, per bucket
    names = {id(p): n for n, p in model.named_parameters()}
    if hook is not None:
        inner = hook

        def hook(state, bucket):  # type: ignore[no-untyped-def]
            seen.append([names[id(p)] for p in bucket.parameters()])
            return inner(state, bucket)

    probe = None
    if mode == "probe":
        probe = ish.watch(ddp, comm_hook=hook)
    elif hook is not None:
        ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(10 + ctx.rank)
    checks = []
    for _ in ctx.steps(steps):
        opt.zero_grad(set_to_none=set_to_none)
        ddp(torch.randn(8, 16, generator=gen)).pow(2).sum().backward()
        checks.append(checksums(MLP_FQNS, list(model.parameters()), "sampled"))
        opt.step()
    return {
        "grads": [p.grad.clone() for p in model.parameters()],
        "params": [p.detach().clone() for p in model.parameters()],
        "seen": seen,
        "checks": checks,
        "iteration": None if probe is None else probe.iteration,
    }


def _payloads(run: ish.Run, kind: str, rank: int) -> list[dict[str, Any]]:
    return [e.payload for e in run.store.of_kind(kind) if e.rank == rank]


def _check_types(payload: dict[str, Any], fields: dict[str, Any]) -> None:
    assert set(payload) == set(fields), set(payload) ^ set(fields)
    for key, kind in fields.items():
        assert isinstance(payload[key], kind), (key, payload[key])
        if kind is int:
            assert not isinstance(payload[key], bool), key


# -- tests ---------------------------------------------------------------------------------
def test_events_follow_the_schema(cluster: ish.Cluster) -> None:
    run = cluster.run(_train, "probe", 3)
    for rank in range(2):
        (watch,) = _payloads(run, WATCH, rank)
        _check_types(watch, WATCH_FIELDS)
        assert watch["fqns"] == MLP_FQNS
        assert watch["shapes"][:2] == [[32, 16], [32]]
        assert watch["dtypes"] == ["torch.float32"] * 6
        assert watch["modules"] == ["0", "0", "2", "2", "4", "4"]
        assert watch["module_types"] == ["Linear"] * 6
        assert watch["bucket_bytes_cap"] == int(0.002 * 2**20)
        assert (watch["world_size"], watch["user_hook"], watch["checksum"]) == (2, None, "sampled")
        assert watch["find_unused_parameters"] is False and watch["static_graph"] is False

        buckets = _payloads(run, BUCKET, rank)
        for b in buckets:
            _check_types(b, BUCKET_FIELDS)
            assert b["ready_t"] <= b["start_t"] <= b["end_t"]
            assert b["nbytes"] == 4 * sum(torch.Size(s).numel() for s in b["shapes"])
        assert sorted({b["iteration"] for b in buckets}) == [1, 2, 3]
        for it in (1, 2, 3):
            assert sum(b["is_last"] for b in buckets if b["iteration"] == it) == 1

        iterations = _payloads(run, ITERATION, rank)
        assert [p["iteration"] for p in iterations] == [1, 2, 3]
        for p, checks in zip(iterations, run.results[rank]["checks"], strict=True):
            _check_types(p, ITERATION_FIELDS)
            assert sorted(p["ready_order"]) == sorted(MLP_FQNS) and p["unready"] == []
            assert p["ready_t"] == sorted(p["ready_t"])
            assert p["backward_start"] == p["ready_t"][0] <= p["ready_t"][-1] == p["backward_end"]
            # Emitted after DDP's finalize: the .grad the user sees once backward returns.
            assert p["checksums"] == checks
    events = [e for e in run.store.of_kind(ITERATION)]
    assert [e.step for e in events if e.rank == 0] == [1, 2, 3]
    assert run.results[0]["iteration"] == 3


def test_bucket_fqns_are_what_ddp_used(cluster: ish.Cluster) -> None:
    run = cluster.run(_train, "probe", 3, hook=default_hooks.allreduce_hook)
    for rank in range(2):
        # Events come as reductions complete, which need not be in bucket order.
        buckets = sorted(_payloads(run, BUCKET, rank), key=lambda b: (b["iteration"], b["index"]))
        assert [b["fqns"] for b in buckets] == run.results[rank]["seen"]
        # Iteration 1: one bucket, every parameter in registration order (TORCH_NOTES).
        first = [b for b in buckets if b["iteration"] == 1]
        assert [(b["index"], b["fqns"]) for b in first] == [(0, MLP_FQNS)]
        # Then rebuilt in the gradient-ready order DDP recorded in iteration 1.
        ready = _payloads(run, ITERATION, rank)[0]["ready_order"]
        second = [b for b in buckets if b["iteration"] == 2]
        assert len(second) > 1 and [b["index"] for b in second] == list(range(len(second)))
        assert [f for b in second for f in b["fqns"]] == ready
        assert _payloads(run, WATCH, rank)[0]["user_hook"].endswith("_train.<locals>.hook")


@pytest.mark.parametrize("hook", [None, default_hooks.allreduce_hook], ids=["default", "user"])
@pytest.mark.parametrize("gabv", [False, True], ids=["copy", "bucket_view"])
@pytest.mark.parametrize("graph", ["", "find_unused_parameters", "static_graph"])
def test_gradients_are_bit_identical(
    cluster: ish.Cluster, hook: Any, gabv: bool, graph: str
) -> None:
    kw = {graph: True} if graph else {}
    plain = cluster.run(_train, "plain", 4, gabv=gabv, hook=hook, **kw).results
    probed = cluster.run(_train, "probe", 4, gabv=gabv, hook=hook, **kw).results
    for a, b in zip(plain, probed, strict=True):
        for key in ("grads", "params"):
            assert all(torch.equal(x, y) for x, y in zip(a[key], b[key], strict=True)), key


def test_three_ranks_scale_exactly_as_ddp() -> None:
    # World size 3: DDP scales a copied gradient by x * (1/3) and one that already is
    # the bucket view by x / 3; these differ in the last bit, and allreduce_hook (x / 3
    # everywhere) shows the test can tell.
    with ish.Cluster(3, timeout=60) as c:
        for gabv, set_to_none in [(False, True), (True, True), (True, False)]:
            ref = c.run(_train, "plain", 3, gabv=gabv, set_to_none=set_to_none).results
            probed = c.run(_train, "probe", 3, gabv=gabv, set_to_none=set_to_none).results
            for a, b in zip(ref, probed, strict=True):
                assert all(torch.equal(x, y) for x, y in zip(a["grads"], b["grads"], strict=True))
        naive = c.run(_train, "plain", 3, hook=default_hooks.allreduce_hook).results
        ref = c.run(_train, "plain", 3).results
        assert not all(
            torch.equal(x, y) for x, y in zip(ref[0]["grads"], naive[0]["grads"], strict=False)
        )


def _unused(ctx: Any) -> str:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(4, 4)
            self.unused = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    ddp = DDP(Net())
    ish.watch(ddp)
    ddp(torch.randn(2, 4)).sum().backward()
    ctx.flush()
    try:
        ddp(torch.randn(2, 4))
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_unused_parameter_named_before_the_next_forward_fails(cluster: ish.Cluster) -> None:
    run = cluster.run(_unused)
    assert all("Expected to have finished reduction" in r for r in run.results)
    for rank in range(2):
        (it,) = _payloads(run, ITERATION, rank)
        assert it["iteration"] == 1
        assert it["unready"] == ["unused.weight", "unused.bias"]
        assert it["ready_order"] == ["used.bias", "used.weight"]
        assert _payloads(run, BUCKET, rank) == []  # the only bucket never got ready


def _checkpoint_twice(ctx: Any, static_graph: bool, head_too: bool = False, steps: int = 1) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 8)
            self.head = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = checkpoint(self.layer, x, use_reentrant=True)
            h = checkpoint(self.layer, h, use_reentrant=True)
            return checkpoint(self.head, h, use_reentrant=True) if head_too else self.head(h)

    torch.manual_seed(0)
    ddp = DDP(Net(), static_graph=static_graph)
    ish.watch(ddp, checksum="full")
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(ctx.rank), requires_grad=True)
    for _ in ctx.steps(steps):
        ddp(x).sum().backward()


@pytest.mark.parametrize("static_graph", [False, True])
def test_reentrant_checkpoint_twice_diverges_without_static_graph(
    cluster: ish.Cluster, static_graph: bool
) -> None:
    run = cluster.run(_checkpoint_twice, static_graph)
    its = [_payloads(run, ITERATION, rank) for rank in range(2)]
    assert [len(i) for i in its] == [1, 1]
    (r0,), (r1,) = its
    assert r0["repeated"] == r1["repeated"] == ["layer.weight", "layer.bias"]
    assert r0["unready"] == []
    differ = sorted(f for f in r0["checksums"] if r0["checksums"][f] != r1["checksums"][f])
    if static_graph:
        assert differ == []
    else:  # silently: no error, different weights on each rank from the next step on
        assert "layer.weight" in differ and "head.weight" not in differ


def test_reduction_times_recorded_when_ddp_finishes_inside_a_nested_backward(
    cluster: ish.Cluster,
) -> None:
    # See Note [DDP bucket probe], "Nested backward": DDP launches the bucket and waits for
    # it in the first reentrant checkpoint's own backward, before the layer's second
    # gradient. The timeline used to read "exposed 0.00 ms of 0.00 ms" with no bar.
    run = cluster.run(_checkpoint_twice, False, False, 6)
    for rank in range(2):
        its = {p["iteration"]: p for p in _payloads(run, ITERATION, rank)}
        buckets = _payloads(run, BUCKET, rank)
        assert sorted(b["iteration"] for b in buckets) == [1, 2, 3, 4, 5, 6]
        for b in buckets:  # ready at the first arrival: the one DDP reduced
            assert b["ready_t"] < b["start_t"] < b["end_t"] < its[b["iteration"]]["backward_end"]
        for it in its:
            tl = run.buckets.timeline(it, rank)
            assert tl.comm_time > 0 and tl.overlap_fraction == 1.0
            title = figure_bucket_timeline(run.buckets, it, rank).layout.title.text
            assert "100% of reduction time overlapped backward" in title


def test_iteration_ends_with_the_users_backward_when_all_of_it_is_nested(
    cluster: ish.Cluster,
) -> None:
    # Every parameter is reached inside a reentrant checkpoint's own (nested) backward;
    # the probe still emits each iteration at the end of the step's backward.
    run = cluster.run(_checkpoint_twice, True, True, 2)
    for rank in range(2):
        events = [e for e in run.store.of_kind(ITERATION) if e.rank == rank]
        assert [(e.step, e.payload["iteration"]) for e in events] == [(1, 1), (2, 2)]
        assert events[0].payload["unready"] == []


def _preregistered(ctx: Any, builtin: bool) -> None:
    ddp = DDP(nn.Linear(2, 2))
    if builtin:
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    else:
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    ish.watch(ddp)


@pytest.mark.parametrize("builtin", [False, True], ids=["python", "builtin"])
def test_preregistered_hook_gives_a_clear_error(cluster: ish.Cluster, builtin: bool) -> None:
    with pytest.raises(ish.RankError) as info:
        cluster.run(_preregistered, builtin)
    text = str(info.value)
    assert "already has a comm hook" in text
    assert "ish.watch(ddp, comm_hook=hook, state=state)" in text
    assert ("ALLREDUCE" if builtin else "allreduce_hook") in text


def _detach_and_no_sync(ctx: Any) -> dict[str, Any]:
    model = _mlp()
    ddp = DDP(model)
    probe = ish.watch(ddp)
    x = torch.randn(8, 16)
    with ddp.no_sync():  # DDP does not reduce: not an iteration
        ddp(x).sum().backward()
    ddp(x).sum().backward()
    before = probe.iteration
    probe.detach()
    ddp(x).sum().backward()  # reduced by DDP as before, nothing recorded
    with pytest.raises(RuntimeError, match="already called"):
        ish.watch(ish.watch(DDP(_mlp())).ddp)  # twice on one attached model
    return {"before": before, "after": probe.iteration, "repr": repr(probe.probes["buckets"])}


def test_no_sync_is_not_counted_and_detach_stops_recording(cluster: ish.Cluster) -> None:
    run = cluster.run(_detach_and_no_sync)
    assert run.results[0] == {
        "before": 1,
        "after": 1,
        "repr": "Probe(6 params, iteration=1, detached)",
    }
    assert len(_payloads(run, ITERATION, 0)) == 1
    assert {b["iteration"] for b in _payloads(run, BUCKET, 0)} == {1}


def test_watch_rejects_what_it_cannot_watch() -> None:
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        ish.watch(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        ish.watch(object())


@pytest.mark.slow
def test_demo_buckets_read_by_layer_name(cluster: ish.Cluster) -> None:
    run = cluster.run(demo.train, 3)
    names = ["embed", "block1", "block2", "head"]
    fqns = [f"{m}.{p}" for m in names for p in ("weight", "bias")]
    assert run.buckets.info is not None and run.buckets.info.fqns == fqns
    assert [f for b in run.buckets.observed(2) for f in b.fqns] == fqns[::-1]  # ready order
    legend = {t.name for t in figure_bucket_map(run.buckets, 2).data}
    assert set(names) <= legend, legend
    assert run.results[0]["param_checksum"] == run.results[1]["param_checksum"]


def _build_watched(ctx: Any) -> None:
    ddp = DDP(_mlp(), bucket_cap_mb=0.002)
    ctx.state["probe_model"] = (ddp, ish.watch(ddp))


def _step_watched(ctx: Any, steps: int) -> None:
    ddp, _ = ctx.state["probe_model"]
    for _ in ctx.steps(steps):
        ddp(torch.randn(8, 16)).pow(2).sum().backward()


def test_a_model_watched_in_one_run_is_mapped_in_the_next(cluster: ish.Cluster) -> None:
    cluster.run(_build_watched)
    first = cluster.run(_step_watched, 2)
    second = cluster.run(_step_watched, 2)
    for run, iterations in ((first, [1, 2]), (second, [3, 4])):
        assert run.buckets.iterations == iterations
        last = iterations[-1]
        planned = [b.fqns for b in run.buckets.planned(last)]
        assert planned == [b.fqns for b in run.buckets.observed(last, rank=1)]


# -- torch 2.15: DDP(lazy_bucket_allocation=True) ----------------------------------------------
def _lazy(ctx: Any, lazy: bool, as_view: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    kwargs = {"lazy_bucket_allocation": True} if lazy else {}
    ddp = DDP(model, bucket_cap_mb=0.03, gradient_as_bucket_view=as_view, **kwargs)
    ish.watch(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(ctx.rank)
    for _ in ctx.steps(3):
        opt.zero_grad()
        ddp(torch.randn(4, 64, generator=gen)).pow(2).mean().backward()
        opt.step()
    return [p.detach().clone() for p in ddp.parameters()]


@pytest.mark.skipif(
    not compat_ddp.LAZY_BUCKET_ALLOCATION, reason=compat_ddp.missing("lazy_bucket_allocation")
)
@pytest.mark.parametrize("as_view", [False, True], ids=["copy", "bucket-view"])
def test_lazy_bucket_allocation_is_watched_as_planned(cluster: ish.Cluster, as_view: bool) -> None:
    """Bucket storage allocated in backward (torch 2.15): the same buckets, in iteration 1
    and rebuilt, no finding, and the same training as without the probe's knowledge of it."""
    lazy = cluster.run(_lazy, True, as_view)
    assert lazy.buckets.iterations == [1, 2, 3]
    for it in lazy.buckets.iterations:
        comparison = lazy.buckets.compare(it)
        assert comparison.matches, comparison.differences
    assert lazy.buckets.health == []
    eager = cluster.run(_lazy, False, as_view).results
    for a, b in zip(lazy.results[0], eager[0], strict=True):
        assert torch.equal(a, b)
