"""Run a model once in the kernel as FSDP2 / FSDP1 / DDP mixed precision would run it.

No process group, no wrapping: on a copy of the model (meta stays meta, anything else
goes to the CPU), each unit's own floating parameters are cast to its compute dtype,
buffers to FSDP1's / DDP's ``buffer_dtype``, each unit's inputs are cast at its
pre-forward with torch's own container walk (``torch.distributed.utils.
_apply_to_tensors``) and FSDP2's ``output_dtype`` is applied to its outputs. Module
hooks record what every unit sees; a ``TorchFunctionMode`` follows where each tensor's
dtype came from (a parameter, a buffer, a unit's output, an input a unit did not or
could not cast) and catches the op that fails on mixed dtypes. A failing op is
retried with its arguments in one dtype (the one it was meant to compute in), so one
run finds every boundary, not only the first.

On the meta device ops do not check dtypes (``F.linear`` of a Half input and a Float
weight returns a meta tensor), so there every op with floating arguments of several
dtypes is first run on empty CPU tensors of the same shapes and dtypes.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

from interactive_shard.example_inputs import split
from interactive_shard.precision._rules import (
    Family,
    buffer_cast,
    compute_dtype,
    input_cast,
    param_cast,
)
from interactive_shard.precision.events import Policy

__all__ = ["Hidden", "Origin", "RawFailure", "Seen", "SimResult", "Simulator", "UnitSpec"]

_DTYPE_WORDS = re.compile(r"dtype|scalar type|Half|BFloat16|Float|Double", re.IGNORECASE)
MAX_FAILURES = 16  # per run; after that the first unrecoverable op stops the forward
_WALK_DEPTH = 6
_WALK_NODES = 10_000


@dataclass(eq=False)
class Origin:
    """Where a tensor's dtype came from (shared by every tensor derived in that dtype)."""

    kind: str  # "input" (an example input), "cast", "output", "param", "buffer", "created"
    unit: str | None  # the unit that cast it / output it / owns the param or buffer
    name: str  # input path, param or buffer fqn, op name
    module: str | None = None  # the module that owns the buffer / created the tensor
    dtype: str = ""


@dataclass(frozen=True)
class UnitSpec:
    fqn: str
    parent: str | None
    policy: Policy
    params: tuple[str, ...]  # fqns of the floating parameters the unit manages
    orig: str | None  # their dtype

    @property
    def root(self) -> bool:
        return self.parent is None


@dataclass(frozen=True)
class Hidden:
    """A floating tensor in a unit's inputs that the cast does not reach."""

    path: str
    dtype: str
    container: str  # the type that hides it: "PackedSequence", "mypkg.Batch"


@dataclass
class Seen:
    """What one unit saw in the run (``inputs``/``cast``/``hidden``: its first call)."""

    inputs: list[str] = field(default_factory=list)  # floating inputs after the cast
    cast: list[bool] = field(default_factory=list)
    before: list[str] = field(default_factory=list)
    hidden: list[Hidden] = field(default_factory=list)
    input_dtypes: list[str] = field(default_factory=list)  # distinct, all calls
    output_dtypes: list[str] = field(default_factory=list)  # distinct, all calls
    output_before: list[str] = field(default_factory=list)  # before output_dtype
    calls: int = 0


@dataclass(frozen=True)
class RawBoundary:
    unit: str
    producer: str | None
    before: str
    after: str
    cast: bool


@dataclass(frozen=True)
class RawFailure:
    unit: str  # innermost unit holding the consumer
    consumer: str  # innermost module running when the op failed
    op: str
    error: str
    kind: str  # uncast_input | hidden_input | output_boundary | buffer | param | other
    got: str  # the offending argument's dtype
    expected: str  # the dtype the op computes in
    origin: Origin
    hidden: Hidden | None = None
    recovered: bool = True


@dataclass
class SimResult:
    seen: dict[str, Seen]
    failures: list[RawFailure]
    boundaries: list[RawBoundary]
    aborted: bool  # the forward stopped at an unrecoverable failure
    device: str


@dataclass
class _Frame:
    unit: str
    uncast: list[Origin]
    hidden: list[tuple[Origin, Hidden]]


class _Abort(Exception):
    pass


def _dt(dtype: torch.dtype) -> str:
    return str(dtype)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."))
    assert isinstance(dtype, torch.dtype), name
    return dtype


def _op_name(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", None) or repr(func)
    return str(name)


def _in_place(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__")


def _castable(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and torch.is_floating_point(x)


def walk(obj: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor, str | None]]:
    """Every tensor in ``obj`` as ``(path, tensor, hidden_by)``.

    ``hidden_by`` is None where ``_apply_to_tensors`` (FSDP's and DDP's input cast)
    reaches the tensor, else the type name of the container that hides it: any object
    that is not a Tensor, dataclass, dict, namedtuple, list, tuple or set, and a
    ``PackedSequence`` (whose cast result torch discards). Bounded in depth and size.
    """
    count = [0]
    seen: set[int] = set()

    def go(x: Any, p: str, depth: int, hidden: str | None) -> Iterator[tuple[str, Any, Any]]:
        count[0] += 1
        if count[0] > _WALK_NODES or depth > _WALK_DEPTH:
            return
        if isinstance(x, torch.Tensor):
            yield p, x, hidden
            return
        if isinstance(x, (str, bytes, int, float, bool, type(None), nn.Module, type)):
            return
        if id(x) in seen:
            return
        seen.add(id(x))
        if isinstance(x, PackedSequence):
            yield from go(x.data, f"{p}.data", depth + 1, hidden or "PackedSequence")
        elif hasattr(x, "__dataclass_fields__"):
            for f in dataclasses.fields(x):
                yield from go(getattr(x, f.name, None), f"{p}.{f.name}", depth + 1, hidden)
        elif isinstance(x, dict):
            for k, v in x.items():
                yield from go(v, f"{p}[{k!r}]", depth + 1, hidden)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                yield from go(v, f"{p}[{i}]", depth + 1, hidden)
        elif isinstance(x, (set, frozenset)):
            container = hidden if isinstance(x, set) else hidden or "frozenset"
            for v in x:
                yield from go(v, f"{p}{{...}}", depth + 1, container)
        elif hasattr(x, "__dict__") and not callable(x):
            name = f"{type(x).__module__}.{type(x).__qualname__}"
            for k, v in vars(x).items():
                yield from go(v, f"{p}.{k}", depth + 1, hidden or name)

    yield from go(obj, path, 0, None)


def _cast_fn(dtype: torch.dtype, record: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """FSDP2's ``_cast_fp_tensor`` (= FSDP1's / DDP's ``cast_fn``), recording its results."""

    def fn(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or not torch.is_floating_point(x) or x.dtype == dtype:
            y = x
        else:
            y = x.to(dtype)
        if isinstance(x, torch.Tensor):
            record[id(x)] = (x, y)
        return y

    return fn


def _standin(x: Any) -> Any:
    """A CPU tensor for a meta one (empty floats, zero integers), for a dtype check."""
    if not isinstance(x, torch.Tensor) or x.device.type != "meta":
        return x
    if torch.is_floating_point(x) or x.is_complex():
        return torch.empty(x.shape, dtype=x.dtype)
    return torch.zeros(x.shape, dtype=x.dtype)


class _Mode(TorchFunctionMode):
    def __init__(self, sim: _Run) -> None:
        super().__init__()
        self.sim = sim

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        sim = self.sim
        if sim.paused:
            return func(*args, **kwargs)
        leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        floating = [t for t in leaves if torch.is_floating_point(t)]
        mixed = len({t.dtype for t in floating}) > 1
        if not mixed:
            out = func(*args, **kwargs)
        else:
            out = sim.call_mixed(func, args, kwargs, floating)
        sim.tag_outputs(func, out, floating)
        return out


class _Run:
    """One simulated forward (hooks, origins and records live here)."""

    def __init__(
        self,
        sim: Simulator,
        family: Family | None,
        units: dict[str, UnitSpec],
    ) -> None:
        self.sim = sim
        self.family = family
        self.units = units
        self.meta = sim.device == "meta"
        self.origins: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.modules: list[str] = []
        self.frames: list[_Frame] = []
        self.seen: dict[str, Seen] = {fqn: Seen() for fqn in units}
        self.failures: list[RawFailure] = []
        self.boundaries: list[RawBoundary] = []
        self.paused = False
        self.abort: BaseException | None = None
        self.raised: tuple[Exception, str, _Frame | None, nn.Module, Any] | None = None

    # -- origins ------------------------------------------------------------------------

    def origin(self, t: torch.Tensor) -> Origin:
        found: Origin | None = self.origins.get(t)  # type: ignore[no-untyped-call]
        if found is None:
            module = self.modules[-1] if self.modules else None
            found = Origin(
                "created", self.frames[-1].unit if self.frames else None, "tensor", module
            )
            found.dtype = _dt(t.dtype)
            self.origins[t] = found
        assert isinstance(found, Origin)
        return found

    def tag_outputs(self, func: Callable[..., Any], out: Any, floating: list[torch.Tensor]) -> None:
        if isinstance(out, torch.Tensor):
            outs: list[Any] = [out]
        elif isinstance(out, (tuple, list)):
            outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        else:
            return
        for o in outs:
            if o in self.origins or not torch.is_floating_point(o):
                continue
            src = next((t for t in floating if t.dtype == o.dtype and t in self.origins), None)
            if src is not None:
                self.origins[o] = self.origins[src]
            else:
                module = self.modules[-1] if self.modules else None
                unit = self.frames[-1].unit if self.frames else None
                self.origins[o] = Origin("created", unit, _op_name(func), module, _dt(o.dtype))

    # -- the failing op -----------------------------------------------------------------

    def _checked(self, func: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        if self.meta:
            a, k = pytree.tree_map(_standin, (args, kwargs))
            with torch.no_grad():
                func(*a, **k)
        return func(*args, **kwargs)

    def call_mixed(
        self,
        func: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        floating: list[torch.Tensor],
    ) -> Any:
        try:
            return self._checked(func, args, kwargs)
        except Exception as err:  # re-raised unless a dtype failure
            error = err
        name = _op_name(func)
        for anchor in self._anchors(name, args, kwargs, floating):

            def to_anchor(x: Any, anchor: torch.dtype = anchor) -> Any:
                return x.to(anchor) if _castable(x) and x.dtype != anchor else x

            fixed_args, fixed_kwargs = pytree.tree_map(to_anchor, (args, kwargs))
            try:
                out = self._checked(func, fixed_args, fixed_kwargs)
            except Exception:  # not this dtype
                continue
            offending = next(t for t in floating if t.dtype != anchor)
            recover = len(self.failures) < MAX_FAILURES
            self.failures.append(self._classify(name, error, offending, anchor, recover))
            if not recover:
                self.abort = error
                raise error
            return out
        if self.meta:  # the CPU check failed for another reason: trust the meta kernel
            return func(*args, **kwargs)
        raise error

    def _anchors(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        floating: list[torch.Tensor],
    ) -> list[torch.dtype]:
        """The dtypes the op may be meant to compute in, most likely first."""
        order: list[torch.dtype] = []
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor):
            order.append(out.dtype)
        if _in_place(name) and args and isinstance(args[0], torch.Tensor):
            order.append(args[0].dtype)
        unit = self.frames[-1].unit if self.frames else None
        params = [t for t in floating if self.origin(t).kind == "param"]
        order += [t.dtype for t in params if self.origin(t).unit == unit]
        order += [t.dtype for t in params]
        if unit is not None:
            spec = self.units[unit]
            compute = compute_dtype(self.family, spec.policy, spec.orig)
            order += [t.dtype for t in floating if _dt(t.dtype) == compute]
        order += [t.dtype for t in floating]
        return list(dict.fromkeys(order))

    def _classify(
        self,
        op: str,
        error: Exception,
        offending: torch.Tensor,
        anchor: torch.dtype,
        recovered: bool,
        frame: _Frame | None = None,
        consumer: str | None = None,
    ) -> RawFailure:
        origin = self.origin(offending)
        if consumer is None:
            frame = self.frames[-1] if self.frames else None
            consumer = self.modules[-1] if self.modules else ""
        kind = "other"
        hidden = None
        if frame is not None and any(origin is o for o, _ in frame.hidden):
            kind = "hidden_input"
            hidden = next(h for o, h in frame.hidden if o is origin)
        elif frame is not None and any(origin is o for o in frame.uncast):
            kind = "uncast_input"
        elif origin.kind == "output" and origin.unit != (frame.unit if frame else None):
            kind = "output_boundary"
        elif origin.kind == "buffer":
            kind = "buffer"
        elif origin.kind == "param":
            kind = "param"
        return RawFailure(
            unit=frame.unit if frame is not None else "",
            consumer=consumer,
            op=op,
            error=str(error).strip(),
            kind=kind,
            got=_dt(offending.dtype),
            expected=_dt(anchor),
            origin=origin,
            hidden=hidden,
            recovered=recovered,
        )

    def failure_from(self, err: Exception) -> RawFailure | None:
        """A dtype failure raised by a module's own code (not by an op), else None.

        ``RNN.check_input`` raises "RNN input dtype (torch.float32) does not match weight
        dtype (torch.bfloat16)" before any op runs. The innermost module whose forward
        raised (its ``always_call`` hook ran first) is the consumer; the offending tensor
        is its first floating input in another dtype than its parameters.
        """
        if self.raised is None or not _caused_by(err, self.raised[0]):
            return None
        if not _DTYPE_WORDS.search(str(err)):
            return None
        _, consumer, frame, module, inputs = self.raised
        expected = next((p.dtype for p in module.parameters() if p.is_floating_point()), None)
        if expected is None and frame is not None:
            spec = self.units[frame.unit]
            name = compute_dtype(self.family, spec.policy, spec.orig)
            expected = _dtype(name) if name else None
        if expected is None:
            return None
        offending = next(
            (t for _, t, _ in walk(inputs) if _castable(t) and t.dtype != expected), None
        )
        if offending is None:
            return None
        name = f"{type(module).__name__}.forward"
        return self._classify(name, err, offending, expected, False, frame, consumer)

    # -- hooks --------------------------------------------------------------------------

    def push_module(self, fqn: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            self.modules.append(fqn)

        return hook

    def pop_module(self, fqn: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            err = sys.exc_info()[1]
            if isinstance(err, Exception) and (self.raised is None or self.raised[0] is not err):
                # the innermost module whose forward raised: its hook runs first
                frame = self.frames[-1] if self.frames else None
                self.raised = (err, fqn, frame, module, (args, kwargs))
            if self.modules and self.modules[-1] == fqn:
                self.modules.pop()
            if fqn in self.units and self.frames and self.frames[-1].unit == fqn:
                self.frames.pop()

        return hook

    def unit_pre(self, spec: UnitSpec) -> Callable[..., Any]:
        target_name = input_cast(
            self.family, spec.policy, root=spec.root, has_params=spec.orig is not None
        )
        target = _dtype(target_name) if target_name else None
        from torch.distributed.utils import _apply_to_tensors

        def hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
            seen = self.seen[spec.fqn]
            seen.calls += 1
            first = seen.calls == 1
            found = list(walk((args, kwargs)))
            record: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            if target is not None:
                self.paused = True
                try:
                    fn = _cast_fn(target, record)
                    args, kwargs = _apply_to_tensors(fn, args), _apply_to_tensors(fn, kwargs)
                finally:
                    self.paused = False
            frame = _Frame(spec.fqn, [], [])
            compute = compute_dtype(self.family, spec.policy, spec.orig)
            for path, x, hidden_by in found:
                if not torch.is_floating_point(x):
                    continue
                before = self.origin(x)
                if hidden_by is not None and target is not None:
                    h = Hidden(_input_path(path), _dt(x.dtype), hidden_by)
                    frame.hidden.append((before, h))
                    if first:
                        seen.hidden.append(h)
                    continue
                if hidden_by is not None:
                    frame.uncast.append(before)
                    continue
                y = record.get(id(x), (x, x))[1]
                cast = y is not x
                if cast:
                    self.origins[y] = Origin("cast", spec.fqn, path, None, _dt(y.dtype))
                else:
                    frame.uncast.append(before)
                if _dt(y.dtype) not in seen.input_dtypes:
                    seen.input_dtypes.append(_dt(y.dtype))
                if first:
                    seen.inputs.append(_dt(y.dtype))
                    seen.before.append(_dt(x.dtype))
                    seen.cast.append(cast)
                    if cast or (compute is not None and _dt(y.dtype) != compute):
                        producer = before.unit if before.kind == "output" else None
                        self.boundaries.append(
                            RawBoundary(spec.fqn, producer, _dt(x.dtype), _dt(y.dtype), cast)
                        )
            self.frames.append(frame)
            return args, kwargs

        return hook

    def unit_post(self, spec: UnitSpec) -> Callable[..., Any]:
        name = spec.policy.output_dtype if self.family == "fsdp2" else None
        target = _dtype(name) if name else None
        from torch.distributed.utils import _apply_to_tensors

        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
            seen = self.seen[spec.fqn]
            before = [_dt(x.dtype) for _, x, h in walk(output) if h is None and _castable(x)]
            for d in before:
                if d not in seen.output_before:
                    seen.output_before.append(d)
            if target is not None:
                self.paused = True
                try:
                    output = _apply_to_tensors(_cast_fn(target, {}), output)
                finally:
                    self.paused = False
            for _, x, hidden_by in walk(output):
                if hidden_by is None and _castable(x):
                    self.origins[x] = Origin("output", spec.fqn, spec.fqn, None, _dt(x.dtype))
                    if _dt(x.dtype) not in seen.output_dtypes:
                        seen.output_dtypes.append(_dt(x.dtype))
            return output

        return hook


class Simulator:
    """A private copy of the model to run simulations on (one per ``plan_precision``)."""

    def __init__(self, model: nn.Module, example_inputs: Any) -> None:
        tensors = [*model.parameters(), *model.buffers()]
        self.device = "meta" if any(t.device.type == "meta" for t in tensors) else "cpu"
        device = torch.device(self.device)
        memo: dict[int, Any] = {}
        with torch.no_grad():
            for p in model.parameters():
                if p.device != device:
                    memo[id(p)] = nn.Parameter(p.detach().to(device), p.requires_grad)
            for b in model.buffers():
                if b.device != device:
                    memo[id(b)] = b.detach().to(device)
            self.model = copy.deepcopy(model, memo)
        self.example_inputs = example_inputs
        self.params: dict[str, nn.Parameter] = dict(self.model.named_parameters())
        self.param_data = {name: p.data for name, p in self.params.items()}
        self.buffers: dict[str, tuple[nn.Module, str, str]] = {}  # fqn -> module, fqn, name
        for mfqn, module in self.model.named_modules():
            for bname, b in module.named_buffers(recurse=False):
                fqn = f"{mfqn}.{bname}" if mfqn else bname
                if b is not None and fqn not in self.buffers:
                    self.buffers[fqn] = (module, mfqn, bname)
        self.buffer_data = {
            fqn: module._buffers[name] for fqn, (module, _, name) in self.buffers.items()
        }

    def _inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = self.example_inputs
        device = torch.device(self.device)
        memo: dict[int, Any] = {}
        for _, t, _ in walk(x):
            if id(t) not in memo:
                c = t.detach().to(device, copy=True)
                if t.requires_grad and torch.is_floating_point(c):
                    c.requires_grad_(True)
                memo[id(t)] = c
        try:
            x = copy.deepcopy(x, memo)
        except Exception:  # an uncopyable object: use the caller's
            pass
        return split(x)

    def _restore(self) -> None:
        for name, p in self.params.items():
            p.data = self.param_data[name]
        for fqn, (module, _, name) in self.buffers.items():
            module._buffers[name] = self.buffer_data[fqn]

    def _innermost_unit(self, fqn: str, units: dict[str, UnitSpec]) -> str | None:
        best: str | None = None
        for u in units:
            if u == "" or fqn == u or fqn.startswith(u + "."):
                if best is None or len(u) > len(best):
                    best = u
        return best

    def run(self, family: Family | None, units: dict[str, UnitSpec]) -> SimResult:
        """Simulate one forward with these units (their fqns are modules of the model)."""
        self._restore()
        run = _Run(self, family, units)
        modules = dict(self.model.named_modules())
        handles: list[Any] = []
        try:
            with torch.no_grad():
                for spec in units.values():
                    target = param_cast(family, spec.policy)
                    if target is None:
                        continue
                    dtype = _dtype(target)
                    for name in spec.params:
                        p = self.params[name]
                        if torch.is_floating_point(p):
                            p.data = p.data.to(dtype)
                for module, mfqn, bname in self.buffers.values():
                    owner = self._innermost_unit(mfqn, units)
                    b = module._buffers[bname]
                    if b is None:
                        continue
                    target = None
                    if family == "ddp" and "" in units:
                        target = buffer_cast(family, units[""].policy)
                        if target is not None:  # DDP's _cast_buffers: every buffer
                            module._buffers[bname] = b.to(_dtype(target))
                        continue
                    if owner is not None:
                        target = buffer_cast(family, units[owner].policy)
                    if target is not None and torch.is_floating_point(b):
                        module._buffers[bname] = b.to(_dtype(target))
            for name, p in self.params.items():
                owner = next((u for u, s in units.items() if name in s.params), None)
                run.origins[p] = Origin("param", owner, name, None, _dt(p.dtype))
            for fqn, (module, mfqn, bname) in self.buffers.items():
                b = module._buffers[bname]
                if b is not None:
                    owner = self._innermost_unit(mfqn, units)
                    run.origins[b] = Origin("buffer", owner, fqn, mfqn, _dt(b.dtype))
            for fqn, module in modules.items():
                if fqn in units:
                    handles.append(
                        module.register_forward_pre_hook(
                            run.unit_pre(units[fqn]), prepend=True, with_kwargs=True
                        )
                    )
                handles.append(
                    module.register_forward_pre_hook(
                        run.push_module(fqn), prepend=True, with_kwargs=True
                    )
                )
                if fqn in units:
                    handles.append(
                        module.register_forward_hook(run.unit_post(units[fqn]), with_kwargs=True)
                    )
                handles.append(
                    module.register_forward_hook(
                        run.pop_module(fqn), with_kwargs=True, always_call=True
                    )
                )
            args, kwargs = self._inputs()
            for path, t, _ in walk((args, kwargs)):
                if torch.is_floating_point(t) and t not in run.origins:
                    run.origins[t] = Origin("input", None, _input_path(path), None, _dt(t.dtype))
            aborted = False
            with torch.enable_grad(), torch.autocast("cpu", enabled=False), _Mode(run):
                try:
                    self.model(*args, **kwargs)
                except Exception as err:
                    if run.abort is not None and _caused_by(err, run.abort):
                        aborted = True
                    elif (raw := run.failure_from(err)) is not None:
                        run.failures.append(raw)
                        aborted = True
                    else:
                        err.add_note(
                            "(raised by the model's forward in plan_precision's simulated run: "
                            f"example_inputs on a {self.device} copy of the model, the "
                            "policies' casts applied)"
                        )
                        raise
        finally:
            for h in handles:
                h.remove()
            self._restore()
        return SimResult(run.seen, run.failures, run.boundaries, aborted, self.device)


def _input_path(path: str) -> str:
    """``[0][1]`` (args, 2nd) -> ``args[1]``; ``[1]['x']`` -> ``kwargs['x']``."""
    if path.startswith("[0]"):
        return "args" + path[3:]
    if path.startswith("[1]"):
        return "kwargs" + path[3:]
    return path


def _caused_by(err: BaseException, cause: BaseException) -> bool:
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        if e is cause:
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False
