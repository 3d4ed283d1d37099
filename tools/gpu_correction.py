"""Would a correction learned from one GPU's own sweeps improve the table it ranks by (another GPU's,
scaled)? The H100 ranks by the H200's fitted table scaled to it (capability_db/measured.py). Here a
correction of that table's fitted GPU times, log2(measured / estimated), is learned from part of the
H100's sweeps and the choice replayed on the rest (5 folds, or one seed held out at a time):
``none`` (the table as it is), ``median`` (one factor per backend), ``median-phase`` (per backend and
decode/prefill), ``median-entry`` (per backend, phase and entry point), ``trees-s``/``trees-m``
(boosted trees of 100 x depth 3 / 300 x depth 4 over the fit's features and the backend). An
experiment (session 21), not part of the choice: it patches ``choice.fitted_ms``.

    python tools/gpu_correction.py FILES_LIST.txt kfold|seed KIND... > OUT.md
"""
import math
import statistics
import sys
import tempfile
from pathlib import Path
from unittest import mock
from capability_db import measured
from capability_db.measured import features
from dispatch import router, choice
from dispatch.lab import replay, table
from dispatch.lab.report import regret_figures, ratio_figures

import sys as _sys
paths = [Path(p) for p in open(_sys.argv[1]).read().split()]
results, source = table.merged(paths)
rows_all = [r for r in results["results"] if "backends" in r]
device = table.sweep_device(results["environment"])
H200 = Path('capability_db/measured/h200.json').resolve()  # the table the H100 ranks by
tmp = tempfile.mkdtemp(); (Path(tmp) / 'h200.json').symlink_to(H200)
measured.MEASURED_DIR = Path(tmp); measured.forget(); router.clear_caches()
scaled = measured.table_for(device)
orig = choice.fitted_ms
NOT = ("auto", "flashinfer")

def samples(rows):
    out = []
    for r in rows:
        p = table.recorded_problem(r); prob = table.problem_of(p); sz = (p.batch, p.q_len, p.kv_len)
        f = features(prob, sz)
        for b in r["backends"]:
            n = b["backend"]
            if n in NOT or b.get("status") != "ok" or not b.get("eager_ms"): continue
            est = orig(scaled, n, prob, sz)
            if est is None: continue
            out.append((n, prob, f, math.log2(b["eager_ms"]) - math.log2(est)))
    return out

def fit(kind, train):
    s = samples(train)
    if kind == "none": return lambda n, prob, f: 0.0
    if kind.startswith("median"):
        by = {}
        for n, prob, f, res in s:
            key = (n, prob.phase) if kind == "median-phase" else (n, prob.phase, prob.entry) if kind == "median-entry" else (n,)
            by.setdefault(key, []).append(res)
        med = {k: statistics.median(v) for k, v in by.items() if len(v) >= 5}
        shrink = 1.0
        def corr(n, prob, f):
            key = (n, prob.phase) if kind == "median-phase" else (n, prob.phase, prob.entry) if kind == "median-entry" else (n,)
            return shrink * med.get(key, 0.0)
        return corr
    from sklearn.ensemble import GradientBoostingRegressor
    names = sorted({k for _, _, f, _ in s for k in f}); backs = sorted({n for n, *_ in s})
    X = [[f.get(k, 0.0) for k in names] + [float(n == b) for b in backs] for n, _, f, _ in s]
    y = [res for *_, res in s]
    ne, depth = {"trees-s": (100, 3), "trees-m": (300, 4), "trees-l": (600, 5)}[kind]
    g = GradientBoostingRegressor(n_estimators=ne, max_depth=depth, learning_rate=0.05, min_samples_leaf=10, subsample=0.8, random_state=0).fit(X, y)
    def corr(n, prob, f):
        return float(g.predict([[f.get(k, 0.0) for k in names] + [float(n == b) for b in backs]])[0])
    return corr

def run(kind, parts_train, test_rows):
    corr = fit(kind, parts_train)
    def patched(tbl, backend, problem, sizes):
        ms = orig(tbl, backend, problem, sizes)
        if ms is None: return None
        return ms * 2 ** corr(backend, problem, features(problem, sizes))
    with mock.patch.object(choice, "fitted_ms", patched):
        router.clear_caches()
        out = replay.replay({**results, "results": test_rows})
    router.clear_caches()
    return out

def report(kind, rows):
    g, e = regret_figures(rows), regret_figures(rows, "cost_regret")
    o, oc = ratio_figures(rows, "over_flashinfer"), ratio_figures(rows, "cost_over_flashinfer")
    print(f"- {kind}: graph {g['within_3pct']}/{g['count']} ({g['within_3pct']/g['count']:.0%}) max {g['max']:.0%}; eager {e['within_3pct']}/{e['count']} ({e['within_3pct']/e['count']:.0%}); "
          f"FI gpu {o['at_most_1_03']}/{o['count']} >1.10 {o['above_1_10']}; cost {oc['at_most_1_03']}/{oc['count']} >1.10 {oc['above_1_10']}", flush=True)

mode = sys.argv[2]
print(f'Sources: {source}; the table: {scaled.scaling}; mode {mode}\n')
for kind in sys.argv[3:]:
    if mode == "kfold":
        k = 5; parts = [rows_all[i::k] for i in range(k)]
        rows = [x for i in range(k) for x in run(kind, [r for j, p in enumerate(parts) if j != i for r in p], parts[i])]
    else:  # by seed: hold one seed out
        seeds = {}
        for r in rows_all: seeds.setdefault(r[table.FROM].split('-h100')[0], []).append(r)
        rows = [x for s, test in seeds.items() for x in run(kind, [r for t, v in seeds.items() if t != s for r in v], test)]
    report(f"{mode}:{kind}", rows)
