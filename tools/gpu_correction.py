"""Would a correction learned from one GPU's own sweeps improve the table it ranks by (another GPU's,
scaled)? The fit of the H200's timing table, scaled to the H100, is what the H100's choice table is
compiled from (tools/tables/measured.py, tools/tables/compile.py). Here a
correction of that table's fitted GPU times, log2(measured / estimated), is learned from part of the
GPU's sweeps and the choice replayed on the rest: 5 folds (``kfold``), or one seed held out at a time
(``seed``). The corrections (``KINDS``): ``none`` (the table as it is), ``median`` (one factor per
backend), ``median-phase`` (per backend and decode/prefill), ``median-entry`` (per backend, phase and
entry point), ``trees-s``/``trees-m`` (boosted trees, 100 of depth 3 / 300 of depth 4, over the fit's
features and the backend; scikit-learn, the bench extra). An experiment, not part of the
choice: the router ranks by the fit while it replays (``ranking_by_the_fit``), its
``estimate.fitted_times`` patched.

    python -m tools.gpu_correction FILES.txt kfold none median trees-s > OUT.md
"""
from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from pathlib import Path
from typing import Callable
from unittest import mock

from dispatch.benchmark.report import regret_figures
from tools.lab import replay, table
from tools.lab.figures import ratio_figures
from tools.tables import estimate, measured
from tools.tables.estimate import ranking_by_the_fit
from tools.tables.measured import features

TABLE = measured.MEASURED_DIR / "h200.json.gz"  # the fit the H100's choice table is compiled from, scaled
TREES = {"trees-s": (100, 3), "trees-m": (300, 4)}  # trees, depth
KEYS = {"median": lambda name, problem: (name,),
        "median-phase": lambda name, problem: (name, problem.phase),
        "median-entry": lambda name, problem: (name, problem.phase, problem.entry)}
KINDS = ["none", *KEYS, *TREES]
MIN_SAMPLES = 5  # a median of fewer is left out (no correction)

Correction = Callable[[str, object, dict], float]  # (backend, problem, features) -> log2 factor


def residuals(rows: list[dict], scaled: measured.TimingTable) -> list[tuple[str, object, dict, float]]:
    """(backend, problem, features, log2(measured / the scaled table's fitted estimate)) per timed pair."""
    out = []
    for r in rows:
        p = table.recorded_problem(r)
        problem, sizes = table.problem_of(p), (p.batch, p.q_len, p.kv_len)
        values = features(problem, sizes)
        for b in r["backends"]:
            if b["backend"] in table.NOT_BACKENDS or b.get("status") != "ok" or not b.get("eager_ms"):
                continue
            expected = estimate.fitted_ms(scaled, b["backend"], problem, sizes)
            if expected is not None:
                out.append((b["backend"], problem, values, math.log2(b["eager_ms"] / expected)))
    return out


def learn(kind: str, train: list[dict], scaled: measured.TimingTable) -> Correction:
    if kind == "none":
        return lambda name, problem, values: 0.0
    samples = residuals(train, scaled)
    if kind in KEYS:
        key, groups = KEYS[kind], {}
        for name, problem, _, error in samples:
            groups.setdefault(key(name, problem), []).append(error)
        medians = {k: statistics.median(v) for k, v in groups.items() if len(v) >= MIN_SAMPLES}
        return lambda name, problem, values: medians.get(key(name, problem), 0.0)
    from sklearn.ensemble import GradientBoostingRegressor
    names = sorted({k for _, _, values, _ in samples for k in values})
    backends = sorted({name for name, *_ in samples})

    def row(name: str, values: dict) -> list[float]:
        return [values.get(k, 0.0) for k in names] + [float(name == b) for b in backends]
    count, depth = TREES[kind]
    trees = GradientBoostingRegressor(n_estimators=count, max_depth=depth, learning_rate=0.05, min_samples_leaf=10,
                                      subsample=0.8, random_state=0)
    trees.fit([row(name, values) for name, _, values, _ in samples], [error for *_, error in samples])
    return lambda name, problem, values: float(trees.predict([row(name, values)])[0])


def replayed(results: dict, test: list[dict], correction: Correction) -> list[dict]:
    """The choice for ``test``'s problems ranked by the fit (of the timing tables in force), its
    fitted times corrected."""
    fitted_times = estimate.fitted_times

    def corrected(tbl, problem, sizes, eager=False):
        values = features(problem, sizes)
        return {b: ms * 2 ** correction(b, problem, values)
                for b, ms in fitted_times(tbl, problem, sizes, eager).items()}
    with mock.patch.object(estimate, "fitted_times", corrected), ranking_by_the_fit():
        return replay.replay({**results, "results": test})


def splits(rows: list[dict], mode: str) -> list[tuple[list[dict], list[dict]]]:
    """(train, test) pairs: 5 interleaved folds, or each seed's problems against the others'."""
    if mode == "kfold":
        parts = [rows[i::5] for i in range(5)]
    else:
        by_seed: dict[str, list[dict]] = {}
        for r in rows:
            by_seed.setdefault(r[table.FROM].split("-seed-")[1].split("-")[0], []).append(r)
        parts = list(by_seed.values())
    return [([r for j, part in enumerate(parts) if j != i for r in part], test) for i, test in enumerate(parts)]


def line(label: str, rows: list[dict]) -> str:
    graph, eager = regret_figures(rows), regret_figures(rows, "cost_regret")
    own, own_cost = ratio_figures(rows, "over_flashinfer"), ratio_figures(rows, "cost_over_flashinfer")
    return (f"- {label}: graph {graph['within_3pct']}/{graph['count']} ({graph['within_3pct'] / graph['count']:.0%}) "
            f"max {graph['max']:.0%}; eager {eager['within_3pct']}/{eager['count']} "
            f"({eager['within_3pct'] / eager['count']:.0%}); FI gpu {own['at_most_1_03']}/{own['count']} >1.10 "
            f"{own['above_1_10']}; cost {own_cost['at_most_1_03']}/{own_cost['count']} >1.10 {own_cost['above_1_10']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", type=Path, help="a text file naming the GPU's bench JSONs")
    ap.add_argument("mode", choices=["kfold", "seed"])
    ap.add_argument("kinds", nargs="+", choices=KINDS)
    args = ap.parse_args()
    results, source = table.merged([Path(p) for p in args.files.read_text().split()])
    rows = [r for r in results["results"] if "backends" in r]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / TABLE.name).symlink_to(TABLE.resolve())
        with ranking_by_the_fit(Path(tmp)):
            scaled = measured.table_for(table.sweep_device(results["environment"]))
            print(f"Sources: {source}; the table: {scaled.scaling}; mode {args.mode}\n")
            for kind in args.kinds:
                out = [r for train, test in splits(rows, args.mode)
                       for r in replayed(results, test, learn(kind, train, scaled))]
                print(line(f"{args.mode}:{kind}", out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
