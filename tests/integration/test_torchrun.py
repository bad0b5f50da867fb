"""Ranks started by torchrun stream to a notebook-side listener over TCP."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import interactive_shard as ish
from interactive_shard.telemetry import rank_info

pytestmark = pytest.mark.slow  # make check leaves it out; make test runs it

RANK_SCRIPT = """
import torch, torch.distributed as dist
from interactive_shard.telemetry import rank as channel

dist.init_process_group("gloo")
emitter = channel.connect_from_env()
for step in range(1, 51):
    emitter.step = step
    channel.emit("scalar", {"name": "loss", "value": 1.0 / step})
t = torch.ones(1)
dist.all_reduce(t)
channel.emit("scalar", {"name": "world", "value": t.item()})
channel.close()
dist.destroy_process_group()
"""


def test_torchrun_ranks_stream_to_the_listener(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    with ish.listen(world_size=2) as listener:
        env = {**os.environ, **listener.command_env(), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", "2", str(script)]
        subprocess.run(cmd, env=env, check=True, timeout=120, capture_output=True)
        run = listener.wait(timeout=30)
        assert listener.refused == {}
    scalars = run.monitor.scalars
    assert scalars["loss"][1].steps == list(range(1, 51))
    assert scalars["world"][0].values == [2.0] and scalars["world"][1].values == [2.0]
    # One node (torchrun's GROUP_RANK 0), one host: ranks are labelled by number alone.
    assert rank_info.of(run.store).nodes() == {0: [0, 1]}
    assert [rank_info.of(run.store).label(r) for r in (0, 1)] == ["0", "1"]


def test_listener_rejects_bad_world_size() -> None:

    with pytest.raises(ValueError, match="world_size must be a positive int, got 0"):
        ish.listen(world_size=0)
