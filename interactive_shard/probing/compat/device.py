"""What needs an accelerator, and how a torch without one says so.

DDP's native mixed precision (``DDP(mixed_precision=_MixedPrecision(...))``) copies
parameters on a side stream and waits on events: on a machine without a GPU it fails,
at a point that depends on the build of torch (measured on 2.11.0 to 2.15.0):

- the CPU build (``2.13.0+cpu``): construction works, the first forward raises
  "cpu backend doesn't support events";
- a CUDA build without a GPU (the default ``pip install torch``): ``torch.Stream()`` in
  ``DDP.__init__`` raises ("Backend doesn't support create a new Stream", or "CUDA
  driver version is insufficient"), so there is no model to watch.
"""

from __future__ import annotations

import os
from typing import Literal

import torch


def accelerator_available() -> bool:
    """A GPU (or another accelerator) this process can use."""
    return bool(torch.accelerator.is_available())


def ddp_mixed_precision_fails_at() -> Literal["construction", "forward"] | None:
    """Where ``DDP(mixed_precision=...)`` fails on this machine (None: it runs).

    ``torch.accelerator.current_accelerator()`` is None on the CPU build and the build's
    device type (cuda) on a CUDA build, whether or not a GPU is there."""
    if accelerator_available():
        return None
    return "forward" if torch.accelerator.current_accelerator() is None else "construction"


def autograd_survives_fork() -> bool:
    """Whether a process forked from this one can run a backward.

    A build of torch with an accelerator (a CUDA wheel, also without a GPU) starts its
    autograd engine's device threads at some backwards in this process (FSDP2's, seen
    on 2.11.0 and 2.15.0; a plain module's backward does not), and from then on every
    forked child fails its first backward ("Unable to handle autograd's threading in
    combination with fork-based multiprocessing"). The CPU build never does. Asked by
    forking a child that runs one tiny backward (a few milliseconds).
    """
    if torch.accelerator.current_accelerator() is None:
        return True
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            x = torch.ones(1, requires_grad=True)
            (x * 2).sum().backward()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0
