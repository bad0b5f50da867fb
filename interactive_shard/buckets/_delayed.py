"""DDP's ``delay_all_reduce_named_params`` for the planner: which parameters leave the
buckets, and what DDP all-reduces for them instead (Note [DDP buckets], "Delayed").

DDP matches the given names against its own keys, ``f"{module}.{name}"`` (``ddp_key``),
so the name decides what leaves the Reducer and the tensor only what goes in the
delayed buffer. The planner resolves names the same way: a root parameter given as
``"pos"`` stays in the buckets (DDP's key is ``".pos"``) and is delayed as well.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from interactive_shard.buckets._params import (
    ParamInfo,
    _tensor_info,
    ddp_key,
    ddp_keys,
    key_fqn,
    reducer_params,
)


@dataclass(frozen=True)
class DelayedParams:
    """Parameters DDP all-reduces outside every bucket: one flat buffer, one all-reduce
    from a gradient hook on ``hook`` (``param_to_hook_all_reduce``)."""

    fqns: list[str]  # in the order given (the flat buffer's order)
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    numels: list[int]
    hook: str | None = None  # fqn of param_to_hook_all_reduce (None: not given)
    # Delayed but still bucketed: named so that DDP's key misses them (a root "pos").
    in_buckets: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes DDP all-reduces: its buffer is ``torch.zeros(numel)`` (default dtype)."""
        return sum(self.numels) * torch.get_default_dtype().itemsize


def delay_names(given: Sequence[str] | Sequence[tuple[str, Any]] | None) -> list[str]:
    """The names of ``delay_all_reduce_named_params`` (fqns, or DDP's (name, param))."""
    if given is None:
        return []
    if isinstance(given, (str, dict)) or not isinstance(given, Sequence):
        raise TypeError(
            "delay_all_reduce_named_params must be a list of fqns or of (name, param) "
            f"pairs, as DDP takes it; got {given!r:.80}"
        )
    names = [entry[0] if isinstance(entry, tuple) and len(entry) == 2 else entry for entry in given]
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"delay_all_reduce_named_params: expected fqns, got {bad[0]!r:.80}")
    twice = [n for n, count in Counter(names).items() if count > 1]
    if twice:
        raise ValueError(f"delay_all_reduce_named_params names {twice} twice; name each once")
    return names


def split_delayed(
    source: nn.Module | list[tuple[str, Any]],
    params: list[ParamInfo],
    names: list[str],
    hook: str | torch.Tensor | None,
) -> tuple[list[ParamInfo], DelayedParams | None, frozenset[str]]:
    """``params`` (``collect_params(source)``) without the delayed ones, the delayed ones,
    and the DDP keys taken out (``ignore`` for ``reducer_params``)."""
    if hook is not None and not names:
        raise ValueError(
            "param_to_hook_all_reduce needs delay_all_reduce_named_params (DDP takes both "
            "or neither)"
        )
    if not names:
        return params, None, frozenset()
    if isinstance(source, nn.Module):
        tensors: dict[str, Any] = ddp_keys(source)
        keys = {k: _tensor_info(key_fqn(k), p) for k, p in tensors.items()}
    else:
        tensors = {ddp_key(fqn): value for fqn, value in source}
        keys = {ddp_key(p.fqn): p for p in params}
    removed, delayed, kept = [], [], []
    for name in names:
        if name in keys:
            removed.append(name)
            delayed.append(keys[name])
        elif ddp_key(name) in keys:  # a root parameter by its fqn: DDP's key misses it
            kept.append(name)
            delayed.append(keys[ddp_key(name)])
        else:
            raise ValueError(_unknown("delay_all_reduce_named_params", name, keys))
    ignore = frozenset(removed)
    if isinstance(source, nn.Module):
        rows = reducer_params(source, ignore)
        params = [_tensor_info(r.fqn, r.param, r.sparse_grad) for r in rows]
        # A shared parameter delayed under one name stays under another (as in DDP).
        bucketed = {id(r.param) for r in rows}
        kept += [key_fqn(k) for k in removed if id(tensors[k]) in bucketed]
    else:
        params = [p for p in params if ddp_key(p.fqn) not in ignore]
    record = DelayedParams(
        fqns=[p.fqn for p in delayed],
        shapes=[p.shape for p in delayed],
        dtypes=[str(p.dtype) for p in delayed],
        numels=[p.numel for p in delayed],
        hook=_hook_name(hook, tensors, keys),
        in_buckets=kept,
    )
    return params, record, ignore


def _hook_name(
    hook: str | torch.Tensor | None, tensors: dict[str, Any], keys: dict[str, ParamInfo]
) -> str | None:
    if hook is None:
        return None
    if isinstance(hook, torch.Tensor):
        found = [k for k, t in tensors.items() if t is hook and k in keys]
        if not found:
            raise ValueError(
                "param_to_hook_all_reduce is not a trainable parameter of this model "
                "(DDP registers a gradient hook on it)"
            )
        return key_fqn(found[0])
    if not isinstance(hook, str):
        raise TypeError(f"param_to_hook_all_reduce: expected an fqn or a parameter, got {hook!r}")
    key = hook if hook in keys else ddp_key(hook)
    if key not in keys:
        raise ValueError(_unknown("param_to_hook_all_reduce", hook, keys))
    return key_fqn(key)


def _unknown(argument: str, name: str, keys: dict[str, ParamInfo]) -> str:
    fqns = [key_fqn(k) for k in keys]
    close = difflib.get_close_matches(name, fqns, n=3)
    return (
        f"{argument}: {name!r} is not a trainable parameter of this model"
        + (f"; did you mean {close}?" if close else "")
        + f" ({len(fqns)} trainable parameters, e.g. {fqns[:4]})"
    )
