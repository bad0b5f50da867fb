"""Resolve a Cluster's settings ("auto" backend, device, start method, threads).

Pure functions of what the machine offers, so every rule is testable without GPUs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

BACKENDS = ("auto", "gloo", "nccl")
START_METHODS = ("auto", "fork", "spawn", "forkserver")


@dataclass(frozen=True)
class Placement:
    """Where the ranks run: the backend and one device string per rank."""

    backend: str
    devices: tuple[str, ...]
    start_method: str
    threads: int

    @property
    def device_types(self) -> list[str]:
        return sorted({d.split(":")[0] for d in self.devices})


def resolve(
    nprocs: int,
    backend: str,
    device: str,
    start_method: str,
    threads: int | None,
    *,
    cuda_count: int,
    cuda_initialized: bool,
    fork_safe: Callable[[], bool] = lambda: True,
    cpu_count: int | None = None,
    platform: str = sys.platform,
) -> Placement:
    """Apply the "auto" rules; raise ValueError naming the bad value and the fix."""
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive int, got {nprocs!r}.")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}.")
    if start_method not in START_METHODS:
        raise ValueError(f"start_method={start_method!r} is not one of {START_METHODS}.")

    kind = _device_kind(device, cuda_count)
    if backend == "auto":
        backend = "nccl" if kind == "cuda" and cuda_count >= nprocs else "gloo"
    if backend == "nccl":
        if kind != "cuda":
            raise ValueError(
                f"backend='nccl' needs CUDA devices, but device={device!r} resolved to "
                f"{kind!r} (CUDA devices visible: {cuda_count}). Use backend='gloo' on CPU."
            )
        if cuda_count < nprocs:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: nprocs={nprocs} but only "
                f"{cuda_count} GPU(s) are visible (NCCL refuses two ranks on one GPU). Use "
                f"backend='gloo' to let ranks share GPUs, or nprocs<={cuda_count}."
            )
    devices = tuple(f"cuda:{r % cuda_count}" if kind == "cuda" else "cpu" for r in range(nprocs))

    if start_method == "auto":
        # Ranks on GPUs are spawned: the CUDA driver does not survive a fork once anything
        # in the kernel called cuInit (torch.cuda.is_available() does, without
        # torch.cuda.is_initialized() saying so).
        forkable = platform.startswith("linux") and not cuda_initialized and kind != "cuda"
        if forkable and not fork_safe():  # asked only here: it forks a child to find out
            start_method = "forkserver"  # a fresh server process forks the ranks
        else:
            start_method = "fork" if forkable else "spawn"
    elif start_method == "fork" and cuda_initialized:
        raise ValueError(
            "start_method='fork' is unsafe here: CUDA is already initialised in this kernel, "
            "and a forked rank cannot use it. Use start_method='spawn' (or 'auto'), or "
            "restart the kernel and create the Cluster before touching CUDA."
        )
    elif start_method == "fork" and not fork_safe():
        raise ValueError(
            "start_method='fork' is unsafe here: autograd in this kernel already started "
            "its device threads (a CUDA build of torch after an FSDP backward), and a "
            "forked rank cannot run backward. Use start_method='forkserver' (or 'auto')."
        )
    if start_method == "fork" and not platform.startswith("linux"):
        raise ValueError(f"start_method='fork' is only supported on Linux here, not {platform}.")

    cpus = cpu_count or os.cpu_count() or 1
    if threads is None:
        # An even share: oversubscribing 2 cores slowed a DDP step by 27%.
        threads = max(1, cpus // nprocs)
    elif not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int or None, got {threads!r}.")
    return Placement(backend, devices, start_method, threads)


def _device_kind(device: str, cuda_count: int) -> str:
    if device == "auto":
        return "cuda" if cuda_count > 0 else "cpu"
    if device in ("cpu", "cuda"):
        if device == "cuda" and cuda_count == 0:
            raise ValueError(
                "device='cuda' but no CUDA device is visible to torch. Use device='cpu' or 'auto'."
            )
        return device
    raise ValueError(f"device={device!r} is not one of 'auto', 'cpu', 'cuda'.")
