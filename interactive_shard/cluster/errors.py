"""The one error a failed run raises in the notebook."""

from __future__ import annotations


class RankError(RuntimeError):
    """One or more ranks failed. ``.ranks`` lists them, ``.tracebacks[rank]`` has the text.

    A rank killed by a signal appears like one that raised: its "traceback" says which
    signal and holds the last lines it wrote to stderr.
    """

    def __init__(self, tracebacks: dict[int, str], *, note: str = "") -> None:
        self.tracebacks = dict(sorted(tracebacks.items()))
        self.ranks = list(self.tracebacks)
        self.note = note
        super().__init__(self._message())

    def _message(self) -> str:
        which = ", ".join(str(r) for r in self.ranks)
        parts = [f"rank{'s' if len(self.ranks) > 1 else ''} {which} failed"]
        if self.note:
            parts[0] += f" ({self.note})"
        for rank, text in self.tracebacks.items():
            parts.append(f"\n--- rank {rank} ---\n{text.rstrip()}")
        return "\n".join(parts)

    def __reduce__(self) -> tuple[object, ...]:  # picklable, note included
        return (_rebuild, (self.tracebacks, self.note))


def _rebuild(tracebacks: dict[int, str], note: str) -> RankError:
    return RankError(tracebacks, note=note)
