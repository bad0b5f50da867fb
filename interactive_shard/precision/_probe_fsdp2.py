"""The precision probe of an FSDP2 root (``fully_shard``): Note [Precision probe], FSDP2."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from interactive_shard.precision import _probe_common as common
from interactive_shard.precision._policy import policy_of
from interactive_shard.precision._probe_common import PrecisionRecorder, floating
from interactive_shard.precision.events import Unit
from interactive_shard.probing import in_backward
from interactive_shard.probing.compat import fsdp as compat_fsdp
from interactive_shard.probing.compat.fsdp import param_groups as fsdp_param_groups

log = logging.getLogger(__name__)

# Whether the probe wraps FSDPState._cast_forward_inputs (compat.fsdp.CAST_METHOD); a
# test turns it off to take the path of releases without it (hooks around the cast).
WRAP_CAST = compat_fsdp.CAST_METHOD

try:  # the comm objects FSDPParamGroup calls (torch >= 2.8)
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    HAS_COMMS = True
except ImportError:  # pragma: no cover - older torch: no per-unit all-gathers
    AllGather = ReduceScatter = object  # type: ignore[assignment, misc]
    HAS_COMMS = False
try:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives
    from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo
except ImportError:  # pragma: no cover - older torch: HSDP's all-reduce not seen
    _fsdp_collectives = DDPMeshInfo = None  # type: ignore[assignment, misc]

# HSDP's all-reduce is a plain dist.all_reduce in _fsdp_collectives (no comm object).
_HSDP_ALL_REDUCE = (
    common.ModulePatch(
        _fsdp_collectives, "dist", lambda real: common.DistProxy(real, ["all_reduce"])
    )
    if _fsdp_collectives is not None
    else None
)


def is_root(obj: object) -> bool:
    """An FSDP2 module that is not known to be inside another (``_is_root`` is None
    until the first forward: the user passes the outermost ``fully_shard``'ed module)."""
    if not isinstance(obj, FSDPModule) or not isinstance(obj, nn.Module):
        return False
    return obj._get_fsdp_state()._is_root is not False


def module_type(module: nn.Module) -> str:
    """``FSDPLinear`` -> ``"Linear"``: the user's class under FSDP2's dynamic subclass."""
    for cls in type(module).__mro__:
        if not issubclass(cls, FSDPModule):
            return cls.__name__
    return type(module).__name__  # pragma: no cover


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class Fsdp2Recorder(PrecisionRecorder):
    wrapper = "fsdp2"

    def __init__(self, root: nn.Module) -> None:
        named = list(root.named_modules())
        module_fqn = {id(m): fqn for fqn, m in named}
        states: OrderedDict[int, tuple[str, Any, list[nn.Module]]] = OrderedDict()
        for fqn, m in named:
            if isinstance(m, FSDPModule):
                state = m._get_fsdp_state()
                states.setdefault(id(state), (fqn, state, []))[2].append(root.get_submodule(fqn))
        self._states = list(states.values())
        fqns = {fqn for fqn, _, _ in self._states}
        units = [self._unit(fqn, state, module_fqn, fqns) for fqn, state, _ in self._states]
        module_unit = common.innermost_units(root, fqns, lambda name: name)
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        super().__init__(root, units, module_fqn, module_unit, world)
        self._output_before: dict[str, list[str]] = {}
        self._input_before: dict[str, list[torch.Tensor]] = {}
        with self.installing():
            self._install(root)

    @staticmethod
    def _unit(fqn: str, state: Any, module_fqn: dict[int, str], fqns: set[str]) -> Unit:
        params, dtypes, numel = [], [], 0
        for group in fsdp_param_groups(state):
            for fp in group.fsdp_params:
                info = fp._module_info
                params.append(_join(module_fqn.get(id(info.module), "?"), info.param_name))
                dtypes.append(str(fp.sharded_param.dtype))  # sharded storage: the original
                numel += fp._orig_size.numel()
        first = state._modules[0]
        return Unit(
            fqn=fqn,
            parent=common.parent_of(fqn, fqns),
            module_type=module_type(first),
            policy=policy_of(state._mp_policy),
            params=params,
            param_dtypes=dtypes,
            numel=numel,
        )

    # -- hooks -------------------------------------------------------------------------------
    def _install(self, root: nn.Module) -> None:
        undo = self.undo
        # Before FSDP's own pre-forward (prepend): the root's cast belongs to the new iteration.
        begin = self.timed(lambda m, a: self.begin_forward())
        handle = root.register_forward_pre_hook(begin, prepend=True)
        undo.append(handle.remove)
        hsdp = False
        for fqn, state, modules in self._states:
            by_hooks = not WRAP_CAST
            if not by_hooks:
                self._wrap_cast(fqn, state)
            for m in modules:
                if by_hooks:  # prepended after fully_shard: before FSDP's pre-forward
                    handle = m.register_forward_pre_hook(
                        self.timed(self._before_cast(fqn)), prepend=True, with_kwargs=True
                    )
                    undo.append(handle.remove)
                handles = [
                    # Appended: after FSDP's pre-forward, the unsharded compute parameters.
                    m.register_forward_pre_hook(
                        self.timed(self._after_pre_forward(fqn, state)), with_kwargs=True
                    ),
                    m.register_forward_hook(self.timed(self._before_output(fqn)), prepend=True),
                    m.register_forward_hook(
                        self.timed(self._after_output(fqn, m is root)), always_call=m is root
                    ),
                ]
                undo += [h.remove for h in handles]
            for group in fsdp_param_groups(state):
                self._wrap_group(fqn, group)
                hsdp |= DDPMeshInfo is not None and isinstance(group.mesh_info, DDPMeshInfo)
        if hsdp and _HSDP_ALL_REDUCE is not None:
            undo.append(_HSDP_ALL_REDUCE.acquire(self))

    def _wrap_cast(self, fqn: str, state: Any) -> None:
        """FSDP2 looks ``self._cast_forward_inputs`` up at call time: an instance attribute
        sees the inputs before and after the unit's cast (Note, step 2)."""
        had = state.__dict__.get("_cast_forward_inputs")
        original = state._cast_forward_inputs
        observe = self.timed(self._observe_cast)

        def cast(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            new_args, new_kwargs = original(args, kwargs)
            observe(fqn, args, kwargs, new_args, new_kwargs)
            return new_args, new_kwargs

        state._cast_forward_inputs = cast

        def restore() -> None:
            if had is None:
                state.__dict__.pop("_cast_forward_inputs", None)
            else:
                state._cast_forward_inputs = had

        self.undo.append(restore)

    def _observe_cast(
        self, fqn: str, args: Any, kwargs: Any, new_args: Any, new_kwargs: Any
    ) -> None:
        if not in_backward():
            self.inputs(fqn, floating((args, kwargs)), floating((new_args, new_kwargs)))

    # The module hooks below are dynamo-disabled: under ``block.compile()`` torch 2.11 and
    # 2.12 trace them (2.13 reaches the cast through _cast_forward_inputs) and fail to
    # build the records (``object.__new__(PrecisionSeen) is not safe``), which switched
    # the hooks off and cost the compiled block its span in the timeline.
    def _before_cast(self, fqn: str) -> Callable[..., None]:
        @torch.compiler.disable
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            if not in_backward() and self.attached:
                self._input_before[fqn] = floating((args, kwargs))

        return hook

    def _after_pre_forward(self, fqn: str, state: Any) -> Callable[..., None]:
        @torch.compiler.disable
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            if in_backward():
                return
            before = self._input_before.pop(fqn, None)
            if before is not None:  # torch without _cast_forward_inputs (Note, step 3)
                after = floating((args, kwargs))
                self.seen(
                    fqn,
                    "input",
                    [str(t.dtype) for t in after],
                    [str(t.dtype) for t in before],
                    [_was_cast(b, a) for b, a in zip(before, after, strict=False)],
                )
            self.seen(fqn, "param", _unsharded_dtypes(fsdp_param_groups(state)))

        return hook

    def _before_output(self, fqn: str) -> Callable[..., None]:
        @torch.compiler.disable
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not in_backward() and self.attached:
                self._output_before[fqn] = [str(t.dtype) for t in floating(output)]

        return hook

    def _after_output(self, fqn: str, is_root: bool) -> Callable[..., None]:
        @torch.compiler.disable
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if is_root and output is None:
                self.after_root_forward(module, output)
                return
            if in_backward() or not self.attached:
                return
            after = [str(t.dtype) for t in floating(output)]
            before = self._output_before.pop(fqn, None)
            if before is None or len(before) != len(after):
                before = after
            pairs = list(OrderedDict.fromkeys(zip(before, after, strict=True)))
            self.seen(fqn, "output", [a for _, a in pairs], [b for b, _ in pairs])

        return hook

    def _wrap_group(self, fqn: str, group: Any) -> None:
        undo = self.undo
        pre_backward, post_backward = group.pre_backward, group.post_backward
        note_param = self.timed(lambda: self.seen(fqn, "param", _unsharded_dtypes([group])))
        note_grad = self.timed(lambda: self.seen(fqn, "grad", _unsharded_grad_dtypes(group)))

        def pre(*args: Any, **kwargs: Any) -> Any:
            out = pre_backward(*args, **kwargs)
            note_param()
            return out

        scoped_post = common.in_scope(self, fqn, post_backward)

        def post(*args: Any, **kwargs: Any) -> Any:
            note_grad()
            return scoped_post(*args, **kwargs)

        group.pre_backward, group.post_backward = pre, post

        def restore_methods() -> None:
            group.__dict__.pop("pre_backward", None)
            group.__dict__.pop("post_backward", None)

        undo.append(restore_methods)
        if not HAS_COMMS or not hasattr(group, "_all_gather_comm"):
            return
        group._all_gather_comm = _SpyAllGather(group._all_gather_comm, self, fqn)
        group._reduce_scatter_comm = _SpyReduceScatter(group._reduce_scatter_comm, self, fqn)

        def restore_comms() -> None:
            for name in ("_all_gather_comm", "_reduce_scatter_comm"):
                comm = getattr(group, name)
                if isinstance(comm, (_SpyAllGather, _SpyReduceScatter)):
                    setattr(group, name, comm.inner)

        undo.append(restore_comms)

    def unit_params(self) -> dict[int, str]:
        return {
            id(fp.sharded_param): fqn
            for fqn, state, _ in self._states
            for group in fsdp_param_groups(state)
            for fp in group.fsdp_params
        }


def _was_cast(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Without the cast itself to look at: a cast makes a new tensor in another dtype; a
    tensor passed through may come back as a view of itself (``RegisterPostBackward
    Function``), with the same data."""
    if after is before:
        return False
    return after.dtype != before.dtype or after.data_ptr() != before.data_ptr()


def _unsharded_dtypes(groups: list[Any]) -> list[str]:
    found = []
    for group in groups:
        for fp in group.fsdp_params:
            param = getattr(fp, "_unsharded_param", None)
            if param is not None:
                found.append(param.dtype)
    return common.distinct(found)


def _unsharded_grad_dtypes(group: Any) -> list[str]:
    found = []
    for fp in group.fsdp_params:
        param = getattr(fp, "_unsharded_param", None)
        if param is not None and param.grad is not None:
            found.append(param.grad.dtype)
    return common.distinct(found)


class _SpyAllGather(AllGather):
    """Delegates to the unit's all-gather comm and notes what this rank sends."""

    def __init__(self, inner: Any, recorder: PrecisionRecorder, unit: str) -> None:
        self.inner, self._recorder, self._unit = inner, recorder, unit

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        async_op: bool = False,
    ) -> Any:
        _note(self._recorder, self._unit, "all_gather", input_tensor)
        return self.inner(
            output_tensor=output_tensor,
            input_tensor=input_tensor,
            group=group,
            async_op=async_op,
        )


class _SpyReduceScatter(ReduceScatter):
    """Delegates to the unit's reduce-scatter comm and notes what this rank sends."""

    def __init__(self, inner: Any, recorder: PrecisionRecorder, unit: str) -> None:
        self.inner, self._recorder, self._unit = inner, recorder, unit

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        _note(self._recorder, self._unit, "reduce_scatter", input_tensor)
        return self.inner(
            output_tensor=output_tensor,
            input_tensor=input_tensor,
            group=group,
            op=op,
            async_op=async_op,
        )


def _note(recorder: PrecisionRecorder, unit: str, op: str, sent: torch.Tensor) -> None:
    try:
        with recorder.meter:
            recorder.collective(unit, op, sent)
    except Exception:  # pragma: no cover
        log.exception("precision probe: recording a collective failed")
