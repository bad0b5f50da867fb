"""Keep views live while ranks run, redrawing each at most ``MAX_HZ`` times a second.

Views never redraw from a probe or a channel thread: a blocking ``run.wait()``
calls ``tick()`` from its loop on the notebook's main thread, and a run started
with ``wait=False`` is polled from the kernel's event loop (also the main thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from interactive_shard.ui import failure, fallback

if TYPE_CHECKING:
    from interactive_shard.telemetry.store import RunStore

log = logging.getLogger(__name__)

MAX_HZ = 10.0
_INTERVAL = 1.0 / MAX_HZ


class LiveView(Protocol):
    def refresh(self) -> None: ...


class ShowsView:
    """Anything a notebook displays as a live view: the views themselves, models
    (``run.buckets``), runs and clusters. The one place the display hook lives;
    ``_view()`` says which view (views return themselves). What is displayed is the
    view's widget, whose mime bundle carries the static fallbacks (see ``widget``)."""

    def _view(self) -> LazyWidget:
        """A feature's model (``run.buckets``) shows its feature's view; others say."""
        from interactive_shard import features  # names its parts by string: no circle

        view: LazyWidget = features.feature_of_model(self).view_of(self)
        return view

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self._view().widget)  # the widget keeps its view alive (see widget)


class LazyWidget(ShowsView):
    """Base of the views: ``widget`` is built on first use (``_build`` sets ``_widget``)
    and then kept live; the state stays usable without any widget."""

    def _view(self) -> LazyWidget:
        return self

    _widget: Any = None

    def _static_model(self) -> Any:
        """The model the static fallback summarises (``ui/fallback.py``); None: none yet."""
        return getattr(self, "model", None)

    def _static_title(self) -> str:
        """The summary's title (empty: the feature's)."""
        return ""

    def _static_heading(self) -> str:
        """A line above the summary, for what the model does not know (the monitor's ranks)."""
        return ""

    def _build(self) -> None:
        raise NotImplementedError

    def refresh(self) -> None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        """The widget was built and then closed (``widget.close()``): nothing to redraw."""
        return self._widget is not None and getattr(self._widget, "comm", True) is None

    @property
    def widget(self) -> Any:
        if self._widget is None:
            try:
                self._build()
                failed = False
            except Exception as err:  # one view's failure costs its own widget only
                self._widget, failed = failure.widget(self, err), True
            # Read again: _build set it (a type checker keeps the `is None` above).
            built: Any = self._widget
            # ui.live holds views weakly; the widget (kept by the kernel while shown)
            # keeps its view alive, so a displayed view goes on refreshing.
            built._ish_view = self
            # However the widget is shown (this hook, or a cell ending in `view.widget`),
            # its bundle carries a summary and a figure for front ends with no widget
            # manager. An instance attribute, as ipywidgets' own close() sets it to None.
            built._repr_mimebundle_ = functools.partial(fallback.bundle, self, built)
            if not failed:  # a failed one has nothing to redraw
                register(self)
        return self._widget


class Budgeted(Protocol):
    """A model whose updates a view may bound in time (``telemetry.consume.Budget``)."""

    store: RunStore
    pending: int  # events taken from the store, not read yet

    def budget(self, seconds: float) -> contextlib.AbstractContextManager[None]: ...

    def update(self) -> bool: ...


class CatchUp:
    """A view's refreshes under its model's time budget, and a poller for what they
    leave: 100k new events cost more than a refresh may take (50 ms), so a refresh
    reads for ``refresh_s`` and a poller reads the rest between ticks, ``poll_s`` at a
    time (the tick after each redraws). Views say ``model.pending`` meanwhile."""

    def __init__(self, view: LazyWidget, refresh_s: float = 0.02, poll_s: float = 0.05) -> None:
        self._view = weakref.ref(view)
        self.refresh_s, self.poll_s = refresh_s, poll_s
        self._model: Budgeted | None = None
        self._seen = -1  # the model's store version at the last refresh
        self._polling = False

    @contextlib.contextmanager
    def __call__(self, model: Budgeted) -> Iterator[None]:
        """Around a refresh of ``model``'s view: with new events in the store some
        reading, else none (only the redraw)."""
        grown = model is not self._model or model.store.version != self._seen
        self._model, self._seen = model, model.store.version
        with model.budget(self.refresh_s if grown else 0.0):
            yield
        if model.pending and not self._polling:  # a burst: finish between ticks
            self._polling = True
            keep_polling(self._poll)

    def _poll(self) -> bool:
        """The poller's question, asked between ticks until it says True."""
        view, model = self._view(), self._model
        if view is None or view.closed or model is None:
            self._polling = False
            return True
        with model.budget(self.poll_s):
            model.update()
        self._polling = bool(model.pending)
        return not self._polling


class Throttle:
    """Lets a call through at most once per ``interval`` seconds (unless forced)."""

    def __init__(self, interval: float = _INTERVAL) -> None:
        self.interval = interval
        self._last = float("-inf")

    def ready(self, *, force: bool = False) -> bool:
        now = time.monotonic()
        if force or now - self._last >= self.interval:
            self._last = now
            return True
        return False


_views: weakref.WeakSet[LiveView] = weakref.WeakSet()
_throttle = Throttle()
_pollers: list[Callable[[], bool]] = []


def register(view: LiveView) -> None:
    _views.add(view)


def tick(*, force: bool = False) -> None:
    """Refresh every live view, at most MAX_HZ times a second (always when forced)."""
    if not _throttle.ready(force=force):
        return
    for view in list(_views):
        if getattr(view, "closed", False):
            _views.discard(view)
            continue
        try:
            view.refresh()
        except Exception as err:  # a broken view must not break the run, nor the others
            _views.discard(view)  # its state is suspect: it says why instead of redrawing
            failure.replace(view, err)


def keep_polling(poll: Callable[[], bool]) -> None:
    """Call ``poll`` (and tick views) from the kernel's event loop until it returns True.

    Outside a running event loop (a plain script) nothing is scheduled: the caller
    drives the run with ``run.wait()``.
    """
    _pollers.append(poll)
    if len(_pollers) == 1:
        _schedule()


def _schedule() -> None:
    try:
        loop = asyncio.get_event_loop()
    except RuntimeError:
        _pollers.clear()
        return
    if not loop.is_running():
        # In a kernel the loop runs between cells; in a script nobody would run it.
        from IPython import get_ipython

        if get_ipython() is None or not hasattr(get_ipython(), "kernel"):
            _pollers.clear()
            return
    loop.call_later(_INTERVAL, _on_timer)


def _on_timer() -> None:
    _pollers[:] = [p for p in _pollers if not _safe_poll(p)]
    tick()
    if _pollers:
        _schedule()
    else:
        tick(force=True)


def _safe_poll(poll: Callable[[], bool]) -> bool:
    try:
        return poll()
    except Exception:
        log.exception("polling a background run failed")
        return True
