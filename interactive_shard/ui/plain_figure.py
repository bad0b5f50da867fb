"""A plotly figure from plain dicts, without plotly's property-by-property validation.

Validating costs about ten times the building, and a view that redraws several figures
at each refresh of a long run pays it every time. The features' unit tests validate
every figure these dicts make (``go.Figure(fig.to_dict())``), so nothing goes unchecked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

_TEMPLATES: dict[str, dict[str, Any]] = {}


def figure(data: Sequence[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """``go.Figure`` of ``data`` (traces) and ``layout``, unvalidated. The default
    template goes in as a dict made once (plotly deep-copies it otherwise)."""
    return go.Figure({"data": list(data), "layout": {**_template(), **layout}}, _validate=False)


def _template() -> dict[str, Any]:
    import plotly.io as pio

    name = pio.templates.default
    if not isinstance(name, str):  # None, or a Template object: plotly applies it
        return {}
    if name not in _TEMPLATES:
        _TEMPLATES[name] = {"template": pio.templates[name].to_plotly_json()}
    return _TEMPLATES[name]
