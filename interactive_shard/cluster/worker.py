"""The rank process: join the process group, then run functions sent by the kernel.

Protocol on the control pipe (an anonymous pipe inherited from the kernel, never a
listening socket, so no other process can write to it), in ``messages.py``:

  kernel -> rank   RunCall(run_id, payload)   payload = cloudpickle of (fn, args, kwargs)
                   Stop()
  rank -> kernel   Ready(pid)
                   Done(run_id, result)       result = pickled return value
                   Failed(run_id, traceback, interrupted, broken)

``broken`` says the process group itself failed (a collective timed out or lost its
peer): the ranks cannot be trusted with another collective and must restart.

Events go separately over the telemetry channel; before "done"/"error" the rank
flushes them and closes the run's stream (``final``), so the kernel knows none are
still in flight.
"""

from __future__ import annotations

import datetime
import io
import linecache
import os
import pickle
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from interactive_shard.cluster import isolation, stacks
from interactive_shard.cluster.messages import STARTUP, Done, Failed, Ready, RunCall


@dataclass(frozen=True)
class WorkerConfig:
    rank: int
    world_size: int
    device: str
    backend: str
    threads: int
    store_file: str  # this generation's FileStore, in the cluster's private directory
    timeout: float
    telemetry_address: str
    telemetry_token: str
    parent_pid: int  # the rank dies with it; 0: with the parent it starts with (forkserver)
    pdeathsig: bool  # the thread that starts the rank outlives it (Note [Rank isolation])


def main(cfg: WorkerConfig, conn: Connection, out_w: Connection, err_w: Connection) -> None:
    # Order matters, see Note [Rank isolation]: follow the parent before anything else,
    # fork the reaper before any thread exists.
    parent = isolation.die_with_parent(cfg.parent_pid, pdeathsig=cfg.pdeathsig)
    isolation.own_session()
    _redirect_output(out_w, err_w)
    isolation.drop_inherited_sockets({conn.fileno(), out_w.fileno(), err_w.fileno()})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only a running function is interruptible
    isolation.start_group_reaper()
    isolation.watch_parent(parent)
    isolation.keep_collectives_on_loopback()
    try:
        ctx = _start(cfg)
    except BaseException:
        conn.send(Failed(STARTUP, _format_exc(cfg.rank), interrupted=False, broken=True))
        return
    conn.send(Ready(os.getpid()))
    _serve(cfg, ctx, conn)


def _redirect_output(out_w: Connection, err_w: Connection) -> None:
    # fd-level, so C++ output (gloo, NCCL, aborts) is captured too.
    os.dup2(out_w.fileno(), 1)
    os.dup2(err_w.fileno(), 2)
    sys.stdout, sys.stderr = _stream(1), _stream(2)
    stacks.enable(sys.stderr)  # Note [Stuck rank stacks]


def _start(cfg: WorkerConfig) -> Any:
    import torch
    import torch.distributed as dist

    from interactive_shard.cluster.context import RankContext
    from interactive_shard.telemetry import rank as rank_channel
    from interactive_shard.telemetry.channel import Emitter

    torch.set_num_threads(cfg.threads)
    if cfg.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(cfg.device))
    timeout = datetime.timedelta(seconds=cfg.timeout)
    # A fresh file per generation: a restarted cluster never sees stale keys.
    store = dist.FileStore(cfg.store_file, cfg.world_size)
    store.set_timeout(timeout)
    dist.init_process_group(
        cfg.backend, store=store, rank=cfg.rank, world_size=cfg.world_size, timeout=timeout
    )
    from interactive_shard import features

    # What a feature must have running before the user's code: the collective log (DDP's
    # construction-time sync happens before any ish.watch). Declared in the feature list.
    features.start_on_rank()
    emitter = Emitter(cfg.telemetry_address, cfg.telemetry_token, cfg.rank)
    rank_channel.set_emitter(emitter)
    return RankContext(cfg.rank, cfg.world_size, cfg.device, cfg.backend, emitter)


def _serve(cfg: WorkerConfig, ctx: Any, conn: Connection) -> None:
    import torch.distributed as dist

    emitter = ctx._emitter
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # kernel closed the pipe
            break
        if not isinstance(msg, RunCall):  # Stop
            break
        run_id = msg.run_id
        emitter.start_run(run_id)
        result = b""
        failure: tuple[str, bool, bool] | None = None  # traceback, interrupted, broken
        try:
            fn, args, kwargs, sources = pickle.loads(msg.payload)
            linecache.cache.update(sources)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                value = fn(ctx, *args, **kwargs)
            finally:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            result = _dumps_result(cfg.rank, value)
        except KeyboardInterrupt:
            failure = (_format_exc(cfg.rank), True, False)
        except BaseException as exc:
            failure = (_format_exc(cfg.rank), False, _breaks_group(exc))
        _restore_output()
        try:
            emitter.flush(final=True)
        except Exception:  # the reply matters more than the last events (counted missing)
            traceback.print_exc()
        sent = emitter.taken  # the kernel compares it with what arrived
        if failure is None:
            # dist.destroy_process_group() in the function: say so, the kernel restarts.
            conn.send(Done(run_id, result, sent, group_lost=not dist.is_initialized()))
        else:
            conn.send(Failed(run_id, *failure, sent=sent))
    _shutdown(emitter)


def _restore_output() -> None:
    """Flush the rank's output; a stream the function closed or replaced by a closed one
    is reopened on its pipe, so the rank lives on (and its next run prints)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name, None)
        try:
            stream.flush()  # type: ignore[union-attr]
        except Exception:  # closed (ValueError), None, or not a stream at all
            setattr(sys, name, _stream(fd))


def _stream(fd: int) -> io.TextIOWrapper:
    # closefd=False: a function that closes sys.stdout leaves the pipe (fd 1) open.
    return io.TextIOWrapper(os.fdopen(fd, "wb", 0, closefd=False), line_buffering=True)


def _dumps_result(rank: int, result: Any) -> bytes:
    try:
        data: bytes = cloudpickle.dumps(result)
        return data
    except Exception as exc:
        raise TypeError(
            f"rank {rank}: the function's return value ({type(result).__qualname__}) cannot "
            f"be sent to the notebook ({exc}). Return plain data, tensors or numbers; keep "
            "other objects in ctx.state."
        ) from exc


# Collective failures surface as plain RuntimeErrors from the backend's C++ code; a
# group the function destroyed (dist.destroy_process_group()) as a ValueError.
_BROKEN_GROUP_SIGNS = (
    "Timed out",
    "timed out",
    "Connection closed by peer",
    "gloo/",
    "NCCL",
    "Default process group has not been initialized",
)


def _breaks_group(exc: BaseException | None) -> bool:
    import torch.distributed as dist

    if not dist.is_initialized():
        return True
    while exc is not None:
        if isinstance(exc, getattr(dist, "DistError", ())) or any(
            sign in str(exc) for sign in _BROKEN_GROUP_SIGNS
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _format_exc(rank: int) -> str:
    return f"[rank {rank}] " + traceback.format_exc()


def _shutdown(emitter: Any) -> None:
    import torch.distributed as dist

    emitter.close()
    if dist.is_initialized():
        dist.destroy_process_group()
