"""What the three precision probes share: the iteration count, deduplicated emission, the
optimizer-step reading, the failure locator and the collective spy.

See Note [Precision probe] in ``probe.py``. Everything here reads dtypes and sizes,
never tensor data, and never changes what the engine computes.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType, TracebackType
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence
from torch.optim.optimizer import register_optimizer_step_pre_hook

from interactive_shard.precision.events import (
    PrecisionBatch,
    PrecisionCollective,
    PrecisionFailure,
    PrecisionSeen,
    PrecisionWatch,
    Unit,
)
from interactive_shard.probing import in_backward
from interactive_shard.probing.attachment import Attachment
from interactive_shard.probing.collectives import FUNCTIONS, Pick
from interactive_shard.probing.compat import fsdp as compat_fsdp

log = logging.getLogger(__name__)
_UNSENT: set[PrecisionRecorder] = set()  # recorders holding records not sent yet

_CALL_IMPL = nn.Module._call_impl.__code__
_FIRST_ONLY = frozenset({"input", "output"})  # a unit's first call per iteration
MAX_MESSAGE_CHARS = 2000
SEND_AT = 1024  # records held before a batch goes out early (a very wide model)


def floating(tree: Any) -> list[torch.Tensor]:
    """The floating-point tensors of ``tree`` in the order FSDP's ``_apply_to_tensors``
    visits them (tensors, dataclasses, dicts, lists, tuples; a ``PackedSequence``'s data,
    which FSDP leaves alone; not sets, whose order a cast changes, nor other objects)."""
    out: list[torch.Tensor] = []
    _collect(tree, out, 0)
    return out


def _collect(x: Any, out: list[torch.Tensor], depth: int) -> None:
    if isinstance(x, torch.Tensor):
        if x.is_floating_point():
            out.append(x)
    elif depth > 32:
        return
    elif isinstance(x, PackedSequence):
        _collect(x.data, out, depth + 1)
    elif isinstance(x, dict):
        for v in x.values():
            _collect(v, out, depth + 1)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _collect(v, out, depth + 1)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            _collect(getattr(x, f.name, None), out, depth + 1)


def distinct(dtypes: Iterable[torch.dtype]) -> list[str]:
    """Distinct dtypes as strings (``"torch.bfloat16"``), in the order first seen."""
    return list(OrderedDict.fromkeys(str(d) for d in dtypes))


def output_dtypes(output: Any) -> list[str]:
    return distinct(t.dtype for t in floating(output))


class PrecisionRecorder(Attachment):
    """One watched root on one rank: the iteration count and what was emitted in it.

    ``units`` (root first) describe the model; ``module_fqn`` maps ``id(module)`` of every
    module under the root to its fqn in the user's model and ``module_unit`` to the fqn
    of the innermost unit holding it. Subclasses install the hooks and list the undo
    callables in ``self.undo`` (``probing.attachment.Attachment``).
    """

    kind = "precision probe"
    title = "PrecisionProbe"
    feature = "precision"

    wrapper: str = ""

    def __init__(
        self,
        root: nn.Module,
        units: list[Unit],
        module_fqn: dict[int, str],
        module_unit: dict[int, str],
        world_size: int,
    ) -> None:
        self.root = root
        self.units = units
        self.module_fqn = module_fqn
        self.module_unit = module_unit
        super().__init__()
        self.recorded = 0  # records (they travel in batches: Note [Precision probe])
        self._seen: dict[tuple[str, str], tuple[int, list[str]]] = {}
        self._held: list[PrecisionSeen] = []
        self._held_collectives: list[PrecisionCollective] = []
        self._hold_lock = threading.Lock()  # autograd hooks may run on other threads
        self.watching(
            PrecisionWatch(
                wrapper=self.wrapper,  # type: ignore[arg-type]
                world_size=world_size,
                units=units,
                reduce_rule=compat_fsdp.reduce_dtype_rule(),
            )
        )
        self._optimizers: weakref.WeakKeyDictionary[Any, tuple[int, dict[str, list[Any]]]] = (
            weakref.WeakKeyDictionary()
        )
        self.undo.append(_stepping(self))

    def describe(self) -> str:
        return f"{self.wrapper}, {len(self.units)} units"

    # -- recording ---------------------------------------------------------------------------
    def seen(
        self,
        unit: str,
        phase: str,
        dtypes: list[str],
        before: list[str] | None = None,
        cast: list[bool] | None = None,
    ) -> None:
        """Record a phase. ``input``/``output``: the unit's first call per iteration;
        other phases: emitted when they show a dtype not yet emitted in this iteration
        (the event then lists every dtype seen so far)."""
        it = self.iteration
        if it < 1 or not self.attached:
            return
        key = (unit, phase)
        last = self._seen.get(key)
        if last is not None and last[0] == it:
            if phase in _FIRST_ONLY:
                return
            known = last[1]
            new = [d for d in dtypes if d not in known]
            if not new:
                return
            dtypes = known + new
        elif phase not in _FIRST_ONLY and not dtypes:
            return
        self._seen[key] = (it, dtypes)
        record = PrecisionSeen(
            iteration=it,
            unit=unit,
            phase=phase,  # type: ignore[arg-type]
            dtypes=dtypes,
            before=before or [],
            cast=cast or [],
        )
        with self._hold_lock:
            self._hold()
            self._held.append(record)
            full = len(self._held) >= SEND_AT
        if full:
            self.send()

    def collective(self, unit: str, op: str, sent: torch.Tensor) -> None:
        if self.iteration < 1 or not self.attached:
            return
        record = PrecisionCollective(
            iteration=self.iteration,
            unit=unit,
            op=op,  # type: ignore[arg-type]
            dtype=str(sent.dtype),
            nbytes=sent.numel() * sent.element_size(),
            backward=in_backward(),
        )
        with self._hold_lock:
            self._hold()
            self._held_collectives.append(record)
            full = len(self._held_collectives) >= SEND_AT
        if full:
            self.send()

    def _hold(self) -> None:
        """Records are about to be held (under ``_hold_lock``): until they are sent, the
        recorder stays alive. A user who drops the model and the handle before the run's
        end flush would otherwise lose them: the flush hook holds the recorder weakly, and
        the garbage collector may take it (a cycle with its hooks) before the flush."""
        if not self._held and not self._held_collectives:
            _UNSENT.add(self)

    def send(self) -> None:
        """Emit the records held so far as one ``precision_batch`` (nothing if none)."""
        with self._hold_lock:
            seen, self._held = self._held, []
            collectives, self._held_collectives = self._held_collectives, []
            _UNSENT.discard(self)
        if seen or collectives:
            self.recorded += len(seen) + len(collectives)
            self.emit(PrecisionBatch(seen=seen, collectives=collectives))

    def inputs(self, unit: str, before: list[torch.Tensor], after: list[torch.Tensor]) -> None:
        """The input phase from the floating inputs before and after the unit's cast."""
        self.seen(
            unit,
            "input",
            [str(t.dtype) for t in after],
            [str(t.dtype) for t in before],
            [a is not b for a, b in zip(before, after, strict=False)],
        )

    # -- the optimizer step ------------------------------------------------------------------
    def unit_params(self) -> dict[int, str]:
        """``id(parameter the optimizer steps)`` -> unit fqn (read at the first step)."""
        raise NotImplementedError

    def _before_step(self, optimizer: Any) -> None:
        if not self.attached or self.iteration < 1:
            return
        groups = optimizer.param_groups
        count = sum(len(g["params"]) for g in groups)
        cached = self._optimizers.get(optimizer)
        if cached is None or cached[0] != count:
            owner = self.unit_params()
            mine: dict[str, list[Any]] = {}
            for g in groups:
                for p in g["params"]:
                    unit = owner.get(id(p))
                    if unit is not None:
                        mine.setdefault(unit, []).append(p)
            cached = (count, mine)
            self._optimizers[optimizer] = cached
        for unit, params in cached[1].items():
            self.seen(unit, "sharded_param", distinct(p.dtype for p in params))
            grads = [p.grad for p in params if p.grad is not None]
            self.seen(unit, "sharded_grad", distinct(g.dtype for g in grads))
        if cached[1]:
            self.send()  # the iteration's last records

    # -- a failed forward --------------------------------------------------------------------
    def after_root_forward(self, module: nn.Module, output: Any) -> None:
        """From an ``always_call`` forward hook of the root: on the exception path (the
        root's ``_call_impl`` is handling an exception), emit where it happened."""
        if output is not None or not self.attached:
            return
        exc = sys.exc_info()[1]
        if exc is None or not _handled_by(exc.__traceback__, module):
            return
        modules = list(_modules_on(exc.__traceback__))
        consumer = next((m for m in reversed(modules) if id(m) in self.module_fqn), module)
        unit = next((m for m in reversed(modules) if id(m) in self.module_unit), module)
        message = f"{type(exc).__name__}: {exc}"
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 3] + "..."
        self.send()
        self.emit(
            PrecisionFailure(
                iteration=max(self.iteration, 1),
                unit=self.module_unit.get(id(unit), ""),
                consumer=self.module_fqn.get(id(consumer), ""),
                message=message,
            )
        )


# One process-wide optimizer step pre-hook for every attached recorder, held weakly: a
# model dropped without detach() takes its recorder with it.
_STEPPING: weakref.WeakSet[PrecisionRecorder] = weakref.WeakSet()
_step_lock = threading.Lock()
_step_hook: list[Any] = []  # the RemovableHandle while installed


def _stepping(recorder: PrecisionRecorder) -> Callable[[], None]:
    with _step_lock:
        _STEPPING.add(recorder)
        if not _step_hook:
            _step_hook.append(register_optimizer_step_pre_hook(_before_any_step))

    def stop() -> None:
        with _step_lock:
            _STEPPING.discard(recorder)
            if not _STEPPING and _step_hook:
                _step_hook.pop().remove()

    return stop


def _before_any_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    for recorder in list(_STEPPING):
        try:
            with recorder.meter:
                recorder._before_step(optimizer)
        except Exception:  # pragma: no cover - a bug in the probe
            log.exception("precision probe: reading the optimizer step failed")


def _handled_by(tb: TracebackType | None, module: nn.Module) -> bool:
    """Whether ``tb`` starts in ``module``'s own ``_call_impl`` (its except block)."""
    return (
        tb is not None
        and tb.tb_frame.f_code is _CALL_IMPL
        and tb.tb_frame.f_locals.get("self") is module
    )


def _modules_on(tb: TracebackType | None) -> Iterator[nn.Module]:
    """The modules whose ``_call_impl`` frames the traceback runs through, outer first."""
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is _CALL_IMPL:
            found = frame.f_locals.get("self")
            if isinstance(found, nn.Module):
                yield found
        tb = tb.tb_next


# -- collectives FSDP1 (and FSDP2's HSDP all-reduce) call through ``torch.distributed`` --------
class Scope(threading.local):
    """The unit whose collectives are being issued on this thread (None: not ours)."""

    current: tuple[PrecisionRecorder, str] | None = None


SCOPE = Scope()


# torch.distributed function -> (op, which argument is the buffer this rank sends).
COLLECTIVES: dict[str, tuple[str, Pick]] = {
    name: FUNCTIONS[name][:2]
    for name in (
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_single",
        "reduce_scatter_tensor",
        "reduce_scatter_single",
        "all_reduce",
    )
}


class DistProxy:
    """Stands for ``torch.distributed`` as the ``dist`` global of one FSDP module: the
    collectives in ``names`` note what they send when ``SCOPE`` names a unit, then call
    the real function; every other attribute is the real module's."""

    def __init__(self, real: ModuleType, names: Iterable[str]) -> None:
        self._real = real
        for name in names:
            if getattr(real, name, None) is not None:
                op, pick = COLLECTIVES[name]
                setattr(self, name, _spying(real, name, op, pick))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _spying(real: ModuleType, name: str, op: str, pick: Pick) -> Callable[..., Any]:
    """Looked up at call time: another probe's wrapper of ``dist.<name>`` (the timeline's)
    installed after this one still runs."""

    def call(*args: Any, **kwargs: Any) -> Any:
        scope = SCOPE.current
        if scope is not None:
            sent = pick(args, kwargs)
            if isinstance(sent, torch.Tensor) and sent.is_floating_point():
                recorder, unit = scope
                try:
                    with recorder.meter:
                        recorder.collective(unit, op, sent)
                except Exception:  # pragma: no cover
                    log.exception("precision probe: recording a collective failed")
        return getattr(real, name)(*args, **kwargs)

    return call


class ModulePatch:
    """Replace ``module.<name>`` while any recorder needs it (reference counted)."""

    def __init__(self, module: ModuleType, name: str, make: Callable[[Any], Any]) -> None:
        self.module, self.name, self._make = module, name, make
        self._users = 0
        self._original: Any = None
        self._lock = threading.Lock()

    @property
    def original(self) -> Any:
        return self._original if self._users else getattr(self.module, self.name)

    def acquire(self, owner: object) -> Callable[[], None]:
        """Patch (if not yet) for ``owner``; the returned callable releases, once. A
        recorder dropped without ``detach()`` releases when it is collected."""
        with self._lock:
            if self._users == 0:
                self._original = getattr(self.module, self.name)
                setattr(self.module, self.name, self._make(self._original))
            self._users += 1
        return weakref.finalize(owner, self._release)

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                setattr(self.module, self.name, self._original)
                self._original = None


def in_scope(recorder: PrecisionRecorder, unit: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with ``SCOPE`` naming ``unit`` while it runs (collectives are attributed)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        outer = SCOPE.current
        SCOPE.current = (recorder, unit) if recorder.attached else None
        try:
            return fn(*args, **kwargs)
        finally:
            SCOPE.current = outer

    return call


def parent_of(fqn: str, units: set[str]) -> str | None:
    """The innermost unit strictly enclosing ``fqn`` (None for the root)."""
    if fqn == "":
        return None
    parts = fqn.split(".")
    for n in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in units:
            return prefix
    return "" if "" in units else None


def innermost_units(
    root: nn.Module, unit_fqns: set[str], fqn_of: Callable[[str], str]
) -> dict[int, str]:
    """``id(module)`` -> the fqn of the innermost unit holding it, for every module."""
    out: dict[int, str] = {}
    for name, m in root.named_modules(remove_duplicate=False):
        fqn = fqn_of(name)
        if fqn in unit_fqns:
            out[id(m)] = fqn
        else:
            parent = parent_of(fqn, unit_fqns)
            if parent is not None:
                out[id(m)] = parent
    return out
