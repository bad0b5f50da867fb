"""Drawing helpers of the split figures: the rectangles of lanes, regions and the
selected lane (figures are built with ``ui.plain_figure.figure``)."""

from __future__ import annotations

from typing import Any

from interactive_shard.ui.colors import PALETTE

LANE_FILL, SELECTED = "rgba(0,0,0,0.045)", PALETTE[0]


def rect(
    x0: float, x1: float, start: int, end: int, color: str, alpha: float, dash: str | None = None
) -> dict[str, Any]:
    return {
        "type": "rect",
        "xref": "x",
        "yref": "y",
        "x0": x0,
        "x1": x1,
        "y0": start - 0.45,
        "y1": end + 0.45,
        "fillcolor": color,
        "opacity": alpha,
        "line": {"width": 1, "color": color, "dash": dash} if dash else {"width": 0},
        "layer": "below",
        "name": "region",
    }


def lane_rect(lane: int, first: int, n: int) -> dict[str, Any]:
    return {
        "type": "rect",
        "x0": lane - 0.45,
        "x1": lane + 0.45,
        "y0": first - 0.5,
        "y1": first + max(n, 1) - 0.5,
        "fillcolor": LANE_FILL,
        "line": {"width": 0},
        "layer": "below",
        "name": "lane",
    }


def outline(lane: int, first: int, n: int) -> dict[str, Any]:
    return {
        "type": "rect",
        "x0": lane - 0.48,
        "x1": lane + 0.48,
        "y0": first - 0.55,
        "y1": first + max(n, 1) - 0.45,
        "line": {"width": 2.5, "color": SELECTED},
        "name": "selected",
    }
