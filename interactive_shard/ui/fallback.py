"""What a front end without a widget manager shows of a view: a summary and a figure.

A view displays as its widget's mime bundle. JupyterLab and Notebook 7 render the widget
mime (``application/vnd.jupyter.widget-view+json``) and ignore the rest, since their
widget renderer outranks every other (rank -10); VS Code puts ``application/vnd.*`` items
first in the order they come (its ipynb code's ``orderOfMimeTypes``), so the widget mime
comes first in the bundle, before plotly's. Everywhere else (an nbconvert HTML page, a
notebook on a code host, a docs site, a front end with the widget manager missing) the
widget mime is dropped, and the reader would see an empty box or ``VBox(children=...)``.
So the bundle also carries the view as of display time:

* ``text/plain``: the feature's ``summary`` (a few plain lines: ranks, iterations,
  buckets, findings...), what a terminal or a plain-text reader prints;
* ``text/html``: the same lines, escaped, with no script: it reads offline;
* ``application/vnd.plotly.v1+json``: the feature's first report figure without
  plotly's template, dropped when its JSON exceeds ``MAX_FIGURE_CHARS`` (the committed
  notebooks keep their outputs and must stay small); renderers of that mime (a docs
  site, nteract) draw it.

Nothing here may break a display: a summary that fails is logged and said in one line.
"""

from __future__ import annotations

import html
import json
import logging
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
MAX_FIGURE_CHARS = 16_000  # JSON per figure at most (indented in a notebook: ~1.4x)
HOVER_CHARS = 6_000  # a larger figure drops its hover texts (the notebook keeps it)
HOVER_KEYS = ("hovertext", "hovertemplate", "customdata")
NOTE = "static summary as of display; the live view needs a Jupyter widget front end"


class Static(NamedTuple):
    """A view as it is now, for readers without a widget manager."""

    name: str  # the feature's (``data-ish-summary`` in the HTML)
    title: str
    body: str  # plain lines
    figure: dict[str, Any] | None  # plotly mime JSON


def static_of(view: Any) -> Static:
    """``view``'s summary and main figure: its feature's ``summary`` and first report
    figure of the model it shows (``view._static_model()``), under its title."""
    from interactive_shard import features

    feature = features.feature_of_view(view)
    title = view._static_title() or feature.title
    model = view._static_model()
    heading = view._static_heading()
    if model is None:
        return Static(feature.name, title, _join(heading, "Nothing to show yet."), None)
    body = _join(heading, feature.summary_of(model))
    figures = feature.report_figures(model)
    return Static(feature.name, title, body, figure_json(figures[0]) if figures else None)


def figure_json(fig: Any) -> dict[str, Any] | None:
    """``fig`` as plotly mime JSON without its template (plotly.js draws its own default).

    A figure over ``HOVER_CHARS`` loses its hover texts (the bulk of a timeline's JSON:
    a sentence per span); one still over ``MAX_FIGURE_CHARS`` is left out (None)."""
    import plotly.io as pio

    data: dict[str, Any] = json.loads(pio.to_json(fig, validate=False, remove_uids=True))
    data.get("layout", {}).pop("template", None)
    if _chars(data) > HOVER_CHARS:
        for trace in data.get("data", []):
            dropped = [trace.pop(key, None) for key in HOVER_KEYS]
            if any(d is not None for d in dropped) and trace.get("hoverinfo") == "text":
                trace["hoverinfo"] = "x+y+name"
    return data if _chars(data) <= MAX_FIGURE_CHARS else None


def _chars(data: dict[str, Any]) -> int:
    return len(json.dumps(data, separators=(",", ":")))


def bundle(view: Any, widget: Any, **_: Any) -> dict[str, Any] | None:
    """``widget``'s mime bundle with the static fallbacks (its ``_repr_mimebundle_``).

    The widget mime is written here as ipywidgets 8 writes it: its own method would
    also pformat the whole widget tree (figures included) into a ``text/plain`` that
    the summary replaces, a third of a second for a view with two figures."""
    if widget.comm is None or widget._view_name is None:
        return None  # closed: nothing to show
    data: dict[str, Any] = {
        WIDGET_MIME: {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
    }
    try:
        static = static_of(view)
    except Exception as err:  # a summary must never hide the live view
        log.exception("the static summary of %r failed", view)
        failed = f"no summary ({type(err).__name__}: {err})"
        static = Static("", type(view).__name__, failed, None)
    # The title, then the note in parentheses, on the first line: nbval compares a
    # widget output's text/plain up to its first "(" (tests/notebooks), the title.
    data["text/plain"] = f"{static.title} ({NOTE})\n{static.body}"
    data["text/html"] = to_html(static)
    if static.figure is not None:
        data[PLOTLY_MIME] = static.figure
    return data


def to_html(static: Static) -> str:
    """The summary as small escaped HTML, no script: the title bold, the lines a list."""
    lines = [line.strip() for line in static.body.splitlines() if line.strip()]
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return (
        f'<div class="ish-summary" data-ish-summary="{html.escape(static.name)}">'
        f"<b>{html.escape(static.title)}</b> <i>({html.escape(NOTE)})</i>"
        f"{f'<ul>{items}</ul>' if items else ''}</div>"
    )


def _join(*parts: str) -> str:
    return "\n".join(part for part in parts if part)


def listed(items: list[str], limit: int = 6) -> str:
    """``a, b, c and 4 more``: a list a line can hold."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
