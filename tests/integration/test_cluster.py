"""Real 2-rank gloo clusters on CPU: runs, state, errors, deaths, cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from support import wait_for

import interactive_shard as ish

CLUSTER = {"timeout": 20, "echo": False}  # the shared fixture's options (conftest.py)


def all_reduce_rank(ctx, scale: float = 1.0):
    t = torch.tensor([float(ctx.rank + 1)]) * scale
    dist.all_reduce(t)
    return t.item()


def test_run_returns_each_ranks_value(cluster: ish.Cluster) -> None:
    run = cluster.run(all_reduce_rank, scale=2.0)
    assert run.results == [6.0, 6.0]
    assert run.done and run.error is None


def test_state_persists_across_runs(cluster: ish.Cluster) -> None:
    def build(ctx):
        ctx.state["model"] = torch.nn.Linear(2, 2)
        return ctx.world_size

    def step(ctx):
        return ctx.state["model"].weight.shape[0] + ctx.rank

    assert cluster.run(build).results == [2, 2]
    assert cluster.run(step).results == [2, 3]


def test_ctx_identity(cluster: ish.Cluster) -> None:
    results = cluster.run(lambda ctx: (ctx.rank, ctx.world_size, str(ctx.device), ctx.backend))
    assert results.results == [(0, 2, "cpu", "gloo"), (1, 2, "cpu", "gloo")]


def test_output_is_kept_per_rank(cluster: ish.Cluster) -> None:
    def talk(ctx):
        print(f"out {ctx.rank}")
        print(f"err {ctx.rank}", file=sys.stderr)
        os.write(1, f"raw {ctx.rank}\n".encode())  # C-level writes are captured too

    run = cluster.run(talk)
    for rank in range(2):
        assert {f"out {rank}", f"err {rank}", f"raw {rank}"} <= set(run.logs(rank))
    streams = {e.payload["stream"] for e in run.store.of_kind("log") if e.rank == 1}
    assert streams == {"stdout", "stderr"}


def test_output_is_complete_when_the_run_returns(cluster: ish.Cluster) -> None:
    # The reply and the output travel on different pipes: the kernel must read the
    # output a rank flushed before its reply first (this lost lines in 1% of runs).
    def talk(ctx):
        print(f"out {ctx.rank}")
        os.write(2, f"raw {ctx.rank}\n".encode())

    for _ in range(200):
        run = cluster.run(talk)
        assert [sorted(run.logs(r)) for r in range(2)] == [["out 0", "raw 0"], ["out 1", "raw 1"]]


def test_events_and_scalars_reach_the_store(cluster: ish.Cluster) -> None:
    def train(ctx):
        for step in ctx.steps(20):
            ctx.emit("scalar", name="loss", value=1.0 / step)

    run = cluster.run(train)
    assert run.monitor.scalars["loss"][1].steps == list(range(1, 21))
    assert [(r.step, r.total) for r in run.monitor.ranks] == [(20, 20), (20, 20)]
    assert [r.state.value for r in run.monitor.ranks] == ["finished", "finished"]


def test_wait_false_returns_at_once(cluster: ish.Cluster) -> None:
    start = time.monotonic()
    run = cluster.run(lambda ctx: time.sleep(0.5) or ctx.rank, wait=False)
    assert time.monotonic() - start < 0.4
    with pytest.raises(RuntimeError, match="still in progress"):
        cluster.run(lambda ctx: None)
    assert run.wait().results == [0, 1]


def test_rank_error_is_fast_and_the_cluster_recovers(cluster: ish.Cluster) -> None:
    def fail_on_one(ctx):
        if ctx.rank == 1:
            raise ValueError("bad batch on rank 1")
        dist.all_reduce(torch.ones(1))  # rank 0 is now stuck waiting for rank 1

    start = time.monotonic()
    with pytest.raises(ish.RankError) as info:
        cluster.run(fail_on_one)
    assert time.monotonic() - start < 5
    assert info.value.ranks == [1]
    assert "ValueError: bad batch on rank 1" in info.value.tracebacks[1]
    assert 'raise ValueError("bad batch on rank 1")' in info.value.tracebacks[1]  # source shown
    assert "restarted" in str(info.value)
    # Rank 0 was stuck in the all-reduce: its stack says where (Note [Stuck rank stacks]).
    assert list(info.value.stuck) == [0]
    assert "in all_reduce" in info.value.stuck[0] and "in fail_on_one" in info.value.stuck[0]
    assert "rank 0, stuck: its stack when stopped" in str(info.value)
    assert cluster.run(all_reduce_rank).results == [3.0, 3.0]


def test_error_on_every_rank_keeps_state(cluster: ish.Cluster) -> None:
    cluster.run(lambda ctx: ctx.state.update(kept=True))
    with pytest.raises(ish.RankError) as info:
        cluster.run(lambda ctx: 1 / 0)
    assert info.value.ranks == [0, 1]
    assert cluster.run(lambda ctx: ctx.state.get("kept")).results == [True, True]


def test_kill_9_during_a_run(cluster: ish.Cluster) -> None:
    def pid_then_sleep(ctx):
        print(f"pid {os.getpid()}", flush=True)
        time.sleep(30)

    run = cluster.run(pid_then_sleep, wait=False)
    wait_for(lambda: run.logs(1), timeout=5, what="rank 1's pid")
    pid = int(run.logs(1)[0].split()[1])
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ish.RankError, match=r"rank 1 was killed by SIGKILL") as info:
        run.wait()
    assert time.monotonic() - start < 5
    assert 1 in info.value.ranks
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    assert cluster.run(all_reduce_rank).results == [3.0, 3.0]


def test_kill_9_while_idle_restarts_on_next_run(cluster: ish.Cluster) -> None:
    pid = cluster.run(lambda ctx: os.getpid()).results[0]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: cluster.rank_states[0].value == "failed", timeout=5, what="the death seen")
    with pytest.warns(RuntimeWarning, match="rank 0 was killed by SIGKILL"):
        assert cluster.run(all_reduce_rank).results == [3.0, 3.0]


@pytest.mark.slow
def test_stuck_collective_is_bounded_by_timeout() -> None:
    def only_rank0_reduces(ctx):
        if ctx.rank == 0:
            dist.all_reduce(torch.ones(1))

    with ish.Cluster(2, timeout=3, echo=False, restart_on_failure=False) as c:
        start = time.monotonic()
        with pytest.raises(ish.RankError) as info:
            c.run(only_rank0_reduces)
        assert time.monotonic() - start < 10
        assert info.value.ranks == [0]
        with pytest.raises(RuntimeError, match=r"call cluster.restart\(\)"):
            c.run(lambda ctx: None)
        c.restart()
        assert c.run(lambda ctx: ctx.rank).results == [0, 1]


def test_interrupt_stops_the_ranks_within_5s(cluster: ish.Cluster) -> None:
    def busy(ctx):
        while True:
            time.sleep(0.01)

    # A shell that starts a job in the background (``cmd &``) has it ignore SIGINT, and
    # Python then installs no handler: this test is about what a kernel interrupt does.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, lambda: signal.raise_signal(signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            cluster.run(busy)
    finally:
        signal.signal(signal.SIGINT, saved)
    assert time.monotonic() - start < 5
    assert cluster.run(lambda ctx: ctx.rank).results == [0, 1]


@pytest.mark.slow
def test_spawn_runs_functions_defined_here() -> None:
    factor = 10

    def scaled(ctx):
        return ctx.rank * factor

    run = ish.launch(scaled, nprocs=2, start_method="spawn", echo=False)
    assert run.results == [0, 10]


def test_unpicklable_argument_is_a_clear_error(cluster: ish.Cluster) -> None:
    with pytest.raises(TypeError, match="cannot send"):
        cluster.run(lambda ctx, lock: None, threading.Lock())


def test_closed_cluster_refuses_runs() -> None:
    c = ish.Cluster(2, echo=False)
    c.close()
    c.close()  # twice is fine
    with pytest.raises(ish.ClusterClosedError):
        c.run(lambda ctx: None)


def test_garbage_collection_stops_ranks() -> None:
    c = ish.Cluster(2, echo=False)
    pids = c.run(lambda ctx: os.getpid()).results
    del c
    import gc

    gc.collect()
    wait_for(
        lambda: (
            not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
        ),
        timeout=5,
        what="the collected cluster's ranks to go",
    )


@pytest.mark.slow
def test_no_orphans_after_20_launch_fail_cycles() -> None:
    def fail(ctx):
        raise RuntimeError(f"cycle failure on {ctx.rank}")

    for _ in range(20):
        with pytest.raises(ish.RankError):
            ish.launch(fail, nprocs=2, echo=False)
    # the autouse no_orphans fixture checks every child process is gone


@pytest.mark.slow
def test_kernel_killed_with_sigkill_leaves_no_ranks(tmp_path: Path) -> None:
    script = tmp_path / "kernel.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, time, interactive_shard as ish
            c = ish.Cluster(2, echo=False)
            print(*c.run(lambda ctx: os.getpid()).results, flush=True)
            time.sleep(60)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    proc.kill()
    proc.wait()
    wait_for(
        lambda: (
            not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
        ),
        timeout=3,
        what=f"ranks {pids} to die with their kernel",
    )


def test_save_and_load_a_real_run(cluster: ish.Cluster, tmp_path: Path) -> None:
    def train(ctx):
        for step in ctx.steps(5):
            ctx.emit("scalar", name="loss", value=float(step))
        return {"rank": ctx.rank}

    run = cluster.run(train)
    loaded = ish.load(run.save(tmp_path / "run.jsonl"))
    assert loaded.store.events() == run.store.events()
    assert loaded.results == [{"rank": 0}, {"rank": 1}]
    assert loaded.monitor.scalars["loss"][1].values == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert loaded.store.info.backend == "gloo" and loaded.store.info.device_types == ["cpu"]
    html = loaded.to_html(tmp_path / "r.html").read_text()
    assert "loss" in html


def test_two_clusters_live_side_by_side(cluster: ish.Cluster) -> None:
    with ish.Cluster(2, timeout=20, echo=False) as other:
        first = cluster.run(all_reduce_rank, wait=False)
        second = other.run(all_reduce_rank, scale=10.0)
        assert second.results == [30.0, 30.0]
        assert first.wait().results == [3.0, 3.0]
        assert cluster.telemetry[0] != other.telemetry[0]


def test_views_update_live_during_a_blocking_run(cluster: ish.Cluster) -> None:
    from interactive_shard.monitor.view import MonitorView

    view = MonitorView(cluster)
    widget = view.widget
    seen: list[tuple[float, str]] = []
    refresh = view.refresh

    def counting_refresh() -> None:
        refresh()
        seen.append((time.monotonic(), widget.children[1].children[0].value))

    view.refresh = counting_refresh  # type: ignore[method-assign]

    def slow_train(ctx):
        for step in ctx.steps(20):
            ctx.emit("scalar", name="loss", value=1.0 / step)
            time.sleep(0.05)

    start = time.monotonic()
    cluster.run(slow_train)
    elapsed = time.monotonic() - start
    during = [label for t, label in seen if t < start + elapsed - 0.1]
    assert any("running" in label and "step 20" not in label for label in during)
    assert 3 <= len(seen) <= 10 * elapsed + 2  # live, and at most 10 redraws a second
    assert "finished" in seen[-1][1] and "step 20" in seen[-1][1]
    widget.close()


def test_monitor_of_a_background_run_is_current(cluster: ish.Cluster) -> None:
    def train(ctx):
        for step in ctx.steps(3):
            ctx.emit("scalar", name="loss", value=float(step))
            time.sleep(0.2)

    run = cluster.run(train, wait=False)
    early = run.monitor.scalars.get("loss", {}).get(0)
    early_count = len(early.values) if early else 0
    run.wait()
    assert early_count < 3 and run.monitor.scalars["loss"][0].values == [1.0, 2.0, 3.0]
