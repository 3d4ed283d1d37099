"""``python -m tools.lab.host_cost --matrix`` on the CPU: every entry point x every backend that serves it
x the three sizes, host time per call recorded per cell, and the JSON ``python -m tools.lab.table`` reads."""
from __future__ import annotations

import json

from dispatch.benchmark.problems import ENTRY_NAMES, XQA
from tools.lab import host_cost


def test_matrix_covers_every_entry_backend_and_size(tmp_path):
    assert host_cost.main(["--matrix", "--device", "cpu", "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "host-cost-matrix-cpu.json").read_text())
    rows = rep["matrix"]
    sizes = set(host_cost.MATRIX_SIZES)
    for entry in ENTRY_NAMES:
        want = {"tiny", "decode 64 x 4096"} if entry == XQA else sizes  # xqa is decode only
        for size in want:
            cells = {r["backend"]: r for r in rows if r.get("entry") == entry and r["size"] == size}
            ok = {name for name, r in cells.items() if r["status"] == "ok"}
            assert {"native-triton", "reference", "auto"} <= ok, (entry, size, cells)
            assert all(cells[name]["host_us"] > 0 for name in ok)
            assert cells["flashinfer"]["status"] == "absent"
    assert any(r["status"] == "skipped" and "xqa" in r["note"] for r in rows)
    assert "| entry point | size | backend |" in (tmp_path / "host-cost-matrix-cpu.md").read_text()
