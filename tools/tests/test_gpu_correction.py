"""tools/gpu_correction.py: a correction of the fit's GPU times learned from one GPU's own sweeps,
judged by replaying the router's choice (ranked by the fit) on the problems held out."""
from __future__ import annotations

import json
from pathlib import Path

from tools import gpu_correction
from tools.lab import replay, table
from tools.tables.estimate import ranking_by_the_fit

# the header and first 6 measured problems of an H100 random sweep (seed 1161395444)
SWEEP = Path(__file__).parent / "data" / "bench-random-150-seed-1161395444-h100-first-6.json"


def test_gpu_correction_holds_out_one_seed_at_a_time():
    """``seed`` mode: each seed's problems are judged by a correction learned from the other seeds'
    (the seed read from the file each problem came from, merged files included)."""
    rows = [{"name": f"p{i}", table.FROM: name} for i, name in enumerate([
        "bench-random-150-seed-11-h100.json", "bench-random-150-seed-22-h100-from-5.json",
        "bench-random-150-seed-11-h100-from-37.json + bench-random-150-seed-11-h100-from-48.json"])]
    pairs = gpu_correction.splits(rows, "seed")
    assert [[r["name"] for r in test] for _, test in pairs] == [["p0", "p2"], ["p1"]]
    assert [[r["name"] for r in train] for train, _ in pairs] == [["p1"], ["p0", "p2"]]
    assert sorted(len(test) for _, test in gpu_correction.splits(rows * 4, "kfold")) == [2, 2, 2, 3, 3]


def test_gpu_correction_replays_the_graph_and_the_eager_choice_through_its_patch():
    """``replayed``: its patch of ``estimate.fitted_times`` takes what the fit's ranking passes (an
    eager call's ``eager`` too); with no correction it replays the fit's choice unchanged, and a
    correction that slows the chosen backends down moves the choice."""
    results = json.loads(SWEEP.read_text())
    test = [r for r in results["results"] if "backends" in r]
    assert len(test) == 6
    with ranking_by_the_fit():
        plain = replay.replay({**results, "results": test})
    corrected = gpu_correction.replayed(results, test, lambda backend, problem, values: 0.0)
    assert [(r["chosen"], r["eager_chosen"]) for r in corrected] == [(r["chosen"], r["eager_chosen"]) for r in plain]
    first = {r["chosen"] for r in plain}
    slowed = gpu_correction.replayed(results, test, lambda backend, problem, values: 10.0 * (backend in first))
    assert any(r["chosen"] != p["chosen"] for r, p in zip(slowed, plain))
