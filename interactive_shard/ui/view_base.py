"""The base of the feature views (``*/view.py``): their state, selectors and one way to redraw.

A view is thin: the state worth testing lives in its model and in the pure figures; a
view wires widgets to them. Its own state (the rank and iteration chosen, a what-if) is
settable before any widget exists, and once ``widget`` is built the controls hold it.
While ranks run ``ui.live`` calls ``refresh()`` at most 10 times a second, which

1. updates the model (``_update``);
2. gives the selectors the ranks and iterations that arrived (``_sync_controls``),
   quietly: a view does not react to its own moves of a control (``_quiet``);
3. redraws the panels (``_redraw``), each only when the key it was drawn for changed
   (``_changed``: the model's revision and the controls it depends on). A figure panel
   is sent only what differs from what it shows (``ui.redraw.Redrawn``): the figure of
   the next iteration mostly differs in its title and values, and building and
   validating a whole figure cost most of a refresh.

Every selector that can follow the newest iteration, compile or instance has one value
for it, ``LATEST``; those count from 1.

A view's status line (``_set_status``) ends with the run's own cost, a small muted badge
(``badge_html``: ``telemetry.overhead``), brought up to date at every refresh.
"""

from __future__ import annotations

import contextlib
import html
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import ipywidgets as widgets
import plotly.graph_objects as go

from interactive_shard.telemetry import overhead, rank_info
from interactive_shard.ui import live
from interactive_shard.ui.redraw import Redrawn, Spec, spec_of

LATEST = 0  # a selector's value that follows the newest (iterations count from 1)


class Model(Protocol):
    """What the base reads of a feature's model."""

    @property
    def revision(self) -> int:
        """Grows whenever data of the feature arrived: the panels' keys hold it."""
        ...

    @property
    def ranks(self) -> list[int]: ...

    def update(self) -> bool: ...


M = TypeVar("M", bound=Model)  # the model a view shows

Selection = tuple[Any, list[Any], Any]  # a selector, its options and its value


def heading(text: str) -> widgets.HTML:
    """A panel's heading in a view."""
    return widgets.HTML(f"<h4 style='margin:12px 0 4px 0'>{html.escape(text)}</h4>")


_BADGES: weakref.WeakKeyDictionary[overhead.OverheadModel, tuple[int, str]] = (
    weakref.WeakKeyDictionary()
)


def badge_html(store: Any) -> str:
    """What the run's probes cost its steps, as a small muted span for a status line
    (``"probes: 1.8% of the step (most: rank 1, 2.1%)"``); empty before any probe said.
    One reader per store, its HTML remade only when a report arrived (views refresh
    10 times a second, probes report once)."""
    if store is None:
        return ""
    reader = overhead.of(store)
    cached = _BADGES.get(reader)
    if cached is None or cached[0] != reader.revision:
        text = reader.badge(rank_info.of(store).label)
        span = (
            "<span class='ish-overhead' style='color:#888;font-size:85%' title='time in the "
            f"probes&#39; own code (run.overhead)'>{html.escape(text)}</span>"
            if text
            else ""
        )
        cached = _BADGES[reader] = (reader.revision, span)
    return cached[1]


def with_badge(status: str, store: Any) -> str:
    """``status`` with the run's own cost after it (``badge_html``)."""
    badge = badge_html(store)
    return f"{status} · {badge}" if status and badge else status or badge


def selector(description: str, options: list[Any], value: Any, width: str | None = None) -> Any:
    """A dropdown selector (rank, unit, compile, DDP instance...); ``width``: CSS."""
    return widgets.Dropdown(
        description=description, options=options, value=value, layout={"width": width}
    )


class PanelView(live.LazyWidget, Generic[M]):
    """A live view of a feature's model: a status line, a rank selector, optionally an
    iteration number box, panels redrawn when their key changed. Subclasses make their
    controls and panels (``_panels``, with ``_rank_selector``, ``_iteration_box``,
    ``_figure`` and ``_observe``) and draw them (``_redraw``, with ``_changed`` and
    ``_draw``)."""

    def __init__(self, model: M, rank: int | None = None, iteration: int = LATEST) -> None:
        self.model = model
        self.chosen_rank = rank
        self.chosen_iteration = iteration or LATEST  # None too: it meant the latest
        self._widget: widgets.VBox | None = None
        self._drawn: dict[str, Any] = {}  # panel -> the key it was drawn for
        self._redrawn: dict[str, Redrawn] = {}  # figure panels by name
        self._ranks_box: widgets.Dropdown | None = None  # the rank selector, if any
        self._box: widgets.BoundedIntText | None = None  # the iteration number box, if any
        self._quiet = False  # set while the view itself moves a control
        self._status_text = ""  # the view's own status line (``_set_status``)

    # -- state (no widgets) ----------------------------------------------------------------
    @property
    def rank(self) -> int:
        """The rank shown: the chosen one, else rank 0 (or the lowest seen, if 0 has not
        reported yet)."""
        if self.chosen_rank is not None:
            return self.chosen_rank
        ranks = self._ranks()
        return 0 if 0 in ranks or not ranks else ranks[0]

    def _ranks(self) -> list[int]:
        """The ranks seen so far."""
        return self.model.ranks

    def _newest(self) -> int | None:
        """The newest iteration of the run, for the number box's bound (None: none yet)."""
        raise NotImplementedError

    def _iteration_note(self) -> str:
        """Next to the number box: what its numbers mean (HTML)."""
        return ""

    # -- widgets ---------------------------------------------------------------------------
    def _build(self) -> None:
        self._update()
        self.status_html = widgets.HTML()
        self._widget = widgets.VBox([self.status_html, *self._panels()])
        self.refresh()

    def _panels(self) -> list[Any]:
        """The widgets below the status line, top to bottom."""
        raise NotImplementedError

    def _rank_selector(self) -> widgets.Dropdown:
        rank = self.rank
        self.rank_selector = self._ranks_box = selector("rank", self._rank_choices(rank), rank)
        return self.rank_selector

    def _rank_choices(self, rank: int) -> list[tuple[str, int]]:
        """The ranks seen so far and ``rank``, the one shown; each labelled with its node
        when the run spans several (``telemetry.rank_info``)."""
        store = getattr(self.model, "store", None)
        label = str if store is None else rank_info.of(store).label
        return [(label(r), r) for r in sorted({*self._ranks(), rank})]

    def _iteration_box(self, width: str) -> list[Any]:
        """The iteration selector and its note. A number box, not a list: a long run has
        10,000 iterations, slow to send and to scroll (``LATEST``: follow the newest)."""
        self.iteration_selector = self._box = widgets.BoundedIntText(
            description="iteration",
            min=LATEST,
            max=self._iteration_max(),
            value=self.chosen_iteration,
            layout={"width": width},
        )
        self.iteration_note = widgets.HTML()
        return [self.iteration_selector, self.iteration_note]

    def _iteration_max(self) -> int:
        return max(self._newest() or 0, self.chosen_iteration)

    def _figure(self, name: str) -> go.FigureWidget:
        """A figure panel, drawn by ``_draw(name, ...)``."""
        self._redrawn[name] = Redrawn(go.FigureWidget())
        return self._redrawn[name].widget

    def _observe(self, *controls: Any) -> None:
        for control in controls:
            control.observe(self._on_control, names="value")

    def _on_control(self, _change: dict[str, Any]) -> None:
        if not self._quiet:
            self._read_controls()
            self.refresh()

    def _read_controls(self) -> None:
        """Take the state the controls hold, after the user moved one."""
        self.chosen_rank = self.rank_selector.value
        if self._box is not None:
            self.chosen_iteration = self._box.value

    # -- refresh ---------------------------------------------------------------------------
    def refresh(self) -> None:
        """Bring controls and panels up to date (cheap when nothing changed)."""
        if self._widget is None:
            return
        self._update()
        self._sync_controls()
        self._redraw()
        self._show_status()

    def _set_status(self, text: str) -> None:
        """Show ``text`` (HTML) as the status line, the run's own cost after it."""
        self._status_text = text
        self._show_status()

    def _show_status(self) -> None:
        value = with_badge(self._status_text, getattr(self.model, "store", None))
        if self.status_html.value != value:  # most refreshes change nothing
            self.status_html.value = value

    def _update(self) -> None:
        self.model.update()

    def _redraw(self) -> None:
        raise NotImplementedError

    def _selections(self) -> list[Selection]:
        """Each selector of the view's own with the options and value it shows now."""
        return []

    def _sync_controls(self) -> None:
        """New ranks, iterations (and what else a view selects) appear as the run goes on."""
        self._set_selectors(self._selections())
        # The rank selector and the number box change with the run and with the choices.
        key = (self.model.revision, self.chosen_rank, self.chosen_iteration)
        if (self._ranks_box is None and self._box is None) or not self._changed("controls", key):
            return
        if self._ranks_box is not None:
            rank = self.rank
            self._set_selectors([(self._ranks_box, self._rank_choices(rank), rank)])
        if self._box is not None:
            with self._quietly():
                self._box.max = self._iteration_max()  # first: the box clamps its value
                self._box.value = self.chosen_iteration
            self.iteration_note.value = self._iteration_note()

    def _set_selectors(self, selections: Iterable[Selection]) -> None:
        """Give each selector its options and value, quietly."""
        moved = [(c, o, v) for c, o, v in selections if o != list(c.options) or c.value != v]
        if moved:  # most refreshes move none
            with self._quietly():
                for control, options, value in moved:
                    if options != list(control.options):
                        control.options = options
                    control.value = value

    @contextlib.contextmanager
    def _quietly(self) -> Iterator[None]:
        """The view moves its own controls: its observers let it be."""
        quiet, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = quiet

    def _changed(self, panel: str, key: tuple[Any, ...]) -> bool:
        """Whether ``panel`` was last drawn for another ``key`` (then it is drawn for this)."""
        if self._drawn.get(panel) == key:
            return False
        self._drawn[panel] = key
        return True

    def _draw(self, name: str, drawing: Spec | go.Figure) -> bool:
        """Send figure panel ``name`` what differs from what it shows; True when its traces
        were drawn whole (new trace objects: click handlers go on them again)."""
        spec = drawing if isinstance(drawing, tuple) else spec_of(drawing)
        return self._redrawn[name].draw(spec)
