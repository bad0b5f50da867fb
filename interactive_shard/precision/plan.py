"""Reference planner: the dtype every FSDP unit (or a DDP model) uses at every phase.

Note [Mixed-precision plan]
~~~~~~~~~~~~~~~~~~~~~~~~~~~

Background: mixed precision in FSDP and DDP is *module-level*, not op-level like
autocast. Each FSDP unit carries a policy; the unit keeps its sharded parameters in
their original dtype, all-gathers and computes in ``param_dtype``, casts its floating
inputs to ``param_dtype`` at its own pre-forward (when the policy says so) and reduces
gradients in ``reduce_dtype``. Nothing casts between two units except those
pre-forward casts and FSDP2's ``output_dtype``: a low-precision unit's output that
flows into a module computing in another dtype crashes the op ("mat1 and mat2 must
have the same dtype, but got Half and Float") -- or, for ops that promote, silently
computes in the wider dtype.

Algorithm (torch 2.13; measured on real ranks, see ``tests/integration/
test_precision_plan_vs_fsdp.py``). ``pd``/``rd``/``od`` are the policy's
``param_dtype``/``reduce_dtype``/``output_dtype``, ``orig`` the dtype of the unit's own
floating parameters (those not under a nested unit), ``compute = pd or orig``:

======================  ====================  ==========================  ================
phase                   FSDP2                 FSDP1                       DDP
======================  ====================  ==========================  ================
input (floating ones)   pd if cast_forward_   pd if (root and cast_root_  pd if pd, else
                        inputs (default True) forward_inputs, default     as given
                        and pd, else as given True) or (the unit has
                                              parameters and cast_
                                              forward_inputs, default
                                              False), else as given
param                   compute               compute                     compute
output                  od or what forward    what forward gives (no      what forward
                        gives                 output cast)                gives
grad                    compute               compute                     compute
reduce                  rd or compute; from   rd or compute               rd or compute
                        torch 2.15 rd or orig
sharded_param           orig                  orig                        orig
sharded_grad            orig                  orig; compute with keep_    orig
                                              low_precision_grads
buffers                 untouched             buffer_dtype of the         every buffer to
                                              innermost unit owning them  buffer_dtype
======================  ====================  ==========================  ================

Sources: FSDP2 ``FSDPState._cast_forward_inputs`` / ``_cast_output_dtype``
(``_fully_shard/_fsdp_state.py``), ``FSDPParam.init_dtype_attrs`` and the reduce-scatter
buffer ``reduce_dtype or grad dtype`` (``_fsdp_collectives.py``); FSDP1
``_root_cast_forward_input`` and ``_pre_forward`` (``fsdp/_runtime_utils.py``, the
latter only with ``state._handle``), ``FlatParamHandle._init_param_reduce_dtypes``,
``_cast_grad_to_param_dtype``, ``prepare_gradient_for_optim`` and
``_get_buffers_and_dtypes_for_computation``; DDP ``_pre_forward``, ``_root_copy_hook``,
``_cast_buffers`` and ``_reducer_allreduce_and_upcast_hook``. Every cast touches
floating tensors only, and leaves a tensor already in the target dtype as the very same
object.

Without ``example_inputs`` only what the policy decides is planned: ``input`` where the
unit casts, ``output`` where FSDP2's ``output_dtype`` is set; the other two phases are
absent (what arrives and what forward produces needs a run). A phase that does not
apply is absent too: a unit without parameters of its own has no ``param``, ``grad``,
``reduce`` or ``sharded_*``; one whose parameters are all frozen no ``grad``, ``reduce``
or ``sharded_grad``; one without floating inputs (outputs) no ``input`` (``output``).
Several dtypes in one phase (floating inputs that are not cast) are joined with ", " in
first-seen order.

With ``example_inputs`` the model runs once in the kernel (``_simulate.py``): on a copy
(meta stays meta, anything else goes to the CPU), every unit's parameters cast as
above, its inputs cast with torch's own ``_apply_to_tensors`` (so tuples, lists, dicts,
namedtuples, sets and dataclasses are walked, while a ``PackedSequence`` or any other
object holding a tensor is not), FSDP2's ``output_dtype`` applied, buffers cast for
FSDP1 and DDP. The run records what each unit sees, and every op that fails on mixed
dtypes (the innermost module running it is the *consumer*, the innermost unit holding
it the failing *unit*). A failing op is retried in the dtype it was meant to compute in
and the run goes on, so all such failures are found; ``failures[0]`` (``.first``) is
where a real run stops, the later ones are met once the earlier are fixed. Each failure
is classified by where the offending dtype came from:

* ``output_boundary``: a unit's output (the *producer*). Fix: FSDP2 ``output_dtype`` on
  the producer; else the consumer module as a unit of its own that casts its input
  (FSDP1 has no ``output_dtype``: ``MixedPrecision(param_dtype=..., cast_forward_
  inputs=True)``); else the producer computing in the consumer's dtype;
* ``uncast_input``: an input the unit did not cast (``cast_forward_inputs`` off, no
  ``param_dtype``, an FSDP1 non-root unit without ``cast_forward_inputs``). Fix: turn the
  cast on (with ``param_dtype`` set, ``cast_root_forward_inputs`` for an FSDP1 root);
* ``hidden_input``: an input in a container the cast does not walk. Fix: the consumer
  module as a unit that receives the tensor itself, else the unit computing in its dtype;
* ``buffer``: a buffer in another dtype (FSDP2 never casts buffers; a BatchNorm's
  running stats in a bf16 unit). Fix: FSDP1 / DDP ``buffer_dtype``; FSDP2: the buffer's
  module as a unit computing in the buffer's dtype with ``output_dtype`` back, else the
  unit computing in the buffer's dtype;
* ``param`` (a parameter of another unit, e.g. tied weights) and ``other`` (a tensor the
  model's own code created in another dtype): the units involved computing in one dtype.

Every candidate fix is planned again with the same inputs; the first that leaves no
failure (following further failures greedily, at most ``MAX_SIMULATIONS`` runs per
call) is ``Failure.fix``, a complete ``policies`` dict of real torch policies. None when
nothing found works.

Caveats:

- The run is one forward on the CPU (or meta) without autocast, in training mode as the
  model is: control flow that depends on values, ranks or devices may differ from the
  real run. The messages are the CPU kernels' words; a CUDA kernel may word the same
  failure differently ("expected mat1 and mat2 to have the same dtype").
- FSDP1 auto-wrapping (``auto_wrap_policy``) gives BatchNorm modules (the policy's
  ``_module_classes_to_ignore``) their own fp32 unit with casting hooks; plan with those
  units listed explicitly. FSDP1 evaluation with ``FSDP_USE_FULL_PREC_IN_EVAL=1`` and
  ``summon_full_params`` force full precision; not modelled.
- A parameter shared by several units goes to the unit met first in reverse module
  order (FSDP wraps bottom-up). FSDP refuses a unit whose trainable parameters have
  several original dtypes; so does the planner.
- Backward is not run: ``grad``, ``reduce`` and ``sharded_*`` come from the rules.
- FSDP1 ``keep_low_precision_grads`` is planned for the sharded strategies (the
  optimizer's gradient is cast to the compute dtype in ``prepare_gradient_for_optim``);
  with ``NO_SHARD`` -- which FSDP1 switches to on one rank -- the gradient stays in the
  reduce dtype (measured).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import torch
from torch import nn

from interactive_shard.precision import _policy, _rules
from interactive_shard.precision._rules import Family
from interactive_shard.precision._simulate import RawFailure, SimResult, Simulator, UnitSpec
from interactive_shard.precision.events import PHASES, Policy, Unit
from interactive_shard.probing.compat import fsdp as compat_fsdp

__all__ = [
    "MAX_SIMULATIONS",
    "Boundary",
    "Failure",
    "FailureKind",
    "PrecisionPlan",
    "PrecisionUnit",
    "plan_precision",
]

MAX_SIMULATIONS = 24  # runs of the model per plan_precision call, fix searches included
_MAX_DEPTH = 8  # fixes applied one after the other in one search

FailureKind = Literal["output_boundary", "uncast_input", "hidden_input", "buffer", "param", "other"]


@dataclass(frozen=True)
class PrecisionUnit:
    """One planned unit: its policy and the dtype of every phase that applies."""

    fqn: str
    parent: str | None  # the enclosing unit (None: a root)
    module_type: str
    policy: Policy
    params: list[str]  # the parameters it manages
    param_dtypes: list[str]  # their original dtypes
    numel: int
    dtypes: dict[str, str]  # phase -> "torch.bfloat16", phases in events.PHASES order
    inputs: list[str] = field(default_factory=list)  # per floating input, after the cast
    cast: list[bool] = field(default_factory=list)  # per floating input: cast (or the same)
    hidden: list[str] = field(default_factory=list)  # inputs the cast cannot reach
    ran: bool | None = None  # called in the simulated forward (None: no example_inputs)

    def event(self) -> Unit:
        """The ``events.Unit`` a probe reports for this unit."""
        return Unit(
            fqn=self.fqn,
            parent=self.parent,
            module_type=self.module_type,
            policy=self.policy,
            params=list(self.params),
            param_dtypes=list(self.param_dtypes),
            numel=self.numel,
        )


@dataclass(frozen=True)
class Boundary:
    """A floating input of a unit in another dtype than it computes in, or cast."""

    unit: str
    producer: str | None  # the unit whose output it is (None: an input or computed)
    before: str
    after: str
    cast: bool


@dataclass(frozen=True)
class Failure:
    """An op that will fail on mixed dtypes, where, why, and policies that work."""

    unit: str  # the innermost unit holding the consumer ("" too when no unit holds it)
    consumer: str  # the innermost module running the op
    message: str  # ``error``, then what happened in plain words
    error: str  # torch's own words (CPU kernel), as the real run raises them
    kind: FailureKind
    op: str  # the torch function: "linear", "batch_norm"
    got: str  # the dtype that arrived
    expected: str  # the dtype the op computes in
    producer: str | None = None  # output_boundary: the unit whose output arrived
    first: bool = False  # the real forward raises here; later ones only once it is fixed
    fix: dict[str, Any] | None = None  # a complete policies dict, planned clean
    fix_note: str = ""  # what the fix changes, in words


@dataclass(frozen=True)
class PrecisionPlan:
    """Per unit and phase the dtype FSDP2 / FSDP1 / DDP mixed precision will use."""

    units: list[PrecisionUnit]  # root first, then module order
    failures: list[Failure]  # in forward order; [0] is where a real run stops
    wrapper: Family | None  # None: no unit has a policy
    policies: dict[str, Policy]  # as planned (None entries: the engine's default)
    boundaries: list[Boundary] = field(default_factory=list)
    simulated: bool = False  # example_inputs ran
    device: str | None = None  # where they ran: "cpu" or "meta"

    def unit(self, fqn: str) -> PrecisionUnit:
        for u in self.units:
            if u.fqn == fqn:
                return u
        names = [u.fqn for u in self.units]
        close = difflib.get_close_matches(fqn, names, n=3)
        hint = f"; did you mean {close}?" if close else ""
        raise KeyError(f"{fqn!r} is not a unit of this plan (units: {names}){hint}")

    @property
    def ok(self) -> bool:
        """No failure predicted (always True without ``example_inputs``)."""
        return not self.failures

    def __repr__(self) -> str:
        """A unit x phase table, then the failures (a plan is read in a notebook)."""
        names = [repr(u.fqn) for u in self.units]
        width = max([len(n) for n in names] + [4])
        head = f"{'unit':<{width}}  " + "  ".join(f"{p:<13}" for p in PHASES)
        rows = [
            f"{n:<{width}}  " + "  ".join(f"{_short(u.dtypes.get(p, '-')):<13}" for p in PHASES)
            for n, u in zip(names, self.units, strict=True)
        ]
        ran = f", simulated on {self.device}" if self.simulated else ""
        lines = [f"PrecisionPlan({self.wrapper or 'no policy'}, {len(self.units)} units{ran})"]
        lines += [head.rstrip(), *[r.rstrip() for r in rows]]
        for f in self.failures:
            lines.append(f"failure at unit {f.unit!r}, in {f.consumer!r}: {f.error}")
            lines.append(f"  fix: {f.fix_note}")
        return "\n".join(lines)


# -- resolving the units ------------------------------------------------------------------


@dataclass(frozen=True)
class _Units:
    family: Family | None
    specs: dict[str, UnitSpec]  # module order
    objects: dict[str, Any]  # fqn -> the caller's policy object (None kept)
    module_types: dict[str, str]
    params: dict[str, list[tuple[str, str, int, bool]]]  # fqn, dtype, numel, trainable


def _unwrap(model: object) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"plan_precision() takes an nn.Module, got {type(model).__name__}")
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        inner = model.module
        assert isinstance(inner, nn.Module)
        return inner
    if type(model).__name__ == "FullyShardedDataParallel" or any(
        type(m).__name__.startswith("FSDP") and hasattr(m, "_get_fsdp_state")
        for m in model.modules()
    ):
        raise TypeError(
            "plan_precision() plans a model before FSDP wraps it: pass the plain module "
            "(plan first, then fully_shard / FullyShardedDataParallel)"
        )
    return model


def _refuse_dtype_overrides(fqn: str, obj: Any, module: nn.Module) -> None:
    """torch 2.15's ``MixedPrecisionPolicy.param_dtype_override_fn`` keeps chosen
    parameters in their own dtype inside a unit; the plan gives a unit one compute dtype,
    so it says so rather than plan those parameters wrong."""
    kept = compat_fsdp.dtype_overrides(obj, module)
    if kept:
        raise ValueError(
            f"policies[{fqn!r}] has a param_dtype_override_fn that keeps {kept[:4]} in their "
            "original dtype; plan_precision plans one compute dtype per unit and does not "
            "model per-parameter overrides yet. Plan without the override (the other "
            "parameters' dtypes are as planned), or make those parameters a unit of their own "
            "with no param_dtype."
        )


def _resolve(model: nn.Module, policies: Mapping[str, Any]) -> _Units:
    if not isinstance(policies, Mapping):
        raise TypeError(
            "policies must be a dict {module fqn: policy} ('' = the root), got "
            f"{type(policies).__name__}"
        )
    if not policies:
        raise ValueError("policies is empty: name at least one unit ('' for the root)")
    modules = dict(model.named_modules())
    for fqn in policies:
        if not isinstance(fqn, str):
            raise TypeError(f"policies keys are module fqns (str), got {fqn!r}")
    missing = [fqn for fqn in policies if fqn not in modules]
    if missing:
        hints = []
        for fqn in missing:
            close = difflib.get_close_matches(fqn, list(modules), n=3)
            hints.append(f"{fqn!r}" + (f" (did you mean {close}?)" if close else ""))
        raise ValueError(
            f"not modules of this model: {', '.join(hints)}; module fqns are those of "
            "model.named_modules(), '' for the root"
        )
    families: dict[str, Family] = {}
    plain: dict[str, Policy] = {}
    for fqn, obj in policies.items():
        try:
            plain[fqn] = _policy.policy_of(obj)
            family = _policy.family_of(obj)
        except TypeError as err:
            raise TypeError(f"policies[{fqn!r}]: {err}") from None
        if family is not None:
            families[fqn] = family
    if len(set(families.values())) > 1:
        listed = ", ".join(f"{fqn!r}: {f}" for fqn, f in families.items())
        raise ValueError(
            "policies mix engines (" + listed + "); one model is wrapped by one of FSDP2 "
            "(MixedPrecisionPolicy), FSDP1 (MixedPrecision) or DDP (_MixedPrecision)"
        )
    for fqn, obj in policies.items():
        _refuse_dtype_overrides(fqn, obj, modules[fqn])
    family = next(iter(families.values()), None)
    if family == "ddp" and set(policies) != {""}:
        raise ValueError(
            "DDP's _MixedPrecision applies to the whole model: give it for the root alone, "
            f"as {{'': _MixedPrecision(...)}} (got units {sorted(policies)})"
        )
    if family in ("fsdp1", "fsdp2"):
        for fqn, p in plain.items():
            if p.kind == "none":
                plain[fqn] = _policy.default_policy(family)
    order = [fqn for fqn in modules if fqn in policies]
    # Parameters: each unit manages those in its subtree not claimed by a nested unit
    # (FSDP wraps bottom-up: reverse module order).
    names = {id(p): name for name, p in model.named_parameters()}
    rank = {name: i for i, name in enumerate(names.values())}
    claimed: set[int] = set()
    owned: dict[str, list[tuple[str, str, int, bool]]] = {}
    for fqn in reversed(order):
        mine = []
        for p in modules[fqn].parameters():
            if id(p) in claimed:
                continue
            claimed.add(id(p))
            mine.append((names[id(p)], str(p.dtype), p.numel(), p.requires_grad))
        owned[fqn] = sorted(mine, key=lambda item: rank[item[0]])
    specs: dict[str, UnitSpec] = {}
    for fqn in order:
        parent = _parent(fqn, order)
        floating = [
            (n, d, t) for n, d, _, t in owned[fqn] if getattr(torch, d[6:]).is_floating_point
        ]
        trainable = {d for _, d, t in floating if t}
        dtypes = trainable or {d for _, d, _ in floating}
        if len(dtypes) > 1:
            raise ValueError(
                f"unit {fqn!r} manages parameters of several dtypes {sorted(dtypes)}; FSDP "
                "expects uniform original parameter dtype per unit (and so does the planner)"
            )
        specs[fqn] = UnitSpec(
            fqn, parent, plain[fqn], tuple(n for n, _, _ in floating), next(iter(dtypes), None)
        )
    return _Units(
        family,
        specs,
        {fqn: policies[fqn] for fqn in order},
        {fqn: type(modules[fqn]).__name__ for fqn in order},
        owned,
    )


def _parent(fqn: str, units: list[str]) -> str | None:
    best: str | None = None
    for u in units:
        if u != fqn and (u == "" or fqn.startswith(u + ".")):
            if best is None or len(u) > len(best):
                best = u
    return best


def _respec(base: _Units, plain: dict[str, Policy], model: nn.Module) -> dict[str, UnitSpec]:
    """Unit specs for a changed policies dict (new units claim their parameters)."""
    if set(plain) == set(base.specs):
        return {
            fqn: dataclasses.replace(spec, policy=plain[fqn]) for fqn, spec in base.specs.items()
        }
    return _resolve(model, {fqn: _policy.policy_object(p) for fqn, p in plain.items()}).specs


# -- turning a simulation into units and failures -----------------------------------------


def _joined(dtypes: list[str]) -> str | None:
    return ", ".join(dict.fromkeys(dtypes)) if dtypes else None


def _units(base: _Units, result: SimResult | None) -> list[PrecisionUnit]:
    out = []
    for fqn, spec in base.specs.items():
        owned = base.params[fqn]
        dtypes = _rules.static_dtypes(
            base.family,
            spec.policy,
            root=spec.root,
            orig=spec.orig,
            trainable=any(t for n, _, _, t in owned if n in spec.params),
            reduce_rule=compat_fsdp.reduce_dtype_rule(),
        )
        inputs: list[str] = []
        cast: list[bool] = []
        hidden: list[str] = []
        ran = None
        if result is not None:
            seen = result.seen.get(fqn)
            ran = seen is not None and seen.calls > 0
            if seen is not None and seen.calls > 0:
                inputs, cast = list(seen.inputs), list(seen.cast)
                hidden = [f"{h.path} ({h.dtype}, in a {h.container})" for h in seen.hidden]
                for phase, found in (("input", seen.input_dtypes), ("output", seen.output_dtypes)):
                    joined = _joined(found)
                    if joined is None:
                        dtypes.pop(phase, None)
                    else:
                        dtypes[phase] = joined
        out.append(
            PrecisionUnit(
                fqn=fqn,
                parent=spec.parent,
                module_type=base.module_types[fqn],
                policy=spec.policy,
                params=[n for n, _, _, _ in owned],
                param_dtypes=[d for _, d, _, _ in owned],
                numel=sum(n for _, _, n, _ in owned),
                dtypes={p: dtypes[p] for p in PHASES if p in dtypes},
                inputs=inputs,
                cast=cast,
                hidden=hidden,
                ran=ran,
            )
        )
    return out


def _short(dtype: str) -> str:
    return dtype.replace("torch.", "")  # "torch.float32, torch.bfloat16" has two


def _explain(raw: RawFailure, family: Family | None, specs: dict[str, UnitSpec]) -> str:
    unit = specs.get(raw.unit)
    where = f"module {raw.consumer!r}" if raw.consumer != raw.unit else f"unit {raw.unit!r}"
    if unit is None:
        in_unit = " (outside every unit)"
    else:
        in_unit = f" (in unit {raw.unit!r})" if raw.consumer != raw.unit else ""
    got, expected = _short(raw.got), _short(raw.expected)
    if raw.kind == "output_boundary":
        producer = raw.origin.unit
        if raw.consumer == raw.unit:
            gap = f"the op runs in unit {raw.unit!r}'s own forward, after its pre-forward cast"
        else:
            gap = f"{raw.consumer!r} is not a unit"
        none = (
            f"unit {producer!r} sets no output_dtype"
            if family == "fsdp2"
            else "FSDP1 has no output_dtype"
        )
        return (
            f"unit {producer!r} outputs {got} and {where}{in_unit} computes in {expected}: "
            f"FSDP casts a unit's inputs only at that unit's own pre-forward, {gap}, and "
            f"{none}"
        )
    if raw.kind == "uncast_input" and unit is not None:
        reason = _rules.why_uncast(
            family, unit.policy, root=unit.root, has_params=unit.orig is not None
        )
        source = (
            f"the output of unit {raw.origin.unit!r}"
            if raw.origin.kind == "output"
            else "a tensor computed from the model's inputs"
            if raw.origin.kind == "input"
            else "an input"
        )
        return (
            f"unit {raw.unit!r} computes in {expected} but receives {source} in {got} and "
            f"does not cast it: {reason}; the {got} tensor reaches {where}"
        )
    if raw.kind == "hidden_input" and raw.hidden is not None:
        h = raw.hidden
        return (
            f"unit {raw.unit!r} casts its inputs to {expected}, but {h.path} ({got}) sits in a "
            f"{h.container}, which torch's _apply_to_tensors does not walk (it walks tensors, "
            f"tuples, lists, dicts, namedtuples, sets and dataclasses; a PackedSequence's "
            f"cast is discarded), so {where}{in_unit} gets it in {got}; pass the tensor "
            f"itself or in one of those containers, or use the fix"
        )
    if raw.kind == "buffer":
        what = (
            "FSDP2 never casts buffers"
            if family == "fsdp2"
            else f"its buffer_dtype is {'None' if family else 'not set'}"
        )
        return (
            f"buffer {raw.origin.name!r} is {got} while {where}{in_unit} computes in "
            f"{expected} ({what}); the {got} buffer reaches the op"
            + (
                " directly"
                if raw.op in ("batch_norm", "layer_norm", "group_norm")
                else " through an op that promotes to it"
            )
        )
    if raw.kind == "param":
        return (
            f"parameter {raw.origin.name!r} belongs to unit {raw.origin.unit!r}, which "
            f"computes in {got}, but {where}{in_unit} uses it computing in {expected}"
        )
    made = f" by {raw.origin.name!r}" if raw.origin.kind == "created" else ""
    return (
        f"{where}{in_unit} computes in {expected} but gets a {got} tensor made{made} in the "
        "model's own code, not by a unit's cast"
    )


# -- fixes ---------------------------------------------------------------------------------


_Candidate = tuple[dict[str, Policy], str]  # policies to set (new or changed), in words


def _struct_replace(policy: Policy, changes: dict[str, Any]) -> Policy:
    return msgspec.structs.replace(policy, **changes)


def _new_unit_policy(family: Family, base: Policy, dtype: str, **extra: Any) -> Policy:
    """A policy for a module made a unit of its own: computing (and casting) in dtype."""
    if family == "fsdp2":
        return _struct_replace(
            base, {"param_dtype": dtype, "cast_forward_inputs": True, "output_dtype": None, **extra}
        )
    return _struct_replace(base, {"param_dtype": dtype, "cast_forward_inputs": True, **extra})


def _candidates(
    raw: RawFailure,
    family: Family | None,
    specs: dict[str, UnitSpec],
    modules: dict[str, nn.Module],
) -> list[_Candidate]:
    if family is None:
        return []
    out: list[_Candidate] = []
    unit = specs.get(raw.unit)  # None: no unit holds the consumer (no root unit)
    base = unit.policy if unit is not None else _policy.default_policy(family)
    got, expected = raw.got, raw.expected
    consumer = raw.consumer
    consumer_free = (
        family != "ddp"
        and consumer != raw.unit
        and consumer not in specs
        and consumer in modules
        and any(True for _ in modules[consumer].parameters())
    )

    def wrap_consumer(dtype: str, **extra: Any) -> _Candidate:
        policy = _new_unit_policy(family, base, dtype, **extra)
        return (
            {consumer: policy},
            f"make {consumer!r} a unit of its own computing in {_short(dtype)} that casts "
            f"its input ({_describe(policy)})",
        )

    def unit_in(fqn: str, dtype: str) -> list[_Candidate]:
        spec = specs.get(fqn)
        if spec is None:
            return []
        changes: dict[str, Any] = {"param_dtype": dtype}
        if family in ("fsdp1", "fsdp2"):
            changes["cast_forward_inputs"] = True
        policy = _struct_replace(spec.policy, changes)
        return [({fqn: policy}, f"unit {fqn!r} computes in {_short(dtype)} ({_describe(policy)})")]

    if raw.kind == "output_boundary" and raw.origin.unit in specs:
        producer = raw.origin.unit
        assert producer is not None
        if family == "fsdp2":
            policy = _struct_replace(specs[producer].policy, {"output_dtype": expected})
            out.append(({producer: policy}, f"unit {producer!r} gets output_dtype={expected}"))
        if consumer_free:
            out.append(wrap_consumer(expected))
        out.extend(unit_in(producer, expected))
    elif raw.kind == "uncast_input" and unit is not None:
        dtype = unit.policy.param_dtype or expected
        if family == "fsdp2":
            policy = _struct_replace(
                unit.policy, {"param_dtype": dtype, "cast_forward_inputs": True}
            )
            out.append(
                ({raw.unit: policy}, f"unit {raw.unit!r} casts its inputs ({_describe(policy)})")
            )
        elif family == "fsdp1":
            if unit.root:
                policy = _struct_replace(
                    unit.policy, {"param_dtype": dtype, "cast_root_forward_inputs": True}
                )
                out.append(
                    (
                        {raw.unit: policy},
                        f"root unit {raw.unit!r} casts its inputs ({_describe(policy)})",
                    )
                )
            policy = _struct_replace(
                unit.policy, {"param_dtype": dtype, "cast_forward_inputs": True}
            )
            out.append(
                ({raw.unit: policy}, f"unit {raw.unit!r} casts its inputs ({_describe(policy)})")
            )
        else:
            policy = _struct_replace(unit.policy, {"param_dtype": dtype})
            out.append(({raw.unit: policy}, f"DDP casts the inputs ({_describe(policy)})"))
        if consumer_free:
            out.append(wrap_consumer(expected))
    elif raw.kind == "hidden_input":
        if consumer_free:
            out.append(wrap_consumer(expected))
        out.extend(unit_in(raw.unit, got))
    elif raw.kind == "buffer":
        owner = raw.origin.unit if raw.origin.unit in specs else raw.unit
        module = raw.origin.module
        if family in ("fsdp1", "ddp") and owner in specs:
            policy = _struct_replace(specs[owner].policy, {"buffer_dtype": expected})
            out.append(({owner: policy}, f"unit {owner!r} gets buffer_dtype={expected}"))
        if family == "fsdp2" and module is not None and module not in specs and module in modules:
            policy = _new_unit_policy(family, base, got, output_dtype=expected)
            out.append(
                (
                    {module: policy},
                    f"make {module!r} (the buffer's module) a unit of its own computing in "
                    f"{_short(got)} with output_dtype={expected} ({_describe(policy)})",
                )
            )
        out.extend(unit_in(raw.unit, got))
    elif raw.kind == "param" and raw.origin.unit in specs:
        owner = raw.origin.unit
        assert owner is not None
        out.extend(unit_in(owner, expected))
        out.extend(unit_in(raw.unit, got))
    else:
        if consumer_free:
            out.append(wrap_consumer(expected))
        out.extend(unit_in(raw.unit, got))
    return out


def _describe(policy: Policy) -> str:
    """``MixedPrecision(param_dtype=torch.float32, cast_forward_inputs=True)``: the
    fields that differ from the class's defaults."""
    obj = _policy.policy_object(policy)
    if obj is None:
        return "no policy"
    default = type(obj)()
    fields = [
        f"{f.name}={getattr(obj, f.name)}"
        for f in dataclasses.fields(obj)
        if not f.name.startswith("_") and getattr(obj, f.name) != getattr(default, f.name)
    ]
    return f"{type(obj).__name__}({', '.join(fields)})"


class _Planner:
    def __init__(self, model: nn.Module, base: _Units, sim: Simulator) -> None:
        self.model = model
        self.base = base
        self.sim = sim
        self.modules = dict(model.named_modules())
        self.runs = 0
        self.cache: dict[tuple[tuple[str, Policy], ...], tuple[dict[str, UnitSpec], SimResult]] = {}

    def simulate(
        self, plain: dict[str, Policy], *, counted: bool = True
    ) -> tuple[dict[str, UnitSpec], SimResult] | None:
        key = tuple(sorted(plain.items()))
        if key in self.cache:
            return self.cache[key]
        if counted and self.runs >= MAX_SIMULATIONS:
            return None
        self.runs += counted
        specs = _respec(self.base, plain, self.model)
        result = self.sim.run(self.base.family, specs)
        self.cache[key] = (specs, result)
        return specs, result

    def fix(
        self, plain: dict[str, Policy], specs: dict[str, UnitSpec], raw: RawFailure
    ) -> tuple[dict[str, Policy], list[str]] | None:
        """Policies (from ``plain`` plus candidates) planned without failures."""
        tried: set[tuple[tuple[str, Policy], ...]] = {tuple(sorted(plain.items()))}
        return self._search(plain, specs, raw, None, tried, [], 0)

    def _search(
        self,
        plain: dict[str, Policy],
        specs: dict[str, UnitSpec],
        raw: RawFailure,
        count: int | None,
        tried: set[tuple[tuple[str, Policy], ...]],
        notes: list[str],
        depth: int,
    ) -> tuple[dict[str, Policy], list[str]] | None:
        if depth >= _MAX_DEPTH:
            return None
        for changes, note in _candidates(raw, self.base.family, specs, self.modules):
            trial = {**plain, **changes}
            key = tuple(sorted(trial.items()))
            if key in tried:
                continue
            tried.add(key)
            done = self.simulate(trial)
            if done is None:
                return None
            new_specs, result = done
            if not result.failures:
                return trial, [*notes, note]
            first = result.failures[0]
            same = (first.unit, first.consumer, first.op, first.kind) == (
                raw.unit,
                raw.consumer,
                raw.op,
                raw.kind,
            )
            if same and count is not None and len(result.failures) >= count:
                continue
            found = self._search(
                trial, new_specs, first, len(result.failures), tried, [*notes, note], depth + 1
            )
            if found is not None:
                return found
        return None


def _fix_objects(fixed: dict[str, Policy], base: _Units) -> dict[str, Any]:
    """Real torch policies: the caller's own objects where a unit's policy did not change
    (a None kept, except for FSDP2 whose ``fully_shard`` needs a policy object)."""
    out: dict[str, Any] = {}
    for fqn, policy in fixed.items():
        obj = base.objects.get(fqn)
        unchanged = fqn in base.specs and base.specs[fqn].policy == policy
        # fully_shard takes no mp_policy=None: FSDP2 gets MixedPrecisionPolicy() for it
        usable = obj is not None or base.family != "fsdp2"
        if unchanged and fqn in base.objects and not isinstance(obj, Policy) and usable:
            out[fqn] = obj  # the caller's own object (None included)
        else:
            out[fqn] = _policy.policy_object(policy, like=obj)
    return out


def _ordered(plain: dict[str, Policy], model: nn.Module) -> dict[str, Policy]:
    order = [fqn for fqn, _ in model.named_modules() if fqn in plain]
    return {fqn: plain[fqn] for fqn in order}


# -- the entry point ----------------------------------------------------------------------


def plan_precision(
    model: nn.Module,
    policies: Mapping[str, Any],
    *,
    example_inputs: Any = None,
) -> PrecisionPlan:
    """Plan each unit's dtypes and predict the dtype failures (Note [Mixed-precision plan]).

    ``policies`` maps the fqn of every module that will be a unit (``""``: the root) to
    its policy: FSDP2 ``MixedPrecisionPolicy``, FSDP1 ``MixedPrecision`` or, for the
    root alone, DDP's ``_MixedPrecision``; None is the engine's default. With
    ``example_inputs`` (as every planner takes them, ``example_inputs.py``: a tensor or
    any single argument, a tuple of positional arguments, or a dict of keyword
    arguments) the model runs once on a copy, in the kernel, to find what each unit
    receives and produces and which ops fail; the model, its parameters, the inputs and
    torch's grad-mode and autocast state are left as they were.
    """
    model = _unwrap(model)
    base = _resolve(model, policies)
    plain = {fqn: spec.policy for fqn, spec in base.specs.items()}
    if example_inputs is None:
        return PrecisionPlan(
            units=_units(base, None),
            failures=[],
            wrapper=base.family,
            policies=plain,
        )
    sim = Simulator(model, example_inputs)
    planner = _Planner(model, base, sim)
    done = planner.simulate(plain, counted=False)
    assert done is not None
    specs, result = done
    failures: list[Failure] = []
    for raw in result.failures:
        fixed = planner.fix(plain, specs, raw)
        fix = notes = None
        if fixed is not None:
            fix = _fix_objects(_ordered(fixed[0], model), base)
            notes = fixed[1]
        explanation = _explain(raw, base.family, specs)
        failures.append(
            Failure(
                unit=raw.unit,
                consumer=raw.consumer,
                message=f"{raw.error}\n{explanation}",
                error=raw.error,
                kind=raw.kind,  # type: ignore[arg-type]
                op=raw.op,
                got=raw.got,
                expected=raw.expected,
                producer=raw.origin.unit if raw.kind == "output_boundary" else None,
                first=not failures,
                fix=fix,
                fix_note="; then ".join(notes) if notes else "no policy change found that works",
            )
        )
    return PrecisionPlan(
        units=_units(base, result),
        failures=failures,
        wrapper=base.family,
        policies=plain,
        boundaries=[
            Boundary(b.unit, b.producer, b.before, b.after, b.cast) for b in result.boundaries
        ],
        simulated=True,
        device=result.device,
    )
