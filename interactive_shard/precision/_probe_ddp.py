"""The precision probe of a DDP model with native mixed precision
(``DistributedDataParallel(mixed_precision=_MixedPrecision(...))``): Note [Precision
probe], DDP."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from interactive_shard.precision import _probe_common as common
from interactive_shard.precision._policy import policy_of
from interactive_shard.precision._probe_common import PrecisionRecorder, floating
from interactive_shard.precision.events import Unit
from interactive_shard.probing import guarded, in_backward


def has_mixed_precision(obj: object) -> bool:
    return (
        isinstance(obj, DistributedDataParallel)
        and getattr(obj, "mixed_precision", None) is not None
    )


class _ReducerSpy:
    """Stands for DDP's Reducer: DDP's mixed-precision comm hook reads
    ``ddp_weakref().reducer`` at every call, so ``_run_allreduce_hook`` sees each bucket
    (after its cast to ``reduce_dtype``); everything else is the real Reducer's."""

    def __init__(self, real: Any, recorder: PrecisionRecorder) -> None:
        self._real, self._recorder = real, recorder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _run_allreduce_hook(self, bucket: Any) -> Any:
        _note_bucket(self._recorder, bucket)
        return self._real._run_allreduce_hook(bucket)


@guarded
def _note_bucket(recorder: PrecisionRecorder, bucket: Any) -> None:
    with recorder.meter:
        recorder.collective("", "all_reduce", bucket.buffer())
        recorder.seen("", "param", common.distinct(p.dtype for p in bucket.parameters()))


class DdpRecorder(PrecisionRecorder):
    wrapper = "ddp"

    def __init__(self, ddp: DistributedDataParallel) -> None:
        module = ddp.module
        module_fqn = {id(m): fqn for fqn, m in module.named_modules()}
        module_fqn[id(ddp)] = ""
        module_unit = dict.fromkeys(module_fqn, "")
        named = list(module.named_parameters())
        self._params = [p for _, p in named]
        unit = Unit(
            fqn="",
            parent=None,
            module_type=type(module).__name__,
            policy=policy_of(ddp.mixed_precision),
            params=[n for n, _ in named],
            param_dtypes=[str(p.dtype) for _, p in named],
            numel=sum(p.numel() for _, p in named),
        )
        super().__init__(ddp, [unit], module_fqn, module_unit, ddp.process_group.size())
        self.ddp = ddp
        self._pending: list[torch.Tensor] | None = None
        with self.installing():
            self._install(ddp)

    def _install(self, ddp: DistributedDataParallel) -> None:
        undo = self.undo
        handles = [
            ddp.register_forward_pre_hook(
                self.timed(self._before_cast), prepend=True, with_kwargs=True
            ),
            # After DDP's _root_copy_hook (registered at construction): the cast inputs
            # and the low-precision parameters the forward computes with.
            ddp.module.register_forward_pre_hook(self.timed(self._after_cast), with_kwargs=True),
            ddp.register_forward_hook(self.timed(self._output), always_call=True),
        ]
        grad_hook = self.timed(self._note_grad)
        handles += [
            p.register_post_accumulate_grad_hook(grad_hook)  # type: ignore[no-untyped-call, unused-ignore]
            for p in self._params
            if p.requires_grad
        ]
        undo += [h.remove for h in handles]
        real = ddp.reducer
        ddp.reducer = _ReducerSpy(real, self)  # type: ignore[assignment]

        def restore() -> None:
            if isinstance(ddp.reducer, _ReducerSpy):
                ddp.reducer = real

        undo.append(restore)

    def _before_cast(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self.begin_forward()
        self._pending = None if in_backward() else floating((args, kwargs))

    def _after_cast(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        before, self._pending = self._pending, None
        if before is None:
            return
        self.inputs("", before, floating((args, kwargs)))
        self.seen("", "param", common.distinct(p.dtype for p in self._params))

    def _output(self, module: nn.Module, args: Any, output: Any) -> None:
        if output is None:
            self._pending = None
            self.after_root_forward(module, output)
        elif not in_backward():
            self.seen("", "output", common.output_dtypes(output))

    def _note_grad(self, param: torch.Tensor) -> None:
        if param.grad is not None:
            self.seen("", "grad", [str(param.grad.dtype)])

    def unit_params(self) -> dict[int, str]:
        return {id(p): "" for p in self._params}
