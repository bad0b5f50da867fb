"""Names from a run reach plotly as text, never as markup (``ui/text.py``): a scalar,
module or parameter named like a link or a styled span shows as itself in every figure
of every feature, and the report holds no live link from it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support import make_store

from interactive_shard import features, testing
from interactive_shard.cluster.run import Run
from interactive_shard.monitor.view import MonitorView
from interactive_shard.telemetry import Event
from interactive_shard.telemetry.run_events import Overhead
from interactive_shard.telemetry.schema import record_event

LINK = '<a href="https://example.com">x</a>'
HOSTILE = f'{LINK}<span style="color:red">y</span>'
SHOWN = '&lt;a href="https://example.com"&gt;x&lt;/a&gt;'  # as plotly shows it, literally
SHOWN_ALL = SHOWN + '&lt;span style="color:red"&gt;y&lt;/span&gt;'


def _renamed(value: Any, old: str, new: str) -> Any:
    """``value`` with ``old`` replaced by ``new`` in every string and key."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_renamed(v, old, new) for v in value]
    if isinstance(value, dict):
        return {_renamed(k, old, new): _renamed(v, old, new) for k, v in value.items()}
    return value


def _unit(u: testing.FakeUnit) -> testing.FakeUnit:
    """Unit "1" of ``mp_net`` named ``HOSTILE`` (and its parameters), of a hostile class."""

    def name(n: str) -> str:
        return HOSTILE + n[1:] if n == "1" or n.startswith("1.") else n

    kind = HOSTILE if u.fqn == "1" else u.module_type
    return replace(u, fqn=name(u.fqn), body=tuple(map(name, u.body)),
                   params=tuple(map(name, u.params)), module_type=kind)  # fmt: skip


def _monitor() -> list[Event]:
    return [
        Event("scalar", r, s, 1000.0 + s, {"name": HOSTILE, "value": 0.5 * s})
        for r in (0, 1)
        for s in range(3)
    ]


def _buckets() -> list[Event]:
    params = [replace(p, module_type=HOSTILE) for p in testing.mlp_params(3, 16, prefix=HOSTILE)]
    return testing.FakeRun(
        params,
        bucket_cap_mb=0.001,
        delayed=[f"{HOSTILE}.1.weight"],
        delay_hook=f"{HOSTILE}.0.weight",
        diverge={2: [f"{HOSTILE}.2.weight"]},
    ).events()


def _splits() -> list[Event]:
    events = testing.FakeSplits(testing.mlp_graph(6, 256), bucket_cap_mb=1).events()
    for old in ("layers", "submod", "linear"):
        events = [Event(e.kind, e.rank, e.step, e.t, _renamed(e.payload, old, HOSTILE + old))
                  for e in events]  # fmt: skip
    return events


def _precision() -> list[Event]:
    policies = {"": testing.fsdp2_policy(), "1": testing.fsdp2_policy("bf16")}
    units = [_unit(u) for u in testing.mp_net(policies)]
    return testing.FakePrecision(units).events()


RUNS: dict[str, Callable[[], list[Event]]] = {
    "monitor": _monitor,
    "buckets": _buckets,
    "splits": _splits,
    "precision": _precision,
    "timeline": lambda: testing.FakeTimeline(units=[HOSTILE, f"{HOSTILE}.1"]).events(),
    "ddp": lambda: testing.FakeLifecycle(
        params=[f"{HOSTILE}.weight", f"{HOSTILE}.bias", "1.weight", "1.bias"],
        buffers=[f"{HOSTILE}.running_mean"],
        unused=[f"{HOSTILE}.bias"],
    ).events(),
    "overhead": lambda: [
        record_event(Overhead(probe=HOSTILE, spent_s=0.01, active_s=1.0), r, 1, 1000.0)
        for r in (0, 1)
    ],
}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)


def _markup_from_names(texts: list[str]) -> list[str]:
    """The texts in which the hostile names are markup (a link, a styled span)."""
    return [t for t in texts if "<a " in t or '<span style="' in t]


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_figure_shows_hostile_names_as_text(name: str) -> None:
    run = Run(make_store(RUNS[name]()))
    feature = features.feature(name)
    figures = feature.report_figures(run.model(name))
    assert figures
    texts = [t for fig in figures for t in _strings(json.loads(fig.to_json()))]
    assert _markup_from_names(texts) == []
    assert any(SHOWN in t for t in texts), f"no figure of {name} shows the hostile name"


def test_the_monitor_view_names_its_lines_as_the_figure_does() -> None:
    view = MonitorView(Run(make_store(_monitor())))
    assert view.widget is not None  # built: its figure drawn
    drawn = view._fig
    view.refresh()  # the same lines: updated in place, not rebuilt
    assert view._fig is drawn
    assert [t.name for t in drawn.data] == [f"{SHOWN_ALL} · rank 0", f"{SHOWN_ALL} · rank 1"]


def test_the_report_holds_no_live_link_from_a_name(tmp_path: Path) -> None:
    events = [e for make in RUNS.values() for e in make()]
    page = Run(make_store(events, name=HOSTILE)).to_html(tmp_path / "r.html").read_text()
    # The figures are JSON in the page, with < as \u003c: decode it as plotly.js will.
    data = re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), page)
    data = data.replace('\\"', '"')
    assert LINK not in data and '<span style="color:red">' not in data
    assert data.count(SHOWN) > len(RUNS)  # the names are there, as text
    for feature in features.FEATURES:  # each feature with a hostile run here
        assert feature.name not in RUNS or f"<h2>{feature.title}</h2>" in page
