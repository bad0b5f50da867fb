"""``probing.attachment.Attachment``: the one attach/detach base every probe's handle uses."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
import pytest

from interactive_shard.probing import attachment
from interactive_shard.probing.attachment import Attachment
from interactive_shard.telemetry import rank


class Watched(msgspec.Struct, frozen=True):
    KIND: ClassVar[str] = "test_watch"
    name: str


class Toy(Attachment):
    kind = "toy probe"

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log
        self.held = 0

    def describe(self) -> str:
        return "2 things"

    def send(self) -> None:
        self.log.append(f"send {self.held}")
        self.held = 0


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any], int | None]]:
    out: list[tuple[str, dict[str, Any], int | None]] = []
    monkeypatch.setattr(
        rank, "emit", lambda kind, payload, step=None: out.append((kind, payload, step))
    )
    return out


def test_detach_undoes_newest_first_once_even_when_a_step_fails() -> None:
    log: list[str] = []
    probe = Toy(log)

    def fails() -> None:
        log.append("undo b")
        raise RuntimeError("b")

    probe.undo += [lambda: log.append("undo a"), fails, lambda: log.append("undo c")]
    probe.detach()
    assert log == ["send 0", "undo c", "undo b", "undo a"]  # a still undone after b failed
    assert not probe.attached and probe.undo == []
    probe.detach()  # twice: nothing more
    assert log == ["send 0", "undo c", "undo b", "undo a"]


def test_installing_takes_off_what_was_installed_when_it_fails() -> None:
    log: list[str] = []
    probe = Toy(log)
    with pytest.raises(ValueError, match="half way"), probe.installing():
        probe.undo.append(lambda: log.append("undo hook"))
        raise ValueError("half way")
    assert log == ["send 0", "undo hook"] and not probe.attached


def test_repr_counts_and_names_the_state() -> None:
    probe = Toy([])
    assert repr(probe) == "Toy(2 things, iteration=0, attached)"
    probe.title = "ToyProbe"
    probe.iteration = 3
    probe.detach()
    assert repr(probe) == "ToyProbe(2 things, iteration=3, detached)"
    assert repr(Attachment()) == "Attachment(iteration=0, attached)"


def test_watch_event_goes_out_now_and_again_in_a_new_run(
    sent: list[tuple[str, dict[str, Any], int | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    probe = Toy(log)
    probe.watching(Watched(name="m"))
    assert sent == [("test_watch", {"name": "m"}, None)] and probe.emitted == 1
    assert probe.begin_forward() is None  # what a forward pre-hook returns must be None
    assert probe.iteration == 1 and len(sent) == 1  # same run: not announced again
    monkeypatch.setattr(attachment, "current_run", lambda: 2)  # a new cluster.run
    probe.held = 5
    assert probe.begin_iteration()
    assert log == ["send 0", "send 5"] and probe.iteration == 2
    assert sent[-1] == ("test_watch", {"name": "m"}, None) and probe.emitted == 2
    assert probe.in_announced_run()
    probe.emit(Watched(name="x"), step=4)
    assert sent[-1] == ("test_watch", {"name": "x"}, 4)
    probe.detach()
    assert not probe.begin_iteration() and probe.iteration == 2  # detached: nothing
