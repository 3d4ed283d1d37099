"""The timer of the tools/ scripts is the package's (dispatch/timing.py): one timing helper."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: dispatch

from dispatch.timing import SPIN_CYCLES_PER_US, time_ms  # noqa: E402

__all__ = ["SPIN_CYCLES_PER_US", "time_ms"]
