"""Mixed-precision policies as plain data (``events.Policy``) and back.

Three policy classes exist in torch 2.13, one per engine ("family"):

* FSDP2 ``torch.distributed.fsdp.MixedPrecisionPolicy`` (``fully_shard(mp_policy=)``):
  ``param_dtype``, ``reduce_dtype``, ``output_dtype``, ``cast_forward_inputs=True``;
* FSDP1 ``torch.distributed.fsdp.MixedPrecision`` (``FullyShardedDataParallel(
  mixed_precision=)``): ``param_dtype``, ``reduce_dtype``, ``buffer_dtype``,
  ``keep_low_precision_grads=False``, ``cast_forward_inputs=False``,
  ``cast_root_forward_inputs=True`` (and ``_module_classes_to_ignore``, which only
  auto-wrapping reads and which plain data does not carry);
* DDP ``torch.nn.parallel.distributed._MixedPrecision`` (``DistributedDataParallel(
  mixed_precision=)``): ``param_dtype``, ``reduce_dtype``, ``buffer_dtype``.

``policy_of`` turns any of them (or None: no policy) into an ``events.Policy`` with the
dtypes as strings (``"torch.bfloat16"``, None kept) and every boolean as the engine will
read it, defaults included. ``policy_object`` builds the real object back (the planner's
fixes are real policies). The rank probe reads a live unit's policy with ``policy_of``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch

from interactive_shard.precision.events import Policy

__all__ = [
    "FAMILY_OF_KIND",
    "KIND_OF_FAMILY",
    "Family",
    "default_policy",
    "dtype_name",
    "dtype_of",
    "family_of",
    "policy_class",
    "policy_object",
    "policy_of",
]

Family = Literal["fsdp2", "fsdp1", "ddp"]
KIND_OF_FAMILY: dict[Family, str] = {
    "fsdp2": "MixedPrecisionPolicy",
    "fsdp1": "MixedPrecision",
    "ddp": "_MixedPrecision",
}
_FAMILIES: tuple[Family, ...] = ("fsdp2", "fsdp1", "ddp")
FAMILY_OF_KIND: dict[str, Family] = {kind: family for family, kind in KIND_OF_FAMILY.items()}
_WHAT = (
    "an FSDP2 torch.distributed.fsdp.MixedPrecisionPolicy, an FSDP1 "
    "torch.distributed.fsdp.MixedPrecision, DDP's "
    "torch.nn.parallel.distributed._MixedPrecision, or None (no policy)"
)
# Per family: the fields events.Policy carries, as the class names them.
_FIELDS: dict[Family, tuple[str, ...]] = {
    "fsdp2": ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs"),
    "fsdp1": (
        "param_dtype",
        "reduce_dtype",
        "buffer_dtype",
        "keep_low_precision_grads",
        "cast_forward_inputs",
        "cast_root_forward_inputs",
    ),
    "ddp": ("param_dtype", "reduce_dtype", "buffer_dtype"),
}
_BOOLS = ("cast_forward_inputs", "cast_root_forward_inputs", "keep_low_precision_grads")


def policy_class(family: Family) -> type[Any]:
    """The torch class of a family's policy (imported on first use)."""
    if family == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy
    if family == "fsdp1":
        from torch.distributed.fsdp import MixedPrecision

        return MixedPrecision
    if family == "ddp":
        from torch.nn.parallel.distributed import _MixedPrecision

        return _MixedPrecision
    raise ValueError(f"unknown policy family {family!r}; expected one of {list(KIND_OF_FAMILY)}")


def _family_of_object(obj: object) -> Family | None:
    for family in _FAMILIES:
        try:
            cls = policy_class(family)
        except ImportError:  # torch built without distributed
            continue
        if isinstance(obj, cls):
            return family
    return None


def family_of(obj: object) -> Family | None:
    """The family of a real policy object or an ``events.Policy`` (None: no policy)."""
    if obj is None:
        return None
    if isinstance(obj, Policy):
        return FAMILY_OF_KIND.get(obj.kind)
    family = _family_of_object(obj)
    if family is None:
        raise TypeError(f"{_type_name(obj)} is not a mixed-precision policy; expected {_WHAT}")
    return family


def dtype_name(dtype: object) -> str | None:
    """``torch.bfloat16`` -> ``"torch.bfloat16"``; None stays None."""
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"a policy dtype must be a torch.dtype or None, got {dtype!r}")
    return str(dtype)


def dtype_of(name: str | None) -> torch.dtype | None:
    """``"torch.bfloat16"`` (or ``"bfloat16"``) -> ``torch.bfloat16``; None stays None."""
    if name is None:
        return None
    found = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype (expected e.g. 'torch.bfloat16')")
    return found


def policy_of(obj: object) -> Policy:
    """A real policy object (or None) as plain data; see the module docstring.

    An ``events.Policy`` is returned as it is. Anything else raises ``TypeError``.
    """
    if obj is None:
        return Policy(kind="none")
    if isinstance(obj, Policy):
        return obj
    family = _family_of_object(obj)
    if family is None:
        raise TypeError(
            f"policy_of() cannot read a {_type_name(obj)}; it accepts {_WHAT} "
            "(for FSDP2 pass the unit's mp_policy, for FSDP1 its mixed_precision, for DDP "
            "the mixed_precision= argument)"
        )
    fields: dict[str, Any] = {}
    for name in _FIELDS[family]:
        value = getattr(obj, name)
        fields[name] = bool(value) if name in _BOOLS else dtype_name(value)
    return Policy(kind=KIND_OF_FAMILY[family], **fields)  # type: ignore[arg-type]


def default_policy(family: Family) -> Policy:
    """What a unit of ``family`` uses when given no policy, as the engine sees it.

    FSDP2 ``fully_shard`` defaults to ``MixedPrecisionPolicy()``, FSDP1 stores
    ``MixedPrecision()``; DDP without ``mixed_precision=`` has none (kind ``"none"``).
    """
    if family == "ddp":
        return Policy(kind="none")
    return policy_of(policy_class(family)())


def policy_object(policy: Policy, like: object | None = None) -> Any:
    """The real torch policy for ``policy`` (None for kind ``"none"``).

    ``like``, a real policy of the same class, lends the fields plain data does not carry
    (FSDP1's ``_module_classes_to_ignore``): the result is ``dataclasses.replace(like,
    ...)``. Booleans left None take the class's defaults.
    """
    if not isinstance(policy, Policy):
        raise TypeError(f"policy_object() takes an events.Policy, got {_type_name(policy)}")
    if policy.kind == "none":
        return None
    family = FAMILY_OF_KIND[policy.kind]
    changes: dict[str, Any] = {}
    for name in _FIELDS[family]:
        value = getattr(policy, name)
        if name in _BOOLS:
            if value is not None:
                changes[name] = bool(value)
        else:
            changes[name] = dtype_of(value)
    cls = policy_class(family)
    if like is not None and isinstance(like, cls):
        return dataclasses.replace(like, **changes)  # type: ignore[type-var]
    return cls(**changes)


def _type_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"
