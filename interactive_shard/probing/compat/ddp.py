"""DistributedDataParallel by release: its arguments, and the private state probes read.

Measured on 2.11.0, 2.12.1, 2.13.0, 2.14.1 and 2.15.0 with 2 CPU ranks
(``shared/TORCH_NOTES.md``). Unchanged in all five and read through here all the same:
``_module_parameters``, ``_delay_all_reduce_params``, ``_get_ddp_logging_data``,
``_lazy_init_ran``, ``dist._DEFAULT_FIRST_BUCKET_BYTES`` and
``dist._compute_bucket_assignment_by_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from interactive_shard.probing.compat import since

MIB = 1024 * 1024

# 2.13: forward_sync_buffers replaces broadcast_buffers (which now warns); before it
# only broadcast_buffers exists.
FORWARD_SYNC_BUFFERS = since(2, 13)

# 2.12: _BucketCapacityConfig turns bucket_cap_mb (or bucket_cap_mb_list) into byte
# limits; the planner's BucketCaps is its twin, checked against it where it exists.
BUCKET_CAPACITY_CONFIG = since(2, 12)

# 2.15: DDP(lazy_bucket_allocation=True) allocates bucket storage in backward.
LAZY_BUCKET_ALLOCATION = since(2, 15)

# 2.11 passes bucket_cap_mb itself (not bytes) to dist._broadcast_coalesced when
# delay_all_reduce_named_params is given: None or a float cap raises TypeError (fixed in
# 2.12).
DELAY_ALL_REDUCE_NEEDS_INT_CAP = not since(2, 12)

# 2.11: static_graph with two forwards before one backward fails in plain torch (an
# inplace version counter); fixed in 2.12.1.
STATIC_GRAPH_MULTI_FORWARD = since(2, 12, 1)

# A rebuild's first bucket when no cap is given (1 MiB; present in every release).
DEFAULT_FIRST_BUCKET_BYTES: int = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", MIB)


def missing(feature: str) -> str:
    """The reason a test skips (or a view says) that this torch lacks ``feature``."""
    return f"torch {torch.__version__} has no {feature} (see probing/compat/ddp.py)"


def compute_bucket_assignment() -> Callable[..., Any] | None:
    """``dist._compute_bucket_assignment_by_size``, DDP's own greedy bucketing."""
    return getattr(dist, "_compute_bucket_assignment_by_size", None)


def params(ddp: Any) -> list[torch.Tensor]:
    """The Reducer's parameters (those DDP ignores or delays left out), in its order."""
    return list(ddp._module_parameters)


def delayed_params(ddp: Any) -> list[torch.Tensor]:
    """``delay_all_reduce_named_params``' tensors, all-reduced outside the buckets."""
    return list(getattr(ddp, "_delay_all_reduce_params", None) or [])


def logging_data(ddp: Any) -> dict[str, Any]:
    """DDP's logger's fields ({} before it exists); runtime ones are sampled."""
    if getattr(ddp, "logger", None) is None:
        return {}
    return dict(ddp._get_ddp_logging_data())


def forward_sync_buffers(ddp: Any) -> bool:
    """Buffers broadcast before every forward: ``forward_sync_buffers`` from 2.13,
    ``broadcast_buffers`` before."""
    return bool(getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", True)))


def first_bucket_bytes(ddp: Any, default_cap: bool) -> int:
    """The first bucket's cap of a rebuild: ``_bucket_config.first_bucket_bytes_cap``
    from 2.12 (``_BucketCapacityConfig``); before it 1 MiB when no cap was given, else
    the cap."""
    first = getattr(getattr(ddp, "_bucket_config", None), "first_bucket_bytes_cap", None)
    if first is None:
        return DEFAULT_FIRST_BUCKET_BYTES if default_cap else int(ddp.bucket_bytes_cap)
    return int(first)


def cap_list_bytes(ddp: Any) -> list[int]:
    """``bucket_cap_mb_list`` in bytes ([] when not given)."""
    return [int(c) for c in getattr(ddp, "bucket_bytes_cap_list", None) or []]


def iterations_done(ddp: Any) -> int | None:
    """Reducing iterations DDP ran before now, from its logger alone (None: unknown).

    DDP logs ``iteration`` (its ``num_iterations_`` minus one) at each reducing forward
    and stops updating it after ten (sampled from then on): it is exact for 2 to 10
    iterations; before the first forward (``_lazy_init_ran`` false) it is 0; after one
    it reads as after none. The collective log counts forwards from construction
    instead (``collective_log.Instance.forwards``), where it saw the instance built.
    """
    if not getattr(ddp, "_lazy_init_ran", False):
        return 0
    logged = logging_data(ddp).get("iteration")
    if isinstance(logged, int) and 1 <= logged <= 9:
        return logged + 1
    return None
