"""What the precision inspector concludes from what the probe saw: dtypes in short words,
bytes held per dtype, and findings (a located failure with its fix, a policy the unit
does not follow, inputs cast twice or reaching a unit uncast).

Pure functions over the records of ``events.py``; ``PrecisionModel`` calls them and
caches the results. No torch, no widgets.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interactive_shard.precision.compare import (
    dtypes_of,
    is_low,
    itemsize,
    joined,
    short,
    short_torch,
)
from interactive_shard.precision.events import (
    Policy,
    PrecisionFailure,
    PrecisionSeen,
    PrecisionWatch,
    Unit,
)

# torch's ScalarType names, as its dtype errors print them ("got Half and Float").
SCALAR_TYPES = {
    "Half": "torch.float16",
    "BFloat16": "torch.bfloat16",
    "Float": "torch.float32",
    "Double": "torch.float64",
}
_GOT = re.compile(r"got (\w+) and (\w+)")
_EXPECTED = re.compile(r"expected scalar type (\w+) but found (\w+)")

# Bytes held, per unit: the stored (sharded) parameters the optimizer steps, the
# unsharded parameters a unit computes with, and the gradients the optimizer reads.
CATEGORIES = ("sharded_param", "param", "sharded_grad")
_CATEGORY_LABELS = {
    "sharded_param": ("sharded parameters", "parameters (replicated)"),
    "param": ("unsharded parameters (compute)", "compute copies of the parameters"),
    "sharded_grad": ("sharded gradients", "gradients"),
}

ERROR, WARNING, NOTE = "error", "warning", "note"


class Malformed(ValueError):
    """An event that decodes but does not hold together (the model skips it)."""


# -- the watch: units as a tree -----------------------------------------------------------------
def aligned(s: PrecisionSeen) -> bool:
    return all(not x or len(x) == len(s.dtypes) for x in (s.before, s.cast))


def check_watch(w: PrecisionWatch) -> None:
    fqns: set[str] = set()
    for u in w.units:
        if u.fqn in fqns:
            raise Malformed(f"unit {u.fqn!r} twice")
        if u.parent is not None and u.parent not in fqns:
            raise Malformed(f"unit {u.fqn!r}: parent {u.parent!r} is not an earlier unit")
        if len(u.params) != len(u.param_dtypes):
            raise Malformed(f"unit {u.fqn!r}: {len(u.params)} params, {len(u.param_dtypes)} dtypes")
        fqns.add(u.fqn)


def unknown_unit(fqn: str) -> Unit:
    return Unit(
        fqn=fqn,
        parent=None,
        module_type="?",
        policy=Policy(kind="none"),
        params=[],
        param_dtypes=[],
        numel=0,
    )


def tree(units: list[Unit]) -> list[Unit]:
    children: dict[str | None, list[Unit]] = {}
    known = {u.fqn for u in units}
    for u in units:
        children.setdefault(u.parent if u.parent in known else None, []).append(u)
    out: list[Unit] = []
    stack = list(reversed(children.get(None, [])))
    while stack:
        u = stack.pop()
        out.append(u)
        stack.extend(reversed(children.get(u.fqn, [])))
    return out


def describe_policy(policy: Policy) -> str:
    """``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the fields set."""
    fields = {
        "param_dtype": policy.param_dtype,
        "reduce_dtype": policy.reduce_dtype,
        "output_dtype": policy.output_dtype,
        "buffer_dtype": policy.buffer_dtype,
        "cast_forward_inputs": policy.cast_forward_inputs,
        "cast_root_forward_inputs": policy.cast_root_forward_inputs,
        "keep_low_precision_grads": policy.keep_low_precision_grads,
    }
    shown = [
        f"{k}={short(v) if isinstance(v, str) else v}" for k, v in fields.items() if v is not None
    ]
    if policy.kind == "none":
        return "no mixed-precision policy"
    return f"{policy.kind}({', '.join(shown)})"


def original_dtype(unit: Unit) -> str | None:
    """The dtype the unit's parameters are stored in (joined when they differ)."""
    return joined(unit.param_dtypes) or None


def planned_compute(unit: Unit) -> str | None:
    """The dtype the unit's policy asks it to compute in: ``param_dtype``, else its own."""
    return unit.policy.param_dtype or original_dtype(unit)


def planned_reduce(unit: Unit) -> str | None:
    p = unit.policy
    return p.reduce_dtype or p.param_dtype or original_dtype(unit)


# -- bytes held ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Held:
    """``nbytes`` of one unit's ``category`` held in ``dtype`` on one rank."""

    unit: str
    category: str  # one of CATEGORIES
    dtype: str
    nbytes: int


def category_label(category: str, wrapper: str | None = None) -> str:
    return _CATEGORY_LABELS[category][1 if wrapper == "ddp" else 0]


def held(unit: Unit, observed: Mapping[str, str], wrapper: str, world_size: int) -> list[Held]:
    """What ``unit`` holds per category, from the dtypes observed (sharded parameters fall
    back to their original dtypes before the first optimizer step; the others count once
    seen). FSDP shards over ``world_size`` (padding not counted); DDP replicates.

    A phase that saw several dtypes is counted at the largest itemsize of them (the
    watch gives one element count per unit, not per parameter): an upper bound."""
    if unit.numel == 0:
        return []
    per_rank = unit.numel if wrapper == "ddp" else -(-unit.numel // max(world_size, 1))
    found = {
        "sharded_param": observed.get("sharded_param") or original_dtype(unit),
        "param": observed.get("param"),
        "sharded_grad": observed.get("sharded_grad"),
    }
    out = []
    for category in CATEGORIES:
        dtype = found[category]
        if not dtype:
            continue
        numel = unit.numel if category == "param" else per_rank
        size = max(itemsize(d) for d in dtypes_of(dtype))
        out.append(Held(unit.fqn, category, dtype, numel * size))
    return out


# -- findings -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Draft:
    """One finding of one rank's iteration, before the model merges ranks and iterations."""

    kind: str
    level: str  # ERROR | WARNING | NOTE
    unit: str
    message: str
    fix: str
    consumer: str | None = None


def unit_findings(
    unit: Unit,
    wrapper: str,
    observed: Mapping[str, str],
    inputs: Sequence[PrecisionSeen],
    reduce_rule: str = "compute",
) -> list[Draft]:
    """A policy the unit does not follow (low precision asked, full seen, or the
    reverse), inputs cast twice, inputs that reach it uncast in another dtype.
    ``reduce_rule``: ``PrecisionWatch.reduce_rule`` (FSDP2 on torch 2.15 reduces in the
    original dtype when no ``reduce_dtype`` is set)."""
    out: list[Draft] = []
    name = unit_name(unit.fqn)
    policy = unit.policy
    unset = original_dtype(unit) if wrapper == "fsdp2" and reduce_rule == "original" else None
    asked = {
        "param": policy.param_dtype,
        "reduce": policy.reduce_dtype or unset or policy.param_dtype,
    }
    words = {"param": "computes", "reduce": "reduces its gradients"}
    for phase in ("param", "reduce"):
        want, seen = asked[phase], observed.get(phase)
        if not seen:
            continue
        if is_low(want) and not is_low(seen):
            out.append(_full_precision(unit, wrapper, phase, want, seen))
        elif is_low(seen) and not is_low(want):
            setting = "param_dtype" if phase == "param" else "reduce_dtype"
            given = f"{setting}={short(want)}" if want else f"no {setting}"
            stored = original_dtype(unit)
            why = (
                f" (its parameters are stored in {short(stored)})"
                if is_low(stored) and phase == "param"
                else ""
            )
            out.append(
                Draft(
                    "low_precision",
                    WARNING,
                    unit.fqn,
                    f"{name}: the policy has {given} but the unit {words[phase]} in "
                    f"{short(seen)}{why}.",
                    "Keep the parameters in float32 and ask for low precision in the policy "
                    f"(`{setting}=torch.{short_torch(seen)}`), so the optimizer steps "
                    "full-precision parameters; or set the dtype you want explicitly.",
                )
            )
    compute = observed.get("param")
    for record in inputs:
        for i, after in enumerate(record.dtypes):
            before = record.before[i] if i < len(record.before) else after
            cast = record.cast[i] if i < len(record.cast) else before != after
            if cast and before != after and is_low(before) and is_low(after):
                out.append(
                    Draft(
                        "cast_twice",
                        NOTE,
                        unit.fqn,
                        f"{name}: input {i} arrived in {short(before)} (cast by an outer unit "
                        f"or made by a {short(before)} unit) and was cast again to "
                        f"{short(after)}: its values were rounded twice.",
                        "Cast once: let the input reach this unit in full precision "
                        "(FSDP2: `output_dtype=torch.float32` on the unit that produces it) "
                        "or compute both units in one low-precision dtype.",
                    )
                )
            elif (
                not cast
                and compute
                and unit.numel
                and not set(dtypes_of(after)) & set(dtypes_of(compute))
            ):
                out.append(_uncast(unit, wrapper, i, after, compute))
    return _unique(out)


def _full_precision(unit: Unit, wrapper: str, phase: str, want: str | None, seen: str) -> Draft:
    what = "computes" if phase == "param" else "reduces its gradients"
    setting = "param_dtype" if phase == "param" else "reduce_dtype"
    causes = {
        "fsdp1": "FSDP1 computes in full precision in eval mode when "
        "FSDP_USE_FULL_PREC_IN_EVAL=1, and for modules its auto-wrap ignores (BatchNorm)",
        "ddp": "DDP's native mixed precision needs a device with streams and events (on "
        "CPU the copy to the low-precision parameters fails)",
        "fsdp2": "FSDP2 keeps non-floating parameters and those already in the dtype as they are",
    }
    return Draft(
        "full_precision",
        WARNING,
        unit.fqn,
        f"{unit_name(unit.fqn)}: the policy asks for {setting}={short(want)} but the unit "
        f"{what} in {short(seen)}: it silently trains in full precision.",
        f"Check that the policy reached this unit ({causes.get(wrapper, '')}).",
    )


def _uncast(unit: Unit, wrapper: str, i: int, after: str, compute: str) -> Draft:
    root = unit.parent is None
    if wrapper == "fsdp1" and root:
        setting = "`cast_root_forward_inputs=True` (FSDP1's root casts only with it)"
    elif wrapper == "fsdp1":
        setting = "`cast_forward_inputs=True` (FSDP1 casts a non-root unit's inputs only then)"
    else:
        setting = "`cast_forward_inputs=True`"
    return Draft(
        "uncast_input",
        WARNING,
        unit.fqn,
        f"{unit_name(unit.fqn)}: input {i} reaches the unit in {short(after)}, uncast, but "
        f"the unit computes in {short(compute)}: unless its forward casts it, its first "
        "op mixes dtypes.",
        f"Set {setting} in the unit's policy, or make the producer output {short(compute)}.",
    )


def failure_finding(
    failure: PrecisionFailure,
    unit: Unit | None,
    wrapper: str,
    observed: Mapping[str, str],
    outputs: Sequence[tuple[str, Sequence[str]]],
) -> Draft:
    """The observed failure at its unit, with a fix read off the error and the dtypes seen.
    ``outputs``: (unit, output dtypes) of the iteration in arrival order; the last unit
    other than the failing one whose output is in the dtype the error names for the input
    probably produced it."""
    where = f"{unit_name(failure.unit)}, in `{failure.consumer}`"
    got, expected = _GOT.search(failure.message), _EXPECTED.search(failure.message)
    fix = "Make every tensor that reaches the failing op one dtype (see the error)."
    if got:
        inp, weight = (SCALAR_TYPES.get(g, g) for g in got.groups())
        producer = next((u for u, d in reversed(outputs) if u != failure.unit and inp in d), None)
        fix = _mismatch_fix(failure, unit, wrapper, observed, producer, inp, weight)
    elif expected:
        want, found = (SCALAR_TYPES.get(g, g) for g in expected.groups())
        fix = (
            f"A tensor in `{failure.consumer}` stayed {short(found)} while its unit computes in "
            f"{short(want)}: FSDP2 leaves buffers (BatchNorm's running statistics) in their "
            f"own dtype. Keep `{failure.consumer}` in full precision in a unit of its own "
            f"(no param_dtype, FSDP2 `output_dtype=torch.{short_torch(want)}`), or FSDP1 "
            f"`buffer_dtype=torch.{short_torch(want)}`."
        )
    return Draft(
        "failure",
        ERROR,
        failure.unit,
        f"{where}: {failure.message}",
        fix,
        consumer=failure.consumer,
    )


def with_planned_fix(draft: Draft, failure: PrecisionFailure, plan: Any) -> Draft:
    """``draft`` with the fix the plan found for this failure (same unit and consumer):
    the policies ``plan_precision`` checked by planning again, in words. Without a plan
    (or one that did not predict it) the fix read off the error, and how to get one."""
    planned = None
    if plan is not None:
        planned = next(
            (
                f
                for f in getattr(plan, "failures", [])
                if (f.unit, f.consumer) == (failure.unit, failure.consumer)
            ),
            None,
        )
    if planned is None:
        how = (
            " For policies checked to run: run.precision.plan = ish.plan_precision(model, "
            "policies, example_inputs=...)."
        )
        return dataclasses.replace(draft, fix=draft.fix + how)
    note = getattr(planned, "fix_note", "")
    if not note:
        return dataclasses.replace(
            draft, fix=draft.fix + " (the plan predicted this failure but found no fix)"
        )
    return dataclasses.replace(
        draft, fix=f"{note} (planned: ish.plan_precision(...).failures[0].fix has the policies)"
    )


def _mismatch_fix(
    failure: PrecisionFailure,
    unit: Unit | None,
    wrapper: str,
    observed: Mapping[str, str],
    producer: str | None,
    inp: str,
    weight: str,
) -> str:
    consumer = f"`{failure.consumer}`"
    head = (
        f"{consumer} computes in {short(weight)} but its input is {short(inp)}."
        if unit is None or not producer
        else f"{consumer} computes in {short(weight)} but its input is {short(inp)}, "
        f"probably the output of {unit_name(producer)}."
    )
    policy = unit.policy if unit is not None else None
    own_input = dtypes_of(observed.get("input"))
    uncast = policy is not None and own_input == [inp] and not producer
    if uncast and wrapper == "fsdp1" and unit is not None and unit.parent is None:
        return f"{head} Set `cast_root_forward_inputs=True` on the root."
    if uncast:
        return f"{head} Set `cast_forward_inputs=True` on {unit_name(failure.unit)}."
    torch_weight = f"torch.{short_torch(weight)}"
    if wrapper == "fsdp1":
        return (
            f"{head} FSDP1 has no output_dtype: wrap {consumer} in its own unit with "
            f"`MixedPrecision(param_dtype={torch_weight}, cast_forward_inputs=True)`, or give "
            "both units one param_dtype."
        )
    target = unit_name(producer) if producer else "the unit that produces the input"
    return (
        f"{head} Give {target} `output_dtype={torch_weight}`, or make {consumer} a unit "
        f"of its own (`param_dtype={torch_weight}`, which casts its input), or give both "
        "units one param_dtype."
    )


@dataclass(frozen=True)
class Finding:
    """Something wrong (or worth knowing) about one unit, in plain words, with its fix;
    ``ranks`` and ``iterations``: where it was seen."""

    kind: str  # failure | full_precision | low_precision | cast_twice | uncast_input
    level: str  # ERROR | WARNING | NOTE
    unit: str
    message: str
    fix: str
    consumer: str | None = None
    ranks: tuple[int, ...] = ()
    iterations: tuple[int, ...] = ()


def unit_name(fqn: str) -> str:
    return "the root unit" if fqn == "" else f"unit '{fqn}'"


def _unique(drafts: list[Draft]) -> list[Draft]:
    return list(dict.fromkeys(drafts))
