"""One palette for every view, so rank 0 and a given module look the same everywhere."""

from __future__ import annotations

# Okabe-Ito: distinguishable for colour-blind readers.
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7",
    "#56B4E9", "#D55E00", "#F0E442", "#000000",
)  # fmt: skip

STATE_COLORS = {
    "starting": "#999999",
    "idle": "#56B4E9",
    "running": "#0072B2",
    "finished": "#009E73",
    "failed": "#D55E00",
}


def rank_color(rank: int) -> str:
    return PALETTE[rank % len(PALETTE)]


def key_color(key: str, keys: list[str]) -> str:
    """Colour of ``key`` among ``keys`` (e.g. module names), stable within one figure."""
    return PALETTE[keys.index(key) % len(PALETTE)] if key in keys else "#999999"
