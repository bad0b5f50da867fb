"""What a careless user or a misbehaving rank does to a real cluster: close or restart
during a run, interrupts, hostile results and output, lost groups, floods."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
from support import gone, wait_for

import interactive_shard as ish
from interactive_shard.cluster import output
from interactive_shard.telemetry.store import RunStore

CLUSTER = {"timeout": 30, "echo": False}  # the shared fixture's options (conftest.py)


def all_reduce_rank(ctx):
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return t.item()


def sleep_long(ctx):
    time.sleep(60)


def rank_pids(cluster: ish.Cluster) -> list[int]:
    return cluster.run(lambda ctx: os.getpid()).results


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    # A shell job started with ``cmd &`` ignores SIGINT: a kernel interrupt is the test.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


# -- 1-3: close and restart during a run, interrupted and repeated -----------------------
@pytest.mark.slow
def test_close_ends_a_background_run_with_a_clear_error() -> None:
    cluster = ish.Cluster(2, timeout=30, echo=False)
    pids = rank_pids(cluster)
    run = cluster.run(sleep_long, wait=False)
    start = time.monotonic()
    cluster.close()
    with pytest.raises(ish.RankError, match=r"ended by cluster\.close\(\)") as info:
        run.wait(timeout=5)
    assert time.monotonic() - start < 10
    assert info.value.ranks == [0, 1]
    assert "had not finished run" in info.value.tracebacks[0]
    assert gone(pids)
    with pytest.raises(ish.ClusterClosedError):
        cluster.run(lambda ctx: None)


def test_close_keeps_a_run_that_finishes_within_the_grace() -> None:
    cluster = ish.Cluster(2, timeout=30, echo=False)
    run = cluster.run(lambda ctx: time.sleep(0.5) or ctx.rank, wait=False)
    cluster.close()
    assert run.wait(timeout=5).results == [0, 1]


@pytest.mark.slow
def test_launch_without_waiting_closes_its_ranks_when_the_run_ends() -> None:
    run = ish.launch(lambda ctx: time.sleep(4) or os.getpid(), wait=False, echo=False)
    assert not run.done
    pids = run.wait(timeout=30).results  # past close's 3 s grace: not cut short
    wait_for(lambda: gone(pids), timeout=5, what="launch's ranks to go")


def test_restart_ends_a_background_run_and_the_next_run_works() -> None:
    with ish.Cluster(2, timeout=30, echo=False) as cluster:
        run = cluster.run(sleep_long, wait=False)
        cluster.restart()
        with pytest.raises(ish.RankError, match=r"ended by cluster\.restart\(\)"):
            run.wait(timeout=5)
        assert cluster.run(all_reduce_rank).results == [3.0, 3.0]


def test_interrupted_close_kills_everything_and_a_second_close_is_quiet(
    sigint_raises: None,
) -> None:
    cluster = ish.Cluster(2, timeout=30, echo=False)
    pids = rank_pids(cluster)
    directory = Path(cluster._res.rendezvous.path)
    run = cluster.run(sleep_long, wait=False)  # close's graceful stop now waits 3 s
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        cluster.close()
    assert time.monotonic() - start < 2.5  # the interrupt cut the grace short
    with pytest.raises(ish.RankError, match="cluster"):
        run.wait(timeout=5)  # decided though the close was interrupted
    cluster.close()
    assert gone(pids)
    assert not directory.exists()
    assert not any(t.name == "ish-collector" and t.is_alive() for t in threading.enumerate())


# -- 4-6: what a rank's code does to the rank ---------------------------------------------
class _ExitsWhenUnpickled:
    def __reduce__(self):  # the kernel's pickle.loads calls sys.exit(3)
        return (sys.exit, (3,))


def test_a_result_that_raises_systemexit_when_unpickled_is_an_error(
    cluster: ish.Cluster,
) -> None:
    with pytest.raises(ish.RankError, match="could not be unpickled: SystemExit"):
        cluster.run(lambda ctx: _ExitsWhenUnpickled())
    # The supervisor lives on: a rank's death in the next run is seen at once.
    run = cluster.run(lambda ctx: print(os.getpid(), flush=True) or time.sleep(30), wait=False)
    wait_for(lambda: run.logs(1), timeout=5, what="rank 1's pid")
    os.kill(int(run.logs(1)[0]), signal.SIGKILL)
    with pytest.raises(ish.RankError, match="killed by SIGKILL"):
        run.wait(timeout=10)
    assert cluster.run(all_reduce_rank).results == [3.0, 3.0]


def test_a_rank_that_closes_its_stdout_lives_on(cluster: ish.Cluster) -> None:
    cluster.run(lambda ctx: ctx.state.update(kept=ctx.rank))
    assert cluster.run(lambda ctx: sys.stdout.close()).results == [None, None]
    run = cluster.run(lambda ctx: print("still here") or ctx.state["kept"])
    assert run.results == [0, 1]
    assert run.logs(0) == ["still here"]


def test_a_destroyed_process_group_is_restarted_before_the_next_run(
    cluster: ish.Cluster,
) -> None:
    assert cluster.run(lambda ctx: dist.destroy_process_group() or ctx.rank).results == [0, 1]
    with pytest.warns(RuntimeWarning, match="destroyed the process group"):
        assert cluster.run(all_reduce_rank).results == [3.0, 3.0]


def test_destroying_the_group_then_failing_is_a_broken_group(cluster: ish.Cluster) -> None:
    def destroy_then_reduce(ctx):
        dist.destroy_process_group()
        dist.all_reduce(torch.ones(1))

    with pytest.raises(ish.RankError, match="restarted"):
        cluster.run(destroy_then_reduce)
    assert cluster.run(all_reduce_rank).results == [3.0, 3.0]


# -- 7: no run is saved short ---------------------------------------------------------------
def test_the_run_returns_with_every_event_in_the_store(
    cluster: ish.Cluster, tmp_path: Path
) -> None:
    n = 150_000

    def flood(ctx):
        for i in range(n):
            ctx.emit("flood", i=i, tag="structured")

    run = cluster.run(flood)
    assert run.missing_events == {}
    assert len(run.store.of_kind("flood")) == 2 * n
    loaded = ish.load(run.save(tmp_path / "flood.jsonl"))
    assert len(loaded.store.of_kind("flood")) == 2 * n


def test_events_a_rank_could_not_send_are_counted_missing(cluster: ish.Cluster) -> None:
    def unsendable(ctx):
        ctx.emit("big", blob="x" * (5 * 2**20))  # over the channel's message limit
        ctx.emit("small", ok=True)

    with pytest.warns(RuntimeWarning, match="still missing"):
        run = cluster.run(unsendable)
    assert run.missing_events == {0: 1, 1: 1}
    assert "missing_events=2" in repr(run)
    assert len(run.store.of_kind("small")) == 2


# -- 8, 10-12: output -----------------------------------------------------------------------
def test_long_lines_are_cut_and_the_run_still_saves(cluster: ish.Cluster, tmp_path: Path) -> None:
    def progress_and_huge_error(ctx):
        for step in range(100_000):
            print(f"\rstep {step + 1}/100000", end="")
        print()
        print("y" * (3 * 2**20))
        raise ValueError("x" * 4_600_000)

    with pytest.raises(ish.RankError) as info:
        cluster.run(progress_and_huge_error)
    assert len(str(info.value)) < 100_000
    run = cluster.latest_run
    assert run is not None
    lines = run.logs(0)
    assert "step 100000/100000" in lines  # the progress bar's last state, as a terminal shows
    assert any(line.endswith("more bytes cut]") for line in lines)
    assert max(map(len, lines)) < output.MAX_LINE_CHARS + 100
    loaded = ish.load(run.save(tmp_path / "long.jsonl"))  # saves whole, loads whole
    assert "step 100000/100000" in loaded.logs(0)


def test_a_long_line_without_newline_costs_linear_time(cluster: ish.Cluster) -> None:
    def one_line(ctx):
        sys.stdout.write("z" * (64 * 2**20))
        sys.stdout.flush()
        return ctx.rank

    run = cluster.run(one_line, wait=False)
    assert run.wait(timeout=30).results == [0, 1]  # was quadratic: 43 s for 64 MiB
    assert run.logs(0)[-1].endswith("more bytes cut]")


def test_rank_output_is_bounded_in_the_kernel(cluster: ish.Cluster, tmp_path: Path) -> None:
    n = 200_000

    def chatty(ctx):
        for i in range(n):
            print(f"line {i}")

    run = cluster.run(chatty)
    lines = run.logs(0)
    head, tail = output.RUN_HEAD_LINES, output.RUN_TAIL_LINES
    assert len(lines) == head + 1 + tail
    assert lines[head - 1] == f"line {head - 1}" and lines[-1] == f"line {n - 1}"
    assert f"{n - head - tail:,} line(s) of rank 0's output not kept" in lines[head]
    assert len(run.store.of_kind("log")) == 2 * (head + 1 + tail)
    assert len(cluster.logs[0]) <= output.CLUSTER_LOG_LINES
    assert cluster.logs[0][-1] == f"line {n - 1}"
    assert cluster.logs_dropped[0] >= n - output.CLUSTER_LOG_LINES
    assert ish.load(run.save(tmp_path / "chatty.jsonl")).logs(0) == lines


def test_echo_builds_no_event_per_columnar_scalar(monkeypatch: pytest.MonkeyPatch) -> None:
    def built(self, positions):  # the only way a columnar scalar becomes an event
        raise AssertionError(f"{len(positions)} columnar scalar(s) built as events")

    with ish.Cluster(2, timeout=30, echo=True) as cluster:
        monkeypatch.setattr(RunStore, "_built", built)

        def flood(ctx):
            print("flooding")
            for i in range(100_000):
                ctx.emit("scalar", name="loss", value=float(i))

        run = cluster.run(flood)
        monkeypatch.undo()
        assert run.store.scalars()[0].at.size == 200_000


# -- what held must hold: nothing grows --------------------------------------------------
def _footprint() -> tuple[int, int, int]:
    import gc

    gc.collect()
    me = psutil.Process()
    ranks = [p for p in me.children(recursive=True) if "forkserver" not in " ".join(p.cmdline())]
    return me.num_fds(), threading.active_count(), len(ranks)


@pytest.mark.slow
def test_no_growth_over_200_runs_and_20_cluster_cycles(cluster: ish.Cluster) -> None:
    cluster.run(lambda ctx: None, wait=False).wait()  # once: asyncio's loop (3 fds)
    before = _footprint()
    for i in range(200):
        run = cluster.run(lambda ctx, i: print(i) or ctx.emit("n", i=i), i)
        assert run.missing_events == {}
    directories = []
    for i in range(20):
        c = ish.Cluster(2, timeout=30, echo=False)
        directories.append(Path(c._res.rendezvous.path))
        c.run(all_reduce_rank)
        if i % 10 == 0:  # now and then a run still going when it closes, or a restart
            c.restart()
            c.run(sleep_long, wait=False)
        c.close()
    # Reaped processes' pipes and threads wind down within moments.
    wait_for(lambda: _footprint()[1:] == before[1:], timeout=5, what="threads and ranks to go")
    after = _footprint()
    assert after[0] <= before[0] + 2, f"fds {before[0]} -> {after[0]}"
    assert not [d for d in directories if d.exists()]


@pytest.mark.slow
def test_a_stopped_rank_is_reported_at_the_timeout() -> None:
    with ish.Cluster(2, timeout=3, echo=False) as c:
        pid = c.run(lambda ctx: os.getpid()).results[1]

        def reduce_after_a_pause(ctx):
            time.sleep(0.5)  # rank 1 is stopped meanwhile
            return all_reduce_rank(ctx)

        run = c.run(reduce_after_a_pause, wait=False)
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(ish.RankError) as info:
            run.wait(timeout=15)
        assert time.monotonic() - start < 3 + 3.5
        assert info.value.ranks == [0] and "1" in info.value.note
        assert c.run(all_reduce_rank).results == [3.0, 3.0]


# -- more of what held ---------------------------------------------------------------------
def test_racing_runs_from_threads_are_refused_cleanly(cluster: ish.Cluster) -> None:
    outcomes: list[object] = []

    def start() -> None:
        try:
            outcomes.append(cluster.run(lambda ctx: time.sleep(0.3) or ctx.rank, wait=False))
        except RuntimeError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    runs = [o for o in outcomes if isinstance(o, ish.Run)]
    refused = [o for o in outcomes if isinstance(o, RuntimeError)]
    assert len(runs) >= 1 and len(runs) + len(refused) == 4
    assert all("still in progress" in str(e) for e in refused)
    for run in runs:
        run.wait(timeout=10)
    assert cluster.run(all_reduce_rank).results == [3.0, 3.0]


def test_binary_rank_output_round_trips(cluster: ish.Cluster, tmp_path: Path) -> None:
    def binary(ctx):
        os.write(1, b"\x00\xff\xfe bytes \x80\n")
        os.write(2, "ünïcode ✓\n".encode())

    run = cluster.run(binary)
    lines = run.logs(0)
    assert lines == ["\x00\ufffd\ufffd bytes \ufffd", "ünïcode ✓"]
    assert ish.load(run.save(tmp_path / "binary.jsonl")).logs(0) == lines


def test_the_listener_refuses_a_port_in_use_and_a_wrong_token() -> None:
    from interactive_shard.telemetry.channel import Emitter

    with ish.Cluster(2, timeout=30, echo=False) as c:
        port = int(c.telemetry[0].rsplit(":", 1)[1])
        with pytest.raises(Exception, match="Address already in use"):
            ish.listen(world_size=2, port=port)
        listener = ish.listen(world_size=1, token="right")
        try:
            wrong = Emitter(listener.address, "wrong", 0)
            wrong.emit("scalar", {"name": "x", "value": 1.0})
            wrong.flush(final=True)
            wrong.close()
            wait_for(lambda: listener._collector.rejected, timeout=5, what="the refusal")
            assert listener._collector.rejected_by_reason["wrong token"] >= 1  # and its BYE
        finally:
            listener.close()


@pytest.mark.slow
def test_a_killed_kernels_rendezvous_directory_is_swept_by_the_next(tmp_path: Path) -> None:
    import subprocess

    script = (
        "import sys, time, interactive_shard as ish\n"
        "c = ish.Cluster(2, timeout=30, echo=False)\n"
        "print(c._res.rendezvous.path, flush=True)\n"
        "time.sleep(60)\n"
    )
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert kernel.stdout is not None
    left = Path(kernel.stdout.readline().strip())
    assert left.is_dir()
    kernel.kill()
    kernel.wait()
    with ish.Cluster(2, timeout=30, echo=False) as c:
        assert not left.exists()
        assert Path(c._res.rendezvous.path).is_dir()
