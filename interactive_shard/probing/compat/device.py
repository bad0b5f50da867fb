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
