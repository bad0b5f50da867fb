"""Redraw a FigureWidget with only what changed since it was last drawn.

A live bucket view following the latest iteration redraws at every refresh, and the
figures of two consecutive iterations are nearly the same (the title's iteration
number; the timeline's times). Building a ``go.Figure`` and swapping it in cost ~60 ms
of plotly validation each time, for an 8-layer MLP; setting only the properties that
differ costs what they hold. ``Redrawn`` keeps the trace and layout dicts it last drew
and compares the next ones with them, then sends what differs in one
``plotly_update``; when the traces are not the same kinds and names (a module more, a
what-if that cannot be planned) it draws the figure whole, validated.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.basedatatypes import Undefined

Spec = tuple[list[dict[str, Any]], dict[str, Any]]
_IDENTITY = ("type", "name", "xaxis", "yaxis", "legendgroup")
_ARRAYS = ("shapes", "annotations")


class Redrawn:
    """A FigureWidget and what it shows. ``draws`` counts redraws (whole or patched)."""

    def __init__(self, widget: go.FigureWidget) -> None:
        self.widget = widget
        self.draws = 0
        self.whole = 0  # draws that rebuilt every trace
        self._shown: Spec | None = None

    @property
    def shown(self) -> Spec | None:
        """The traces and layout drawn last (None: nothing yet); a view that knows which
        of their values a new iteration changes builds the next spec from them."""
        return self._shown

    def draw(self, spec: Spec) -> bool:
        """Show ``spec``; True when it drew the traces whole (new trace objects: a click
        handler set on the old ones must be set again)."""
        traces, layout = spec
        self.draws += 1
        shown = self._shown
        self._shown = spec
        if shown is None or _identities(shown[0]) != _identities(traces):
            self.whole += 1
            whole(self.widget, traces, layout)
            return True
        restyle: dict[str, list[Any]] = {}
        changed_traces: list[int] = []
        for i, (new, old) in enumerate(zip(traces, shown[0], strict=True)):
            changed = {k: v for k, v in new.items() if k not in old or not same(v, old[k])}
            changed.update({k: None for k in old if k not in new})
            if not changed:
                continue
            for key, value in changed.items():
                restyle.setdefault(key, [Undefined] * len(changed_traces)).append(value)
            changed_traces.append(i)
            for values in restyle.values():  # Undefined: this trace keeps that property
                values.extend([Undefined] * (len(changed_traces) - len(values)))
        old_layout = shown[1]
        relayout = {
            k: v for k, v in layout.items() if k not in old_layout or not same(v, old_layout[k])
        }
        relayout.update({k: None for k in old_layout if k not in layout})
        # plotly keeps an object per shape and annotation, reading its values from the
        # list a relayout sets, but as many objects as before: another number of shapes
        # goes in through the property (validated), else the Python side lacks one.
        arrays = {
            k: relayout.pop(k) or ()
            for k in _ARRAYS
            if k in relayout and len(relayout[k] or ()) != len(old_layout.get(k) or ())
        }
        if restyle or relayout:
            # One update message, and no validation: these dicts differ from validated
            # ones only in values of the same kinds (plotly's batch_update ends with
            # this very call, after validating each assignment one by one).
            self.widget.plotly_update(restyle, relayout, changed_traces)
        if arrays:
            with self.widget.batch_update():
                for key, value in arrays.items():
                    self.widget.layout[key] = value
        return False


def spec_of(fig: go.Figure) -> Spec:
    """A figure built for one draw as the dicts ``Redrawn`` compares: its own, not the
    copies ``to_plotly_json`` makes (a deep copy of every trace cost as much as building
    the figure), less its template (assigning a whole layout re-validates plotly's
    default template, which cost more than the traces)."""
    layout = {k: v for k, v in fig._layout.items() if k != "template"}
    return list(fig._data), layout


def retitled(layout: dict[str, Any], title: str) -> dict[str, Any]:
    """``layout`` (a spec's) with another title."""
    return {**layout, "title": {**layout.get("title", {}), "text": title}}


def _identities(traces: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(t.get(k) for k in _IDENTITY) for t in traces]


def whole(widget: go.FigureWidget, traces: list[Any], layout: dict[str, Any]) -> None:
    """Draw ``traces`` (dicts, or a figure's traces) and ``layout`` whole, as one front-end
    update: every redraw that is not a patch comes here."""
    with widget.batch_update():
        widget.data = ()
        widget.add_traces(traces)
        widget.update_layout(layout, overwrite=True)
        widget.layout.shapes = layout.get("shapes", ())
        widget.layout.annotations = layout.get("annotations", ())


def same(a: Any, b: Any) -> bool:
    """Equal as plotly would draw them: arrays by value (NaN equal to NaN), dicts and
    lists item by item."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)
