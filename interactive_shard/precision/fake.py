"""Synthetic mixed-precision runs, as the precision probe emits them, without ranks:
units with policies (``mp_net`` builds the nested model of the measurements) run
through FSDP2's, FSDP1's or DDP's dtype rules. For tests, benchmarks and offline demos
(``Feature.fake``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from interactive_shard.precision._rules import static_dtypes
from interactive_shard.precision.events import (
    Policy,
    PrecisionBatch,
    PrecisionCollective,
    PrecisionFailure,
    PrecisionSeen,
    PrecisionWatch,
    Unit,
)
from interactive_shard.telemetry.schema import Event, record_event

_DTYPES = {
    "fp32": "torch.float32",
    "bf16": "torch.bfloat16",
    "fp16": "torch.float16",
    "fp64": "torch.float64",
}
# torch's ScalarType names, as its dtype errors print them.
_SCALAR_NAMES = {
    "torch.float16": "Half",
    "torch.bfloat16": "BFloat16",
    "torch.float32": "Float",
    "torch.float64": "Double",
}


def _dt(name: str | None) -> str | None:
    """``"bf16"`` or ``"torch.bfloat16"`` -> ``"torch.bfloat16"``; None stays None."""
    return None if name is None else _DTYPES.get(name, name)


def fsdp2_policy(
    param: str | None = None,
    reduce: str | None = None,
    output: str | None = None,
    *,
    cast_forward_inputs: bool = True,
) -> Policy:
    """An FSDP2 ``MixedPrecisionPolicy`` as the probe reports it (``"bf16"`` is short for
    ``"torch.bfloat16"``)."""
    return Policy(
        kind="MixedPrecisionPolicy",
        param_dtype=_dt(param),
        reduce_dtype=_dt(reduce),
        output_dtype=_dt(output),
        cast_forward_inputs=cast_forward_inputs,
    )


def fsdp1_policy(
    param: str | None = None,
    reduce: str | None = None,
    buffer: str | None = None,
    *,
    cast_forward_inputs: bool = False,
    cast_root_forward_inputs: bool = True,
    keep_low_precision_grads: bool = False,
) -> Policy:
    """An FSDP1 ``MixedPrecision`` as the probe reports it."""
    return Policy(
        kind="MixedPrecision",
        param_dtype=_dt(param),
        reduce_dtype=_dt(reduce),
        buffer_dtype=_dt(buffer),
        cast_forward_inputs=cast_forward_inputs,
        cast_root_forward_inputs=cast_root_forward_inputs,
        keep_low_precision_grads=keep_low_precision_grads,
    )


def ddp_policy(param: str | None, reduce: str | None = None, buffer: str | None = None) -> Policy:
    """DDP's ``_MixedPrecision`` as the probe reports it."""
    return Policy(
        kind="_MixedPrecision",
        param_dtype=_dt(param),
        reduce_dtype=_dt(reduce),
        buffer_dtype=_dt(buffer),
    )


@dataclass(frozen=True)
class FakeUnit:
    """One unit of a fake mixed-precision model. ``body``: what its forward runs, in
    order: the fqn of a child unit, or a leaf module (a Linear) the unit computes itself,
    in its compute dtype, failing on an input of another dtype as ``F.linear`` does."""

    fqn: str
    policy: Policy
    body: tuple[str, ...]
    params: tuple[str, ...]
    numel: int
    module_type: str = "Sequential"
    dtype: str = "torch.float32"  # the parameters' stored dtype


# The model of /tmp/mp's measurements: Sequential(Linear(8, 16), Inner(16), Inner(16),
# Linear(16, 4)), Inner = Linear(16, 16) + relu (module, leaf, elements, class).
_MP_NET = (
    ("0", "0", 8 * 16 + 16, "Linear"),
    ("1", "1.lin", 16 * 16 + 16, "Inner"),
    ("2", "2.lin", 16 * 16 + 16, "Inner"),
    ("3", "3", 16 * 4 + 4, "Linear"),
)


def mp_net(policies: dict[str, Policy]) -> list[FakeUnit]:
    """The units of ``Sequential(Linear(8,16), Inner, Inner, Linear(16,4))`` sharded with
    ``policies`` (fqn -> policy; ``""``, the root, is required; children among "0".."3"):
    the root owns the modules that are not units of their own."""
    if "" not in policies:
        raise ValueError("mp_net: policies needs the root ('')")
    unknown = set(policies) - {"", *(m for m, *_ in _MP_NET)}
    if unknown:
        raise ValueError(f"mp_net: no module {sorted(unknown)} (modules are 0, 1, 2, 3)")
    root_body: list[str] = []
    root_params: list[str] = []
    root_numel = 0
    children = []
    for module, leaf, numel, cls in _MP_NET:
        params = (f"{leaf}.weight", f"{leaf}.bias")
        if module in policies:
            root_body.append(module)
            children.append(FakeUnit(module, policies[module], (leaf,), params, numel, cls))
        else:
            root_body.append(leaf)
            root_params += params
            root_numel += numel
    root = FakeUnit("", policies[""], tuple(root_body), tuple(root_params), root_numel)
    return [root, *children]


class _Failed(Exception):
    def __init__(self, failure: PrecisionFailure) -> None:
        self.failure = failure


@dataclass
class FakePrecision:
    """Settings of a fake mixed-precision run; ``events()`` returns every rank's events as
    the precision probe emits them: the watch, then per iteration one batch of each unit's input
    (cast or passed through), parameter and output dtypes and its all-gather in forward,
    its parameter, gradient, reduce-scatter (DDP: all-reduce) and sharded-gradient dtypes
    in backward, and the sharded parameters at the optimizer step. The dtypes follow
    FSDP2's, FSDP1's or DDP's rules (``/tmp/mp`` measurements); a leaf that gets an input
    in another dtype than it computes in fails as torch does, and the rank stops there.

    ``alter``: (unit, phase) -> dtype reported instead of the rule's (a probe seeing
    something the plan did not predict)."""

    units: list[FakeUnit]
    wrapper: str = "fsdp2"
    world_size: int = 2
    iterations: int = 2
    input_dtype: str = "torch.float32"
    alter: dict[tuple[str, str], str] = field(default_factory=dict)
    t0: float = 1000.0
    # What FSDP2 reduces in without a reduce_dtype (PrecisionWatch.reduce_rule): torch
    # 2.14's by default, so a fake run is the same on every torch; compare it with the
    # planner under compat.fsdp.reduce_dtype_rule().
    reduce_rule: str = "compute"

    def parent(self, fqn: str) -> str | None:
        if fqn == self.units[0].fqn:
            return None
        prefixes = [u.fqn for u in self.units if u.fqn != fqn and fqn.startswith(u.fqn)]
        return max(prefixes, key=len) if prefixes else self.units[0].fqn

    def watch(self) -> PrecisionWatch:
        return PrecisionWatch(
            wrapper=self.wrapper,  # type: ignore[arg-type]
            world_size=self.world_size,
            reduce_rule=self.reduce_rule,  # type: ignore[arg-type]
            units=[
                Unit(
                    fqn=u.fqn,
                    parent=self.parent(u.fqn),
                    module_type=u.module_type,
                    policy=u.policy,
                    params=list(u.params),
                    param_dtypes=[u.dtype] * len(u.params),
                    numel=u.numel,
                )
                for u in self.units
            ],
        )

    def compute(self, u: FakeUnit) -> str:
        return u.policy.param_dtype or u.dtype

    def cast_to(self, u: FakeUnit) -> str | None:
        p = u.policy
        if p.kind == "none" or p.param_dtype is None:
            return None
        if self.wrapper == "fsdp2":
            return p.param_dtype if p.cast_forward_inputs is not False else None
        if self.wrapper == "fsdp1":
            root = self.parent(u.fqn) is None
            at_root = root and p.cast_root_forward_inputs is not False
            return p.param_dtype if at_root or (u.numel > 0 and p.cast_forward_inputs) else None
        return p.param_dtype

    def events(self) -> list[Event]:
        out: list[Event] = []
        for rank in range(self.world_size):
            out += self.rank_events(rank)
        return sorted(out, key=lambda e: e.t)

    def rank_events(self, rank: int) -> list[Event]:
        records: list[tuple[int, Any]] = [(0, self.watch())]
        for it in range(1, self.iterations + 1):
            try:
                self._forward(self.units[0], self.input_dtype, it, records)
            except _Failed as failed:
                records.append((it, failed.failure))
                break
            self._backward(it, records)
        out = [record_event(records[0][1], rank, 0, self.t0)]
        for it in range(1, self.iterations + 1):  # as the probe: a batch per iteration
            mine = [r for i, r in records if i == it]
            batched = [r for r in mine if not isinstance(r, PrecisionFailure)]
            if batched:
                out.append(precision_batch(batched, rank=rank, step=it, t=self.t0 + it))
            failures = [r for r in mine if isinstance(r, PrecisionFailure)]
            out += [record_event(r, rank, it, self.t0 + it + 1e-3) for r in failures]
        return out

    def _seen(self, it: int, u: FakeUnit, phase: Any, dtype: str, **kw: Any) -> Any:
        dtype = self.alter.get((u.fqn, phase), dtype)
        return (it, PrecisionSeen(iteration=it, unit=u.fqn, phase=phase, dtypes=[dtype], **kw))

    def _once(self, records: list[Any], it: int, u: FakeUnit, phase: Any, dtype: str) -> None:
        """As the probe: a phase other than input and output is emitted again in one
        iteration only when it shows a new dtype (then with every dtype seen so far)."""
        record = self._seen(it, u, phase, dtype)[1]
        for i, r in records:
            if i == it and isinstance(r, PrecisionSeen) and (r.unit, r.phase) == (u.fqn, phase):
                if record.dtypes[0] in r.dtypes:
                    return
                record = msgspec.structs.replace(record, dtypes=[*r.dtypes, *record.dtypes])
        records.append((it, record))

    def _collective(self, it: int, u: FakeUnit, op: Any, dtype: str, backward: bool) -> Any:
        shard = u.numel if self.wrapper == "ddp" else -(-u.numel // self.world_size)
        full = op != "all_gather" and self.wrapper != "ddp"
        nbytes = shard * (self.world_size if full else 1) * _itemsize(dtype)
        record = PrecisionCollective(
            iteration=it, unit=u.fqn, op=op, dtype=dtype, nbytes=nbytes, backward=backward
        )
        return (it, record)

    def _forward(self, u: FakeUnit, x: str, it: int, records: list[Any]) -> str:
        compute = self.compute(u)
        after = self.cast_to(u) or x
        gather = u.numel and self.wrapper != "ddp"
        if gather and self.wrapper == "fsdp1":  # FSDP1 all-gathers, then casts
            records.append(self._collective(it, u, "all_gather", compute, False))
        records.append(self._seen(it, u, "input", after, before=[x], cast=[after != x]))
        if gather and self.wrapper == "fsdp2":  # FSDP2 casts, then all-gathers
            records.append(self._collective(it, u, "all_gather", compute, False))
        if u.numel:
            self._once(records, it, u, "param", compute)
        children = {c.fqn: c for c in self.units if self.parent(c.fqn) == u.fqn}
        h = after
        for item in u.body:
            if item in children:
                h = self._forward(children[item], h, it, records)
            elif h != compute:
                message = (
                    "RuntimeError: mat1 and mat2 must have the same dtype, but got "
                    f"{_SCALAR_NAMES.get(h, h)} and {_SCALAR_NAMES.get(compute, compute)}"
                )
                raise _Failed(
                    PrecisionFailure(iteration=it, unit=u.fqn, consumer=item, message=message)
                )
            else:
                h = compute
        out = (u.policy.output_dtype if self.wrapper == "fsdp2" else None) or h
        records.append(self._seen(it, u, "output", out, before=[h]))
        return out

    def _backward(self, it: int, records: list[Any]) -> None:
        for u in reversed(self.units):
            if not u.numel:
                continue
            compute = self.compute(u)
            family: Any = self.wrapper
            rules = static_dtypes(
                family,
                u.policy,
                root=False,
                orig=u.dtype,
                trainable=True,
                reduce_rule=self.reduce_rule,
            )
            reduce = rules["reduce"]
            if self.wrapper != "ddp" and self.parent(u.fqn) is not None:
                records.append(self._collective(it, u, "all_gather", compute, True))
            self._once(records, it, u, "param", compute)
            self._once(records, it, u, "grad", rules["grad"])
            op = "all_reduce" if self.wrapper == "ddp" else "reduce_scatter"
            records.append(self._collective(it, u, op, reduce, True))
        for u in self.units:  # the optimizer step: what it steps and reads
            if u.numel:
                keep = self.wrapper == "fsdp1" and u.policy.keep_low_precision_grads
                reduce = u.policy.reduce_dtype or self.compute(u)
                self._once(records, it, u, "sharded_param", u.dtype)
                self._once(records, it, u, "sharded_grad", reduce if keep else u.dtype)


def precision_batch(
    records: list[PrecisionSeen | PrecisionCollective],
    *,
    rank: int = 0,
    step: int = 1,
    t: float = 1.0,
) -> Event:
    """The ``precision_batch`` event holding ``records`` (in order), as the probe sends it."""
    batch = PrecisionBatch(
        seen=[r for r in records if isinstance(r, PrecisionSeen)],
        collectives=[r for r in records if isinstance(r, PrecisionCollective)],
    )
    return record_event(batch, rank, step, t)


def _itemsize(dtype: str) -> int:
    return {"torch.float64": 8, "torch.float32": 4, "torch.bfloat16": 2, "torch.float16": 2}[dtype]


def sample(iterations: int = 2) -> list[Event]:
    """The feature's synthetic run (``Feature.fake``): three nested FSDP2 units in bf16 with
    fp32 reduction on 2 ranks, ``iterations`` iterations. Beyond 3, the third's batches
    are repeated, re-numbered (the generator rescans a rank's records at every record:
    50k iterations would take hours)."""
    policies = {unit: fsdp2_policy("bf16", "fp32") for unit in ("", "1", "2")}
    fake = FakePrecision(mp_net(policies), iterations=min(iterations, 3))
    made = fake.events()
    if iterations <= fake.iterations:
        return made
    last = [e for e in made if e.kind == PrecisionBatch.KIND and e.step == fake.iterations]
    for it in range(fake.iterations + 1, iterations + 1):
        for e in last:
            payload = {k: [{**r, "iteration": it} for r in v] for k, v in e.payload.items()}
            made.append(Event(e.kind, e.rank, it, fake.t0 + it + e.rank * 1e-6, payload))
    return made
