"""``ish.watch``: options go to the probes that declare them, all probes attach or none."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

import interactive_shard as ish
from interactive_shard import watching
from interactive_shard.features import Feature


class Handle:
    def __init__(self, log: list[str], name: str, options: dict[str, Any]) -> None:
        self.log, self.name, self.options = log, name, options
        self.iteration = 7

    def detach(self) -> None:
        self.log.append(f"detach {self.name}")

    def __repr__(self) -> str:
        return f"Handle({self.name})"


def fake_probe(name: str, log: list[str], fits: type, options: set[str], fail: bool = False) -> str:
    """Register a probe module ``name`` that watches instances of ``fits``."""
    module = ModuleType(f"fake_probes.{name}")
    module.OPTIONS = frozenset(options)  # type: ignore[attr-defined]
    module.WATCHES = f"{fits.__name__} objects"  # type: ignore[attr-defined]
    module.fits = lambda obj: isinstance(obj, fits)  # type: ignore[attr-defined]

    def attach(obj: object, **opts: Any) -> Handle:
        if fail:
            raise RuntimeError(f"{name} cannot attach")
        log.append(f"attach {name} {sorted(opts.items())}")
        return Handle(log, name, opts)

    module.attach = attach  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    return module.__name__


class Model:
    pass


class Compiled(Model):
    pass


Install = Callable[..., list[str]]


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Install:
    """Two fake features: ``a`` watches any Model, ``b`` only a Compiled one; returns
    the list their probes log attach and detach calls to."""

    def features(fail_b: bool = False) -> list[str]:
        calls: list[str] = []
        probes = (
            ("a", fake_probe("a", calls, Model, {"alpha", "shared"})),
            ("b", fake_probe("b", calls, Compiled, {"beta"}, fail=fail_b)),
        )
        found = tuple(
            Feature(name=n, title=n, model="m:M", view="m:V", figures="m:f", probe=p)
            for n, p in probes
        )
        monkeypatch.setattr(watching, "FEATURES", found)
        return calls

    return features


def test_ish_watch_is_the_watching_verb() -> None:
    assert ish.watch is watching.watch


def test_each_probe_gets_the_options_it_declares(install: Install) -> None:
    log = install()
    handle = ish.watch(Compiled(), alpha=1, beta=2)
    assert log == ["attach a [('alpha', 1)]", "attach b [('beta', 2)]"]
    assert list(handle.probes) == ["a", "b"] and handle.iteration == 7
    assert repr(handle) == "Watch(a=Handle(a), b=Handle(b))"
    handle.detach()
    assert log[-2:] == ["detach a", "detach b"]


def test_one_probe_is_the_handle_itself_in_repr_and_attributes(install: Install) -> None:
    install()
    handle = ish.watch(Model(), shared="x")
    assert repr(handle) == "Handle(a)" and handle.options == {"shared": "x"}
    with pytest.raises(AttributeError, match="no probe of this Watch has it"):
        handle.nothing  # noqa: B018


def test_unknown_option_lists_the_options_and_their_probes(install: Install) -> None:
    log = install()
    with pytest.raises(
        TypeError, match=r"unknown option\(s\) \['gamma'\].*alpha \(a\).*beta \(b\)"
    ):
        ish.watch(Model(), gamma=1)
    assert log == []


def test_an_option_of_a_probe_that_does_not_fit_is_refused(install: Install) -> None:
    log = install()
    with pytest.raises(TypeError, match=r"\['beta'\] belong to the \['b'\] probe"):
        ish.watch(Model(), beta=1)
    assert log == []


def test_an_unwatchable_object_is_told_what_can_be_watched(install: Install) -> None:
    log = install()
    with pytest.raises(TypeError, match=r"cannot watch a builtins\.str") as info:
        ish.watch("a string")
    assert "a: Model objects; b: Compiled objects" in str(info.value)
    assert log == []


def test_attach_is_all_or_nothing(install: Install) -> None:
    log = install(fail_b=True)
    with pytest.raises(RuntimeError, match="b cannot attach"):
        ish.watch(Compiled())
    assert log == ["attach a []", "detach a"]  # the one that attached is detached again
