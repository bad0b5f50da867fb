"""The feature list: what every view of the package contributes, declared in one place.

A feature is a folder (``monitor/``, ``buckets/``, ...) and one entry in ``FEATURES``.
``Run`` (``run.<name>``), ``run.to_html``, the demo, display and ``ish.watch`` walk
this list; none of them names a feature. Adding a feature adds a folder and a line
here: nothing in ``cluster/run.py`` or ``report.py`` changes.

Entries name their parts as ``"module:attribute"`` strings, imported on first use,
so that importing the package (or writing a report) imports no widget library, and
no feature folder imports another through this list.

An entry's parts:

* ``events``: ``"module:EVENTS"``, a tuple of the msgspec Structs of the events its
  model reads, one per kind (``KIND``); ``kinds`` derives from it, and
  ``tools/gen_event_docs.py`` writes them all into ``docs/events.md``.
* ``model``: ``Model(store)``; it consumes the store's new events in ``update()``.
* ``figures``: a pure function ``model -> list[go.Figure]`` for the report (a figure
  module: plotly only, no ipywidgets).
* ``view``: ``View(model)`` with a lazily built ``.widget``; what display shows.
* ``summary``: a pure function ``model -> str``: the view in a few plain lines, which a
  front end without a widget manager shows (with the first of ``figures``) in place of
  the widget (``ui/fallback.py``).
* ``fake``: ``"module:sample"``, ``sample(iterations) -> list[Event]``: a synthetic
  2-rank run of its events, exactly as its probe emits them (``<folder>/fake.py``); the
  display tests, ``bench_views.py``, the wheel test and the demo's offline sections walk
  the list and call it, so a new feature is tested and measured by its entry alone.
* ``rank_start``: ``"module:function"`` that every rank a ``Cluster`` starts calls once,
  right after its process group exists and before any user code (the collective log:
  DDP's construction-time sync happens before ``ish.watch`` can see it). ``cluster/``
  names no feature: it walks this list.
* ``job_start``: ``"module:function"`` that a rank of a job started without a Cluster
  (``ISH_RECORD`` / ``ISH_TELEMETRY`` set: torchrun, a scheduler) calls when it imports
  the package, before its first collective (the ledger turns torch's Flight Recorder on);
  its ``rank_start`` then runs at the first ``ish.watch``.
* ``probe``: ``"module"`` with ``fits(obj) -> bool``, ``OPTIONS`` (the keyword
  arguments it takes), ``WATCHES`` (what it can watch, in words) and
  ``attach(obj, **options)`` returning a handle with ``detach()``; ``ish.watch``
  attaches every probe whose ``fits`` accepts the object.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any


def load(ref: str) -> Any:
    """Import ``"package.module:attribute"`` (or a whole module when there is no colon)."""
    module, _, attribute = ref.partition(":")
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


@dataclass(frozen=True)
class Feature:
    """One view of a run: its events, model, report figures, widget and probe."""

    name: str  # the Run attribute: run.<name>
    title: str  # the report section's heading
    model: str
    view: str
    figures: str
    events: str | None = None  # "module:EVENTS": the event Structs its model reads
    probe: str | None = None
    summary: str | None = None  # "module:function": model -> str, the view in plain words
    fake: str | None = None  # "module:sample": sample(iterations) -> events of a 2-rank run
    rank_start: str | None = None  # "module:function" each rank runs once its group exists
    job_start: str | None = None  # "module:function" a job's rank runs at import (see below)
    always: bool = False  # in the report even when none of its kinds was recorded

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"Feature name {self.name!r} must be a Python identifier")

    def event_types(self) -> tuple[Any, ...]:
        """The event Structs its model reads (imported on first use)."""
        return tuple(load(self.events)) if self.events else ()

    @functools.cached_property
    def kinds(self) -> frozenset[str]:
        """The event kinds its model reads: the ``KIND`` of each of its ``events``."""
        return frozenset(event.KIND for event in self.event_types())

    def build_model(self, store: Any) -> Any:
        return load(self.model)(store)

    def view_of(self, model: Any) -> Any:
        return load(self.view)(model)

    def report_figures(self, model: Any) -> list[Any]:
        return list(load(self.figures)(model))

    def summary_of(self, model: Any) -> str:
        """The view in plain words (its ``summary``; empty without one)."""
        return str(load(self.summary)(model)) if self.summary else ""

    def sample(self, iterations: int | None = None) -> list[Any]:
        """Its synthetic 2-rank run (``fake``): events as its probe emits them, no ranks;
        ``iterations``: how long (the sample's own default when None)."""
        if self.fake is None:
            raise LookupError(f"feature {self.name!r} has no synthetic run (Feature.fake)")
        make = load(self.fake)
        return list(make() if iterations is None else make(iterations))

    def recorded_in(self, store: Any) -> bool:
        """Whether the store holds anything this feature reads."""
        return self.always or any(store.of_kind(kind) for kind in self.kinds)


FEATURES: tuple[Feature, ...] = (
    Feature(
        name="monitor",
        title="Scalars",
        model="interactive_shard.monitor.model:MonitorModel",
        view="interactive_shard.monitor.view:MonitorView",
        summary="interactive_shard.monitor.summary:summary",
        fake="interactive_shard.monitor.fake:sample",
        figures="interactive_shard.monitor.figures:report_figures",
        events="interactive_shard.telemetry.run_events:EVENTS",
        always=True,
    ),
    Feature(
        name="buckets",
        title="DDP gradient buckets",
        model="interactive_shard.buckets.model:BucketMap",
        view="interactive_shard.buckets.view:BucketMapView",
        summary="interactive_shard.buckets.summary:summary",
        fake="interactive_shard.buckets.fake:sample",
        figures="interactive_shard.buckets.figures_timeline:report_figures",
        events="interactive_shard.buckets.events:EVENTS",
        probe="interactive_shard.buckets.probe",
        rank_start="interactive_shard.probing.collective_log:start",  # DDP's own iterations
        job_start="interactive_shard.probing.collective_log:start",
    ),
    Feature(
        name="splits",
        title="torch.compile graph splits (DDPOptimizer)",
        model="interactive_shard.splits.model:SplitsModel",
        view="interactive_shard.splits.view:SplitsView",
        summary="interactive_shard.splits.summary:summary",
        fake="interactive_shard.splits.fake:sample",
        figures="interactive_shard.splits.figures:report_figures",
        events="interactive_shard.splits.events:EVENTS",
        probe="interactive_shard.splits.probe",
    ),
    Feature(
        name="precision",
        title="Mixed precision per unit (FSDP2, FSDP1, DDP)",
        model="interactive_shard.precision.model:PrecisionModel",
        view="interactive_shard.precision.view:PrecisionView",
        summary="interactive_shard.precision.summary:summary",
        fake="interactive_shard.precision.fake:sample",
        figures="interactive_shard.precision.figures:report_figures",
        events="interactive_shard.precision.events:EVENTS",
        probe="interactive_shard.precision.probe",
    ),
    Feature(
        name="timeline",
        title="Hook order and overlap timeline",
        model="interactive_shard.timeline.model:TimelineModel",
        view="interactive_shard.timeline.view:TimelineView",
        summary="interactive_shard.timeline.summary:summary",
        fake="interactive_shard.timeline.fake:sample",
        figures="interactive_shard.timeline.figures:report_figures",
        events="interactive_shard.timeline.events:EVENTS",
        probe="interactive_shard.timeline.probe",
    ),
    Feature(
        name="ddp",
        title="DDP lifecycle",
        model="interactive_shard.ddp.model:LifecycleModel",
        view="interactive_shard.ddp.view:LifecycleView",
        summary="interactive_shard.ddp.summary:summary",
        fake="interactive_shard.ddp.fake:sample",
        figures="interactive_shard.ddp.figures:report_figures",
        events="interactive_shard.ddp.events:EVENTS",
        probe="interactive_shard.ddp.probe",
        rank_start="interactive_shard.probing.collective_log:start",  # construction syncs
        job_start="interactive_shard.probing.collective_log:start",
    ),
    Feature(
        name="collectives",
        title="Collective ledger (divergence and hangs)",
        model="interactive_shard.collectives.model:CollectivesModel",
        view="interactive_shard.collectives.view:CollectivesView",
        summary="interactive_shard.collectives.summary:summary",
        fake="interactive_shard.collectives.fake:sample",
        figures="interactive_shard.collectives.figures:report_figures",
        events="interactive_shard.collectives.events:EVENTS",
        rank_start="interactive_shard.collectives.recorder:start",  # every collective, no watch
        job_start="interactive_shard.collectives.recorder:prepare",
    ),
    Feature(
        name="overhead",
        title="Probe overhead: share of the step, per probe and rank",
        model="interactive_shard.overhead.model:OverheadModel",
        view="interactive_shard.overhead.view:OverheadView",
        summary="interactive_shard.overhead.summary:summary",
        fake="interactive_shard.overhead.fake:sample",
        figures="interactive_shard.overhead.figures:report_figures",
        events="interactive_shard.overhead.events:EVENTS",
    ),
)


def start_on_rank() -> None:
    """Run every feature's ``rank_start`` once on this rank (each is idempotent): a
    Cluster's rank right after its process group exists, a torchrun rank at ``ish.watch``."""
    for ref in dict.fromkeys(f.rank_start for f in FEATURES if f.rank_start):
        load(ref)()


def start_job_rank() -> None:
    """Run every feature's ``job_start`` (at import, in a rank of a job)."""
    for ref in dict.fromkeys(f.job_start for f in FEATURES if f.job_start):
        load(ref)()


def feature(name: str) -> Feature:
    for f in FEATURES:
        if f.name == name:
            return f
    raise KeyError(f"no feature {name!r}; features are {[f.name for f in FEATURES]}")


def feature_of_view(view: object) -> Feature:
    """The feature whose view class ``view`` is an instance of (for its static fallback)."""
    for f in FEATURES:
        module, _, cls = f.view.partition(":")
        if any(t.__module__ == module and t.__name__ == cls for t in type(view).__mro__):
            return f
    raise LookupError(f"{type(view).__qualname__} is not the view of any feature")


def feature_of_model(model: object) -> Feature:
    """The feature whose model class ``model`` is an instance of (for display)."""
    for f in FEATURES:
        module, _, cls = f.model.partition(":")
        if type(model).__module__ == module and type(model).__name__ == cls:
            return f
    raise LookupError(f"{type(model).__qualname__} is not the model of any feature")
