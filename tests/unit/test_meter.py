"""A probe's own cost on the rank side: ``telemetry.meter.Meter``, the process's meters
per feature, ``Attachment.timed`` / ``report_cost`` and the channel's ``sending``."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
from support import wait_for

from interactive_shard.probing.attachment import Attachment
from interactive_shard.telemetry import Collector, Emitter, meter, rank
from interactive_shard.telemetry.meter import Meter
from interactive_shard.telemetry.run_events import Overhead
from interactive_shard.telemetry.schema import Batch


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_nested_blocks_count_once_and_the_span_runs_first_to_last() -> None:
    m = Meter()
    assert m.active == 0.0 and m.overhead("x") is None  # nothing measured: nothing said
    with m:
        _busy(0.002)
        with m:  # a hook that calls another timed method
            _busy(0.002)
    assert m.calls == 1 and 0.004 <= m.spent < 0.05
    time.sleep(0.01)  # between callbacks: in the span, not spent
    with m:
        _busy(0.001)
    assert m.calls == 2 and m.active >= m.spent + 0.01
    assert m.overhead("buckets", iterations=3) == Overhead(
        probe="buckets", spent_s=m.spent, active_s=m.active, calls=2, iterations=3
    )


def test_add_counts_a_wrappers_own_parts_only() -> None:
    m = Meter()
    start = time.perf_counter()
    _busy(0.002)  # the wrapped real call: not the wrapper's
    m.add(0.0005, start=start)
    assert m.spent == 0.0005 and m.calls == 1 and m.first == start and m.active >= 0.002
    m.add(0.0005)
    assert m.spent == 0.001 and m.calls == 2


def test_restart_counts_from_zero_a_block_in_progress_from_its_start() -> None:
    m = Meter()
    with m:
        _busy(0.001)
    m.__enter__()  # another thread's callback, running while the run changes
    m.restart()
    assert m.spent == 0.0 and m.calls == 0 and m.first is not None
    m.__exit__(None, None, None)
    assert m.calls == 1 and m.active == pytest.approx(m.spent)
    m.restart()
    assert m.first is None and m.active == 0.0


def test_a_steady_meter_spans_from_its_start_to_now() -> None:
    """A background thread runs the whole run: one flush in a second is not 100% busy."""
    m = Meter(steady=True)
    with m:
        _busy(0.001)
    time.sleep(0.05)
    assert m.active >= 0.05 and m.spent / m.active < 0.2
    m.restart()
    assert m.calls == 0 and m.first is not None and m.active < 0.05


def test_due_at_most_once_a_second_and_only_with_something_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(meter, "_clock", lambda: now[0])
    m = Meter()
    now[0] += 5
    assert not m.due()  # nothing measured
    with m:
        now[0] += 0.001
    assert m.due() and not m.due()  # said: not again within REPORT_S
    now[0] += meter.REPORT_S
    assert m.due()


def test_the_process_has_one_meter_per_probe_and_restarts_them_all() -> None:
    a, b = meter.of("test-meter-a"), meter.of("test-meter-b", steady=True)
    assert meter.of("test-meter-a") is a and b.steady
    with a:
        pass
    meter.restart_all()
    assert a.calls == 0 and a.first is None and b.first is not None


class _Probe(Attachment):
    feature = "test-probe"

    def __init__(self) -> None:
        super().__init__()
        self.meter.restart()

    def hook(self, fail: bool = False) -> str:
        _busy(0.001)
        if fail:
            raise RuntimeError("a probe bug")
        return "done"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(rank, "emit", lambda kind, payload, step=None: out.append((kind, payload)))
    return out


def test_timed_hooks_are_guarded_and_count_to_the_features_meter(
    sent: list[tuple[str, dict[str, Any]]],
) -> None:
    probe, other = _Probe(), _Probe()
    assert probe.meter is other.meter is meter.of("test-probe")  # one row per feature
    hook = probe.timed(probe.hook)
    assert hook() == "done" and hook(fail=True) is None  # a bug never breaks the step
    assert probe.meter.calls == 2 and probe.meter.spent >= 0.002
    probe.report_cost()  # not due yet: at most once a second
    assert sent == []
    probe.detach()  # an explicit send: said now, not counted in emitted
    kind, payload = sent[-1]
    said = msgspec.convert(payload, Overhead)
    assert kind == Overhead.KIND and said.probe == "test-probe" and said.calls == 2
    assert probe.emitted == 0
    assert Attachment.feature == ""  # the base: a probe without a name says nothing


def test_emitter_says_what_its_background_flushes_cost() -> None:
    received: list[Batch] = []
    collector = Collector(received.append)
    emitter = Emitter(collector.address, collector.token, rank=0, flush_interval=0.005)
    try:
        emitter.emit("scalar", {"name": "x", "value": 1.0})
        wait_for(lambda: emitter.sending.calls >= 1)  # a background flush sent it
        emitter.flush()  # an explicit flush says it
        wait_for(lambda: any(e.kind == Overhead.KIND for b in received for e in b.events))
        said = [e for b in received for e in b.events if e.kind == Overhead.KIND]
        record = msgspec.convert(said[-1].payload, Overhead)
        assert record.probe == "sending" and record.calls >= 1 and record.spent_s > 0
        assert 0 < record.spent_s < record.active_s  # steady: from its start to the flush
        emitter.start_run(5)  # each run counts from zero
        assert emitter.sending.calls == 0
    finally:
        emitter.close()
        collector.close()
