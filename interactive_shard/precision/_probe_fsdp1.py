"""The precision probe of an FSDP1 root (``FullyShardedDataParallel``): Note [Precision
probe], FSDP1."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, _flat_param, _runtime_utils

from interactive_shard.precision import _probe_common as common
from interactive_shard.precision._policy import policy_of
from interactive_shard.precision._probe_common import PrecisionRecorder, floating
from interactive_shard.precision.events import Unit
from interactive_shard.probing import guarded, in_backward

_WRAPPERS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")
_lock = threading.Lock()
# FlatParamHandle -> (its recorder, weakly: a dropped model takes its recorder along; unit)
_HANDLES: weakref.WeakKeyDictionary[Any, tuple[weakref.ref[PrecisionRecorder], str]] = (
    weakref.WeakKeyDictionary()
)


def _post_backward_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """FSDP1 binds ``_runtime_utils._post_backward_hook`` into a partial at every forward:
    this stand-in notes the unsharded gradient, then reduces inside the unit's scope."""

    def hook(state: Any, handle: Any, *args: Any) -> Any:
        mine = _HANDLES.get(handle)
        recorder = None if mine is None else mine[0]()
        if mine is None or recorder is None:
            return original(state, handle, *args)
        unit = mine[1]
        _note_grad(recorder, unit, handle)
        outer = common.SCOPE.current
        common.SCOPE.current = (recorder, unit) if recorder.attached else None
        try:
            return original(state, handle, *args)
        finally:
            common.SCOPE.current = outer

    return hook


@guarded
def _note_grad(recorder: PrecisionRecorder, unit: str, handle: Any) -> None:
    grad = handle.flat_param.grad
    if grad is not None:
        with recorder.meter:
            recorder.seen(unit, "grad", [str(grad.dtype)])


_NAMES = list(common.COLLECTIVES)
_PATCHES = (
    common.ModulePatch(_flat_param, "dist", lambda real: common.DistProxy(real, _NAMES)),
    common.ModulePatch(_runtime_utils, "dist", lambda real: common.DistProxy(real, _NAMES)),
    common.ModulePatch(_runtime_utils, "_post_backward_hook", _post_backward_hook),
)


def is_root(obj: object) -> bool:
    """An FSDP1 wrapper not known to be nested (``_is_root`` is None until the first
    forward: the user passes the outermost wrapper)."""
    return isinstance(obj, FullyShardedDataParallel) and obj._is_root is not False


def clean(name: str) -> str:
    """``"_fsdp_wrapped_module.1._fsdp_wrapped_module.lin"`` -> ``"1.lin"``."""
    return ".".join(p for p in name.split(".") if p and p not in _WRAPPERS)


class Fsdp1Recorder(PrecisionRecorder):
    wrapper = "fsdp1"

    def __init__(self, root: FullyShardedDataParallel) -> None:
        named = list(root.named_modules())
        module_fqn = {id(m): clean(name) for name, m in named}
        self._wrappers = [
            (clean(n), m) for n, m in named if isinstance(m, FullyShardedDataParallel)
        ]
        fqns = {fqn for fqn, _ in self._wrappers}
        units = [self._unit(fqn, w, fqns) for fqn, w in self._wrappers]
        module_unit = common.innermost_units(root, fqns, clean)
        super().__init__(root, units, module_fqn, module_unit, root.world_size)
        self._pending: dict[str, list[Any]] = {}
        with self.installing():
            self._install(root)

    @staticmethod
    def _unit(fqn: str, wrapper: Any, fqns: set[str]) -> Unit:
        handle = wrapper._handle
        params: list[str] = []
        numel = 0
        dtype = ""
        if handle is not None:
            flat = handle.flat_param
            params = [clean(f"{fqn}.{name}" if fqn else name) for name in flat._fqns]
            numel = sum(getattr(flat, "_numels", ())) or flat._unpadded_unsharded_size.numel()
            dtype = str(handle._orig_param_dtype)
        return Unit(
            fqn=fqn,
            parent=common.parent_of(fqn, fqns),
            module_type=type(wrapper._fsdp_wrapped_module).__name__,
            policy=policy_of(wrapper.mixed_precision),
            params=params,
            param_dtypes=[dtype] * len(params),
            numel=numel,
        )

    def _install(self, root: nn.Module) -> None:
        undo = self.undo
        begin = self.timed(lambda m, a: self.begin_forward())
        undo.append(root.register_forward_pre_hook(begin, prepend=True).remove)
        for fqn, wrapper in self._wrappers:
            inner = wrapper._fsdp_wrapped_module
            handles = [
                # FSDP1 casts inside forward(): the wrapper's pre-hook sees the inputs
                # before, the wrapped module's after (Note, FSDP1).
                wrapper.register_forward_pre_hook(
                    self.timed(self._before_cast(fqn)), prepend=True, with_kwargs=True
                ),
                inner.register_forward_pre_hook(
                    self.timed(self._after_cast(fqn, wrapper)), with_kwargs=True
                ),
                wrapper.register_forward_hook(
                    self.timed(self._output(fqn, wrapper is root)), always_call=wrapper is root
                ),
            ]
            undo += [h.remove for h in handles]
            handle = wrapper._handle
            if handle is not None:
                self._wrap_unshard(fqn, handle)
        with _lock:
            for patch in _PATCHES:
                undo.append(patch.acquire(self))

    def _before_cast(self, fqn: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            if not in_backward() and self.attached:
                self._pending[fqn] = floating((args, kwargs))

        return hook

    def _after_cast(self, fqn: str, wrapper: Any) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            before = self._pending.pop(fqn, None)
            if before is None or in_backward():
                return
            self.inputs(fqn, before, floating((args, kwargs)))
            handle = wrapper._handle
            if handle is not None:  # unsharded by now, in the compute dtype
                self.seen(fqn, "param", [str(handle.flat_param.dtype)])

        return hook

    def _output(self, fqn: str, is_root: bool) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if is_root and output is None:
                self._pending.clear()
                self.after_root_forward(module, output)
                return
            if not in_backward():
                self.seen(fqn, "output", common.output_dtypes(output))

        return hook

    def _wrap_unshard(self, fqn: str, handle: Any) -> None:
        had = handle.__dict__.get("unshard")
        scoped = common.in_scope(self, fqn, handle.unshard)
        note = self.timed(lambda: self.seen(fqn, "param", [str(handle.flat_param.dtype)]))

        def unshard(*args: Any, **kwargs: Any) -> Any:
            out = scoped(*args, **kwargs)
            if in_backward():
                note()
            return out

        handle.unshard = unshard
        with _lock:
            _HANDLES[handle] = (weakref.ref(self), fqn)

        def restore() -> None:
            if had is None:
                handle.__dict__.pop("unshard", None)
            else:
                handle.unshard = had
            with _lock:
                mine = _HANDLES.get(handle)
                if mine is not None and mine[0]() is self:
                    del _HANDLES[handle]

        self.undo.append(restore)

    def unit_params(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for fqn, wrapper in self._wrappers:
            handle = wrapper._handle
            if handle is None:
                continue
            flat = handle.flat_param
            out[id(flat)] = fqn
            for p in getattr(flat, "_params", None) or ():  # use_orig_params=True
                out[id(p)] = fqn
        return out
