"""The features so far on CUDA, one line per case: ``PASS|FAIL|SKIP <case>: <details>``.

    python benchmarks/gpu_check.py

Cases (each on real ranks started by ``ish.Cluster``):

* ``gloo-shared-gpu-buckets``: 2 ranks over gloo on CUDA tensors (with one GPU both
  share it), DDP + ``ish.watch`` for a few steps: the bucket map's planned buckets equal
  the observed ones on every rank in iteration 1 and after the rebuild, health clean;
* ``gloo-shared-gpu-splits-inductor``: the same ranks, ``torch.compile(ddp,
  backend="inductor")`` + ``ish.watch``: captured partitions equal
  ``ish.plan_splits`` (planned in this process, on CPU), compiled outputs equal eager;
* ``gloo-shared-gpu-precision-fsdp2``: the same ranks, a small model under FSDP2 with
  nested policies (a bfloat16 unit and a float16 unit under a float32 root):
  ``ish.plan_precision`` (in this process, on CPU) predicts the float16 output reaching
  the float32 head and gives the fix (``output_dtype=float32`` on that unit); with the
  fix, ``ish.watch`` on the ranks observes every unit's dtype as planned, and the
  output is float32;
* ``gloo-shared-gpu-precision-ddp``: the same ranks, DDP native mixed precision
  (``DDP(mixed_precision=_MixedPrecision(param_dtype=float16))``, which fails on CPU:
  it records CUDA events): output float16, parameters and gradients float32 after
  backward, every phase as planned; SKIP with ``--cpu``;
* ``gloo-shared-gpu-timeline-fsdp2``: the same ranks, FSDP2 with one unit per block,
  each block compiled (aot_eager), ``ish.watch(model, timeline=True)``: compute spans
  timed with CUDA events (on the host clock through an anchor event), each unit's
  compiled backward followed by its reduce-scatter in backward, on every rank;
* ``gloo-shared-gpu-optimizer-in-backward``: the same ranks, DDP with
  ``_apply_optimizer_in_backward(SGD)`` (fails on CPU: it needs an accelerator) and
  ``ish.watch``: the lifecycle probe counts the optimizer steps taken inside each
  backward (one per parameter), gradients are None after backward, parameters moved;
  SKIP with ``--cpu``;
* ``nccl-gpu-per-rank``: 2 ranks over NCCL, one GPU each (bucket map and splits with
  aot_eager), where at least 2 GPUs are visible; else SKIP.

Without CUDA every case is SKIP and the exit status is 0; it is 1 if any case FAILs.
Written for torch 2.11 and 2.13 (the lent GPU machine runs 2.11): nothing newer than
2.11 is used here. The ranks are spawned (see ``SETTINGS``); the script stays under 4
minutes (each case has its deadline, ``DEADLINES_S``). ``--cpu`` runs the gloo
cases on CPU, to try the script on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

# Seconds from the start by which each case must be done (else it FAILs with a timeout):
# the whole script stays under 4 minutes, inductor's cold compile gets the most.
DEADLINES_S = (50.0, 145.0, 165.0, 180.0, 198.0, 212.0, 235.0)
MAX_DETAILS = 1000  # characters of a FAIL line's details
STEPS = 4
WIDTH, LAYERS, BATCH = 512, 4, 32
BUCKET_CAP_MB = 1.0  # each Linear(512, 512) is 1 MiB: several buckets and partitions
RTOL = ATOL = 1e-4  # compiled against eager outputs, fp32 (no TF32 either way)
# spawn, not the default fork: torch.cuda.is_available() (which ish.Cluster calls too)
# runs cuInit in this process, and a forked child cannot use CUDA after that ("poison
# fork", torch's multiprocessing notes) while torch.cuda.is_initialized() stays False.
SETTINGS: dict[str, Any] = {"start_method": "spawn", "timeout": 120, "echo": False}

CASES = (
    "gloo-shared-gpu-buckets",
    "gloo-shared-gpu-splits-inductor",
    "gloo-shared-gpu-precision-fsdp2",
    "gloo-shared-gpu-precision-ddp",
    "gloo-shared-gpu-timeline-fsdp2",
    "gloo-shared-gpu-optimizer-in-backward",
    "nccl-gpu-per-rank",
)
PRECISION_STEPS = 2  # the second iteration is compared: after an optimizer step


def _net() -> Any:
    """A user module (``nn.Sequential`` would compile nothing), same weights every call."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
            self.head = nn.Linear(WIDTH, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return self.head(x)

    torch.manual_seed(0)
    return Net()


def _mp_net() -> Any:
    """``embed -> block1 -> block2 -> head`` (16 features): units ``block1``, ``block2``
    and the root, which owns ``embed`` and ``head``; same weights every call."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x))

    class MpNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(8, 16)
            self.block1 = Block()
            self.block2 = Block()
            self.head = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.block2(self.block1(self.embed(x))))

    torch.manual_seed(0)
    return MpNet()


def _mp_input(rank: int = 0) -> Any:
    import torch

    return torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))


def _nested_policies() -> dict[str, Any]:
    """bfloat16 ``block1`` and float16 ``block2`` under a float32 root: the float16
    output reaches the float32 ``head`` (the plan's failure, before its fix)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {
        "": MixedPrecisionPolicy(),
        "block1": MixedPrecisionPolicy(param_dtype=torch.bfloat16),
        "block2": MixedPrecisionPolicy(param_dtype=torch.float16),
    }


# -- rank code --------------------------------------------------------------------------------
def _ddp(ctx: Any, model: Any) -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [ctx.device] if ctx.device.type == "cuda" else None
    return DDP(model.to(ctx.device), device_ids=ids, bucket_cap_mb=BUCKET_CAP_MB)


def _sync(ctx: Any) -> None:
    import torch

    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _input(ctx: Any) -> Any:
    import torch

    g = torch.Generator().manual_seed(ctx.rank)
    return torch.randn(BATCH, WIDTH, generator=g).to(ctx.device)


def _train(ctx: Any) -> dict[str, Any]:
    """DDP + ish.watch for a few SGD steps on this rank's device."""
    import torch

    import interactive_shard as ish

    ddp = _ddp(ctx, _net())
    watch = ish.watch(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = _input(ctx)
    for _ in range(STEPS):
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(ctx)
    watch.detach()
    return {"device": str(next(ddp.parameters()).device), "iterations": watch.iteration}


def _compile(ctx: Any, backend: str) -> dict[str, Any]:
    """torch.compile(DDP) + ish.watch: one forward against eager, one backward."""
    import torch

    import interactive_shard as ish

    inductor = getattr(getattr(torch, "_inductor", None), "config", None)
    if backend == "inductor" and inductor is not None and hasattr(inductor, "compile_threads"):
        inductor.compile_threads = 1  # no worker pool in a forked rank; a few kernels only
    torch._dynamo.reset()
    eager = _net().to(ctx.device)
    ddp = _ddp(ctx, _net())
    compiled = torch.compile(ddp, backend=backend)
    watch = ish.watch(compiled)
    x = _input(ctx)
    start = time.perf_counter()
    out = compiled(x)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        ref = eager(x)
    close = bool(torch.allclose(out, ref, rtol=RTOL, atol=ATOL))
    diff = float((out.detach() - ref).abs().max())
    out.square().mean().backward()
    grads = all(p.grad is not None for p in ddp.parameters())
    _sync(ctx)
    watch.detach()
    return {
        "close": close,
        "diff": diff,
        "grads": grads,
        "device": str(out.device),
        "compile_s": seconds,
    }


def _fsdp2_precision(ctx: Any, policies: dict[str, Any]) -> dict[str, Any]:
    """FSDP2 units as ``policies`` say (inner first, then the root) + ish.watch, a few
    SGD steps on this rank's device."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import interactive_shard as ish

    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = _mp_net()
    for fqn in sorted((f for f in policies if f), key=lambda f: -f.count(".")):
        fully_shard(model.get_submodule(fqn), mesh=mesh, mp_policy=policies[fqn])
    fully_shard(model, mesh=mesh, mp_policy=policies[""])
    watch = ish.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = _mp_input(ctx.rank).to(ctx.device)
    out = x
    for _ in range(PRECISION_STEPS):
        out = model(x)
        out.float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(ctx)
    watch.detach()
    return {"output": str(out.dtype), "device": str(out.device)}


def _ddp_precision(ctx: Any, policy: Any) -> dict[str, Any]:
    """DDP(mixed_precision=policy) + ish.watch; dtypes of the output, and of the
    parameters and gradients after each backward (before the optimizer step)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import interactive_shard as ish

    ids = [ctx.device] if ctx.device.type == "cuda" else None
    ddp = DDP(_mp_net().to(ctx.device), device_ids=ids, mixed_precision=policy)
    watch = ish.watch(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = _mp_input(ctx.rank).to(ctx.device)
    outputs, params, grads = set(), set(), set()
    for _ in range(PRECISION_STEPS):
        out = ddp(x)
        outputs.add(str(out.dtype))
        out.float().square().mean().backward()
        params |= {str(p.dtype) for p in ddp.parameters()}
        grads |= {str(p.grad.dtype) if p.grad is not None else "None" for p in ddp.parameters()}
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(ctx)
    watch.detach()
    return {
        "outputs": sorted(outputs),
        "params": sorted(params),
        "grads": sorted(grads),
        "device": str(out.device),
    }


# -- checks in this process ---------------------------------------------------------------------
def _wait(run: Any, deadline: float) -> Any:
    return run.wait(timeout=max(1.0, deadline - time.monotonic()))


def check_buckets(cluster: Any, deadline: float) -> tuple[str, str]:
    run = _wait(cluster.run(_train, wait=False), deadline)
    bm = run.buckets
    its = bm.iterations
    if len(its) < 2:
        return "FAIL", f"bucket map saw iterations {its}, expected {STEPS}"
    wrong = []
    for it in (its[0], its[-1]):
        for rank in range(len(run.results)):
            cmp = bm.compare(it, rank)
            if not cmp.matches:
                wrong.append(f"iteration {it}, rank {rank}: {'; '.join(cmp.differences)}")
    health = bm.health
    if wrong or health:
        found = wrong + [f.message for f in health]
        return "FAIL", " | ".join(found)
    devices = ", ".join(r["device"] for r in run.results)
    first, last = len(bm.observed(its[0])), len(bm.observed(its[-1]))
    return "PASS", (
        f"ranks on {devices}; {len(its)} iterations; planned == observed on every rank "
        f"({first} bucket(s) in iteration {its[0]}, {last} after the rebuild); health clean"
    )


def check_splits(cluster: Any, backend: str, deadline: float) -> tuple[str, str]:
    import torch

    import interactive_shard as ish

    run = _wait(cluster.run(_compile, backend, wait=False), deadline)
    results = run.results
    plan = ish.plan_splits(_net(), torch.randn(BATCH, WIDTH), bucket_cap_mb=BUCKET_CAP_MB)
    cmp = run.splits.compare(plan)
    problems = list(cmp.differences)
    comps = [run.splits.compilations(r) for r in range(len(results))]
    backends = sorted({c.backend for per_rank in comps for c in per_rank})
    for rank, got in enumerate(results):
        if not got["close"]:
            problems.append(f"rank {rank}: output differs from eager by {got['diff']:.3g}")
        if not got["grads"]:
            problems.append(f"rank {rank}: a parameter has no gradient after backward")
    if any(len(c) != 1 for c in comps):
        problems.append(f"compiles per rank {[len(c) for c in comps]}, expected 1 each")
    if backends != [backend]:
        problems.append(f"captured backend(s) {backends}, expected {backend!r}")
    if problems:
        return "FAIL", " | ".join(problems)
    parts = len(plan.partitions)
    diff = max(r["diff"] for r in results)
    compile_s = max(r["compile_s"] for r in results)
    devices = ", ".join(r["device"] for r in results)
    return "PASS", (
        f"ranks on {devices}; {parts} partitions planned == captured on every rank "
        f"(backend {backends[0]}); outputs equal eager (max |diff| {diff:.2g}); "
        f"first forward with compile {compile_s:.1f} s"
    )


def _precision_problems(run: Any, plan: Any) -> list[str]:
    """Planned vs observed on every rank at the last iteration, and no failure."""
    problems = list(run.precision.compare(plan).differences)
    iterations = run.precision.iterations
    if len(iterations) != PRECISION_STEPS:
        problems.append(f"precision iterations {iterations}, expected {PRECISION_STEPS}")
    problems += [
        f"rank {f.rank} failed in {f.consumer!r}: {f.message}" for f in run.precision.failures
    ]
    return problems


def check_precision_fsdp2(cluster: Any, deadline: float) -> tuple[str, str]:
    import interactive_shard as ish

    nested = ish.plan_precision(_mp_net(), _nested_policies(), example_inputs=_mp_input())
    if not nested.failures or nested.failures[0].fix is None:
        return "FAIL", f"the planner predicted no failure (or no fix) for {nested!r}"
    failure = nested.failures[0]
    fixed = failure.fix
    plan = ish.plan_precision(_mp_net(), fixed, example_inputs=_mp_input())
    if not plan.ok:
        return "FAIL", f"the plan of the fix still fails: {plan.failures[0].error}"
    run = _wait(cluster.run(_fsdp2_precision, fixed, wait=False), deadline)
    problems = _precision_problems(run, plan)
    outputs = sorted({r["output"] for r in run.results})
    if outputs != ["torch.float32"]:
        problems.append(f"outputs {outputs}, expected float32 (output_dtype)")
    if problems:
        return "FAIL", " | ".join(problems)
    devices = ", ".join(r["device"] for r in run.results)
    dtypes = {u.fqn or "root": u.dtypes["param"].removeprefix("torch.") for u in plan.units}
    return "PASS", (
        f"ranks on {devices}; planner: {failure.error!r} at unit {failure.unit!r} in "
        f"{failure.consumer!r}, fixed by {failure.fix_note}; with the fix, {len(plan.units)} "
        f"units x {len(plan.units[0].dtypes)} phases planned == observed on every rank "
        f"(compute {dtypes}); output float32"
    )


def _timeline_fsdp2(ctx: Any) -> dict[str, Any]:
    """Three compiled blocks, each its own FSDP2 unit, watched with timeline=True."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import interactive_shard as ish
    from interactive_shard.timeline.examples import Stack

    torch.manual_seed(0)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = Stack(blocks=3, width=256).to(ctx.device)
    for block in model.layers:
        fully_shard(block, mesh=mesh)
        block.compile(backend="aot_eager")
    fully_shard(model, mesh=mesh)
    watch = ish.watch(model, timeline=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(32, 256, device=ctx.device)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(ctx)
    probe = watch.probes["timeline"]
    watch.detach()
    return {"cuda_events": probe._anchor is not None, "device": ctx.device.type}


def check_timeline_fsdp2(cluster: Any, deadline: float) -> tuple[str, str]:
    run = _wait(cluster.run(_timeline_fsdp2, wait=False), deadline)
    if any(r["cuda_events"] != (r["device"] == "cuda") for r in run.results):
        return "FAIL", f"CUDA events used for compute spans on CUDA only: {run.results}"
    clock = "CUDA-event" if run.results[0]["cuda_events"] else "host-clock"
    units = ["layers.2", "layers.1", "layers.0"]
    expected = [x for unit in units for x in (unit, "reduce_scatter")]
    kinds = ["compiled_backward", "collective"]
    problems, overlaps = [], []
    for rank in run.timeline.ranks:
        order = run.timeline.order(rank=rank, iteration=3, phase="backward", kinds=kinds)
        order = [n for n in order if n != "all_gather"]
        if order != expected:
            problems.append(f"rank {rank}: backward order {order}, expected {expected}")
        spans = run.timeline.spans(rank=rank, iteration=3, kinds=["compiled_backward"])
        if len(spans) != 3 or any(s.end < s.start for s in spans):
            problems.append(f"rank {rank}: compiled backward spans {spans}")
        overlaps.append(f"{run.timeline.overlap(rank=rank, iteration=3):.0%}")
    if problems:
        return "FAIL", " | ".join(problems)
    return "PASS", (
        f"3 compiled FSDP2 units, {clock} compute spans; backward order {expected} on "
        f"every rank; backward overlap per rank {overlaps}"
    )


def _optimizer_in_backward(ctx: Any) -> dict[str, Any]:
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward

    import interactive_shard as ish

    torch.manual_seed(0)
    model = _net().to(ctx.device)
    _apply_optimizer_in_backward(torch.optim.SGD, model.parameters(), {"lr": 0.1})
    ddp = _ddp(ctx, model)
    watch = ish.watch(ddp)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        ddp(_input(ctx)).sum().backward()
    _sync(ctx)
    watch.detach()
    return {
        "grads_none": all(p.grad is None for p in model.parameters()),
        "moved": all(
            not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)
        ),
        "params": len(before),
    }


def check_optimizer_in_backward(cluster: Any, deadline: float) -> tuple[str, str]:
    run = _wait(cluster.run(_optimizer_in_backward, wait=False), deadline)
    problems = []
    for rank, result in enumerate(run.results):
        if not (result["grads_none"] and result["moved"]):
            problems.append(f"rank {rank}: {result}")
    (inst,) = run.ddp.instances
    steps = [it.steps_in_backward for it in inst.iterations]
    if not inst.settings["optimizer_in_backward"] or not all(s > 0 for s in steps):
        problems.append(f"lifecycle: settings {inst.settings}, steps in backward {steps}")
    if problems:
        return "FAIL", " | ".join(problems)
    return "PASS", (
        f"optimizer steps inside each backward {steps} ({run.results[0]['params']} "
        "parameters), gradients None after backward, parameters moved, on every rank"
    )


def check_precision_ddp(cluster: Any, deadline: float) -> tuple[str, str]:
    import torch

    import interactive_shard as ish

    try:
        from torch.nn.parallel.distributed import _MixedPrecision
    except ImportError:
        return "SKIP", f"torch {torch.__version__} has no DDP _MixedPrecision"
    policy = _MixedPrecision(param_dtype=torch.float16)
    plan = ish.plan_precision(_mp_net(), {"": policy}, example_inputs=_mp_input())
    run = _wait(cluster.run(_ddp_precision, policy, wait=False), deadline)
    problems = _precision_problems(run, plan)
    expected = {
        "outputs": ["torch.float16"],
        "params": ["torch.float32"],
        "grads": ["torch.float32"],
    }
    for rank, got in enumerate(run.results):
        for key, want in expected.items():
            if got[key] != want:
                problems.append(f"rank {rank}: {key} {got[key]}, expected {want}")
    if problems:
        return "FAIL", " | ".join(problems)
    devices = ", ".join(r["device"] for r in run.results)
    phases = {p: d.removeprefix("torch.") for p, d in plan.unit("").dtypes.items()}
    return "PASS", (
        f"ranks on {devices}; _MixedPrecision(param_dtype=float16): output float16, "
        f"parameters and gradients float32 after backward; planned == observed on every "
        f"rank {phases}"
    )


def _case(name: str, check: Any, *args: Any) -> str:
    """Run one check and print its line; returns the status."""
    try:
        status, details = check(*args)
    except Exception as err:  # a case that raises is a FAIL line, and the next case runs
        status, details = "FAIL", _error(err)
    print(f"{status} {name}: {details[:MAX_DETAILS]}", flush=True)
    return status


def _error(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:500]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="run the gloo cases on CPU (tests this script on a machine without a GPU)",
    )
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.cpu:
        why = f"CUDA is not available (torch {torch.__version__})"
        for name in CASES:
            print(f"SKIP {name}: {why}", flush=True)
        return 0

    import interactive_shard as ish

    start = time.monotonic()
    device = "cpu" if args.cpu else "cuda"
    a, b, c, d, t, o, e = (start + s for s in DEADLINES_S)
    statuses: dict[str, str] = {}
    gloo = CASES[:6]
    try:
        with ish.Cluster(2, backend="gloo", device=device, **SETTINGS) as cluster:
            statuses[gloo[0]] = _case(gloo[0], check_buckets, cluster, a)
            statuses[gloo[1]] = _case(gloo[1], check_splits, cluster, "inductor", b)
            statuses[gloo[2]] = _case(gloo[2], check_precision_fsdp2, cluster, c)
            if args.cpu:
                statuses[gloo[3]] = "SKIP"
                print(
                    f"SKIP {gloo[3]}: --cpu: DDP native mixed precision records CUDA events "
                    "(on CPU its first forward fails: cpu backend doesn't support events)",
                    flush=True,
                )
            else:
                statuses[gloo[3]] = _case(gloo[3], check_precision_ddp, cluster, d)
            statuses[gloo[4]] = _case(gloo[4], check_timeline_fsdp2, cluster, t)
            if args.cpu:
                statuses[gloo[5]] = "SKIP"
                print(
                    f"SKIP {gloo[5]}: --cpu: _apply_optimizer_in_backward needs an "
                    "accelerator (on CPU: Cannot access accelerator device)",
                    flush=True,
                )
            else:
                statuses[gloo[5]] = _case(gloo[5], check_optimizer_in_backward, cluster, o)
    except Exception as err:  # the cluster itself did not start (or stop)
        for name in gloo:
            if name not in statuses:
                statuses[name] = "FAIL"
                print(f"FAIL {name}: 2 ranks over gloo on {device}: {_error(err)}", flush=True)
    nccl_case = CASES[6]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        print(
            f"SKIP {nccl_case}: {gpus} CUDA device(s) visible; NCCL needs one GPU per rank (2)",
            flush=True,
        )
    else:
        try:
            with ish.Cluster(2, backend="nccl", device="cuda", **SETTINGS) as nccl:
                statuses[nccl_case] = _case(nccl_case, _nccl, nccl, e)
        except Exception as err:
            if nccl_case not in statuses:
                statuses[nccl_case] = "FAIL"
                print(f"FAIL {nccl_case}: 2 ranks over NCCL: {_error(err)}", flush=True)
    return 1 if "FAIL" in statuses.values() else 0


def _nccl(cluster: Any, deadline: float) -> tuple[str, str]:
    half = time.monotonic() + (deadline - time.monotonic()) / 2
    status, buckets = check_buckets(cluster, half)
    if status != "PASS":
        return status, f"bucket map: {buckets}"
    status, splits = check_splits(cluster, "aot_eager", deadline)
    return status, f"bucket map: {buckets}; splits: {splits}"


if __name__ == "__main__":
    sys.exit(main())
