"""torch's private names and its differences between releases, one module per concern.

interactive_shard supports torch 2.11 to 2.15 (``pyproject.toml``). Whatever the package
reads of torch that is private (a leading underscore) or differs between those releases
is reached through these modules, and each difference names the release it appears in:

- ``ddp.py``: ``DistributedDataParallel``'s arguments and private state;
- ``fsdp.py``: FSDP2's state and its mixed-precision rules;
- ``device.py``: what needs an accelerator, and how a CPU torch says it has none.

Nothing outside this package compares torch versions: it asks a named question here
(``ddp.FORWARD_SYNC_BUFFERS``, ``fsdp.reduce_dtype_rule()``), so a new release is one
edit in one place, and its tests skip with the reason written here.
"""

from __future__ import annotations

import re

import torch

__all__ = ["RELEASE", "release", "since"]


def release(version: str) -> tuple[int, int, int]:
    """``"2.15.0+cu132"`` -> ``(2, 15, 0)``; a pre-release counts as its release."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


RELEASE = release(str(torch.__version__))


def since(major: int, minor: int, patch: int = 0) -> bool:
    """The running torch is this release or newer."""
    return RELEASE >= (major, minor, patch)
