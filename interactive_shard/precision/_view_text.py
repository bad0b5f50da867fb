"""The mixed-precision view's HTML panels: the selected unit, the findings, the status and
the note beside the iteration selector (``PrecisionView`` calls these with itself)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from interactive_shard.precision.analysis import describe_policy
from interactive_shard.precision.compare import Plan, differing_phases, short
from interactive_shard.precision.events import PHASES
from interactive_shard.precision.figures import DIFF, DTYPE_COLORS, dtype_class, planned_dtypes
from interactive_shard.precision.figures_bytes import LEVEL_COLORS, fix_text
from interactive_shard.ui.format import nbytes

if TYPE_CHECKING:
    from interactive_shard.precision.view import PrecisionView

MAX_FINDINGS = 30  # listed in the widget; all are in PrecisionModel.findings
MAX_FAILED = 20  # failed iterations named next to the iteration selector


def unit_text(view: PrecisionView) -> str:
    """The selected unit in HTML: policy, dtypes per phase (planned next to observed),
    inputs cast or passed through, collectives with dtype and bytes."""
    fqn = view.unit
    u = None if fqn is None else view.model.unit(fqn, rank=view.rank)
    if u is None:
        return ""
    r, it = view.rank, view.iteration
    observed = view.model.observed(u.fqn, rank=r, iteration=it)
    planned = planned_dtypes(view.plan).get(u.fqn)
    differ = set(differing_phases(planned, observed)) if planned is not None else set()
    head = (
        f"<b>{html.escape(u.fqn or 'root')}</b> ({html.escape(u.module_type)}) · parent "
        f"{html.escape(_name(u.parent))} · {len(u.params)} parameter(s), {u.numel:,} elements "
        f"stored in {html.escape(short(', '.join(dict.fromkeys(u.param_dtypes))) or '—')}"
        f"<br><b>policy</b>: <code>{html.escape(describe_policy(u.policy))}</code>"
    )
    rows = "".join(
        f"<tr><td>{p}</td>"
        + (f"<td>{_chip(planned.get(p))}</td>" if planned is not None else "")
        + f"<td>{_chip(observed.get(p), p in differ)}</td></tr>"
        for p in PHASES
    )
    plan_head = "<th>planned</th>" if planned is not None else ""
    table = (
        f"<table><tr><th>phase</th>{plan_head}<th>observed (rank {r}, iteration {it})</th>"
        f"</tr>{rows}</table>"
    )
    inputs = view.model.inputs(u.fqn, rank=r, iteration=it)
    ins = "".join(
        f"<li>input {i}: {_chip(b)} → {_chip(a)} · "
        + ("<b>cast</b>" if c else "passed through (the same tensor)")
        + "</li>"
        for i, (b, a, c) in enumerate(inputs)
    )
    found = view.model.collectives(u.fqn, rank=r, iteration=it)
    colls = "".join(
        f"<tr><td>{c.op}</td><td>{'backward' if c.backward else 'forward'}</td>"
        f"<td>{_chip(c.dtype)}</td><td>{nbytes(c.nbytes)}</td></tr>"
        for c in found
    )
    parts = [head, table]
    parts.append(f"<b>inputs</b><ul>{ins}</ul>" if ins else "<b>inputs</b>: none seen")
    parts.append(
        "<b>collectives</b> (bytes this rank sent)<table><tr><th>op</th><th>when</th>"
        f"<th>dtype</th><th>bytes</th></tr>{colls}</table>"
        if colls
        else "<b>collectives</b>: none seen"
    )
    failed = [f for f in view.model.failures if f.rank == r and f.unit == u.fqn]
    for f in failed:
        parts.append(
            f"<span style='color:{DIFF}'><b>failed</b> in iteration {f.iteration}, in "
            f"<code>{html.escape(f.consumer)}</code>: {html.escape(f.message)}</span>"
        )
    return "<br>".join(parts)


def findings_text(view: PrecisionView) -> str:
    """Observed failures and findings with their fixes, and the plan's predicted ones.

    On a long run, those of the iterations read so far: every rank's first and latest,
    the one shown and those that failed (``run.precision.findings`` reads them all)."""
    items = []
    m = view.model
    also = [(f.rank, f.iteration) for f in m.failures]
    for r in m.ranks:
        also += [(r, 1), (r, m.latest(r) or 1), (r, view.iteration)]
    findings = m.findings_read(also)
    for f in findings[:MAX_FINDINGS]:
        color = LEVEL_COLORS.get(f.level, "#999999")
        where = f"rank(s) {', '.join(map(str, f.ranks))}"
        items.append(
            f"<li><b style='color:{color}'>{f.level} · {f.kind}</b> at "
            f"<b>{html.escape(_name(f.unit))}</b> ({where}): {html.escape(f.message)}"
            f"<br><i>fix</i>: {html.escape(f.fix)}</li>"
        )
    if len(findings) > MAX_FINDINGS:
        items.append(
            f"<li>… {len(findings) - MAX_FINDINGS} more: see "
            "<code>run.precision.findings</code></li>"
        )
    plan = view.plan
    for p in plan.failures if plan is not None else ():
        items.append(
            f"<li><b style='color:{LEVEL_COLORS['planned']}'>predicted failure</b> at "
            f"<b>{html.escape(_name(p.unit))}</b>, in <code>{html.escape(p.consumer)}</code>:"
            f" {html.escape(p.message).replace(chr(10), '<br>')}<br><i>fix</i>: "
            f"{html.escape(getattr(p, 'fix_note', '') or '')} <code>"
            f"{html.escape(fix_text(getattr(p, 'fix', None)))}</code></li>"
        )
    total = sum(m.latest(r) or 0 for r in m.ranks)
    read = m.findings_count
    partial = (
        f" <i>(from {read:,} of {total:,} rank-iterations read: the first, latest, shown "
        "and failed ones; <code>run.precision.findings</code> reads them all)</i>"
        if read < total
        else ""
    )
    if not items:
        return f"<b>Findings:</b> none.{partial}"
    return f"<b>Findings: {len(items)}</b>{partial}<ul>{''.join(items)}</ul>"


def status(view: PrecisionView) -> str:
    ranks = view.model.ranks
    if not ranks:
        return (
            "<i>Waiting for <code>ish.watch(model)</code> on the ranks (an FSDP2 or FSDP1 "
            "root, or DDP with mixed_precision=)…</i>"
        )
    units = view.model.units(view.rank)
    parts = [
        f"<b>{view.model.wrapper(view.rank)}</b> · {len(units)} unit(s) · world size "
        f"{view.model.world_size} · {view.model.latest() or 0} iteration(s)"
    ]
    failed = view.model.failures
    if failed:
        parts.append(f"<span style='color:{DIFF}'>{len(failed)} failure(s)</span>")
    if view.plan is not None:
        n = len(view.differences())
        parts.append(
            f"<span style='color:{DIFF}'>{n} difference(s) from the plan</span>"
            if n
            else "observed = planned"
        )
    if view.model.skipped:
        parts.append(f"{view.model.skipped} malformed event(s) skipped")
    return " · ".join(parts)


def iteration_text(view: PrecisionView) -> str:
    """Next to the iteration selector: what 0 means, the range, the failed ones."""
    latest = view.model.latest(view.rank) or 0
    failed = sorted({f.iteration for f in view.model.failures if f.rank == view.rank})
    shown = ", ".join(map(str, failed[:MAX_FAILED])) + ("…" if len(failed) > MAX_FAILED else "")
    parts = [f"0 = latest ({latest})" if latest else "0 = latest (none yet)"]
    if failed:
        parts.append(f"<span style='color:{DIFF}'>failed: {shown}</span>")
    return " · ".join(parts)


def _name(fqn: str | None) -> str:
    return "—" if fqn is None else "root" if fqn == "" else fqn


def _chip(dtype: str | None, differs: bool = False) -> str:
    """A dtype as a coloured chip (HTML), outlined red when it differs from the plan."""
    if not dtype:
        return "<span style='color:#999'>—</span>"
    color = DTYPE_COLORS[dtype_class(dtype) or "other"]
    outline = f"outline:3px solid {DIFF};" if differs else ""
    return (
        f"<span style='background:{color};color:white;padding:1px 6px;border-radius:3px;"
        f"{outline}' title='{html.escape(dtype)}'>{html.escape(short(dtype))}</span>"
    )


def differences_html(lines: list[str], plan: Plan | None) -> str:
    if plan is None:
        return (
            "<i>No plan: <code>view.set_plan(ish.plan_precision(model, policies))</code> "
            "compares every unit and phase.</i>"
        )
    if not lines:
        return "<b>observed = planned</b>: every unit and phase both have, and the failures."
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f"<b style='color:{DIFF}'>{len(lines)} difference(s)</b><ul>{items}</ul>"
