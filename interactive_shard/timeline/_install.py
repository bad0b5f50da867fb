"""Install the timeline probe's hooks on a model: Note [Timeline probe] in ``probe.py``.

Its own cost (``rec.meter``, run.overhead): hooks are ``rec.timed``; a wrapper around a
real call (a compiled region, FSDP2's backward methods, the user's hooks) times only
its own parts, and every span it records is timed in ``SpanRecorder.add_at``."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from interactive_shard.probing import collectives as _collectives
from interactive_shard.probing import in_backward
from interactive_shard.probing import spy as _spy
from interactive_shard.probing.compat.dynamo import OptimizedModule
from interactive_shard.probing.compat.fsdp import param_groups as fsdp_param_groups
from interactive_shard.timeline import _graph
from interactive_shard.timeline._recorder import SpanRecorder, clock

_FSDP1_PARTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def target_of(model: nn.Module) -> str:
    if isinstance(model, OptimizedModule):
        return "compiled"
    if isinstance(model, DDP):
        return "ddp"
    if isinstance(model, FSDPModule):
        return "fsdp2"
    if isinstance(model, FSDP1):
        return "fsdp1"
    return "module"


def _clean(name: str) -> str:
    return ".".join(p for p in name.split(".") if p and p not in _FSDP1_PARTS)


_CONTAINERS = (nn.ModuleList, nn.ModuleDict)


def _called_depth(base: nn.Module, name: str) -> int:
    """Depth of ``name`` not counting ModuleList / ModuleDict levels (never called)."""
    depth, m = 0, base
    for part in name.split("."):
        m = m.get_submodule(part)
        depth += not isinstance(m, _CONTAINERS)
    return depth if not isinstance(m, _CONTAINERS) else -1


def spanned(model: nn.Module, target: str, depth: int | None) -> list[tuple[str, nn.Module]]:
    """The modules to span below the root, with their fqns in the user's model. Nothing
    inside a compiled region: its hooks would be traced by dynamo (Note, step 3)."""
    if target == "compiled":
        return []
    base = model.module if isinstance(model, DDP) else model
    out: list[tuple[str, nn.Module]] = []
    names: set[str] = set()
    compiled: list[str] = []
    for raw, m in base.named_modules():
        name = _clean(raw) if target == "fsdp1" else raw
        if not name or name in names:  # FSDP1: the wrapper comes before its module
            continue
        if any(name.startswith(c + ".") for c in compiled):
            continue
        is_compiled = getattr(m, "_compiled_call_impl", None) is not None
        if is_compiled:
            compiled.append(name)
        if depth is not None:
            chosen = len(name.split(".")) <= depth
        elif target == "fsdp2":
            chosen = isinstance(m, FSDPModule)
        elif target == "fsdp1":
            chosen = isinstance(m, FSDP1)
        else:  # the children, through containers that are never called themselves
            chosen = _called_depth(base, name) == 1
        if chosen or is_compiled:
            names.add(name)
            out.append((name, m))
    return out


def install(model: nn.Module, depth: int | None) -> SpanRecorder:
    target = target_of(model)
    modules = spanned(model, target, depth)
    rec = SpanRecorder(target, depth, [name for name, _ in modules])
    params = list(model.parameters())
    rec.params = {id(p) for p in params}
    if params and params[0].device.type == "cuda":
        rec.use_cuda_events(params[0].device)
    with rec.installing():
        _root(rec, model, compiled=target == "compiled")
        for name, m in modules:
            if getattr(m, "_compiled_call_impl", None) is not None:
                _compiled_region(rec, name, m)
            else:
                _eager(rec, name, m)
                _user_hooks(rec, name, m)
        if target == "fsdp2":
            _fsdp2_hooks(rec, model)
        ddp = _ddp_of(model)
        if ddp is not None:
            _ddp_hooks(rec, ddp)
        rec.undo.append(_listen(rec))
        rec.undo.append(_stepping(rec))
    return rec


# -- modules --------------------------------------------------------------------------------
def _root(rec: SpanRecorder, model: nn.Module, *, compiled: bool) -> None:
    starts: list[tuple[float, int, int]] = []

    def pre(m: nn.Module, args: Any, kwargs: Any) -> None:
        if in_backward():
            return
        rec.begin_iteration()
        starts.append((rec.stamp(), _graph.boundary(args, kwargs), rec.iteration))

    def post(m: nn.Module, args: Any, output: Any) -> None:
        if in_backward() or not starts:
            return
        start, above, it = starts.pop()
        kind = "compiled_forward" if compiled else "forward"
        rec.add(kind, "", start, rec.stamp())
        if compiled and output is not None and torch.is_grad_enabled():
            _time_compiled(rec, "", output, above, it)

    h1 = model.register_forward_pre_hook(rec.timed(pre), prepend=True, with_kwargs=True)
    h2 = model.register_forward_hook(rec.timed(post), always_call=True)
    rec.undo += [h1.remove, h2.remove]


def _eager(rec: SpanRecorder, name: str, m: nn.Module) -> None:
    calls: list[list[Any]] = []  # [start, above, iteration] per call in progress

    def first(mod: nn.Module, args: Any) -> None:
        calls.append([rec.stamp(), -1, rec.iteration])

    def last(mod: nn.Module, args: Any, kwargs: Any) -> None:
        if calls:  # after FSDP's pre-forward: its nodes are outside the call (Note, 2)
            calls[-1][1] = _graph.boundary(args, kwargs)

    def post(mod: nn.Module, args: Any, output: Any) -> None:
        if not calls:
            return
        start, above, it = calls.pop()
        recompute = in_backward()
        rec.add("forward", name, start, rec.stamp(), {"recompute": True} if recompute else None)
        if recompute or output is None or not torch.is_grad_enabled():
            return
        found = _graph.walk(output, above)
        if found is not None:
            _graph.time_span(
                found.tops,
                found.sinks,
                rec.stamp,
                lambda s, e: rec.add_at(it, "backward", name, s, e),
            )

    handles = [
        m.register_forward_pre_hook(rec.timed(first), prepend=True),
        m.register_forward_pre_hook(rec.timed(last), with_kwargs=True),
        m.register_forward_hook(rec.timed(post), always_call=True),
    ]
    rec.undo += [h.remove for h in handles]


def _compiled_region(rec: SpanRecorder, name: str, m: nn.Module) -> None:
    original: Callable[..., Any] = m._compiled_call_impl  # type: ignore[assignment]

    def call(*args: Any, **kwargs: Any) -> Any:
        if not rec.attached or in_backward():
            return original(*args, **kwargs)
        with rec.meter:  # its own parts only, not the compiled region's
            start, above, it = rec.stamp(), _graph.boundary(args, kwargs), rec.iteration
        out = original(*args, **kwargs)
        rec.add("compiled_forward", name, start, rec.stamp())
        if torch.is_grad_enabled():
            rec.timed(_time_compiled)(rec, name, out, above, it)
        return out

    m._compiled_call_impl = call

    def restore() -> None:
        m._compiled_call_impl = original

    rec.undo.append(restore)


def _time_compiled(rec: SpanRecorder, name: str, output: Any, above: int, it: int) -> None:
    """One ``compiled_backward`` span per CompiledFunctionBackward node of the call."""
    found = _graph.walk(output, above)
    if found is None:
        return
    many = len(found.compiled) > 1
    label = name or "compiled"
    for k, node in enumerate(found.compiled):
        span = f"{label}#{k}" if many or not name else label

        def done(s: Any, e: Any, span: str = span) -> None:
            rec.add_at(it, "compiled_backward", span, s, e)

        _graph.time_span([node], [node], rec.stamp, done)


_USER_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def _user_hooks(rec: SpanRecorder, name: str, m: nn.Module) -> None:
    """Wrap the user's Python hooks on ``m`` (not torch's, not ours) in timing."""
    for attr in _USER_HOOKS:
        hooks = getattr(m, attr, None)
        if not hooks:
            continue
        for key, fn in list(hooks.items()):
            module = getattr(getattr(fn, "__func__", fn), "__module__", "") or ""
            if module.startswith(("torch", "interactive_shard")):
                continue
            hooks[key] = _timed_hook(rec, f"{attr.strip('_').removesuffix('s')}:{name}", fn)
            rec.undo.append(_putting_back(hooks, key, fn))


def _putting_back(hooks: Any, key: int, fn: Any) -> Callable[[], None]:
    def put_back() -> None:
        if key in hooks:
            hooks[key] = fn

    return put_back


def _timed_hook(rec: SpanRecorder, span: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            rec.add("hook", span, start, clock(), {"user": True})

    return call


# -- FSDP2 and DDP hooks --------------------------------------------------------------------
def _fsdp2_hooks(rec: SpanRecorder, root: nn.Module) -> None:
    seen: set[int] = set()
    for fqn, m in root.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        state = m._get_fsdp_state()
        if id(state) in seen:
            continue
        seen.add(id(state))
        for group in fsdp_param_groups(state):
            for method in ("pre_backward", "post_backward"):
                _wrap_method(rec, group, method, f"{method}:{fqn}")


def _wrap_method(rec: SpanRecorder, obj: Any, method: str, span: str) -> None:
    """Time ``obj.<method>`` (an instance attribute wins over the class's: FSDP2 looks
    the method up at call time); detach puts back what was there before."""
    had = method in obj.__dict__
    before = obj.__dict__.get(method)
    inner = getattr(obj, method)

    def call(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            rec.add("hook", span, start, clock())

    setattr(obj, method, call)

    def restore() -> None:
        if had:
            setattr(obj, method, before)
        else:
            obj.__dict__.pop(method, None)

    rec.undo.append(restore)


def _ddp_of(model: nn.Module) -> DDP | None:
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, DDP) else None


def _ddp_hooks(rec: SpanRecorder, ddp: DDP) -> None:
    for name, p in ddp.module.named_parameters():
        if not p.requires_grad:
            continue

        def ready(param: Any, name: str = name) -> None:
            if param.grad is None:  # Note [Undefined gradients] in probing/__init__.py
                return
            t = clock()
            rec.add("hook", f"grad_ready:{name}", t, t, {"param": name})

        handle = p.register_post_accumulate_grad_hook(rec.timed(ready))
        rec.undo.append(handle.remove)
    group = getattr(ddp.process_group, "group_name", "default")
    size = ddp.process_group.size()

    def launched(launch: _spy.Launch) -> None:
        detail = {
            "nbytes": launch.nbytes,
            "dtype": f"{launch.element_size}-byte",
            "group": group,
            "group_size": size,
            "source": "reducer",
        }
        rec.collective("all_reduce", launch.start_t, None, detail, launch)

    spy = _spy.attach(ddp, launched, rec.meter)
    if spy is not None:
        rec.undo.append(lambda: _spy.detach(ddp, spy, launched))


# -- process-wide: collectives and the optimizer --------------------------------------------
def _listen(rec: SpanRecorder) -> Callable[[], None]:
    """Collectives go to ``rec`` while it lives (held weakly: a recorder dropped without
    detach() stops listening when collected)."""
    ref = weakref.WeakMethod(rec.collective)

    def listener(*args: Any) -> None:
        method = ref()
        if method is not None:
            method(*args)

    stop = _collectives.listen(listener)
    weakref.finalize(rec, stop)
    return stop


_STEPPING: weakref.WeakSet[SpanRecorder] = weakref.WeakSet()
_step_hooks: list[Any] = []
_step_starts: dict[int, float] = {}


def _stepping(rec: SpanRecorder) -> Callable[[], None]:
    _STEPPING.add(rec)
    if not _step_hooks:
        _step_hooks.append(register_optimizer_step_pre_hook(_before_step))
        _step_hooks.append(register_optimizer_step_post_hook(_after_step))

    def stop() -> None:
        _STEPPING.discard(rec)
        if not _STEPPING:
            while _step_hooks:
                _step_hooks.pop().remove()

    return stop


def _before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _step_starts[id(optimizer)] = clock()


def _steps_watched(optimizer: Any, rec: SpanRecorder) -> bool:
    """Whether ``optimizer`` steps any of ``rec``'s parameters (cached per optimizer)."""
    key = (id(rec), sum(len(g["params"]) for g in optimizer.param_groups))
    cache: dict[Any, bool] = optimizer.__dict__.setdefault("_ish_timeline_steps", {})
    if key not in cache:
        cache[key] = any(id(p) in rec.params for g in optimizer.param_groups for p in g["params"])
    return cache[key]


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    start = _step_starts.pop(id(optimizer), None)
    end = clock()
    for rec in list(_STEPPING):
        if start is not None and rec.current():
            with rec.meter:
                if _steps_watched(optimizer, rec):
                    rec.add("optimizer", type(optimizer).__name__, start, end)
                    rec.closed = True
                    rec.send()
