"""The per-unit dtype rules of FSDP2, FSDP1 and DDP mixed precision, on plain data.

No torch here: dtypes are strings (``"torch.bfloat16"``), policies ``events.Policy``.
Note [Mixed-precision plan] in ``plan.py`` gives the rules with their torch sources;
the simulation (``_simulate.py``) and the planner both read them from here.
"""

from __future__ import annotations

from typing import Literal

from interactive_shard.precision.events import PHASES, Policy

Family = Literal["fsdp2", "fsdp1", "ddp"]

__all__ = [
    "Family",
    "buffer_cast",
    "compute_dtype",
    "input_cast",
    "param_cast",
    "static_dtypes",
    "why_uncast",
]


def param_cast(family: Family | None, policy: Policy) -> str | None:
    """The dtype a unit's floating parameters are cast to for compute (None: kept)."""
    if family is None or policy.kind == "none":
        return None
    return policy.param_dtype


def compute_dtype(family: Family | None, policy: Policy, orig: str | None) -> str | None:
    """The dtype the unit's parameters have while it computes: ``param_dtype or orig``."""
    return param_cast(family, policy) or orig


def input_cast(
    family: Family | None, policy: Policy, *, root: bool, has_params: bool
) -> str | None:
    """The dtype the unit casts its floating inputs to at its pre-forward (None: none).

    FSDP2 (``FSDPState._cast_forward_inputs``): ``param_dtype`` when
    ``cast_forward_inputs`` and ``param_dtype`` are set. FSDP1: a root
    (``_root_cast_forward_input``) when ``cast_root_forward_inputs``; any unit with
    parameters (a handle, ``_pre_forward``) when ``cast_forward_inputs``. DDP
    (``_pre_forward``): always, to ``param_dtype``. A None ``param_dtype`` casts nothing.
    """
    if family is None or policy.kind == "none" or policy.param_dtype is None:
        return None
    if family == "fsdp2":
        return policy.param_dtype if policy.cast_forward_inputs is not False else None
    if family == "fsdp1":
        at_root = root and policy.cast_root_forward_inputs is not False
        at_unit = has_params and bool(policy.cast_forward_inputs)
        return policy.param_dtype if at_root or at_unit else None
    return policy.param_dtype  # ddp


def why_uncast(family: Family | None, policy: Policy, *, root: bool, has_params: bool) -> str:
    """Why ``input_cast`` is None for this unit, in words (empty when it casts)."""
    if input_cast(family, policy, root=root, has_params=has_params) is not None:
        return ""
    if family is None or policy.kind == "none":
        return "the unit has no mixed-precision policy"
    if policy.param_dtype is None:
        if family == "ddp":
            return "_MixedPrecision.param_dtype is None: DDP casts inputs only to a param_dtype"
        return "its param_dtype is None: FSDP casts inputs only to a set param_dtype"
    if family == "fsdp2":
        return "its policy has cast_forward_inputs=False"
    if root and not has_params:
        return (
            "its policy has cast_root_forward_inputs=False (and FSDP1 reads "
            "cast_forward_inputs only on units with parameters)"
        )
    if root:
        return "its policy has cast_root_forward_inputs=False and cast_forward_inputs=False"
    if not has_params:
        return (
            "it has no parameters of its own, and FSDP1 casts a non-root unit's inputs only "
            "when it has a flat parameter (state._handle)"
        )
    return (
        "FSDP1 casts a non-root unit's inputs only with cast_forward_inputs=True "
        "(the default is False)"
    )


def buffer_cast(family: Family | None, policy: Policy) -> str | None:
    """The dtype the buffers the unit owns are cast to (FSDP1 and DDP ``buffer_dtype``)."""
    if family in ("fsdp1", "ddp") and policy.kind != "none":
        return policy.buffer_dtype
    return None  # FSDP2 never touches buffers


_ITEMSIZE = {"torch.float64": 8, "torch.float32": 4, "torch.bfloat16": 2, "torch.float16": 2}


def _itemsize(dtype: str) -> int:
    return _ITEMSIZE.get(dtype, 1 if "float8" in dtype else 4)


def static_dtypes(
    family: Family | None,
    policy: Policy,
    *,
    root: bool,
    orig: str | None,
    trainable: bool,
    reduce_rule: str = "compute",
) -> dict[str, str]:
    """Each phase's dtype from the policy and the original parameter dtype alone.

    ``orig``: the dtype of the unit's own floating parameters (None: it has none);
    ``trainable``: some of them require grad; ``reduce_rule``: what FSDP2 reduces in
    without a ``reduce_dtype``, ``"compute"`` (torch up to 2.14) or ``"original"`` (2.15
    on, ``compat.fsdp.reduce_dtype_rule``). ``input`` is present only when the unit
    casts (what arrives otherwise is known only from a run); ``output`` only for an
    FSDP2 ``output_dtype``.
    """
    out: dict[str, str] = {}
    has_params = orig is not None
    cast = input_cast(family, policy, root=root, has_params=has_params)
    if cast is not None:
        out["input"] = cast
    if orig is not None:
        compute = compute_dtype(family, policy, orig)
        assert compute is not None
        out["param"] = compute
        if trainable:
            out["grad"] = compute
            reduce = policy.reduce_dtype if policy.kind != "none" else None
            out["reduce"] = reduce or compute
            if family == "fsdp2" and reduce_rule == "original":
                # 2.15: FSDPParam.unsharded_grad_dtype is reduce_dtype or the original;
                # the gradient is made in it (param.grad_dtype) unless it is wider than
                # the compute dtype, whose gradient is then upcast only at the reduction.
                kept = reduce or orig
                out["reduce"] = kept
                out["grad"] = compute if _itemsize(kept) > _itemsize(compute) else kept
        out["sharded_param"] = orig
        if trainable:
            keep = family == "fsdp1" and bool(policy.keep_low_precision_grads)
            out["sharded_grad"] = compute if keep else orig
    if family == "fsdp2" and policy.output_dtype is not None:
        out["output"] = policy.output_dtype
    return {phase: out[phase] for phase in PHASES if phase in out}
