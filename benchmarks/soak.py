"""Soak: launch, rank failure, kill -9 of a rank, interrupt, kill -9 of the kernel.

Each cycle, in this process (the notebook's kernel):

1. ``ish.launch`` a function on two fresh ranks (start, run, close);
2. on a long-lived cluster, rank 1 raises while rank 0 waits in an all_reduce;
3. both ranks start a child process, then rank 1 is killed with SIGKILL;
4. a run is interrupted (SIGINT to this process, as Jupyter interrupts a kernel);

and in a separate kernel process:

5. the kernel starts a cluster whose ranks each start a child; rank 1 then sleeps in
   a C call that holds the GIL; the kernel is killed with SIGKILL. Every rank, child
   and group reaper must be gone within ``--cleanup-s``.

The kernels of step 5 are forked by a helper interpreter that imported the package
once (seconds saved per cycle); every ``--fresh-kernel-every`` cycles the kernel is a
fresh ``python -c`` instead.

Reported: cycles, orphans (processes still alive after their cycle), errors not
reported (a step that should have raised and did not), the latency from each
failure to the error in this process (RankError or KeyboardInterrupt, bound 2 s),
and the cleanup time after kill -9 of a kernel. Last line: JSON.

    python benchmarks/soak.py [--cycles 100] [--fresh-kernel-every 10]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

MARKER = f"9999.{os.getpid()}"  # argument of every child's `sleep`: ours, findable
BOUND_S = 2.0
STEP_TIMEOUT_S = 60.0  # a step that takes longer hangs: the soak stops and says so

KERNEL = """
import os, time

def stuck(ctx, marker):
    import ctypes, subprocess
    child = subprocess.Popen(["sleep", marker])
    print("pids", os.getpid(), child.pid, flush=True)
    if ctx.rank == 1:
        ctypes.PyDLL(None).sleep(1000)  # holds the GIL: no Python runs in this rank
    time.sleep(1000)

def kernel(marker):
    import interactive_shard as ish
    c = ish.Cluster(2, echo=False)
    c.run(stuck, marker, wait=False)
    lines = []
    while len(lines) < 2:
        time.sleep(0.01)
        lines = [line for log in c.logs for line in log if line.startswith("pids")]
    time.sleep(0.2)  # rank 1 is inside sleep() now
    print("kernel", os.getpid(), *[p for line in lines for p in line.split()[1:]], flush=True)
    time.sleep(1000)
"""

ZYGOTE = (
    KERNEL
    + """
import sys
from interactive_shard.cluster._support import preimport_for_fork
preimport_for_fork()
print("ready", flush=True)
for line in sys.stdin:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:  # reap the kernels killed so far
            pass
    except ChildProcessError:
        pass
    if os.fork() == 0:
        try:
            kernel(line.strip())
        finally:
            os._exit(1)
"""
)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def family(pids: list[int]) -> list[int]:
    """``pids`` and their children (the ranks' own children and group reapers)."""
    out = list(pids)
    for pid in pids:
        try:
            out += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return sorted(set(out))


def reap(pids: list[int], within: float) -> tuple[list[int], float]:
    """Wait for ``pids`` to die: (survivors, killed afterwards; seconds waited)."""
    start = time.monotonic()
    while (left := [p for p in pids if alive(p)]) and time.monotonic() - start < within:
        time.sleep(0.02)
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    return left, time.monotonic() - start


class Soak:
    def __init__(self, fresh_every: int, cleanup_s: float) -> None:
        import interactive_shard as ish

        self.ish = ish
        self.fresh_every, self.cleanup_s = fresh_every, cleanup_s
        self.latencies: dict[str, list[float]] = {"raise": [], "kill": [], "interrupt": []}
        self.cleanups: list[float] = []
        self.orphans: list[int] = []
        self.unreported: list[str] = []
        self.cluster = ish.Cluster(2, timeout=20, echo=False)
        self.zygote = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.zygote.stdout is not None and self.zygote.stdout.readline() == "ready\n"

    def ranks(self) -> list[int]:
        return self.cluster.run(lambda ctx: os.getpid()).results

    def expect(self, step: str, exc: type[BaseException], run: Any) -> BaseException | None:
        """Wait for ``run`` (a ``Run``); the error it raised, or None (unreported)."""
        try:
            run.wait(timeout=STEP_TIMEOUT_S)
        except TimeoutError:
            raise RuntimeError(f"soak step {step!r} hung for {STEP_TIMEOUT_S} s") from None
        except exc as err:
            return err
        self.unreported.append(step)
        return None

    def cycle(self, n: int) -> None:
        import torch
        import torch.distributed as dist

        ish = self.ish
        before = family(self.ranks())
        # 1. launch on fresh ranks
        assert ish.launch(lambda ctx: ctx.rank, nprocs=2, echo=False).results == [0, 1]

        # 2. a rank raises while the other waits for it in a collective
        def fail_on_one(ctx: Any) -> None:
            if ctx.rank == 1:
                raise ValueError(f"soak failure at {time.time()!r}")
            dist.all_reduce(torch.ones(1))

        err = self.expect("raise", ish.RankError, self.cluster.run(fail_on_one, wait=False))
        if err is not None:
            at = float(err.tracebacks[1].rsplit("soak failure at ", 1)[1].split()[0])
            self.latencies["raise"].append(time.time() - at)

        # 3. kill -9 of a rank that has a child process
        def child_then_sleep(ctx: Any, marker: str) -> None:
            ctx.state["child"] = subprocess.Popen(["sleep", marker])
            print("pids", os.getpid(), ctx.state["child"].pid, flush=True)
            time.sleep(30)

        run = self.cluster.run(child_then_sleep, MARKER, wait=False)
        while not (run.logs(0) and run.logs(1)):
            time.sleep(0.01)
        pids = [int(p) for r in (0, 1) for p in run.logs(r)[0].split()[1:]]
        started = time.time()
        os.kill(pids[2], signal.SIGKILL)
        err = self.expect("kill", ish.RankError, run)
        if err is not None and "rank 1 was killed by SIGKILL" in str(err):
            self.latencies["kill"].append(time.time() - started)
        elif err is not None:
            self.unreported.append(f"kill: {str(err)[:200]}")

        # 4. interrupt of a running function
        def busy(ctx: Any) -> None:
            while True:
                time.sleep(0.01)

        fired: list[float] = []
        timer = threading.Timer(
            0.3, lambda: fired.append(time.time()) or os.kill(os.getpid(), signal.SIGINT)
        )
        timer.start()
        if self.expect("interrupt", KeyboardInterrupt, self.cluster.run(busy, wait=False)):
            self.latencies["interrupt"].append(time.time() - fired[0])
        timer.join()

        # 5. kill -9 of a kernel whose rank is stuck holding the GIL
        self.kill_kernel(fresh=bool(self.fresh_every) and n % self.fresh_every == 0)

        live = family(self.ranks())
        gone = sorted(set(before + pids) - set(live))
        self.orphans += reap(gone, self.cleanup_s)[0]

    def kill_kernel(self, *, fresh: bool) -> None:
        if fresh:
            code = KERNEL + f"\nkernel({MARKER!r})\n"
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            out = proc.stdout
        else:
            assert self.zygote.stdin is not None
            self.zygote.stdin.write(MARKER + "\n")
            self.zygote.stdin.flush()
            out = self.zygote.stdout
        assert out is not None
        if not select.select([out], [], [], STEP_TIMEOUT_S)[0]:
            raise RuntimeError(f"the kernel did not start within {STEP_TIMEOUT_S} s")
        kernel, *pids = (int(p) for p in out.readline().split()[1:])
        everyone = family(pids)
        os.kill(kernel, signal.SIGKILL)
        if fresh:
            proc.wait()
        left, waited = reap(everyone, self.cleanup_s)
        self.orphans += left
        self.cleanups.append(waited)

    def close(self) -> None:
        self.cluster.close()
        assert self.zygote.stdin is not None
        self.zygote.stdin.close()
        self.zygote.kill()
        self.zygote.wait()
        strays = [
            p.pid for p in psutil.process_iter(["cmdline"]) if MARKER in (p.info["cmdline"] or [])
        ]
        self.orphans += reap(strays, 1.0)[0]

    def summary(self, cycles: int, seconds: float) -> dict[str, Any]:
        late = {k: sum(v > BOUND_S for v in vs) for k, vs in self.latencies.items()}
        return {
            "bench": "soak",
            "cycles": cycles,
            "seconds": round(seconds, 1),
            "orphans": len(self.orphans),
            "unreported_errors": self.unreported,
            "max_error_latency_s": {
                k: round(max(v, default=0.0), 3) for k, v in self.latencies.items()
            },
            "errors_over_2s": late,
            "max_kernel_kill_cleanup_s": round(max(self.cleanups, default=0.0), 3),
            "ok": not self.orphans and not self.unreported and not any(late.values()),
        }


def soak(cycles: int, fresh_every: int = 10, cleanup_s: float = 3.0) -> dict[str, Any]:
    start = time.monotonic()
    # Started in the background by a shell, a process ignores SIGINT: step 4 needs it.
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    s = Soak(fresh_every, cleanup_s)
    try:
        for n in range(1, cycles + 1):
            s.cycle(n)
            if n % 10 == 0 or n == cycles:
                print(f"  cycle {n}: orphans {len(s.orphans)}, unreported {len(s.unreported)}")
    finally:
        s.close()
        signal.signal(signal.SIGINT, old_handler)
    return s.summary(cycles, time.monotonic() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--fresh-kernel-every", type=int, default=10)
    args, _ = parser.parse_known_args()  # run_all passes every script the same extras
    print(f"soak: {args.cycles} cycles, load average {os.getloadavg()[0]:.2f}", flush=True)
    result = soak(args.cycles, args.fresh_kernel_every)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
