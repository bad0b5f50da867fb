"""Synthetic timelines, as the timeline probe emits them, without ranks. For tests,
benchmarks and offline demos (``Feature.fake``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from interactive_shard.telemetry.schema import Event, record_event
from interactive_shard.timeline.events import Kind, Span, TimelineSpans, TimelineWatch


@dataclass
class FakeTimeline:
    """Settings of a fake timeline run; ``events()`` returns every rank's events as the
    timeline probe emits them: the watch, then one ``timeline_spans`` per iteration with
    the root's forward ``""`` and each unit's forward nested in it, the units' backwards
    in reverse order inside the root's, after each a ``post_backward:<unit>`` hook that
    issues the unit's reduce-scatter, and the optimizer step once the last one completed.

    A collective completes at once on every rank, when the last rank issued it (and the
    one before it completed: one process group runs them in order), ``collective_s``
    after; so a late rank makes the others wait. Interleaved (the default), a unit's
    reduce-scatter runs during the next unit's backward; ``bunched``: every hook and
    collective comes after the last backward (as with a compiled backward that fires
    DDP's hooks only at its end), so none overlaps. ``compiled``: compiled_forward /
    compiled_backward spans. ``hosts``: each rank's host (None: one host); ``skew``: what
    each rank's clock reads ahead of the true time (ranks on one host share a clock: keep
    them equal there); ``delay``: how much later each rank starts every iteration."""

    units: list[str] = field(default_factory=lambda: ["0", "1", "2"])
    world_size: int = 2
    iterations: int = 2
    compiled: bool = False
    bunched: bool = False
    hosts: list[str] | None = None
    skew: list[float] | None = None
    delay: list[float] | None = None
    t0: float = 1000.0
    forward_s: float = 0.002  # per unit
    backward_s: float = 0.004  # per unit
    hook_s: float = 0.0002
    collective_s: float = 0.003
    optimizer_s: float = 0.001
    nbytes: int = 4096  # per unit's reduce-scatter

    def host(self, rank: int) -> str:
        return self.hosts[rank] if self.hosts is not None else "node0"

    def watch(self, rank: int) -> TimelineWatch:
        return TimelineWatch(
            target="compiled" if self.compiled else "fsdp2",
            depth=None,
            modules=["", *self.units],
            world_size=self.world_size,
            host=self.host(rank),
            step_is_iteration=True,
        )

    def period(self) -> float:
        """Seconds between the starts of two iterations (true time)."""
        n = len(self.units)
        per_unit = self.forward_s + self.backward_s + self.hook_s + self.collective_s
        return 2 * n * per_unit + self.optimizer_s + max(self.delay or [0.0]) + 0.01

    def true_spans(self, iteration: int) -> dict[int, list[Span]]:
        """Rank -> the iteration's spans on the true clock, in the order they ended."""
        fwd: Kind = "compiled_forward" if self.compiled else "forward"
        bwd: Kind = "compiled_backward" if self.compiled else "backward"
        ranks = range(self.world_size)
        start = {r: self.t0 + (iteration - 1) * self.period() + self._delay(r) for r in ranks}
        spans: dict[int, list[Span]] = {r: [] for r in ranks}
        issued: dict[int, list[float]] = {r: [] for r in ranks}  # per unit, backward order
        for r in ranks:
            t = start[r] + 1e-5  # the root's pre-forward first
            for u in self.units:
                spans[r].append(Span(kind=fwd, name=u, start=t, end=t + self.forward_s))
                t += self.forward_s
            spans[r].append(Span(kind=fwd, name="", start=start[r], end=t + 1e-5))
            b0 = t + 1e-4
            t = b0 + 1e-5  # the root's own nodes (the loss) first
            hooks = []
            for u in reversed(self.units):
                spans[r].append(Span(kind=bwd, name=u, start=t, end=t + self.backward_s))
                t += self.backward_s
                if self.bunched:
                    hooks.append(u)
                else:
                    t = self._hook(spans[r], issued[r], u, t)
            spans[r].append(Span(kind=bwd, name="", start=b0, end=t))
            for u in hooks:
                t = self._hook(spans[r], issued[r], u, t)
        done = 0.0
        for k in range(len(self.units)):  # one group: in order, once every rank issued it
            done = max(done, *(issued[r][k] for r in ranks)) + self.collective_s
            for r in ranks:
                detail: dict[str, str | int | float | bool] = {
                    "op": "reduce_scatter",
                    "nbytes": self.nbytes,
                    "dtype": "torch.float32",
                    "group": "0",
                    "group_size": self.world_size,
                    "backward": True,
                }
                spans[r].append(
                    Span(
                        kind="collective",
                        name="reduce_scatter",
                        start=issued[r][k],
                        end=done,
                        detail=detail,
                    )
                )
        for r in ranks:
            step = max(done, max(s.end for s in spans[r])) + 1e-4
            spans[r].append(
                Span(kind="optimizer", name="SGD.step", start=step, end=step + self.optimizer_s)
            )
            spans[r].sort(key=lambda s: s.end)
        return spans

    def _hook(self, spans: list[Span], issued: list[float], unit: str, t: float) -> float:
        """The unit's post-backward hook from ``t``; it issues the reduce-scatter."""
        spans.append(Span(kind="hook", name=f"post_backward:{unit}", start=t, end=t + self.hook_s))
        issued.append(t + self.hook_s / 2)
        return t + self.hook_s

    def _delay(self, rank: int) -> float:
        return self.delay[rank] if self.delay is not None else 0.0

    def _skew(self, rank: int) -> float:
        return self.skew[rank] if self.skew is not None else 0.0

    def rank_spans(self, rank: int, iteration: int) -> list[Span]:
        """The iteration's spans as ``rank`` reports them (its own clock)."""
        dt = self._skew(rank)
        return [
            msgspec.structs.replace(s, start=s.start + dt, end=s.end + dt)
            for s in self.true_spans(iteration)[rank]
        ]

    def events(self) -> list[Event]:
        out: list[Event] = []
        for rank in range(self.world_size):
            out += self.rank_events(rank)
        return sorted(out, key=lambda e: e.t)

    def rank_events(self, rank: int) -> list[Event]:
        out = [record_event(self.watch(rank), rank, 0, self.t0 + self._skew(rank) - 1.0)]
        for it in range(1, self.iterations + 1):
            spans = self.rank_spans(rank, it)
            batch = TimelineSpans(iteration=it, spans=spans)
            out.append(record_event(batch, rank, it, spans[-1].end))
        return out


def sample(iterations: int = 2) -> list[Event]:
    """The feature's synthetic run (``Feature.fake``): 2 ranks, rank 1 two milliseconds late
    at every step, ``iterations`` iterations."""
    return FakeTimeline(delay=[0.0, 0.002], iterations=iterations).events()
