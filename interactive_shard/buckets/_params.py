"""Inputs of the bucket planner: which parameters DDP reduces, and their ready order.

``reducer_params`` lists the parameters exactly as DDP's ``_build_params_for_reducer``
does (its list index is the reducer's parameter index), for the planner and the probe;
``collect_params`` describes them as the planner needs; ``observe_ready_order`` runs one
local forward and backward on a copy of the model to see when each gradient is ready.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import operator
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from interactive_shard.example_inputs import split
from interactive_shard.probing.compat import autograd as compat_autograd


class ReadyOrderSource(Enum):
    """Where the gradient-ready order used for the rebuild came from."""

    GIVEN = "ready_order"  # the caller passed it
    OBSERVED = "example_inputs"  # one local forward + backward on a copy
    ASSUMED = "reverse registration"  # no information: DDP's own initial guess


@dataclass(frozen=True)
class ParamSpec:
    """A parameter described without memory: plan a model too large to allocate.

    ``dtype`` is a ``torch.dtype`` or its name (``"bfloat16"`` or ``"torch.bfloat16"``).
    ``sparse_grad`` marks a parameter that produces sparse gradients (an
    ``nn.Embedding(sparse=True)`` weight): DDP gives it a bucket of its own.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype | str = torch.float32
    device: torch.device | str = "cpu"
    sparse_grad: bool = False

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"ParamSpec.shape must be non-negative ints, got {self.shape!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", as_dtype(self.dtype))
        object.__setattr__(self, "device", torch.device(self.device))


class ParamInfo(NamedTuple):
    """What the planner needs to know about one parameter (plain data; a tuple for speed)."""

    fqn: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    numel: int
    nbytes: int
    sparse_grad: bool = False


@functools.lru_cache(maxsize=64)
def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` for ``torch.float32``, ``"float32"`` or ``"torch.float32"``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}: use a torch.dtype such as torch.float32")
    return resolved


def _spec_info(fqn: str, spec: ParamSpec) -> ParamInfo:
    numel = math.prod(spec.shape)
    dtype, device = spec.dtype, spec.device
    assert isinstance(dtype, torch.dtype) and isinstance(device, torch.device)
    return _make_info(
        (fqn, spec.shape, dtype, device, numel, numel * dtype.itemsize, spec.sparse_grad)
    )


def _tensor_info(fqn: str, t: torch.Tensor, sparse_grad: bool = False) -> ParamInfo:
    if t.is_sparse:
        raise ValueError(f"parameter {fqn!r} is a sparse tensor: DDP does not support those")
    numel, dtype = t.numel(), t.dtype
    itemsize = _ITEMSIZE.get(dtype) or _ITEMSIZE.setdefault(dtype, dtype.itemsize)
    # tuple.__new__ directly: a NamedTuple's __new__ and _make are Python functions.
    return _make_info((fqn, tuple(t.shape), dtype, t.device, numel, numel * itemsize, sparse_grad))


_make_info = functools.partial(tuple.__new__, ParamInfo)
_ITEMSIZE: dict[torch.dtype, int] = {}  # dtype.itemsize is a Python property: 0.4 us a call
_IS_PARAMETER: dict[type, bool] = {}


def _is_parameter(t: torch.Tensor) -> bool:
    """``isinstance(t, nn.Parameter)`` without ``_ParameterMeta.__instancecheck__`` (a
    Python call per tensor): a Parameter subclass, or a tensor marked ``_is_param``."""
    kind = type(t)
    known = _IS_PARAMETER.get(kind)
    if known is None:
        known = _IS_PARAMETER[kind] = issubclass(kind, nn.Parameter)
    return known or bool(getattr(t, "_is_param", False))


def collect_params(
    source: nn.Module | Iterable[tuple[str, Any]], ignore: Collection[str] = ()
) -> list[ParamInfo]:
    """Parameters in the reducer's order, shared ones once, frozen ones left out; of a
    module, also those whose DDP key (``ddp_key``) is in ``ignore``."""
    if isinstance(source, nn.Module):
        return [_tensor_info(r.fqn, r.param, r.sparse_grad) for r in reducer_params(source, ignore)]
    pairs = source if isinstance(source, list) else list(source)
    infos: list[ParamInfo] = []
    seen_tensors: dict[int, str] = {}
    tensor, spec = torch.Tensor, ParamSpec
    for pair in pairs:
        if not (type(pair) is tuple and len(pair) == 2 and type(pair[0]) is str):
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
                raise TypeError(f"expected (fqn, tensor) pairs, got {pair!r:.80}")
        fqn, value = pair
        if isinstance(value, tensor):
            key = id(value)
            if key in seen_tensors:
                raise ValueError(
                    f"{fqn!r} and {seen_tensors[key]!r} are the same tensor; DDP reduces "
                    "a shared parameter once: pass it once (as named_parameters() does)"
                )
            seen_tensors[key] = fqn
            if not value.requires_grad and _is_parameter(value):
                continue  # frozen: DDP leaves it out
            infos.append(_tensor_info(fqn, value))
        elif isinstance(value, spec):
            infos.append(_spec_info(fqn, value))
        else:
            raise TypeError(f"{fqn!r}: expected a Tensor or ParamSpec, got {type(value)!r}")
    if len(set(map(operator.itemgetter(0), infos))) != len(infos):
        twice = [fqn for fqn, n in Counter(p.fqn for p in infos).items() if n > 1]
        raise ValueError(f"fqns given twice: {twice}; name each parameter once")
    return infos


class ReducerParam(NamedTuple):
    """One parameter DDP reduces, as ``_build_params_for_reducer`` finds it."""

    fqn: str  # the wrapped module's name for it: "layers.0.weight" (a root one: "weight")
    module_fqn: str  # its owning module ("" = the root)
    module: nn.Module
    param: nn.Parameter

    @property
    def sparse_grad(self) -> bool:
        """DDP expects a sparse gradient: an ``Embedding``/``EmbeddingBag(sparse=True)``."""
        return isinstance(self.module, (nn.Embedding, nn.EmbeddingBag)) and bool(self.module.sparse)


def ddp_key(fqn: str) -> str:
    """DDP's name for a parameter in ``parameters_to_ignore``: ``f"{module}.{name}"``, so
    ``".pos"`` for a root parameter ``pos`` (``_build_params_for_reducer``)."""
    return fqn if "." in fqn else f".{fqn}"


def key_fqn(key: str) -> str:
    """The fqn of a DDP key: ``"pos"`` for ``".pos"``."""
    return key.removeprefix(".")


def reducer_params(model: nn.Module, ignore: Collection[str] = ()) -> list[ReducerParam]:
    """The parameters DDP reduces, in the Reducer's order (the list index is the Reducer's
    parameter index): a mirror of ``DistributedDataParallel._build_params_for_reducer``.

    ``model`` is a DDP model (its ``parameters_to_ignore`` are the ones ignored) or the
    module to wrap (then those DDP would read from it: the names given to
    ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``). Trainable
    parameters only, a shared one once under its first name. ``ignore``: more DDP keys
    to leave out (a DDP model's already has its ``delay_all_reduce_named_params``).
    """
    if isinstance(model, DistributedDataParallel):
        module, ignored = model.module, set(model.parameters_to_ignore)
    else:
        module, ignored = model, set(getattr(model, "_ddp_params_and_buffers_to_ignore", ()))
    ignored.update(ignore)
    out: list[ReducerParam] = []
    seen: set[int] = set()
    for module_fqn, sub in module.named_modules():
        for name, p in sub.named_parameters(recurse=False):
            key = f"{module_fqn}.{name}"  # DDP's key for the ignore list: a root one is ".name"
            if not p.requires_grad or key in ignored or id(p) in seen:
                continue
            if isinstance(p, nn.parameter.UninitializedParameter):
                raise ValueError(
                    f"parameter {key.lstrip('.')} is uninitialized (a lazy module): run one "
                    "forward pass before planning, as DDP requires"
                )
            seen.add(id(p))
            out.append(ReducerParam(key if module_fqn else name, module_fqn, sub, p))
    return out


def ddp_keys(model: nn.Module) -> dict[str, nn.Parameter]:
    """Every trainable parameter under each DDP key it has (a shared one under each)."""
    return {
        f"{module_fqn}.{name}": p
        for module_fqn, sub in model.named_modules()
        for name, p in sub.named_parameters(recurse=False)
        if p.requires_grad
    }


def observe_ready_order(
    model: nn.Module,
    example_inputs: Any,
    ignore: Collection[str] = (),
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> list[str]:
    """Run forward + backward once on a deep copy; return fqns in gradient-ready order.

    ``example_inputs`` as ``example_inputs.split`` reads it; the backward starts from
    ``loss_fn(outputs)``, else from the sum of every output tensor that requires grad
    (then an output the real loss ignores, e.g. BERT's ``pooler_output``, counts as
    used).

    A parameter is placed where its *last* gradient hook fired (one used in several
    reentrant backwards fires several times; with ``static_graph`` DDP counts it ready at
    the last one). Parameters whose hook never fired are left out. The caller's model
    and its CPU/CUDA RNG state are untouched.
    """
    replica = copy.deepcopy(model)
    params = {r.fqn: r.param for r in reducer_params(replica, ignore)}
    last: dict[str, int] = {}
    tick = itertools.count()

    def mark(fqn: str) -> None:
        last[fqn] = next(tick)

    def marker(fqn: str) -> Callable[[torch.Tensor], None]:
        return lambda _param: mark(fqn)

    handles = [
        p.register_post_accumulate_grad_hook(marker(fqn))  # type: ignore[no-untyped-call, unused-ignore]
        for fqn, p in params.items()
    ]
    cuda = sorted({p.device.index or 0 for p in params.values() if p.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=cuda), torch.enable_grad():
            args, kwargs = split(example_inputs)
            out = replica(*args, **kwargs)
            loss = _loss(out, loss_fn)
            loss.backward()  # type: ignore[no-untyped-call, unused-ignore]
    finally:
        for handle in handles:
            handle.remove()
    return [fqn for fqn, _ in sorted(last.items(), key=operator.itemgetter(1))]


def _loss(out: Any, loss_fn: Callable[[Any], torch.Tensor] | None) -> torch.Tensor:
    if loss_fn is not None:
        loss = loss_fn(out)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            got = type(loss).__qualname__
            if isinstance(loss, torch.Tensor):
                got = f"a tensor of shape {tuple(loss.shape)}, requires_grad={loss.requires_grad}"
            raise ValueError(
                f"loss_fn must return a scalar tensor that requires grad; it returned {got}"
            )
        return loss
    leaves, _ = compat_autograd.tree_flatten(out)
    parts = [t.sum() for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    if not parts:
        raise ValueError(
            "example_inputs: the model's output holds no tensor that requires grad, "
            "so no gradient would become ready; check the inputs or pass ready_order"
        )
    total: torch.Tensor = functools.reduce(operator.add, parts)
    return total


def resolve_ready_order(
    source: object,
    fqns: list[str],
    ready_order: list[str] | None,
    example_inputs: Any,
    rebuilds: bool,
    static_graph: bool,
    ignore: Collection[str] = (),
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> tuple[list[str], ReadyOrderSource, list[str]]:
    """The rebuild's ready order; ``ignore``: DDP keys of the delayed parameters, which
    may be in a given ``ready_order`` (they are dropped: DDP does not record them)."""
    if ready_order is not None and example_inputs is not None:
        raise ValueError("pass ready_order or example_inputs, not both")
    if ready_order is not None:
        strings = all(map(isinstance, ready_order, itertools.repeat(str)))
        if isinstance(ready_order, str) or not strings:
            raise TypeError(f"ready_order must be a list of fqn strings, got {ready_order!r:.80}")
        left_out = {key_fqn(k) for k in ignore} - set(fqns)
        given = [f for f in ready_order if f not in left_out] if left_out else list(ready_order)
        known, listed = set(fqns), set(given)
        if len(given) == len(fqns) == len(listed) and listed == known:  # each once: C loops
            return given, ReadyOrderSource.GIVEN, []
        problems = {
            "unknown": [f for f in dict.fromkeys(given) if f not in known],
            "duplicated": [f for f, n in Counter(given).items() if n > 1],
            "missing": [f for f in fqns if f not in listed],
        }
        if any(problems.values()):
            detail = "; ".join(f"{k}: {_short(v)}" for k, v in problems.items() if v)
            raise ValueError(
                f"ready_order must list every trainable parameter exactly once ({detail}); "
                "planned parameters are: " + _short(fqns)
            )
        return given, ReadyOrderSource.GIVEN, []
    if example_inputs is None:
        if loss_fn is not None:
            raise ValueError("loss_fn is used with example_inputs: pass both, or neither")
        return fqns[::-1], ReadyOrderSource.ASSUMED, []
    if not isinstance(source, nn.Module):
        raise TypeError("example_inputs needs an nn.Module to run, not a list of parameters")
    seen = observe_ready_order(source, example_inputs, ignore, loss_fn)
    fired = set(seen)
    unused = [f for f in fqns if f not in fired]
    if unused and rebuilds and not static_graph:
        raise ValueError(
            f"parameters got no gradient with these example_inputs: {_short(unused)}. "
            "DDP with find_unused_parameters=False fails on such a model at iteration 2; "
            "pass find_unused_parameters=True or static_graph=True (as you would to DDP)"
        )
    return seen + unused, ReadyOrderSource.OBSERVED, unused


def _short(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return f"[{shown}{f', ... ({len(names) - limit} more)' if len(names) > limit else ''}]"
