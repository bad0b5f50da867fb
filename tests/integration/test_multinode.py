"""Two torchrun "nodes" on this machine (issue 25, multi-node): ``--nnodes=2`` with a c10d
rendezvous on loopback, two ranks each, a DDP script under ``ish.watch`` and nothing else
of ours. The ranks stream to one ``ish.listen`` (token, bound to the address given), or
record to ``ISH_RECORD``; either way one ``Run`` holds the four ranks, each labelled with
its node. And the listener refuses a wrong token and a rank outside the world size."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
import warnings
from pathlib import Path

import pytest
from support import kill_tree, wait_for

import interactive_shard as ish
from interactive_shard import RecordingWarning, features
from interactive_shard.cluster.isolation import loopback_interface
from interactive_shard.telemetry import rank_info, schema
from interactive_shard.telemetry.channel import Emitter
from interactive_shard.telemetry.rank_file import RECORD_ENV
from interactive_shard.telemetry.rank_state import RankState

NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
STEPS = 3
JOB_TIMEOUT_S = 120  # both agents, start to exit: 10 to 20 s on 2 busy cores

TRAIN = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
import interactive_shard as ish
from interactive_shard.telemetry import rank as channel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
ddp = DDP(model)
ish.watch(ddp)  # connects as ISH_TELEMETRY / ISH_RECORD say
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(dist.get_rank())
for step in range(1, {steps} + 1):
    channel.emitter().step = step
    loss = ddp(torch.randn(8, 16, generator=gen)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    channel.emit("scalar", {{"name": "loss", "value": loss.item()}})
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun_two_nodes(tmp_path: Path, extra_env: dict[str, str]) -> None:
    """Start two torchrun agents (one per "node") as a job script would on two hosts, and
    wait for both; on failure or timeout kill them and their ranks, and say what they said."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN.format(steps=STEPS)))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISH_")}
    env.update(OMP_NUM_THREADS="1", **extra_env)
    iface = loopback_interface()
    if iface is not None:  # gloo binds the loopback interface, as a Cluster's ranks do
        env["GLOO_SOCKET_IFNAME"] = iface
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}"]
    cmd += [f"--nproc-per-node={PER_NODE}", "--rdzv-backend=c10d"]
    cmd += [f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=ish-{uuid.uuid4().hex[:12]}"]
    cmd += ["--rdzv-conf=join_timeout=60", "--local-addr=127.0.0.1", str(script)]
    logs = [tmp_path / f"node{n}.log" for n in range(NODES)]
    agents: list[subprocess.Popen[bytes]] = []
    try:
        for log in logs:
            with log.open("wb") as out:
                agents.append(
                    subprocess.Popen(
                        cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while any(a.poll() is None for a in agents):
            if any(a.poll() not in (None, 0) for a in agents):
                break  # one node failed: the other would wait for it
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        codes = [a.poll() for a in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                kill_tree(agent.pid)  # the agent and its ranks (each in a session of its own)
            agent.wait(timeout=10)
    if codes != [0] * NODES:
        said = "\n".join(
            f"--- node {n} (exit {c}):\n{logs[n].read_text()[-3000:]}" for n, c in enumerate(codes)
        )
        why = f"None: stopped, still running (the time limit is {JOB_TIMEOUT_S} s)"
        pytest.fail(f"torchrun agents ended with {codes} ({why})\n{said}")


def _check_the_job(run: ish.Run) -> None:
    """Four ranks on two nodes of two, all finished, each with what DDP did and its node
    in the views' rank selector."""
    assert run.store.info.world_size == WORLD
    nodes = rank_info.of(run.store).nodes()
    assert sorted(map(sorted, nodes.values())) == [[0, 1], [2, 3]], nodes  # torchrun's order
    node_of = {rank: node for node, ranks in nodes.items() for rank in ranks}
    assert sorted(nodes) == [0, 1]
    monitor = run.monitor
    assert [r.state for r in monitor.ranks] == [RankState.FINISHED] * WORLD
    assert [r.node for r in monitor.ranks] == [node_of[r] for r in range(WORLD)]
    assert all(r.host for r in monitor.ranks)
    assert sorted(monitor.scalars["loss"]) == list(range(WORLD))
    assert all(monitor.scalars["loss"][r].steps == list(range(1, STEPS + 1)) for r in range(WORLD))
    buckets = run.buckets
    assert buckets.ranks == list(range(WORLD)) and buckets.iterations == list(range(1, STEPS + 1))
    for rank in range(WORLD):  # what DDP did is what the planner says, on every rank
        assert buckets.observed(STEPS, rank) and buckets.compare(STEPS, rank).matches
    for rank in range(WORLD):
        (instance,) = run.ddp.instances_of(rank)
        assert [it.finished for it in instance.iterations if it.backward] == [True] * STEPS
        assert run.collectives.entries(rank), f"rank {rank} recorded no collective"
    assert run.collectives.ranks == list(range(WORLD))
    view = features.feature("buckets").view_of(buckets)
    view.widget  # noqa: B018
    assert view.rank_selector.options == tuple(
        (f"{r} · node {node_of[r]}", r) for r in range(WORLD)
    )


@pytest.mark.slow
def test_two_nodes_stream_to_one_listener(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    with ish.listen(world_size=WORLD, host="127.0.0.1", token=token) as listener:
        assert listener.address.startswith("tcp://127.0.0.1:")
        env = listener.command_env()
        assert env == {"ISH_TELEMETRY": listener.address, "ISH_TOKEN": token}
        _torchrun_two_nodes(tmp_path, env)
        run = listener.wait(timeout=30)
        assert listener.streams_closed == set(range(WORLD)) and listener.refused == {}
        _check_the_job(run)


@pytest.mark.slow
def test_two_nodes_record_one_job(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    _torchrun_two_nodes(tmp_path, {RECORD_ENV: str(folder)})
    files = sorted(folder.iterdir())
    assert [f.name.rpartition(".rank")[2] for f in files] == [
        f"{r:05d}.jsonl" for r in range(WORLD)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordingWarning)  # nothing missing, damaged or cut
        run = ish.load(folder)
    _check_the_job(run)


# -- refusals (fast: no torchrun) ------------------------------------------------------------
def _send(address: str, token: str, rank: int) -> None:
    """What a rank's ``ish.watch`` sends: where it runs, a scalar, its stream's end."""
    emitter = Emitter(address, token, rank)
    try:
        emitter.announce()
        emitter.emit("scalar", {"name": "loss", "value": 1.0})
        emitter.flush(final=True)
    finally:
        emitter.close()


def test_the_listener_refuses_a_wrong_token_and_a_rank_outside_the_world(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="interactive_shard.telemetry.channel")
    with ish.listen(world_size=WORLD, host="127.0.0.1", token="right-token") as listener:
        _send(listener.address, "wrong-token", 1)  # its batches and its BYE: refused
        wait_for(lambda: schema.WRONG_TOKEN in listener.refused, 10, "the wrong token's refusal")
        assert len(listener.run.store) == 0
        _send(listener.address, "right-token", 7)  # a world of 4: ranks 0..3
        wait_for(lambda: schema.UNKNOWN_RANK in listener.refused, 10, "rank 7's refusal")
        # Its batches (RankInfo and scalar, the last one final) are refused; its BYE, which
        # carries no event, is taken.
        assert len(listener.run.store) == 0 and listener.streams_closed == set()
        assert "refused" in repr(listener)
        with pytest.raises(TimeoutError, match=r"wrong token: .*ISH_TOKEN"):
            listener.wait(timeout=0.1)
        _send(listener.address, "right-token", 3)  # and a right one still lands
        wait_for(lambda: 3 in listener.streams_closed, 10, "rank 3's stream")
        assert [e.rank for e in listener.run.store.of_kind("scalar")] == [3]
    # The first refusal of each reason is logged, naming the rank it claims and its sender.
    said = [r.getMessage() for r in caplog.records if "dropped a message" in r.getMessage()]
    (wrong,) = [m for m in said if "wrong token" in m]
    assert "says rank 1" in wrong and "from 127.0.0.1" in wrong
    (outside,) = [m for m in said if schema.UNKNOWN_RANK in m]
    assert "rank 7" in outside and "ranks 0..3" in outside


def test_command_env_names_this_host_when_listening_on_every_interface() -> None:
    with pytest.raises(ValueError, match="needs a token"):
        ish.listen(world_size=2, host="0.0.0.0")
    with ish.listen(world_size=2, host="0.0.0.0", token="t") as listener:
        port = listener.address.rpartition(":")[2]
        env = listener.command_env()
        assert env["ISH_TELEMETRY"] == f"tcp://{socket.gethostname()}:{port}"
        assert listener.command_env(host="head-node")["ISH_TELEMETRY"] == f"tcp://head-node:{port}"
