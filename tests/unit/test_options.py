"""The "auto" rules for backend, device, start method and threads."""

from __future__ import annotations

import pytest

from interactive_shard.cluster.options import resolve


def _resolve(nprocs=2, backend="auto", device="auto", start="auto", threads=None, **kw):
    kw.setdefault("cuda_count", 0)
    kw.setdefault("cuda_initialized", False)
    kw.setdefault("cpu_count", 2)
    kw.setdefault("platform", "linux")
    return resolve(nprocs, backend, device, start, threads, **kw)


def test_cpu_machine_gets_gloo_fork_and_one_thread_per_rank() -> None:
    p = _resolve()
    assert (p.backend, p.devices, p.start_method, p.threads) == ("gloo", ("cpu", "cpu"), "fork", 1)


def test_enough_gpus_gets_nccl_one_gpu_per_rank() -> None:
    p = _resolve(cuda_count=4)
    assert p.backend == "nccl" and p.devices == ("cuda:0", "cuda:1")


def test_ranks_sharing_one_gpu_use_gloo() -> None:
    p = _resolve(nprocs=3, cuda_count=1)
    assert p.backend == "gloo" and p.devices == ("cuda:0",) * 3


def test_cuda_initialised_means_spawn() -> None:
    assert _resolve(cuda_count=1, cuda_initialized=True).start_method == "spawn"
    # Ranks on GPUs are spawned even before CUDA is initialised here (cuInit breaks fork).
    assert _resolve(device="cuda", cuda_count=1).start_method == "spawn"
    assert _resolve(device="cpu", cuda_count=1).start_method == "fork"
    assert _resolve(platform="darwin").start_method == "spawn"


def test_forced_fork_after_cuda_init_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="start_method='spawn'"):
        _resolve(start="fork", cuda_count=1, cuda_initialized=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nprocs": 0}, "nprocs must be a positive int, got 0"),
        ({"backend": "mpi"}, "backend='mpi'"),
        ({"backend": "nccl"}, "needs CUDA devices"),
        ({"backend": "nccl", "cuda_count": 1}, "only 1 GPU"),
        ({"device": "cuda"}, "no CUDA device"),
        ({"device": "tpu"}, "device='tpu'"),
        ({"start": "thread"}, "start_method='thread'"),
        ({"threads": 0}, "threads must be a positive int"),
    ],
)
def test_bad_settings_name_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _resolve(**kwargs)


def test_a_kernel_whose_autograd_breaks_forks_gets_a_fork_server() -> None:
    """A CUDA build of torch after an FSDP backward in the kernel: a forked rank could
    not run backward (compat.device.autograd_survives_fork)."""
    asked: list[bool] = []

    def unsafe() -> bool:
        asked.append(True)
        return False

    assert _resolve(fork_safe=unsafe).start_method == "forkserver"
    assert _resolve(start="spawn", fork_safe=unsafe).start_method == "spawn"
    with pytest.raises(ValueError, match="start_method='forkserver'"):
        _resolve(start="fork", fork_safe=unsafe)
    asked.clear()
    assert _resolve(cuda_count=2, fork_safe=unsafe).start_method == "spawn"
    assert asked == []  # GPU ranks are spawned anyway: no child forked to ask


def test_this_process_can_fork_a_rank_that_runs_backward() -> None:
    from interactive_shard.probing.compat import device

    assert device.autograd_survives_fork()  # a plain backward here starts no device threads
