"""One feature that fails costs its own section, never the report or the other views.

A model, a figure or a view can still raise on what nobody foresaw (a bug, a hostile
recording that passed every check). The report (``report.py``) builds each feature's
section apart, and ``ui/live.py`` builds and redraws each view apart: a section that
raises is replaced by a plain message naming the feature and the error, logged with
its traceback, and the others are drawn as usual. Nothing here imports a widget
library until a widget is asked for (the report loads none).
"""

from __future__ import annotations

import html
import logging
from typing import Any

log = logging.getLogger("interactive_shard")

MAX_ERROR_CHARS = 500  # an error's text quotes the data: a hostile name can be megabytes
STYLE = "color:#B00020;border-left:3px solid #B00020;padding:4px 8px;margin:8px 0"


def message(title: str, err: BaseException) -> str:
    """The plain words that stand for a section that failed."""
    what = f"{type(err).__name__}: {err}"
    if len(what) > MAX_ERROR_CHARS:
        what = what[:MAX_ERROR_CHARS] + "…"
    return (
        f"{title}: this section could not be shown ({what}). The other sections are "
        "unaffected; the traceback is in the log."
    )


def failed_html(title: str, err: BaseException) -> str:
    """``message`` as escaped HTML (the error's text may quote names from the run), logged
    with the traceback: what stands in the failed section's place."""
    text = message(title, err)
    log.warning("%s", text, exc_info=err)
    return f'<div class="ish-failed" style="{STYLE}">{html.escape(text)}</div>'


def title_of(view: Any) -> str:
    """The title of the feature ``view`` shows (its class name if it is no feature's)."""
    from interactive_shard import features

    try:
        return features.feature_of_view(view).title
    except LookupError:
        return type(view).__name__


def widget(view: Any, err: BaseException) -> Any:
    """The widget that stands for ``view`` when building it raised ``err``."""
    import ipywidgets

    return ipywidgets.HTML(failed_html(title_of(view), err))


def replace(view: Any, err: BaseException) -> None:
    """Put the message in place of ``view``'s widget's content when redrawing it raised
    ``err`` (it is not redrawn again: display the model again for a new view)."""
    import ipywidgets

    shown = getattr(view, "_widget", None)
    note = failed_html(title_of(view), err)
    if isinstance(shown, ipywidgets.Box):
        shown.children = (ipywidgets.HTML(note),)
    elif isinstance(shown, ipywidgets.HTML):
        shown.value = note
