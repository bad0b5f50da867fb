"""A 64-rank event stream into one kernel through the real wire, live views refreshing:
none lost, and the findings across ranks name the faulty ranks.

A short version of ``python benchmarks/bench_wide.py`` (300 iterations, 4 workers);
both share ``benchmarks/_wide.py``. The workers host the ranks without torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # benchmarks/ is not a package: its scripts import _wide

import _wide  # noqa: E402


@pytest.mark.timeout(120)
def test_64_ranks_stream_into_one_kernel_and_findings_name_the_ranks() -> None:
    result = _wide.stream(world_size=64, iterations=20, workers=2, idle_ticks=2)
    assert result["torch_in_workers"] is False
    assert result["lost"] == {}, result["lost"]
    assert result["dropped"] == 0
    assert result["stored"] == result["events"] > 64 * 20 * 5
    faults = _wide.Faults.spread(64, 20)
    findings = result["findings"]
    assert findings["buckets"]["divergence"] == [(10, [faults.diverged], [_wide.DIVERGED_FQN])]
    assert findings["timeline"]["stragglers"] == [faults.straggler]
    assert findings["ddp"]["unfinished_iterations"] == 20
    assert findings["ddp"]["unfinished_all_ranks"] is True
    assert findings["ddp"]["forward_without_backward"] == [(6, [faults.dropped])]
    assert findings["splits"]["nothing"] == [faults.nothing]
    assert ("full_precision", "1", [faults.full_precision]) in findings["precision"]["findings"]
    assert all(f["ok"] for f in findings.values()), findings
    # Every view was refreshed while the ranks streamed and after, with nothing new, and
    # none raised (ui.live would only log it): ranks keep appearing during a refresh.
    for name, row in result["refresh"].items():
        assert row["errors"] == [], (name, row["errors"])
        assert row["streaming"]["n"] >= 1, name
        assert row["idle"]["n"] == 2, name
