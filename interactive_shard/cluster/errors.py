"""The one error a failed run raises in the notebook."""

from __future__ import annotations


class RankError(RuntimeError):
    """One or more ranks failed. ``.ranks`` lists them, ``.tracebacks[rank]`` has the text.

    A rank killed by a signal appears like one that raised: its "traceback" says which
    signal and holds the last lines it wrote to stderr. ``.stuck[rank]``: where a rank
    that never replied was when the cluster stopped it (Note [Stuck rank stacks]).
    """

    def __init__(
        self, tracebacks: dict[int, str], *, note: str = "", stuck: dict[int, str] | None = None
    ) -> None:
        self.tracebacks = dict(sorted(tracebacks.items()))
        self.ranks = list(self.tracebacks)
        self.note = note
        self.stuck = dict(sorted((stuck or {}).items()))
        super().__init__(self._message())

    def _message(self) -> str:
        which = ", ".join(str(r) for r in self.ranks)
        parts = [f"rank{'s' if len(self.ranks) > 1 else ''} {which} failed"]
        if self.note:
            parts[0] += f" ({self.note})"
        for rank, text in self.tracebacks.items():
            parts.append(f"\n--- rank {rank} ---\n{text.rstrip()}")
        for rank, text in self.stuck.items():
            parts.append(f"\n--- rank {rank}, stuck: its stack when stopped ---\n{text.rstrip()}")
        return "\n".join(parts)

    def __reduce__(self) -> tuple[object, ...]:  # picklable, note and stacks included
        return (_rebuild, (self.tracebacks, self.note, self.stuck))


def _rebuild(tracebacks: dict[int, str], note: str, stuck: dict[int, str]) -> RankError:
    return RankError(tracebacks, note=note, stuck=stuck)
