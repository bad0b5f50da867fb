"""``ish.watch(obj, **options)``: the one call a user makes in rank code.

It walks the feature list (``features.FEATURES``), attaches every probe whose
``fits(obj)`` accepts the object, hands each probe the options it declares, and
returns one ``Watch`` handle. A user never needs to know which probe modules exist.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from interactive_shard.features import FEATURES, Feature, load, start_on_rank
from interactive_shard.telemetry import rank as telemetry


class Watch:
    """What ``ish.watch`` returns: the probes it attached, detached together.

    ``watch.probes`` maps feature name -> probe handle. Attributes a probe has
    (``.iteration`` of the bucket probe, ``.ddp``) are readable on the handle too.
    """

    def __init__(self, obj: object, probes: dict[str, Any]) -> None:
        self.obj = obj
        self.probes = probes

    def detach(self) -> None:
        """Remove every probe's hooks; the watched object works on as before."""
        for probe in self.probes.values():
            probe.detach()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        for probe in self.__dict__.get("probes", {}).values():
            if hasattr(probe, name):
                return getattr(probe, name)
        raise AttributeError(
            f"{name!r}: no probe of this Watch has it (probes: {list(self.probes)})"
        )

    def __repr__(self) -> str:
        if len(self.probes) == 1:
            return repr(next(iter(self.probes.values())))
        inner = ", ".join(f"{name}={probe!r}" for name, probe in self.probes.items())
        return f"Watch({inner})"


def _start_recorders() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # else: one process, no collectives
        start_on_rank()


def _probes() -> list[tuple[Feature, ModuleType]]:
    return [(f, load(f.probe)) for f in FEATURES if f.probe]


def _declined(probes: list[tuple[Feature, ModuleType]], option: str, value: Any) -> bool:
    """``timeline=False``: an opt-in switched off, consumed here."""
    return not value and any(getattr(p, "OPT_IN", None) == option for _, p in probes)


def watch(obj: object, **options: Any) -> Watch:
    """Attach every probe that applies to ``obj`` on this rank; see each feature's probe.

    Call it on every rank, after wrapping (``DistributedDataParallel(model)``), before
    the first step to record. Options go to the probes that declare them, e.g.
    ``comm_hook=``, ``state=``, ``checksum=`` of the DDP bucket probe; ``timeline=True``
    (with ``depth=``) adds the timeline probe.

    In a script started by ``torchrun`` (no Cluster), the environment says where events
    go: ``ISH_RECORD=DIR`` records each rank to its own file (``ish.load(DIR)``),
    ``ISH_TELEMETRY`` / ``ISH_TOKEN`` stream to ``ish.listen``; the first ``watch``
    connects and starts what a Cluster's rank starts with its process group (the
    collective ledger). With neither set, the probes attach and send nothing.
    """
    if telemetry.emitter() is None and telemetry.from_env() is not None:
        _start_recorders()
    probes = _probes()
    known = {name: f.name for f, p in probes for name in p.OPTIONS}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(
            f"ish.watch got unknown option(s) {unknown}; it takes "
            f"{', '.join(f'{o} ({f})' for o, f in sorted(known.items()))}"
        )
    # A probe with OPT_IN (the timeline's "timeline") attaches only when asked for.
    fitting = [
        (f, p)
        for f, p in probes
        if p.fits(obj) and (not getattr(p, "OPT_IN", None) or options.get(p.OPT_IN))
    ]
    options = {k: v for k, v in options.items() if not _declined(probes, k, v)}
    opt_in = {o: p.OPT_IN for _, p in probes if getattr(p, "OPT_IN", None) for o in p.OPTIONS}
    off = sorted(o for o in options if o in opt_in and not options.get(opt_in[o]))
    if off:
        switches = sorted({f"{opt_in[o]}=True" for o in off})
        raise TypeError(f"ish.watch: option(s) {off} need {' and '.join(switches)}")
    if not fitting:
        what = "; ".join(f"{f.name}: {p.WATCHES}" for f, p in probes)
        raise TypeError(
            f"ish.watch cannot watch a {type(obj).__module__}.{type(obj).__qualname__}. "
            f"It watches: {what}. Wrap your model first and pass the wrapper."
        )
    taken = {name for _, p in fitting for name in p.OPTIONS}
    stray = sorted(set(options) - taken)
    if stray:
        raise TypeError(
            f"ish.watch: option(s) {stray} belong to the {sorted({known[o] for o in stray})} "
            f"probe, which does not apply to a {type(obj).__qualname__}"
        )
    attached: dict[str, Any] = {}
    try:
        for f, p in fitting:
            mine = {k: v for k, v in options.items() if k in p.OPTIONS}
            attached[f.name] = p.attach(obj, **mine)
    except BaseException:
        for probe in attached.values():  # all or nothing
            probe.detach()
        raise
    return Watch(obj, attached)
