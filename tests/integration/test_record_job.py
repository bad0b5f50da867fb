"""A torchrun job records without a notebook (ISH_RECORD) and loads as the same run.

The script calls ``ish.watch(model)`` and nothing else of ours. Its recording, merged by
``ish.load(DIR)``, must show what the same training shows when run from a Cluster; a
rank killed with SIGKILL loses at most its last second, and the loader names it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import interactive_shard as ish
from interactive_shard import features
from interactive_shard.telemetry.recording import RecordingWarning

pytestmark = pytest.mark.slow  # make check leaves it out; make test runs it

TRAIN = """
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import interactive_shard as ish


def train(steps, pause=0.0):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    ), bucket_cap_mb=0.004)
    watch = ish.watch(model, timeline=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for step in range(1, steps + 1):
        loss = model(torch.randn(8, 16, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        from interactive_shard.telemetry import rank as channel
        if channel.emitter() is not None:
            channel.emitter().step = step
            channel.emit("scalar", {"name": "loss", "value": loss.item()})
            channel.emit("scalar", {"name": "wall", "value": time.time()})
        time.sleep(pause)
    return watch


if __name__ == "__main__":
    dist.init_process_group("gloo")
    train(int(os.environ["STEPS"]), float(os.environ.get("PAUSE", "0")))
    dist.destroy_process_group()
"""
STEPS = 12


def _torchrun(script: Path, nproc: int = 2) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*cmd, "--nproc-per-node", str(nproc), str(script)]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **extra}
    env.pop("ISH_TELEMETRY", None)
    return env


def _from_cluster(script: Path) -> ish.Run:
    def run_script(ctx: Any, path: str, steps: int) -> None:
        import runpy

        runpy.run_path(path, run_name="ish_train")["train"](steps)

    with ish.Cluster(2) as cluster:
        return cluster.run(run_script, str(script), STEPS).wait(timeout=120)


def _load(folder: Path) -> tuple[ish.Run, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = ish.load(folder)
    return run, [str(w.message) for w in caught if issubclass(w.category, RecordingWarning)]


def _findings(model: Any) -> list[tuple[str, ...]]:
    found = model.findings() if callable(model.findings) else model.findings
    return sorted(
        (str(getattr(f, "severity", "")), str(getattr(f, "kind", "")), str(f.message)[:60])
        for f in found
    )


def test_a_recorded_job_shows_what_the_same_cluster_run_shows(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    folder = tmp_path / "record"
    subprocess.run(
        _torchrun(script),
        env=_env(ISH_RECORD=str(folder), STEPS=str(STEPS)),
        check=True,
        timeout=180,
        capture_output=True,
    )
    recorded, warned = _load(folder)
    assert warned == []
    assert sorted(p.name.split(".")[-2] for p in folder.iterdir()) == ["rank00000", "rank00001"]
    live = _from_cluster(script)

    shown = {f.name for f in features.FEATURES if f.recorded_in(recorded.store)}
    assert shown == {f.name for f in features.FEATURES if f.recorded_in(live.store)}
    assert {"buckets", "ddp", "timeline", "collectives"} <= shown
    for name in ("buckets", "ddp", "collectives"):  # no timings in these summaries
        feature = features.feature(name)
        assert feature.summary_of(getattr(recorded, name)) == feature.summary_of(
            getattr(live, name)
        ), name
    for name in ("ddp", "collectives", "timeline"):
        assert _findings(getattr(recorded, name)) == _findings(getattr(live, name)), name
    for rank in range(2):
        ours, theirs = recorded.monitor.scalars["loss"][rank], live.monitor.scalars["loss"][rank]
        assert ours.steps == theirs.steps == list(range(1, STEPS + 1))
        assert ours.values == pytest.approx(theirs.values, rel=1e-6)
        assert recorded.monitor.ranks[rank].state.value == "finished"
    assert recorded.timeline.iterations(1)[-1] == live.timeline.iterations(1)[-1] == STEPS
    for name in shown - {"monitor"}:  # every view draws the recorded run
        view = getattr(recorded, name)._view()
        assert view.widget is not None
        view.refresh()
    assert recorded._view().widget is not None  # the run's own: the monitor


def test_a_rank_killed_with_sigkill_loses_at_most_its_last_second(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    folder = tmp_path / "record"
    env = _env(ISH_RECORD=str(folder), STEPS="100000", PAUSE="0.01")
    job = subprocess.Popen(
        _torchrun(script),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        pid = _pid_once_training(folder, rank=1, job=job)
        time.sleep(1.0)  # train a while
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        job.wait(timeout=60)  # torchrun stops the other rank and ends
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
    run, warned = _load(folder)
    assert any(w.startswith("rank 1 ended early") for w in warned), warned
    assert run.monitor.ranks[1].state.value == "failed"
    assert "ended early" in run.monitor.ranks[1].detail
    wall = run.monitor.scalars["wall"][1].values
    assert killed_at - wall[-1] <= 1.0, f"rank 1's file stops {killed_at - wall[-1]:.2f} s early"
    assert len(wall) > 10


def _pid_once_training(folder: Path, rank: int, job: subprocess.Popen[bytes]) -> int:
    """The pid of ``rank`` (its RankInfo), once its file holds a training step."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert job.poll() is None, "the job ended before it trained"
        for path in folder.glob(f"*.rank{rank:05d}.jsonl"):
            lines = path.read_text().splitlines()[1:]
            events = [json.loads(line) for line in lines if line.endswith("]")]
            pids = [e[4]["pid"] for e in events if e[0] == "rank"]
            if pids and any(e[0] == "scalar" and e[4]["name"] == "wall" for e in events):
                return int(pids[0])
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} never recorded a step in {folder}")
