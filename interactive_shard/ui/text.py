"""Text from a run (names, log lines, error messages) shown by plotly as itself.

plotly.js renders a subset of HTML in every text it draws: titles, legend entries (trace
``name``), tick labels and categorical axis values, hover text (``text``, ``hovertext``,
``customdata`` put in by a ``hovertemplate``), annotations, table cells. A module named
``<a href="https://example.com">x</a>`` would be a live link in a report, a ``<span
style=...>`` would restyle the legend. Every string a run supplies goes into a figure
through ``literal``; the figures' own markup (``<b>``, ``<br>``) stays outside it.
"""

from __future__ import annotations

import html

__all__ = ["literal"]


def literal(text: object) -> str:
    """``text`` as plotly shows it literally: ``&``, ``<`` and ``>`` as entities.

    plotly.js decodes ``&amp;``, ``&lt;``, ``&gt;`` and numeric entities, not ``&quot;``:
    quotes stay as they are (``html.escape``'s default would show ``&quot;``)."""
    return html.escape(str(text), quote=False)
