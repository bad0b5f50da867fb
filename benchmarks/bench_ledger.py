"""Ledger overhead: a DDP step with the collective ledger (what every cluster rank records
by default) over the same step without it, on the same ranks.

One cluster of 2 CPU ranks trains DDP(``--layers`` × Linear(``--width``, ``--width``)) and
all-reduces its loss (the user's own collective) each step. Each round runs ``--steps``
steps with the ledger's recorder on (as every rank has it) and ``--steps`` with it
stopped (``collectives.recorder.stop()``: no listener, no thread), in alternating order;
a round's ratio is the median step with over the median step without (paired: same
processes, same load). The result is the median of the rounds. torch's Flight Recorder,
which the ledger turns on, stays on in both halves: ``--fr`` measures it alone against
ranks started without it (two clusters, made in both orders: identical clusters measured
so differ by up to 3 % by which was made first). Acceptance (issue 24): <= 1.01.

    python benchmarks/bench_ledger.py [--rounds 16] [--steps 8] [--fr] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import interactive_shard as ish

LIMIT = 1.01


def train(ctx: Any, steps: int, layers: int, width: int, ledger: bool) -> list[float]:
    """``steps`` DDP steps with the ledger's recorder on or stopped; each step's seconds."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from interactive_shard.collectives import recorder

    if ledger:
        recorder.start()
    else:
        recorder.stop()
    torch.manual_seed(0)
    if "model" not in ctx.state:
        blocks = [torch.nn.Linear(width, width) for _ in range(layers)]
        model = DDP(torch.nn.Sequential(*blocks))
        ctx.state["model"] = model, torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = ctx.state["model"]
    x = torch.randn(32, width)
    out = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach())
        out.append(time.perf_counter() - start)
    recorder.start()  # as the rank was
    return out


def paired(c: ish.Cluster, rounds: int, args: tuple[int, int, int]) -> tuple[list[float], int]:
    """Per round, median step with the recorder over without; ledger entries seen."""
    c.run(train, 2, *args[1:], True)  # warm up: build the model, first steps
    ratios, entries = [], 0
    for k in range(rounds):
        got = {}
        for ledger in (True, False)[:: 1 if k % 2 == 0 else -1]:
            run = c.run(train, *args, ledger)
            got[ledger] = statistics.median(run.results[0])
            if ledger:
                entries += len(run.collectives.entries(0))
        ratios.append(got[True] / got[False])
    return ratios, entries


def flight_recorder(rounds: int, args: tuple[int, int, int]) -> float:
    """Steps on ranks with torch's Flight Recorder over ranks without (ledger stopped in
    both): two sessions, the clusters made in opposite orders; the geometric mean."""
    sessions = []
    for session in range(2):
        made = [True, False][:: 1 if session == 0 else -1]
        clusters = {fr: _cluster(fr) for fr in made}
        try:
            for c in clusters.values():
                c.run(train, 2, *args[1:], False)
            ratios = []
            for k in range(rounds // 2):
                got = {}
                for fr in (True, False)[:: 1 if k % 2 == 0 else -1]:
                    got[fr] = statistics.median(clusters[fr].run(train, *args, False).results[0])
                ratios.append(got[True] / got[False])
            sessions.append(statistics.median(ratios))
        finally:
            for c in clusters.values():
                c.close()
    return statistics.geometric_mean(sessions)


def _cluster(flight_recorder: bool) -> ish.Cluster:
    saved = os.environ.get("TORCH_FR_BUFFER_SIZE")
    if not flight_recorder:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "0"
    try:
        return ish.Cluster(nprocs=2)
    finally:
        if saved is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--fr", action="store_true", help="also the Flight Recorder alone")
    parser.add_argument("--check", action="store_true", help="exit 1 if above the limit")
    a = parser.parse_args()
    started = time.monotonic()
    args = (a.steps, a.layers, a.width)
    with _cluster(flight_recorder=True) as c:
        ratios, entries = paired(c, a.rounds, args)
    ratio = statistics.median(ratios)
    fr = flight_recorder(a.rounds, args) if a.fr else None
    per_step = entries / (a.rounds * a.steps)
    ok = ratio <= LIMIT
    print(
        f"bench_ledger: DDP of {a.layers} x Linear({a.width}, {a.width}) + a loss all-reduce, "
        f"2 ranks, {a.rounds} rounds x {a.steps} steps each way"
    )
    print(
        f"  with/without the ledger's recorder, paired {ratio:.4f} ({'within' if ok else 'ABOVE'} "
        f"{LIMIT}); rounds {min(ratios):.3f}-{max(ratios):.3f}; {per_step:.2f} entries per step"
    )
    if fr is not None:
        print(f"  torch's Flight Recorder on/off (both orders of making the clusters): {fr:.4f}")
    print(f"  wall time {time.monotonic() - started:.0f} s")
    result = {
        "bench": "ledger",
        "paired": round(ratio, 4),
        "rounds": [round(r, 4) for r in ratios],
        "flight_recorder": None if fr is None else round(fr, 4),
        "entries_per_step": round(per_step, 2),
    }
    print(json.dumps(result))
    return 0 if ok or not a.check else 1


if __name__ == "__main__":
    sys.exit(main())
