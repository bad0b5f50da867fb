"""Time from "start the ranks" to "rank 0 finished its first DDP step", four launchers.

Variants (2 ranks, gloo, CPU, one thread per rank, the same ``_ddp_step.py`` code):

* ``ish_fork``   ``ish.launch(ish_step, nprocs=2, start_method="fork")``
* ``ish_spawn``  ``ish.launch(ish_step, nprocs=2, start_method="spawn")``
* ``torchrun``   ``python -m torch.distributed.run --nproc-per-node 2 --standalone
  _ddp_step.py`` (a subprocess, as a user would run it from a shell)
* ``mp_spawn``   ``torch.multiprocessing.spawn(mp_worker, nprocs=2)``

One definition for all: ``t0 = time.time()`` in this process just before the call
(or ``Popen``), and ``time.time()`` on rank 0 right after its first optimizer step
(returned, written to a file, or printed). The variants are interleaved (the order
rotates every round) and repeated; medians are compared. ``total`` is the wall time
until the call returned / the subprocess exited (teardown included), for reference.

Acceptance: ish_fork <= 0.5 x torchrun.

A last phase (not interleaved: it changes the kernel for good) imports
``torch._dynamo`` in this process and times ``ish_fork`` again. ``DDP.__init__``
touches ``torch._dynamo`` (``get_optimize_ddp_mode()``), which imports ~480 modules
(dynamo, sympy, mpmath) in every forked rank unless the kernel already has them, as a
kernel that built a DDP model or called ``torch.compile`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # _ddp_step must be importable in spawned children too

import _ddp_step  # noqa: E402

VARIANTS = ("ish_fork", "ish_spawn", "torchrun", "mp_spawn")
Sample = tuple[float, float]  # (to first step, total)


def _ish(start_method: str) -> Sample:
    import interactive_shard as ish

    t0 = time.time()
    run = ish.launch(
        _ddp_step.ish_step, nprocs=2, start_method=start_method, threads=1, echo=False, timeout=60
    )
    total = time.time() - t0
    return float(run.results[0]) - t0, total


def ish_fork() -> Sample:
    return _ish("fork")


def ish_spawn() -> Sample:
    return _ish("spawn")


def torchrun() -> Sample:
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", "2", "--standalone", str(HERE / "_ddp_step.py"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    out, _ = proc.communicate(timeout=120)
    total = time.time() - t0
    done = [line.split()[1] for line in out.splitlines() if line.startswith(_ddp_step.MARKER)]
    if not done:
        raise RuntimeError(f"torchrun failed (exit {proc.returncode}):\n{out}")
    if proc.returncode != 0:
        _teardown_abort("torchrun", f"exit {proc.returncode}")
    return float(done[0]) - t0, total


TEARDOWN_ABORTS: list[str] = []


def _teardown_abort(variant: str, why: str) -> None:
    """A rank died after rank 0 reported its step (gloo teardown, see TORCH_NOTES.md)."""
    TEARDOWN_ABORTS.append(f"{variant}: {why}")
    print(f"  note: {variant} rank died at teardown after the step ({why}); sample kept")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mp_spawn() -> Sample:
    import torch.multiprocessing as tmp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "done")
        t0 = time.time()
        try:
            tmp.spawn(_ddp_step.mp_worker, args=(2, _free_port(), out), nprocs=2, join=True)
        except tmp.ProcessExitedException as exc:
            if not os.path.exists(out):
                raise
            _teardown_abort("mp_spawn", str(exc))
        total = time.time() - t0
        return float(Path(out).read_text()) - t0, total


RUNNERS: dict[str, Callable[[], Sample]] = {
    "ish_fork": ish_fork,
    "ish_spawn": ish_spawn,
    "torchrun": torchrun,
    "mp_spawn": mp_spawn,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 if acceptance fails")
    args = parser.parse_args()

    import torch  # the kernel has torch loaded before it launches anything

    print(
        f"bench_launch: torch {torch.__version__}, {os.cpu_count()} CPUs, 2 ranks, gloo; "
        f"load average {os.getloadavg()[0]:.2f} (other work on the machine skews the numbers)"
    )
    # Warm-up, untimed: one ish launch loads what the kernel side imports lazily (and
    # the page cache); the other variants start fresh interpreters every time.
    print(f"  warmup: ish_fork={ish_fork()[0]:.3f}s", flush=True)
    samples: dict[str, list[Sample]] = {v: [] for v in VARIANTS}
    for rnd in range(args.repeats):
        order = VARIANTS[rnd % len(VARIANTS) :] + VARIANTS[: rnd % len(VARIANTS)]
        cells = []
        for name in order:
            step, total = RUNNERS[name]()
            samples[name].append((step, total))
            cells.append(f"{name}={step:.3f}s")
        print(f"  round {rnd + 1}: " + "  ".join(cells), flush=True)

    med = {v: statistics.median(s[0] for s in samples[v]) for v in VARIANTS}
    med_total = {v: statistics.median(s[1] for s in samples[v]) for v in VARIANTS}
    print(f"median over {args.repeats} rounds (to first DDP step on rank 0 | to return/exit):")
    for v in VARIANTS:
        lo, hi = min(s[0] for s in samples[v]), max(s[0] for s in samples[v])
        print(
            f"  {v:<10} {med[v]:7.3f} s  (min {lo:.3f}, max {hi:.3f})  | total {med_total[v]:.3f} s"
        )
    ratios = {
        "fork/torchrun": med["ish_fork"] / med["torchrun"],
        "spawn/torchrun": med["ish_spawn"] / med["torchrun"],
        "fork/mp_spawn": med["ish_fork"] / med["mp_spawn"],
        "spawn/mp_spawn": med["ish_spawn"] / med["mp_spawn"],
    }
    for k, r in ratios.items():
        print(f"  ratio {k:<15} {r:.3f}")

    t = time.time()
    import torch._dynamo  # what DDP.__init__ imports lazily in each rank

    preload_s = time.time() - t
    pre = [ish_fork() for _ in range(args.repeats)]
    med_pre = statistics.median(s[0] for s in pre)
    ratios["fork_preloaded/torchrun"] = med_pre / med["torchrun"]
    print(
        f"after `import torch._dynamo` in this process ({preload_s:.2f} s, once): ish_fork "
        f"median {med_pre:.3f} s over {args.repeats} (min {min(s[0] for s in pre):.3f}, "
        f"max {max(s[0] for s in pre):.3f}); ratio fork_preloaded/torchrun "
        f"{ratios['fork_preloaded/torchrun']:.3f}"
    )
    if TEARDOWN_ABORTS:
        print(f"teardown aborts after the step (samples kept): {len(TEARDOWN_ABORTS)}")
    ok = ratios["fork/torchrun"] <= 0.5
    verdict = "PASS" if ok else "FAIL"
    print(f"acceptance ish_fork <= 0.5 x torchrun: {verdict} ({ratios['fork/torchrun']:.3f})")
    result = {
        "bench": "launch",
        "repeats": args.repeats,
        "loadavg_end": os.getloadavg()[0],
        "median_s": med,
        "median_total_s": med_total,
        "median_fork_preloaded_s": med_pre,
        "preload_dynamo_s": preload_s,
        "ratios": ratios,
        "teardown_aborts": TEARDOWN_ABORTS,
        "acceptance": {"fork<=0.5*torchrun": ok},
    }
    print(json.dumps(result))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
