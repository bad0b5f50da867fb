"""Self-contained HTML report of a run: every figure, plotly.js inline, works offline."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import TYPE_CHECKING

from plotly.offline import get_plotlyjs

from interactive_shard.features import FEATURES
from interactive_shard.telemetry.files import write_text
from interactive_shard.ui import failure

if TYPE_CHECKING:
    from interactive_shard.cluster.run import Run


def _sections(run: Run) -> list[str]:
    """The HTML of every feature that has something to show, in list order. Each is
    built apart: one that raises stands as a message saying so (``ui/failure.py``)."""
    out = []
    for feature in FEATURES:
        try:
            if not feature.recorded_in(run.store):
                continue
            figures = feature.report_figures(run.model(feature.name))
            parts = [f.to_html(full_html=False, include_plotlyjs=False) for f in figures]
        except Exception as err:
            parts = [failure.failed_html(feature.title, err)]
        if parts:
            out.append(f"<h2>{html.escape(feature.title)}</h2>{''.join(parts)}")
    return out


def _rank_table(run: Run) -> str:
    try:
        model = run.model("monitor")
        rows = "".join(
            f"<tr><td>{r}</td><td>{s.state.value}</td><td>{s.step}</td>"
            f"<td><pre>{html.escape(chr(10).join(s.logs))}</pre></td></tr>"
            for r, s in enumerate(model.ranks)
        )
    except Exception as err:  # the table is the monitor's section: isolated as the others
        return failure.failed_html("Ranks", err)
    return (
        "<table><tr><th>rank</th><th>state</th><th>step</th><th>last output</th></tr>"
        f"{rows}</table>"
    )


def write_report(run: Run, path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    info = run.store.info
    parts = [
        f"<h1>interactive_shard run: {html.escape(info.name or 'run')}</h1>",
        f"<p>{info.world_size} ranks · backend {html.escape(info.backend)} · devices "
        f"{html.escape(', '.join(info.device_types))} · torch {html.escape(info.torch_version)}"
        f" · interactive_shard {html.escape(info.package_version)} · {len(run.store)} events</p>",
        _rank_table(run),
    ]
    parts.extend(_sections(run))
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>interactive_shard · {html.escape(info.name)}</title>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:left;"
        "vertical-align:top}pre{margin:0;font-size:11px}</style>"
        f"</head><body>{''.join(parts)}</body></html>"
    )
    return write_text(path, page)  # whole or not at all: Note [Writing a file whole]
