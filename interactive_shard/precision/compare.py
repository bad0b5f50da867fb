"""Planned vs observed dtypes, unit by unit and phase by phase, in words.

Pure: reads a plan (``ish.plan_precision``'s ``PrecisionPlan``, duck-typed through the
protocols below) and the dtypes the model observed; no torch, no widgets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from interactive_shard.precision.events import PHASES

SEP = ", "  # joins the distinct dtypes of a phase that saw several, in the order first seen
FULL = frozenset({"torch.float32", "torch.float64"})
LOW = frozenset({"torch.bfloat16", "torch.float16"})
_SHORT = {
    "torch.float32": "fp32",
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.float64": "fp64",
}


def dtypes_of(value: str | None) -> list[str]:
    """``"torch.bfloat16, torch.float32"`` -> its dtypes (an observed or planned cell)."""
    return [d for d in (value or "").split(SEP) if d]


def joined(dtypes: Sequence[str]) -> str:
    """The distinct dtypes in the order first seen, joined with ``SEP``."""
    return SEP.join(dict.fromkeys(d for d in dtypes if d))


def short(dtype: str | None) -> str:
    """``torch.bfloat16`` -> ``bf16``; several -> ``bf16+fp32``; none -> ``""``."""
    return "+".join(_SHORT.get(d, d.removeprefix("torch.")) for d in dtypes_of(dtype))


def itemsize(dtype: str) -> int:
    """Bytes per element, from the dtype's name (``torch.float8_e4m3fn`` -> 1); 4 when the
    name says nothing (``torch.bool``: 1)."""
    name = dtype.removeprefix("torch.")
    if name == "bool":
        return 1
    bits = re.search(r"(\d+)", name)
    return max(int(bits.group(1)) // 8, 1) if bits else 4


def is_low(dtype: str | None) -> bool:
    found = dtypes_of(dtype)
    return bool(found) and all(d in LOW or d.startswith("torch.float8") for d in found)


def is_full(dtype: str | None) -> bool:
    found = dtypes_of(dtype)
    return bool(found) and all(d in FULL for d in found)


def short_torch(dtype: str | None) -> str:
    """``torch.bfloat16`` -> ``bfloat16`` (for ``torch.<name>`` in a fix)."""
    return (dtype or "").removeprefix("torch.")


class PlannedUnit(Protocol):
    @property
    def fqn(self) -> str: ...
    @property
    def dtypes(self) -> Mapping[str, str]: ...


class PlannedFailure(Protocol):
    @property
    def unit(self) -> str: ...
    @property
    def consumer(self) -> str: ...
    @property
    def message(self) -> str: ...


class Plan(Protocol):
    """What ``compare`` reads of a ``PrecisionPlan``."""

    @property
    def units(self) -> Sequence[PlannedUnit]: ...
    @property
    def failures(self) -> Sequence[PlannedFailure]: ...


Cell = tuple[int, str, str]  # (rank, unit fqn, phase)


@dataclass(frozen=True)
class Comparison:
    """``matches``: every unit and phase planned and observed agree, on every rank
    compared, and the failures planned are the failures seen; ``differences``: what did
    not, one line each; ``cells``: the differing (rank, unit, phase) -> (planned,
    observed); ``iterations``: the iteration compared on each rank."""

    matches: bool
    differences: list[str] = field(default_factory=list)
    cells: dict[Cell, tuple[str, str]] = field(default_factory=dict)
    iterations: dict[int, int] = field(default_factory=dict)

    def __repr__(self) -> str:
        if self.matches:
            return "Comparison(matches: planned == observed)"
        return "Comparison(differs:\n  " + "\n  ".join(self.differences) + ")"


def same(planned: str, observed: str) -> bool:
    """Whether two cells hold the same dtypes (in any order)."""
    return set(dtypes_of(planned)) == set(dtypes_of(observed))


def differing_phases(planned: Mapping[str, str], observed: Mapping[str, str]) -> list[str]:
    """The phases both have whose dtypes differ, in ``PHASES`` order."""
    return [
        p
        for p in PHASES
        if p in planned and p in observed and not same(str(planned[p]), observed[p])
    ]


def compare_rank(
    rank: int,
    iteration: int,
    plan: Plan,
    observed: Mapping[str, Mapping[str, str]],
    failures: Sequence[PlannedFailure],
    casts: Mapping[str, Sequence[bool]] | None = None,
) -> tuple[list[str], dict[Cell, tuple[str, str]]]:
    """One rank's differences at ``iteration``: units on one side only, phases whose
    dtypes differ, inputs cast where the plan passes them through (or the reverse, when
    the plan's units say: a ``cast`` list per unit), and the failures
    (``compare_failures``)."""
    where = f"rank {rank}, iteration {iteration}"
    lines: list[str] = []
    cells: dict[Cell, tuple[str, str]] = {}
    planned = {u.fqn: u for u in plan.units}
    for fqn in planned:
        if fqn not in observed:
            lines.append(f"rank {rank}: unit {fqn!r} is planned but is not a unit on the rank")
    for fqn in observed:
        if fqn not in planned:
            lines.append(f"rank {rank}: unit {fqn!r} is a unit on the rank but not in the plan")
    for fqn, unit in planned.items():
        if fqn not in observed:
            continue
        for phase in differing_phases(unit.dtypes, observed[fqn]):
            want, seen = str(unit.dtypes[phase]), observed[fqn][phase]
            cells[(rank, fqn, phase)] = (want, seen)
            lines.append(
                f"{where}, unit {fqn!r} ({phase}): planned {short(want)}, observed {short(seen)}"
            )
        want_cast = list(getattr(unit, "cast", None) or [])
        seen_cast = list((casts or {}).get(fqn, []))
        if want_cast and seen_cast and want_cast != seen_cast:
            lines.append(
                f"{where}, unit {fqn!r} (input): planned {_casts(want_cast)}, observed "
                f"{_casts(seen_cast)}"
            )
            cells.setdefault((rank, fqn, "input"), (_casts(want_cast), _casts(seen_cast)))
    lines += compare_failures(rank, plan.failures, failures)
    return lines, cells


def compare_failures(
    rank: int, planned: Sequence[PlannedFailure], seen: Sequence[PlannedFailure]
) -> list[str]:
    """A run stops at its first failure, the planner finds them all (``failures[0]`` is
    where a real run stops): a rank that failed must have failed at the first planned
    failure's unit and consumer; a rank that did not fail must have none planned."""
    if not seen:
        if not planned:
            return []
        first = planned[0]
        more = f" ({len(planned)} planned in all)" if len(planned) > 1 else ""
        return [
            f"rank {rank}: the plan predicts a failure at unit {first.unit!r} (in "
            f"`{first.consumer}`){more}; the rank did not fail"
        ]
    got = seen[0]
    if not planned:
        return [
            f"rank {rank}: failed at unit {got.unit!r} (in `{got.consumer}`: {got.message}); "
            "the plan predicts no failure"
        ]
    first = planned[0]
    if (first.unit, first.consumer) != (got.unit, got.consumer):
        return [
            f"rank {rank}: failed at unit {got.unit!r} (in `{got.consumer}`); the plan's first "
            f"failure is at unit {first.unit!r} (in `{first.consumer}`)"
        ]
    return []


def _casts(flags: Sequence[bool]) -> str:
    return "[" + ", ".join("cast" if c else "passed through" for c in flags) + "]"
