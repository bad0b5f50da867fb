"""A committed notebook as the docs site shows it: each view's plotly figure, drawn offline.

A displayed view's output holds the widget mime, a text summary (``text/plain`` and
``text/html``) and, when small enough, the view's main figure as plotly JSON
(``application/vnd.plotly.v1+json``; ``interactive_shard/ui/fallback.py``). The
committed notebooks carry no widget state, so on a static page the widget mime draws
nothing, and nbconvert does not render the plotly mime at all. ``with_figures``
rewrites each such output into ``text/html``: the figure as a placeholder ``<div>``
with its JSON in a ``<script type="application/json">`` (inert: no inline code, so the
page holds data only), followed by the summary. The site's ``ish-figures.js`` draws
every placeholder with the local plotly.js (``docs_hooks.py`` adds both to pages that
have one). An output with a widget and no figure keeps its summary, never the widget.
"""

from __future__ import annotations

import html
import json
from typing import Any

import nbformat

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
FIGURE_CLASS = "ish-figure"  # the placeholder div; ish-figures.js finds its data by it
DATA_CLASS = "ish-figure-data"


def with_figures(nb: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, int]:
    """A copy of ``nb`` whose outputs show figures and summaries instead of widgets, and
    how many figures it holds. ``nb`` itself is not changed."""
    out = nbformat.from_dict(json.loads(json.dumps(nb)))
    figures = 0
    for cell in out.cells:
        for output in cell.get("outputs", []):
            data = output.get("data")
            if not data or (PLOTLY_MIME not in data and WIDGET_MIME not in data):
                continue
            figure = data.get(PLOTLY_MIME)
            parts = []
            if figure is not None:
                parts.append(figure_html(figure, f"{FIGURE_CLASS}-{figures}"))
                figures += 1
            parts.append(summary_html(data))
            output["data"] = {"text/html": "".join(parts)}
    return out, figures


def figure_html(figure: dict[str, Any], element_id: str) -> str:
    """A placeholder for ``figure`` (plotly JSON: ``data``, ``layout``) with its JSON."""
    if not isinstance(figure, dict) or not isinstance(figure.get("data", []), list):
        raise ValueError(
            f"{PLOTLY_MIME} output {element_id} is not a plotly figure "
            f"(a dict with a 'data' list): {str(figure)[:80]!r}"
        )
    # '<' escaped: a '</script>' inside a label cannot end the data block early.
    text = json.dumps(figure, separators=(",", ":")).replace("<", "\\u003c")
    return (
        f'<div class="{FIGURE_CLASS}" id="{element_id}"></div>'
        f'<script type="application/json" class="{DATA_CLASS}" data-for="{element_id}">'
        f"{text}</script>"
    )


def summary_html(data: dict[str, Any]) -> str:
    """The output's own ``text/html`` summary, else its ``text/plain`` as preformatted
    text, else nothing (a widget with neither shows nothing rather than an empty box)."""
    rich = data.get("text/html")
    if rich:
        return rich if isinstance(rich, str) else "".join(rich)
    plain = data.get("text/plain")
    if plain:
        text = plain if isinstance(plain, str) else "".join(plain)
        return f"<pre>{html.escape(text)}</pre>"
    return ""
