"""tools/trace_vs_table.py on a committed H200 trace run: the steps are redrawn from the run's seed
(the trace's own per-step key counts must match) and each side's GPU time is read against the table."""
from __future__ import annotations

from pathlib import Path

from tools import trace_vs_table

RUN = Path(__file__).resolve().parents[2] / "docs" / "data" / "trace-h200-seed-1624534694.json.gz"


def test_a_committed_run_is_read_against_the_table_at_both_lengths():
    [(seed, ratios)] = trace_vs_table.run_ratios(str(RUN), "h200").items()
    assert seed == 1624534694
    assert set(ratios) == {"ours native-triton longest", "ours native-triton mean", "flashinfer xqa longest",
                           "flashinfer xqa mean", "measured ours / flashinfer"}
    # at the mean length every expected time is shorter, so every measured / expected ratio is larger
    assert ratios["ours native-triton mean"] > ratios["ours native-triton longest"] > 0
    assert ratios["flashinfer xqa mean"] > ratios["flashinfer xqa longest"] > 0
