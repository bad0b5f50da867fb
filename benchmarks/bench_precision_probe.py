"""Step-time overhead of the precision probe on FSDP2: 2-rank gloo on CPU, interleaved.

Each rank builds same-seeded copies of one model, ``--layers`` blocks of
``Linear(--width, --width)`` + ReLU (default 10 x 1024: 10,496,000 parameters), every
block ``fully_shard``-ed and then the root, all with one ``MixedPrecisionPolicy``
(``--policy fp32``: ``MixedPrecisionPolicy()``, the default; ``bf16``:
``param_dtype=bfloat16, reduce_dtype=float32``, 3-4 times slower per step on a CPU
without bfloat16 instructions). Variants:

* ``plain``: FSDP2 as is;
* ``probe``: FSDP2 + ``ish.watch(model)``, which attaches the precision probe (Note
  [Precision probe]: hooks per unit, spying all-gather / reduce-scatter comms, wrapped
  ``pre_backward`` / ``post_backward``, a global optimizer step pre-hook).

The probe's optimizer step pre-hook is process-wide (``register_optimizer_step_pre_hook``):
``plain``'s steps pass through it too, a cached lookup per attached probe that finds
none of its parameters (microseconds).

A step is a training step: forward, backward, SGD ``step`` and ``zero_grad``, on a
fixed batch per rank. Steps of the two variants alternate one by one, in an order that
rotates, so load from other processes hits both alike; step times are rank 0's (FSDP's
collectives keep the ranks in step). Prints per variant the median and lower quartile
step time, three ratios probe/plain (of medians, of lower quartiles, and the median of
paired ratios, step i over step i run back to back), the noise (the spread of plain's
step times, and of the paired ratios round by round), then:

* the probe's **own time per step**: a third copy (``timed``), watched with every probe
  callback timed from inside (the hooks the probe wraps in ``guarded``, its collective
  notes, its iteration count and its optimizer-step reading, ``time.perf_counter`` and
  ``time.thread_time`` around each; nested calls counted once), run for
  ``--timed-steps`` steps after the interleaved rounds, so the timing does not slow the
  ``probe`` variant down; and the events it emits per step;
* the CPU time this process (the collector receiving the ranks' events) spends per
  step of ``probe`` during the rounds: on a machine where the ranks use every core, the
  events cost the ranks that too;
* **bit-identical training**: after the rounds, ``plain`` and ``probe`` have taken the
  same steps on the same batches; their parameters must be equal bit for bit (the probe
  reads dtypes and sizes, never changes a value).

The last line is a JSON summary. Target: paired probe/plain <= 1.03.

    python benchmarks/bench_precision_probe.py [--rounds 16] [--steps 4] [--policy fp32|bf16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import interactive_shard as ish

VARIANTS = ("plain", "probe")
TARGET = 1.03


def _model(layers: int, width: int, policy: str) -> Any:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if policy == "bf16"
        else MixedPrecisionPolicy()
    )
    torch.manual_seed(0)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)]
    )
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for block in model:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


class _Timer:
    """The probe's own time: every callback it installs, timed from inside.

    Exclusive: a timed call made inside another timed call counts once. ``seconds`` is
    wall time (``perf_counter``: it includes waiting for the GIL or a core, on a loaded
    machine much of it), ``cpu`` this thread's CPU time (``thread_time``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu = 0.0
        self.calls = 0
        self._depth = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.cpu += time.thread_time() - cpu
                self.calls += 1
                self._depth -= 1

        return timed


def _timed_attach(model: Any, timer: _Timer) -> Any:
    """``ish.watch(model)`` with the hooks the probe installs timed (what ``_install``
    wraps in ``guarded``: the unit hooks, the cast observer, the backward notes)."""
    from interactive_shard.precision import _probe_fsdp2

    real_guarded = _probe_fsdp2.guarded
    _probe_fsdp2.guarded = lambda fn: timer.wrap(real_guarded(fn))
    try:
        return ish.watch(model)
    finally:
        _probe_fsdp2.guarded = real_guarded


def _build(ctx: Any, layers: int, width: int, policy: str) -> int:
    import torch

    models, optimizers = {}, {}
    for name in (*VARIANTS, "timed"):
        models[name] = _model(layers, width, policy)
        optimizers[name] = torch.optim.SGD(models[name].parameters(), lr=1e-4)
    ctx.state["probe"] = ish.watch(models["probe"])
    ctx.state["timer"] = timer = _Timer()
    ctx.state["timed"] = _timed_attach(models["timed"], timer)
    ctx.state["models"], ctx.state["optimizers"] = models, optimizers
    return sum(p.numel() for p in models["plain"].parameters())


def _batch(ctx: Any, batch: int, width: int) -> Any:
    import torch

    return torch.randn(batch, width, generator=torch.Generator().manual_seed(ctx.rank))


def _step(ctx: Any, name: str, x: Any) -> float:
    model, opt = ctx.state["models"][name], ctx.state["optimizers"][name]
    start = time.perf_counter()
    model(x).float().square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def _round(ctx: Any, steps: int, batch: int, width: int, rotate: int) -> dict[str, list[float]]:
    """``steps`` times: one step of each variant, the first variant alternating."""
    x = _batch(ctx, batch, width)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for i in range(steps):
        k = (i + rotate) % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:
            times[name].append(_step(ctx, name, x))
    return times


def _timed_round(ctx: Any, steps: int, batch: int, width: int) -> dict[str, Any]:
    """The ``timed`` copy: step time, the probe's own time and its events, per step.

    While it steps, the probe's methods called from outside those hooks are timed too
    (its collective notes, the iteration count, the optimizer-step reading): patched on
    the class, so only here, where no other watched model steps."""
    from interactive_shard.precision import _probe_common

    x = _batch(ctx, batch, width)
    timer, handle = ctx.state["timer"], ctx.state["timed"]
    recorder = handle.probes["precision"]
    recorder_class = _probe_common.PrecisionRecorder
    saved = {n: getattr(recorder_class, n) for n in ("collective", "begin_forward", "_before_step")}
    for name, fn in saved.items():
        setattr(_probe_common.PrecisionRecorder, name, timer.wrap(fn))
    out: dict[str, list[float]] = {"step": [], "own": [], "own_cpu": [], "calls": [], "events": []}
    try:
        for _ in range(steps):
            seconds, cpu, calls, events = timer.seconds, timer.cpu, timer.calls, recorder.emitted
            out["step"].append(_step(ctx, "timed", x))
            out["own"].append(timer.seconds - seconds)
            out["own_cpu"].append(timer.cpu - cpu)
            out["calls"].append(timer.calls - calls)
            out["events"].append(recorder.emitted - events)
    finally:
        for name, fn in saved.items():
            setattr(_probe_common.PrecisionRecorder, name, fn)
    return out


def _identical(ctx: Any) -> dict[str, Any]:
    """Whether ``plain`` and ``probe`` hold the same parameters, bit for bit (this rank's
    shards), and the probe's iteration count."""
    import torch

    plain, probe = (ctx.state["models"][n].parameters() for n in VARIANTS)
    same = all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(plain, probe, strict=True))
    return {"identical": same, "iterations": ctx.state["probe"].probes["precision"].iteration}


def _quartile(ts: list[float]) -> float:
    return statistics.quantiles(ts, n=4)[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--policy", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4, help="steps of each variant per round")
    parser.add_argument("--timed-steps", type=int, default=8, help="steps of the timed copy")
    args = parser.parse_args()
    shape = (args.batch, args.width)

    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    per_round: list[float] = []  # median paired ratio of each round
    t_start = time.monotonic()
    with ish.Cluster(2, timeout=600, echo=False) as cluster:
        numel = cluster.run(_build, args.layers, args.width, args.policy).results[0]
        print(
            f"model: {args.layers} x Linear({args.width}, {args.width}) + ReLU = {numel:,} "
            f"parameters, each block and the root an FSDP2 unit, policy {args.policy}, "
            f"batch {args.batch}, SGD; 2 ranks, gloo, CPU",
            flush=True,
        )
        cluster.run(_round, 2, *shape, 0)  # warm-up: lazy init, allocator, gloo buffers
        cluster.run(_timed_round, 2, *shape)
        driver_cpu = time.process_time()
        for r in range(args.rounds):
            times = cluster.run(_round, args.steps, *shape, r).results[0]
            for name in VARIANTS:
                samples[name].extend(times[name])
            ratios = [a / b for a, b in zip(times["probe"], times["plain"], strict=True)]
            per_round.append(statistics.median(ratios))
        driver_cpu = time.process_time() - driver_cpu
        timed = cluster.run(_timed_round, args.timed_steps, *shape).results[0]
        checks = cluster.run(_identical).results
    medians = {name: statistics.median(ts) for name, ts in samples.items()}
    quartiles = {name: _quartile(ts) for name, ts in samples.items()}
    pairs = [a / b for a, b in zip(samples["probe"], samples["plain"], strict=True)]
    paired = statistics.median(pairs)
    spread = (_quartile(samples["plain"]), statistics.quantiles(samples["plain"], n=4)[2])
    noise = (spread[1] - spread[0]) / medians["plain"]
    own_ms = statistics.median(timed["own"]) * 1e3
    own_cpu_ms = statistics.median(timed["own_cpu"]) * 1e3
    own_share = statistics.median(o / s for o, s in zip(timed["own"], timed["step"], strict=True))
    events = statistics.median(timed["events"])
    calls = statistics.median(timed["calls"])
    identical = all(c["identical"] for c in checks)
    driver_ms = driver_cpu / len(samples["probe"]) * 1e3

    steps = len(samples["plain"])
    print(f"{args.rounds} rounds x {args.steps} steps per variant, interleaved ({steps} each)")
    for name in VARIANTS:
        print(
            f"{name:>6}: median step {medians[name] * 1e3:7.1f} ms, lower quartile "
            f"{quartiles[name] * 1e3:7.1f} ms (min {min(samples[name]) * 1e3:.1f}, "
            f"max {max(samples[name]) * 1e3:.1f})"
        )
    print(
        f"probe/plain: medians {medians['probe'] / medians['plain']:.3f}, lower quartiles "
        f"{quartiles['probe'] / quartiles['plain']:.3f}, paired {paired:.3f} "
        f"(pairs min {min(pairs):.3f}, max {max(pairs):.3f})"
    )
    print(
        f"noise: plain's interquartile range is {noise:.1%} of its median; per-round paired "
        f"ratios {min(per_round):.3f} .. {max(per_round):.3f}"
    )
    print(
        f"the probe's own time (timed copy, {args.timed_steps} steps): median {own_ms:.2f} ms "
        f"wall per step = {own_share:.2%} of a step, {own_cpu_ms:.2f} ms of thread CPU time "
        f"({calls:.0f} callbacks, {events:.0f} events per step; step "
        f"{statistics.median(timed['step']) * 1e3:.1f} ms)"
    )
    print(
        f"this process (the collector: it receives and stores every rank's events) used "
        f"{driver_ms:.1f} ms of CPU per probe step during the rounds, on the cores the "
        f"ranks share (an upper bound: cluster.run's own work included)"
    )
    print(
        f"bit-identical training with and without the probe: {identical} "
        f"(probe iterations per rank {[c['iterations'] for c in checks]})"
    )
    ok = paired <= TARGET
    print(f"probe/plain paired {paired:.3f} ({'within' if ok else 'ABOVE'} {TARGET})")
    print(f"wall time {time.monotonic() - t_start:.0f} s")
    summary = {
        "params": numel,
        "policy": args.policy,
        "rounds": args.rounds,
        "steps": steps,
        "median_ms": {k: round(v * 1e3, 2) for k, v in medians.items()},
        "q1_ms": {k: round(v * 1e3, 2) for k, v in quartiles.items()},
        "paired": round(paired, 4),
        "noise_iqr": round(noise, 4),
        "round_paired": [round(min(per_round), 4), round(max(per_round), 4)],
        "own_ms": round(own_ms, 3),
        "own_share": round(own_share, 5),
        "own_cpu_ms": round(own_cpu_ms, 3),
        "events_per_step": events,
        "driver_cpu_ms": round(driver_ms, 2),
        "identical": identical,
    }
    print(json.dumps(summary))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
