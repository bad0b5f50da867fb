"""What-if cap sliders (the bucket map's and the graph splits'): a log2 scale whose grid
passes through the recorded cap, so that a browser snapping the slider to its grid does
not move it off the recorded value (nor start a what-if)."""

from __future__ import annotations

import math
from typing import Any

CAP_STEP = 0.25  # what-if cap sliders, in log2: four positions per doubling


def clamp_log2(value: float, bounds: tuple[float, float]) -> float:
    """``value`` inside ``2**bounds`` (the upper end for anything not a positive number)."""
    low, high = 2.0 ** bounds[0], 2.0 ** bounds[1]
    return min(max(value, low), high) if math.isfinite(value) and value > 0 else high


def log2_grid(recorded: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """Slider bounds (log2) whose grid passes through the recorded value, so that a
    browser snapping the slider to its grid leaves the recorded value where it is."""
    at = math.log2(clamp_log2(recorded, bounds))
    low = at - math.ceil((at - bounds[0]) / CAP_STEP) * CAP_STEP
    return low, low + math.ceil((bounds[1] - low) / CAP_STEP) * CAP_STEP


def cap_slider(
    description: str, value: float, recorded: float, bounds: tuple[float, float], width: str
) -> Any:
    """A what-if cap slider (MiB, log2 scale) at ``value``, its grid through ``recorded``."""
    import ipywidgets as widgets

    low, high = log2_grid(recorded, bounds)
    return widgets.FloatLogSlider(
        value=clamp_log2(value, bounds),
        base=2,
        min=low,
        max=high,
        step=CAP_STEP,
        readout_format=".3g",
        description=description,
        style={"description_width": "initial"},
        layout={"width": width},
    )


def place(slider: Any, value: float, recorded: float, bounds: tuple[float, float]) -> None:
    """Move ``slider`` to ``value`` on a grid through ``recorded`` (another compile's or
    run's cap): widened first, as the slider clamps its value to its bounds."""
    low, high = log2_grid(recorded, bounds)
    slider.min, slider.max = min(low, slider.min), max(high, slider.max)
    slider.value = clamp_log2(value, bounds)
    slider.min, slider.max = low, high


def snapped(new: float, shown: float) -> bool:
    """A browser snaps the value to the slider's grid and sends it back: a move within
    half a step is that snap, not the user's choice (it would turn the what-if on)."""
    return abs(math.log2(new) - math.log2(shown)) < CAP_STEP / 2
