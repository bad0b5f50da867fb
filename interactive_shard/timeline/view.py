"""TimelineView: the hook-order / overlap widget (ranks, iteration, nesting depth, the
timeline, the backward order, overlap per iteration, collectives across ranks), on
``ui.view_base``; and ``versus``: two runs (eager vs compiled) with a toggle and a
side-by-side figure.
"""

from __future__ import annotations

import html
from typing import Any, Literal

import ipywidgets as widgets
import plotly.graph_objects as go

from interactive_shard.timeline.figures import (
    Spec,
    backward_order,
    figure_side_by_side,
    figure_timeline,
    report_figures,
    timeline_spec,
)
from interactive_shard.timeline.figures_collectives import collectives_spec, overlap_spec
from interactive_shard.timeline.figures_lanes import KIND_COLORS
from interactive_shard.timeline.model import TimelineModel, TimelineSpan
from interactive_shard.ui.redraw import spec_of
from interactive_shard.ui.view_base import LATEST, PanelView, Selection, heading

__all__ = ["TimelineView", "report_figures", "versus"]

ALL = -1  # iteration selector value: every iteration (LATEST: the newest)
ALL_RANKS = -1  # rank selector value: every rank
ALL_DEPTHS = -1  # depth selector value: every nesting level
MAX_DEPTH_CHOICES = 6
MAX_ORDER = 200  # spans listed in the order panel; all are in model.order(...)
# A Dropdown of 10k options is slow to send and to use: past this many iterations it
# lists the first and the latest ones (and the chosen one); "go to" reaches any other.
MAX_ITERATION_OPTIONS = 100
RECENT_OPTIONS = 50
FINDINGS_WINDOW = 20  # the status checks the latest iterations (run.timeline.findings: all)
# ... of at most this many (rank, iteration)s: at 256 ranks 20 iterations are 5,120
# summaries to decode at every refresh while a run streams (seconds, bench_wide.py).
FINDINGS_CHECKED = 320
Showing = Literal["a", "b", "both"]  # this run, the other run, side by side
EXPORT = (
    "<b>Export</b>: <code>run.timeline.to_chrome_trace('timeline.json')</code> writes every "
    "rank's spans as a Chrome trace; open it in <a href='https://ui.perfetto.dev' "
    "target='_blank'>ui.perfetto.dev</a> or chrome://tracing."
)


class TimelineView(PanelView[TimelineModel]):
    """Live view of a ``TimelineModel`` (``run.timeline``), or of two (``versus``);
    ``widget`` is built on first use.

    State first, settable before any widget exists: ``ranks`` (None: all), ``iteration``
    (``LATEST``: the latest; ``ALL``: every one), ``depth`` (None: every nesting level) and,
    with ``other``, ``showing`` (``"a"``: this run, ``"b"``: the other, ``"both"``: side
    by side). Once ``widget`` is built the controls hold that state: set
    ``rank_selector.value``, ``iteration_selector.value``, ``depth_selector.value`` or
    ``run_toggle.value``, then read the figures and HTML panels.
    """

    def __init__(
        self,
        model: TimelineModel,
        other: TimelineModel | None = None,
        labels: tuple[str, str] = ("eager", "compiled"),
        *,
        ranks: list[int] | None = None,
        iteration: int = LATEST,
        depth: int | None = None,
        showing: Showing | None = None,
    ) -> None:
        if len(labels) != 2 or not all(isinstance(x, str) and x for x in labels):
            raise ValueError(f"labels={labels!r}: give two names, e.g. ('eager', 'compiled')")
        if showing not in (None, "a", "b", "both") or (showing in ("b", "both") and other is None):
            raise ValueError(f"showing={showing!r}: 'a', or with another run 'b' or 'both'")
        super().__init__(model, iteration=iteration)
        self.other = other
        self.labels = labels
        self.chosen_ranks = tuple(ranks) if ranks else None
        self.depth = depth
        self.showing: Showing = showing or ("both" if other is not None else "a")

    # -- state (no widgets) ----------------------------------------------------------------
    @property
    def current(self) -> TimelineModel:
        """The run the panels show (side by side: this one)."""
        return self.other if self.showing == "b" and self.other is not None else self.model

    def _models(self) -> list[TimelineModel]:
        return [self.model] if self.other is None else [self.model, self.other]

    @property
    def ranks(self) -> list[int]:
        """The ranks shown: those chosen that the run has (none chosen: all of them)."""
        found = self.current.ranks
        chosen = [r for r in self.chosen_ranks or () if r in found]
        return chosen or found

    @property
    def rank(self) -> int:
        """The rank of the order panel and of the side-by-side figure: the first shown."""
        ranks = self.ranks
        return ranks[0] if ranks else 0

    @property
    def iteration(self) -> int | None:
        """The iteration shown (None: every iteration, or none arrived yet)."""
        if self.chosen_iteration == ALL:
            return None
        if self.chosen_iteration != LATEST:
            return self.chosen_iteration
        return self.current.latest()

    @property
    def single(self) -> int | None:
        """The one iteration of the order and collectives panels (every: the latest)."""
        return self.iteration if self.iteration is not None else self.current.latest()

    def figure(self) -> go.Figure:
        """The timeline as the controls have it: one run, or both side by side."""
        if self.showing == "both" and self.other is not None:
            it = None if self.chosen_iteration in (LATEST, ALL) else self.chosen_iteration
            return figure_side_by_side(
                self.model, self.other, self.labels, it, self.rank, depth=self.depth
            )
        label = None if self.other is None else self.labels[self.showing == "b"]
        return figure_timeline(
            self.current, iteration=self.iteration, ranks=self.ranks, depth=self.depth, label=label
        )

    def _timeline_spec(self) -> Spec:
        """``figure()`` as plain dicts: one run's straight from the model, the subplots
        of two side by side through their figure (built by make_subplots)."""
        if self.showing == "both" and self.other is not None:
            return spec_of(self.figure())
        label = None if self.other is None else self.labels[self.showing == "b"]
        return timeline_spec(
            self.current, iteration=self.iteration, ranks=self.ranks, depth=self.depth, label=label
        )

    def order_text(self) -> str:
        """The backward order on the rank shown (HTML): every span that started in the
        backward, in start order, its kind marked; both runs' when side by side."""
        if self.showing != "both" or self.other is None:
            return _order_html(self.current, self.rank, self.single, None)
        columns = "".join(
            f"<td style='vertical-align:top;padding-right:24px'>"
            f"{_order_html(m, self.rank, self._single_of(m), label)}</td>"
            for m, label in zip(self._models(), self.labels, strict=True)
        )
        return f"<table><tr>{columns}</tr></table>"

    def _single_of(self, model: TimelineModel) -> int | None:
        if self.chosen_iteration in (LATEST, ALL):
            return model.latest(self.rank)
        return self.chosen_iteration

    def _status(self) -> str:
        if not any(m.ranks for m in self._models()):
            return (
                "<i>No timeline yet: watch a model with <code>ish.watch(model, timeline=True)"
                "</code> in the rank code…</i>"
            )
        parts = []
        for m, label in zip(self._models(), self.labels, strict=False):
            watch = m.watch(m.ranks[0]) if m.ranks else None
            what = f"<b>{watch.target}</b> · " if watch is not None else ""
            name = f"{html.escape(label)}: " if self.other is not None else ""
            count = m.count()
            parts.append(
                f"{name}{what}{len(m.ranks)} rank(s) · {count:,} iteration(s)"
                + (f" · {m.skipped} malformed event(s) skipped" if m.skipped else "")
            )
            # A long run: the latest iterations only (all of them would read every span).
            latest = max(1, min(FINDINGS_WINDOW, FINDINGS_CHECKED // max(1, len(m.ranks))))
            window = m.recent(latest) if count > latest else None
            checked = (
                f" (the latest {latest} of {count:,} iterations checked; "
                "run.timeline.findings checks every one)"
                if window is not None
                else ""
            )
            parts += [
                f"<span style='color:#D55E00'>{html.escape(f.message + checked)}</span>"
                for f in m.findings_of(window)
            ]
        return "<br>".join(parts)

    # -- widgets ---------------------------------------------------------------------------
    def _panels(self) -> list[Any]:
        self.run_toggle = widgets.ToggleButtons(
            options=[(self.labels[0], "a"), (self.labels[1], "b"), ("side by side", "both")],
            value=self.showing,
        )
        self.run_toggle.layout.display = "" if self.other is not None else "none"
        self.rank_selector = widgets.SelectMultiple(
            description="ranks", options=self._rank_options(), value=self._rank_value(), rows=3
        )
        self.iteration_selector = widgets.Dropdown(
            description="iteration", options=self._iteration_options(), value=self.chosen_iteration
        )
        self.iteration_box = widgets.BoundedIntText(
            description="go to",
            min=0,
            max=max(self._latest_of_all(), self.chosen_iteration, 0),
            value=max(self.chosen_iteration, 0),
            layout={"width": "170px"},
            tooltip="any iteration (0: the latest)",
        )
        self.depth_selector = widgets.Dropdown(
            description="nesting",
            options=self._depth_options(),
            value=ALL_DEPTHS if self.depth is None else self.depth,
        )
        self.order_html = widgets.HTML()
        self.export_html = widgets.HTML(EXPORT)
        self.timeline_figure = self._figure("timeline")
        self.overlap_figure = self._figure("overlap")
        self.collectives_figure = self._figure("collectives")
        self._observe(
            self.run_toggle, self.rank_selector, self.iteration_selector, self.depth_selector
        )
        self.iteration_box.observe(self._on_box, names="value")
        self.details = widgets.VBox(
            [
                heading("Backward order"),
                self.order_html,
                heading("Overlap per iteration"),
                self.overlap_figure,
                heading("Collectives across ranks"),
                self.collectives_figure,
                self.export_html,
            ]
        )
        iterations = widgets.VBox([self.iteration_selector, self.iteration_box])
        selectors = widgets.HBox([self.rank_selector, iterations, self.depth_selector])
        return [self.run_toggle, selectors, self.timeline_figure, self.details]

    def _rank_options(self) -> list[tuple[str, int]]:
        found = sorted({r for m in self._models() for r in m.ranks} | set(self.chosen_ranks or ()))
        return [("all", ALL_RANKS)] + [(f"rank {r}", r) for r in found]

    def _rank_value(self) -> tuple[int, ...]:
        return self.chosen_ranks or (ALL_RANKS,)

    def _iteration_options(self) -> list[tuple[str, int]]:
        """latest, all, and the iterations: every one, or past ``MAX_ITERATION_OPTIONS``
        the first, the latest ``RECENT_OPTIONS`` and the chosen one (``iteration_box``
        goes to any other)."""
        found = [_listed(m) for m in self._models()]
        listed = found[0] if len(found) == 1 else sorted({i for its in found for i in its})
        chosen = self.chosen_iteration
        if chosen not in (LATEST, ALL) and chosen not in listed:
            listed = sorted({*listed, chosen})
        return [("latest", LATEST), ("all", ALL)] + [(str(i), i) for i in listed]

    def _latest_of_all(self) -> int:
        return max((m.latest() or 0 for m in self._models()), default=0)

    def _depth_options(self) -> list[tuple[str, int]]:
        deepest = max(MAX_DEPTH_CHOICES - 1, self.depth or 0)
        return [("all", ALL_DEPTHS)] + [(f"≤ {d}", d) for d in range(deepest + 1)]

    def _on_box(self, change: dict[str, Any]) -> None:
        """``go to``: any iteration (0: the latest), added to the selector's options."""
        if self._quiet:
            return
        self.chosen_iteration = int(change["new"]) or LATEST
        self.refresh()  # which lists it in the selector

    def _read_controls(self) -> None:
        chosen = tuple(self.rank_selector.value)
        self.chosen_ranks = None if not chosen or ALL_RANKS in chosen else chosen
        self.chosen_iteration = self.iteration_selector.value
        self.depth = None if self.depth_selector.value == ALL_DEPTHS else self.depth_selector.value
        if self.other is not None:
            self.showing = self.run_toggle.value

    def _update(self) -> None:
        for m in self._models():
            m.update()

    def _redraw(self) -> None:
        revisions = tuple(m.revision for m in self._models())
        shown = (revisions, self.showing, tuple(self.ranks), self.chosen_iteration)
        if self._changed("status", revisions):
            self._set_status(self._status())
        if self._changed("timeline", (*shown, self.depth)):
            self._draw("timeline", self._timeline_spec())
        if self._changed("order", (*shown, self.rank)):
            self.order_html.value = self.order_text()
        self.details.layout.display = "" if self.current.ranks else "none"
        if self._changed("panels", (revisions, self.showing, self.single)):
            self._draw("overlap", overlap_spec(self.current, self.single))
            self._draw("collectives", collectives_spec(self.current, self.single))

    def _selections(self) -> list[Selection]:
        return [
            (self.rank_selector, self._rank_options(), self._rank_value()),
            (self.iteration_selector, self._iteration_options(), self.chosen_iteration),
        ]

    def _sync_controls(self) -> None:
        """New ranks and iterations appear while the run goes on."""
        super()._sync_controls()
        box, value = self.iteration_box, max(self.chosen_iteration, 0)  # ALL shows as 0
        top = max(self._latest_of_all(), value)
        if (box.max, box.value) != (top, value):
            with self._quietly():
                box.max, box.value = top, value


def versus(
    a: TimelineModel, b: TimelineModel, labels: tuple[str, str] = ("eager", "compiled")
) -> TimelineView:
    """Two runs' timelines (say eager and compiled) in one view, side by side first;
    the toggle shows either run alone. ``run.timeline.versus(other_run.timeline)``."""
    return TimelineView(a, other=b, labels=labels, showing="both")


def _order_html(model: TimelineModel, rank: int, iteration: int | None, label: str | None) -> str:
    head = f"<b>{html.escape(label)}</b> · " if label is not None else ""
    if iteration is None:
        return f"{head}<i>no iteration yet</i>"
    spans = backward_order(model, rank, iteration)
    if not spans:
        return f"{head}<i>no backward on rank {rank} in iteration {iteration}</i>"
    t0 = spans[0].start
    items = "".join(_order_item(s, t0) for s in spans[:MAX_ORDER])
    more = (
        f"<li>… {len(spans) - MAX_ORDER} more: see <code>run.timeline.order({rank}, "
        f"{iteration})</code></li>"
        if len(spans) > MAX_ORDER
        else ""
    )
    return (
        f"{head}rank {rank}, iteration {iteration}: {len(spans)} span(s) in start order"
        f"<ol style='max-height:320px;overflow:auto;margin:4px 0'>{items}{more}</ol>"
    )


def _order_item(s: TimelineSpan, t0: float) -> str:
    color = KIND_COLORS.get(s.kind, "#999999")
    chip = (
        f"<span style='background:{color};color:white;padding:0 5px;border-radius:3px;"
        f"font-size:11px'>{html.escape(s.kind)}</span>"
    )
    return (
        f"<li>{chip} <code>{html.escape(s.name) or 'root'}</code> "
        f"<span style='color:#777'>+{(s.start - t0) * 1e3:.3f} ms</span></li>"
    )


def _listed(model: TimelineModel) -> list[int]:
    """What the selector lists of a run's iterations: all, or the first and the latest."""
    if model.count() <= MAX_ITERATION_OPTIONS:
        return model.iterations()
    first = model.earliest()
    return [*([first] if first is not None else []), *model.recent(RECENT_OPTIONS)]
