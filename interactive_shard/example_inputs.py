"""What ``example_inputs`` means to every planner: one convention, one place.

``plan_buckets``, ``plan_splits`` and ``plan_precision`` run the model once in the kernel
when given ``example_inputs``, which is, in all three:

- a tuple: the forward's positional arguments, ``model(*example_inputs)``;
- a dict (any mapping): its keyword arguments, ``model(**example_inputs)``, as Hugging
  Face models take them (``{"input_ids": ids, "attention_mask": mask}``);
- anything else (a tensor, a list, an object): the one positional argument,
  ``model(example_inputs)``.

Positional and keyword arguments together: ``ish.Inputs(args, kwargs)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Inputs", "split"]


@dataclass(frozen=True)
class Inputs:
    """Positional and keyword arguments together: ``Inputs((x,), {"mask": m})``."""

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def split(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``example_inputs`` as ``(args, kwargs)`` for ``model(*args, **kwargs)``."""
    if example_inputs is None:
        raise TypeError(
            "example_inputs is None: pass a tensor, a tuple of positional inputs or a dict "
            "of keyword inputs (or leave example_inputs out)"
        )
    if isinstance(example_inputs, Inputs):
        return tuple(example_inputs.args), _keywords(example_inputs.kwargs)
    if isinstance(example_inputs, tuple):
        return example_inputs, {}
    if isinstance(example_inputs, Mapping):
        return (), _keywords(example_inputs)
    return (example_inputs,), {}


def _keywords(kwargs: Mapping[Any, Any]) -> dict[str, Any]:
    bad = [k for k in kwargs if not isinstance(k, str)]
    if bad:
        raise TypeError(
            f"example_inputs as a dict holds keyword arguments, so its keys must be "
            f"strings; got {bad[:3]!r}. Wrap a dict the forward takes as one argument in a "
            "tuple: (the_dict,)"
        )
    return dict(kwargs)
