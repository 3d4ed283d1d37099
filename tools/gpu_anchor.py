"""The anchor workloads (bf16, 32/8 heads, d128, pages of 16), every backend side by side: a thin
wrapper of ``attn-dispatch bench`` (dispatch/bench/) over the paged wrapper's entry point.

    python tools/gpu_anchor.py [OUT_DIR]     # writes bench-anchor-cuda.json + .md (+ PNG)
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: dispatch

from dispatch import bench  # noqa: E402

ANCHORS = [
    {"entry": "paged", "batch": 64, "q_len": 1, "kv_len": 4096},
    {"entry": "paged", "batch": 8, "q_len": 2048, "kv_len": 2048, "causal": True},
    {"entry": "paged", "batch": 1, "q_len": 1, "kv_len": 131072},
    {"entry": "paged", "batch": 4, "q_len": 1, "kv_len": 32768},
    {"entry": "paged", "batch": 64, "q_len": 1, "kv_len": 4096, "window_left": 1023, "soft_cap": 30.0, "sinks": True},
]


def main(argv: list[str]) -> int:
    out = argv[0] if argv else "tools/results"
    with tempfile.TemporaryDirectory() as tmp:
        problems = Path(tmp) / "anchor.json"
        problems.write_text(json.dumps(ANCHORS))
        return bench.main(["--problems", str(problems), "--out", out])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
