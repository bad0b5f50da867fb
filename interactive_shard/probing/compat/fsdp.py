"""FSDP2 (``fully_shard``) by release: where its state lives, how it reduces.

Each name below is read where the probes and planners need it; the release where a
difference appears is in the comment beside it (measured on 2.11.0, 2.12.1, 2.13.0,
2.14.1 and 2.15.0 with 2 CPU ranks, ``shared/TORCH_NOTES.md``).
"""

from __future__ import annotations

from typing import Any, Literal

from interactive_shard.probing.compat import since

# 2.13: FSDPState._cast_forward_inputs holds the forward-input cast; before, FSDP2 cast
# inline in _pre_forward, and the precision probe compares hooks before and after it.
CAST_METHOD = since(2, 13)

# 2.15: MixedPrecisionPolicy.param_dtype_override_fn (a parameter may keep its dtype).
PARAM_DTYPE_OVERRIDE = since(2, 15)

ReduceRule = Literal["compute", "original"]


def reduce_dtype_rule() -> ReduceRule:
    """The dtype FSDP2 reduce-scatters in when the policy sets no ``reduce_dtype``.

    Up to 2.14 the gradient's own dtype, the compute dtype (``param_dtype`` or the
    original); from 2.15 the parameters' original dtype (``FSDPParam.unsharded_grad_dtype``
    falls back to ``orig_dtype``; ``FSDPParamGroup._get_reduce_dtype`` promotes over them).
    """
    return "original" if since(2, 15) else "compute"


def param_groups(state: Any) -> list[Any]:
    """An FSDP2 state's parameter groups (``FSDPParamGroup``).

    2.12: a list, ``FSDPState._fsdp_param_groups``; 2.11 keeps one group or None,
    ``_fsdp_param_group`` (from 2.13 that name raises when there are several groups).
    """
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def param_reduce_dtype(fsdp_param: Any) -> Any:
    """The dtype an ``FSDPParam`` says its gradient is reduced in (with no other
    parameter of its group promoting it): 2.15's ``unsharded_grad_dtype``, else
    ``reduce_dtype or param_dtype or orig_dtype``."""
    if reduce_dtype_rule() == "original":
        return fsdp_param.unsharded_grad_dtype
    return fsdp_param.reduce_dtype or fsdp_param.param_dtype or fsdp_param.orig_dtype


def dtype_overrides(policy: Any, module: Any) -> list[str]:
    """Parameters (names in ``module``) that a policy's ``param_dtype_override_fn``
    (2.15) keeps in a dtype other than its ``param_dtype``; [] before 2.15, or without
    one. A parameter owned by a nested unit is listed too: an over-report, never a miss."""
    fn = getattr(policy, "param_dtype_override_fn", None) if PARAM_DTYPE_OVERRIDE else None
    if fn is None or getattr(policy, "param_dtype", None) is None:
        return []
    return [
        name for name, p in module.named_parameters() if fn(p) not in (None, policy.param_dtype)
    ]
