"""torch.compile's private names the split probe and planner read (unchanged 2.11 to
2.15): DDPOptimizer, the compiled-module wrapper, dynamo's per-code caches and the
sources of a graph's placeholders. Importing this module imports ``torch._dynamo``
(about half a second): import it where a compiled model is met, not at package import."""

from __future__ import annotations

from types import CodeType

import torch
import torch._dynamo
from torch._dynamo import source as sources  # the classes of a placeholder's source
from torch._dynamo.backends.distributed import DDPOptimizer
from torch._dynamo.eval_frame import OptimizedModule

__all__ = [
    "DDPOptimizer",
    "OptimizedModule",
    "cached",
    "optimize_ddp_mode",
    "reset_code",
    "sources",
]


def optimize_ddp_mode() -> str:
    """``torch._dynamo.config.optimize_ddp`` as a mode name ("ddp_optimizer", ...)."""
    return str(torch._dynamo.utils.get_optimize_ddp_mode())


def cached(code: CodeType) -> bool:
    """Dynamo holds compiled entries for ``code`` (it was compiled before)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return bool(_debug_get_cache_entry_list(code))


def reset_code(code: CodeType) -> None:
    """Drop dynamo's cache entries of ``code`` (a fresh compile next time)."""
    torch._dynamo.reset_code(code)
