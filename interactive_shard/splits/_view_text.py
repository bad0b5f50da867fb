"""The graph-split view's HTML panels: the what-if plan, the selected partition, the status
and the differences (``SplitsView`` calls these with itself)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from interactive_shard.splits.figures import plan_for
from interactive_shard.splits.figures_lanes import DIFF, short_target
from interactive_shard.splits.plan import SplitPlanError
from interactive_shard.ui.format import nbytes

if TYPE_CHECKING:
    from interactive_shard.splits.view import SplitsView


def what_if_text(view: SplitsView) -> str:
    """The what-if plan in words (HTML): how many partitions, their bytes; or why not."""
    comp = view.compilation
    if comp is None:
        return ""
    try:
        plan = plan_for(view.model, view.rank, view._position(), **view._caps())
    except (SplitPlanError, LookupError) as err:
        return f"<span style='color:{DIFF}'><b>cannot plan:</b> {html.escape(str(err))}</span>"
    sizes = ", ".join(nbytes(p.nbytes) for p in plan.partitions)
    cap = f"cap {nbytes(plan.bucket_bytes_cap)} (first {nbytes(plan.first_bucket_bytes)})"
    head = "<b>what if</b> " if view.what_if else "at the compile's own "
    more, fewer = len(plan.partitions), len(comp.partitions)
    trade = (
        "more pieces: more all-reduce overlaps backward, more graph breaks"
        if more > fewer
        else "fewer pieces: fewer graph breaks, less overlap"
        if more < fewer
        else "as many pieces as captured"
    )
    return (
        f"{head}{cap}: <b>{more} partition(s)</b> [{sizes}] · captured {fewer} at cap "
        f"{nbytes(comp.bucket_bytes_cap)} · {trade}"
    )


def partition_text(view: SplitsView) -> str:
    comp, p = view.compilation, view.selected
    if comp is None or p is None:
        return ""
    fqns = ", ".join(f"<code>{html.escape(f)}</code>" for f in p.fqns) or "none"
    regions = "; ".join(html.escape(r.describe()) for r in p.regions) or "none"
    reason = comp.break_reasons[p.index] if p.index < len(comp.break_reasons) else ""
    calls = " → ".join(html.escape(short_target(c)) for c in p.calls)
    rows = [
        f"<b>{html.escape(p.name)}</b> (partition {p.index} of {len(comp.partitions)}) · "
        f"{nbytes(p.nbytes)} in {len(p.fqns)} parameter(s) · compiled by "
        f"<code>{html.escape(comp.backend)}</code> in {p.compile_s:.3g} s",
        f"<b>parameters</b> (as DDPOptimizer counted them): {fqns}",
        f"<b>inputs</b>: {html.escape(', '.join(p.inputs)) or 'none'} · <b>outputs</b>: "
        f"{html.escape(', '.join(p.outputs)) or 'none'}",
        f"<b>regions</b>: {regions}",
        f"<b>calls</b>: {calls or 'none'}",
    ]
    if p.extended:
        rows.append(f"{p.extended} node(s) added past the cap so the bucket has an output")
    if reason:
        rows.append(f"<b>compile reason</b>: {html.escape(reason)}")
    return "<br>".join(rows)


def status(view: SplitsView) -> str:
    ranks = view.model.ranks
    if not ranks:
        return "<i>Waiting for <code>ish.watch(torch.compile(ddp))</code> on the ranks…</i>"
    found = view.model.count(view.rank)
    nothing = view.model.nothing(view.rank)
    parts = [f"<b>rank {view.rank}</b>: {found} compile(s)"]
    comp = view.compilation
    if comp is None and view.index is not None:
        parts.append(
            f"<span style='color:{DIFF}'>compile at position {view.index} could not be "
            "read (malformed)</span>"
        )
    if comp is not None:
        parts.append(
            f"compile {comp.index}: {len(comp.partitions)} partition(s), backend "
            f"<code>{html.escape(comp.backend)}</code>, compiled in {comp.compile_s:.3g} s"
        )
    if nothing and not found:
        parts.append(f"<span style='color:{DIFF}'>nothing compiled: {html.escape(nothing)}</span>")
    if view.model.skipped:
        parts.append(f"{view.model.skipped} malformed event(s) skipped")
    return " · ".join(parts)


def differences_html(lines: list[str]) -> str:
    if not lines:
        return "<b>captured = planned</b>: every partition's parameters, bytes, calls and regions."
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f"<b style='color:{DIFF}'>{len(lines)} difference(s)</b><ul>{items}</ul>"
