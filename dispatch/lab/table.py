"""Bench results -> the router's timing table (capability_db/measured/<gpu>.json).

Every problem's backends that agreed with the oracle become one row (bucket + GPU ms per backend
+ host us per eager call per backend, where the bench measured it); each backend's efficiency
(achieved / peak bandwidth on decode rows, achieved / peak FLOP/s on prefill rows: the best of
its rows) and launch floor (its fastest call) feed the cost model of buckets nobody measured.
The table's host time per (backend, entry point) is the median of its rows' (``bench
--host-cost`` JSONs given beside the bench JSONs take precedence: their figures are measured on
purpose, per entry x backend x size). Peaks come from capability_db.measured.GPU_PEAKS (vendor
datasheets) by GPU name; the file is measured/<gpu key>.json (an H200 run: h200.json).
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Optional

import torch

import capability_db
from capability_db.measured import (GPU_PEAKS, MEASURED_DIR, Bucket, Efficiency, FittedTimes, TimingRow, TimingTable,
                                    Tree, features, gpu_key, gpu_peaks, pair_row)

from ..choice import plans_per_call
from ..problem import AttentionProblem, DeviceDesc, size_class
from .problems import CUDNN, RAGGED, SINGLE, SINGLE_LSE, TRTLLM, XQA, BenchProblem


def recorded_problem(result: dict) -> BenchProblem:
    """The bench problem one result of a bench JSON recorded (its JSON holds ``backends`` as a list)."""
    return BenchProblem(**{**result["problem"], "backends": tuple(result["problem"].get("backends", ()))})


def sweep_device(environment: dict) -> DeviceDesc:
    """The DeviceDesc a bench JSON's environment names (its GPU and capability): what a replay
    decides for, off the GPU."""
    major, minor = divmod(int(environment["capability"].removeprefix("sm_")), 10)
    return capability_db.device_for_capability(major, minor, environment["gpu"])


def entry_of(bench_entry: str) -> str:
    """The AttentionProblem's entry name: wrappers without '.run'; the LSE variant is single prefill."""
    name = bench_entry.removesuffix(".run")
    return "single_prefill_with_kv_cache" if name == SINGLE_LSE else name


def problem_of(p: BenchProblem) -> AttentionProblem:
    """The AttentionProblem the entry point builds for the bench problem's call."""
    storage = "dense" if p.entry in (SINGLE, SINGLE_LSE) else ("ragged" if p.entry == RAGGED else "paged")
    return AttentionProblem(
        entry=entry_of(p.entry), phase="decode" if p.decode or p.entry == XQA else "prefill", kv_storage=storage,
        kv_layout="HND" if p.entry == CUDNN else p.kv_layout, num_qo_heads=p.num_qo_heads, num_kv_heads=p.num_kv_heads,
        head_dim_qk=p.head_dim, head_dim_vo=p.head_dim, q_dtype=p.dtype, kv_dtype=p.kv_type, out_dtype=p.dtype,
        page_size=p.page_size if storage == "paged" else 0, causal=p.causal or p.entry == XQA,
        window_left=p.window_left, logits_soft_cap=p.soft_cap, has_sinks=p.sinks,
        mask="custom" if p.custom_mask else "none",
        return_lse=p.lse or p.entry == SINGLE_LSE or (p.entry in (CUDNN, TRTLLM) and p.lse),
        sizes=size_class(p.batch, p.q_len, p.kv_len))


def bucket_of(p: BenchProblem) -> Bucket:
    return Bucket(entry=entry_of(p.entry), phase="decode" if p.decode else "prefill", batch=p.batch,
                  q_len=p.q_len, kv_len=p.kv_len, gqa_group=p.num_qo_heads // p.num_kv_heads,
                  head_dim_qk=p.head_dim, head_dim_vo=p.head_dim, q_dtype=p.dtype, kv_dtype=p.kv_type,
                  causal=p.causal, window=p.window_left >= 0, soft_cap=p.soft_cap > 0, sinks=p.sinks,
                  num_kv_heads=p.num_kv_heads)


def peaks(gpu: str) -> tuple[float, float]:
    """(HBM TB/s, dense bf16 TFLOP/s) of a GPU by name."""
    known = gpu_peaks(gpu)
    if known is None:
        raise ValueError(f"no peak figures for GPU {gpu!r}; known: {', '.join(p.key for _, p in GPU_PEAKS)} "
                         "(capability_db/measured.py GPU_PEAKS)")
    return known.tb_per_s, known.tflops


def harness_failed(result: dict) -> bool:
    """A side-by-side row with a candidate missing for a failure, not a declared limit: a backend
    that raised, or a vendor that failed while planning (a JIT build, say). The choice reads a
    backend absent from a complete row as one that could not serve it (choice.UNMEASURED_BEHIND);
    such a row is kept with ``complete=False`` and never used that way (the H200's sweep A: fa3's
    modules failed to build)."""
    return any(b["status"] == "error" or (b["status"] == "refused" and "at plan time" in b.get("note", ""))
               for b in result["backends"] if b["backend"] not in NOT_BACKENDS)


NOT_BACKENDS = ("auto", "flashinfer")  # bench columns that are not a backend the router can choose


def build_table(results: dict, source: str) -> TimingTable:
    env = results["environment"]
    if not env.get("gpu"):
        raise ValueError(f"{source}: a CPU run; timing tables are per GPU")
    bw_peak, fl_peak = peaks(env["gpu"])
    rows, eff, seen = [], {}, []
    for r in results["results"]:
        if "backends" not in r:
            continue
        p = recorded_problem(r)
        ms = {b["backend"]: round(b["eager_ms"], 5) for b in r["backends"]  # ours only: not auto, not FlashInfer's
              if b["backend"] not in NOT_BACKENDS and b["status"] == "ok" and b.get("eager_ms")}
        host = {b["backend"]: b["host_us"] for b in r["backends"]
                if b["backend"] in ms and b.get("host_us")}
        if r.get("auto") and r.get("auto_ms") and r["auto"] not in ms:  # a backend only auto ran (the grid
            ms[r["auto"]] = round(r["auto_ms"], 5)  # forces fa3 at d128 only, to bound its JIT compiles)
            auto = next((b for b in r["backends"] if b["backend"] == "auto"), {})
            if auto.get("host_us"):
                host[r["auto"]] = auto["host_us"]
        if not ms:
            continue
        rows.append(TimingRow(bucket=bucket_of(p), ms=ms, source=f"{r.get(FROM, source)}: {r['name']}", host_us=host,
                              complete=not harness_failed(r)))
        for name, t in ms.items():
            kind, peak = ("bandwidth", bw_peak) if p.decode else ("compute", fl_peak)
            e = eff.setdefault(name, {"bandwidth": 0.0, "compute": 0.0})
            e[kind] = max(e[kind], r["work"] / (t * 1e-3) / 1e12 / peak)
            seen.append((name, kind, peak, r["work"], t))
    # launch floor: the least time a call took beyond its work at the backend's best rate
    floor: dict[str, float] = {}
    for name, kind, peak, amount, t in seen:
        beyond_us = t * 1e3 - amount / (eff[name][kind] * peak * 1e12) * 1e6
        floor[name] = min(floor.get(name, 50.0), max(2.0, beyond_us))
    efficiency = {n: Efficiency(bandwidth=round(e["bandwidth"] or 0.05, 3), compute=round(e["compute"] or 0.05, 3),
                                launch_us=round(floor[n], 1), source=source)
                  for n, e in eff.items()}
    return TimingTable(gpu=env["gpu"], sm=int(env["capability"].removeprefix("sm_")), source=source,
                       environment={k: str(v) for k, v in env.items()}, peak_tb_per_s=bw_peak, peak_tflops=fl_peak,
                       efficiency=efficiency, rows=rows, host_us=host_table(rows, results.get("host_cost", [])),
                       fitted=fit_times(results["results"], source))


RIDGE = 0.1  # the fit's penalty on coefficients (intercept aside): chosen by tools/crossval_choice.py
MIN_FIT_ROWS = 8  # a backend timed on fewer problems is not fitted (its rows and the cost model serve)
# The trees correcting the linear fits (``FittedTimes.trees``), gradient-boosted on their errors:
# scikit-learn's GradientBoostingRegressor with these settings. Session 9's exploration on the H200's
# sweeps A-H chose 300 trees of depth 5 at rate 0.1 (76% within 3% against the linear fit's 75%). On A-N
# (1642 problems, tools/crossval_choice.py, 5 folds) more and deeper trees did better, by graph choice within 3%:
# 300 x depth 5, rate 0.1: 1225 (75%); huber loss: 1235; 600 x 6, rate 0.05: 1246; 800 x 7: 1265 (77%);
# 800 x 7, leaves of 5: 1260; 1200 x 8: 1273 (78%). Kept 800 x 7: a decision per size class walked the trees in
# Python, 3.5 ms for six backends on a 2-core CPU against 1.1 ms for 300 x 5 (tools/results/fit-trees-cost-cpu-s13.md;
# NOTES-h200-sweeps.md, session 13); walked at once (measured.PackedTrees) since session 14, 1.5-2.7 ms
# (fit-trees-cost-cpu-s14.md). Only over MIN_TREE_SAMPLES timed (problem, backend) pairs: trees fitted
# on a few dozen would learn their noise. Since session 18 each split is drawn from half the features: on
# A-R (2297 problems) the graph choice within 3% on 1886 and 1894 (two seeds of the draw) against 1873 with
# all of them, 1882 with 0.3 of them; the eager choice within noise (NOTES-h200-sweeps.md, session 18).
TREES = {"n_estimators": 800, "learning_rate": 0.05, "max_depth": 7, "min_samples_leaf": 10, "max_features": 0.5}
MIN_TREE_SAMPLES = 400


def fit_times(results: list[dict], source: str, ridge: float = RIDGE) -> Optional[FittedTimes]:
    """Per backend, a ridge regression of log2 GPU ms on ``features`` over every problem it was
    timed on, through any entry point but those where it plans per call (capability data
    ``plans_per_call``: its times there hold host syncs); then the trees that correct its errors
    (``fit_trees``)."""
    samples = fit_samples(results)
    names = list(dict.fromkeys(k for rows in samples.values() for values, _ in rows for k in values))
    coef, counts = {}, {}
    for name, rows in sorted(samples.items()):
        if len(rows) < MIN_FIT_ROWS:
            continue
        x = torch.tensor([[values.get(k, 0.0) for k in names] for values, _ in rows], dtype=torch.float64)
        y = torch.tensor([t for _, t in rows], dtype=torch.float64)
        penalty = torch.full((len(names),), ridge, dtype=torch.float64)
        penalty[names.index("one")] = 0.0
        solved = torch.linalg.solve(x.T @ x + torch.diag(penalty), x.T @ y)
        coef[name], counts[name] = [round(float(c), 6) for c in solved], len(rows)
    if not coef:
        return None
    linear = FittedTimes(names=names, coef=coef, rows=counts, ridge=ridge, source=f"ridge fit over {source}")
    corrected = fit_trees(linear, {name: rows for name, rows in samples.items() if name in coef}, source)
    return fit_pairs(corrected, problem_samples(results), source)


def fit_samples(results: list[dict]) -> dict[str, list[tuple[dict[str, float], float]]]:
    """backend -> (features, log2 GPU ms) of every problem it was timed on, but through the entry
    points where it plans per call."""
    samples: dict[str, list[tuple[dict[str, float], float]]] = {}
    for values, times in problem_samples(results):
        for name, log2_ms in times.items():
            samples.setdefault(name, []).append((values, log2_ms))
    return samples


def problem_samples(results: list[dict]) -> list[tuple[dict[str, float], dict[str, float]]]:
    """Per measured problem: its features, and backend -> log2 GPU ms of the backends timed there,
    but through the entry points where they plan per call."""
    out = []
    for r in results:
        if "backends" not in r:
            continue
        p = recorded_problem(r)
        problem = problem_of(p)
        values = features(problem, (p.batch, p.q_len, p.kv_len))
        out.append((values, {b["backend"]: math.log2(b["eager_ms"]) for b in r["backends"]
                             if b["backend"] not in NOT_BACKENDS and b["status"] == "ok" and b.get("eager_ms")
                             and problem.entry not in plans_per_call(b["backend"])}))
    return out


def fit_trees(linear: FittedTimes, samples: dict[str, list[tuple[dict[str, float], float]]],
              source: str) -> FittedTimes:
    """``linear`` with boosted trees fitted to its errors over every (problem, backend) pair, the
    backend a 0/1 feature; ``linear`` unchanged where the pairs are too few or scikit-learn (the
    ``bench`` extra) is not installed (the source says which)."""
    pairs = sum(len(rows) for rows in samples.values())
    if pairs < MIN_TREE_SAMPLES:
        return linear
    try:
        from sklearn.ensemble import GradientBoostingRegressor
    except ImportError:
        return linear.model_copy(update={"source": f"{linear.source} (no tree correction: scikit-learn, the "
                                                   "bench extra, is not installed)"})
    columns = linear.names + [f"backend {name}" for name in sorted(samples)]
    x, y = [], []
    for name, rows in sorted(samples.items()):
        for values, log2_ms in rows:
            x.append([values.get(k, float(k == f"backend {name}")) for k in columns])
            y.append(log2_ms - linear.log2_ms(name, values))
    trees = trees_of(GradientBoostingRegressor(init="zero", random_state=0, **TREES).fit(x, y))
    return linear.model_copy(update={"trees": trees, "tree_features": columns, "source":
                                     f"ridge fit + {len(trees)} boosted trees on its errors over {source}"})


# The pairwise model (``FittedTimes.pair_trees``): scikit-learn's HistGradientBoostingRegressor with these
# settings, on every ordered pair of backends timed on one problem. Chosen on the H200's sweeps A-R (2297
# problems, 5 folds, graph choice within 3%): 500 trees, early stopping on, 1924 (83.8%); 1000, unbounded
# depth, 1931; 1000 of depth 7, 1931 (84.1%), the eager choice 1787 against 1761 without the model; rate
# 0.05, leaves of 20. NOTES-h200-sweeps.md, session 22.
PAIR_TREES = {"max_iter": 1000, "learning_rate": 0.05, "max_depth": 7, "max_leaf_nodes": 63, "min_samples_leaf": 20,
              "early_stopping": False, "random_state": 0}


def fit_pairs(fit: FittedTimes, problems: list[tuple[dict[str, float], dict[str, float]]],
              source: str) -> FittedTimes:
    """``fit`` with the pairwise model: boosted trees of log2(a's ms / b's) over each problem's
    ordered pairs of fitted backends (features, ``first <a>``, ``second <b>``); ``fit`` unchanged
    where the pairs are too few or scikit-learn is not installed."""
    backends = sorted(fit.coef)
    columns = fit.names + [f"first {b}" for b in backends] + [f"second {b}" for b in backends]
    x, y = [], []
    for values, times in problems:
        timed = [b for b in times if b in fit.coef]
        for a in timed:
            for b in timed:
                if a != b:
                    x.append(pair_row(columns, values, a, b))
                    y.append(times[a] - times[b])
    if len(x) < MIN_TREE_SAMPLES:
        return fit
    try:
        from sklearn.ensemble import HistGradientBoostingRegressor
    except ImportError:
        return fit.model_copy(update={"pair_source": "none: scikit-learn, the bench extra, is not installed"})
    boosted = HistGradientBoostingRegressor(**PAIR_TREES).fit(x, y)
    return fit.model_copy(update={"pair_trees": hist_trees_of(boosted), "pair_features": columns, "pair_source":
                                  f"{boosted.n_iter_} boosted trees of log2 time ratios over {len(x)} ordered pairs "
                                  f"of {source}"})


def hist_trees_of(boosted) -> list[Tree]:
    """A fitted HistGradientBoostingRegressor as plain trees whose leaves hold their share (the
    learning rate applied, as that library stores them). Its nodes are not public API: a test checks
    the walk against its ``predict``. The constant it starts from is left out: the pairwise
    estimate takes differences of the predictions, where it cancels."""
    out = []
    for (predictor,) in boosted._predictors:
        nodes = predictor.nodes
        leaf = nodes["is_leaf"].astype(bool)
        out.append(Tree(feature=[int(f) for f in nodes["feature_idx"]],
                        threshold=[float(t) for t in nodes["num_threshold"]],
                        left=[-1 if e else int(n) for e, n in zip(leaf, nodes["left"])],
                        right=[-1 if e else int(n) for e, n in zip(leaf, nodes["right"])],
                        value=[round(float(v), 9) if e else 0.0 for e, v in zip(leaf, nodes["value"])]))
    return out


def trees_of(boosted) -> list[Tree]:
    """A fitted scikit-learn GradientBoostingRegressor (``init="zero"``) as plain trees whose leaves
    hold their share of the prediction (the learning rate applied): the sum of ``Tree.leaf`` over
    them is its ``predict``. A leaf's feature (-2 there) becomes 0: it is never read."""
    rate = boosted.learning_rate
    return [Tree(feature=[max(int(f), 0) for f in t.feature], threshold=[float(v) for v in t.threshold],
                 left=[int(n) for n in t.children_left], right=[int(n) for n in t.children_right],
                 value=[round(float(v) * rate, 9) for v in t.value[:, 0, 0]])
            for t in (estimator.tree_ for estimator in boosted.estimators_[:, 0])]


def host_table(rows: list[TimingRow], host_cost_rows: list[dict]) -> dict[str, dict[str, float]]:
    """backend -> entry point -> host us per eager call: the median of the rows', then the host-cost
    runs' on top: the least over their sizes, for a matrix cell times back-to-back calls, which on
    a kernel-bound size (decode 64 x 4096, prefill 8 x 2048) is the GPU's time, not the host's. Where
    the backend plans (and syncs) on every call through the entry point, the least of the rows': each
    call's host time there waits for the last call's kernels, so beyond the smallest problems it holds
    their GPU time (the H100's sweeps: fa3 through the cuDNN entry, 1.1 ms at 20 us of work, 28.4 ms at
    28.9 ms of GPU time; NOTES-h200-sweeps.md, session 23)."""
    seen: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        for name, us in row.host_us.items():
            seen.setdefault((name, row.bucket.entry), []).append(us)
    seen = {(name, entry): [min(values)] if entry in plans_per_call(name) else values
            for (name, entry), values in seen.items()}
    measured: dict[tuple[str, str], list[float]] = {}
    for r in host_cost_rows:  # bench --host-cost --matrix rows: entry, backend, size, host_us
        if r.get("host_us") and r.get("backend") and r["backend"] not in NOT_BACKENDS:
            measured.setdefault((r["backend"], entry_of(r["entry"])), []).append(r["host_us"])
    seen.update({key: [min(values)] for key, values in measured.items()})
    out: dict[str, dict[str, float]] = {}
    for (name, entry), values in sorted(seen.items()):
        out.setdefault(name, {})[entry] = round(statistics.median(values), 2)
    return out


FROM = "from_file"  # a merged result's own file(s): its row's source, not the list of every file merged


def seed_of(source: str) -> str:
    """The random seed in a sweep file's name (``bench-random-N-seed-S[-GPU][-from-K].json``, as
    ``bench --random`` names it), else the name itself."""
    return source.split("-seed-")[1].split("-")[0] if "-seed-" in source else source


def merged(paths: list[Path]) -> tuple[dict, str]:
    """Several bench results of one GPU as one: the first file's environment, every measured
    problem (a backend measured again in a later file takes the later time; the backends a later
    file did not run keep their earlier times; a recheck, which runs no auto, leaves the problem its
    earlier summary: auto's choice then), each naming the file(s) it came from (``FROM``)."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    for run, path in zip(runs, paths):
        for r in run.get("results", ()):
            r[FROM] = Path(path).name
    host_cost = [row for run in runs if "matrix" in run for row in run["matrix"]]  # bench --host-cost --matrix
    gpus = {r["environment"].get("gpu") for r in runs}
    runs = [run for run in runs if "results" in run]
    if not runs:
        raise ValueError(f"{', '.join(map(str, paths))}: no bench results (host-cost runs only add host times)")
    if len(gpus) > 1:
        raise ValueError(f"results from different GPUs cannot make one table: {sorted(map(str, gpus))}")
    by_name: dict[str, dict] = {}
    for run in runs:
        for r in run["results"]:
            before = by_name.get(r["name"])
            if "backends" in r and before is not None and "backends" in before:
                # per backend: a re-run of some backends (a recheck's short list) keeps the others' times
                backends = {b["backend"]: b for b in before["backends"]}
                backends.update({b["backend"]: b for b in r["backends"]})
                rechecked = all(b["backend"] != "auto" for b in r["backends"])
                files = " + ".join(dict.fromkeys([before[FROM], r[FROM]]))
                r = {**(before if rechecked else r), "backends": list(backends.values()), FROM: files}
            if "backends" in r or before is None:
                by_name[r["name"]] = r
    return {"environment": runs[0]["environment"], "results": list(by_name.values()), "host_cost": host_cost}, \
        " + ".join(Path(p).name for p in paths)


def write_from_results(results_paths, out: Optional[Path] = None) -> Path:
    paths = [results_paths] if isinstance(results_paths, (str, Path)) else list(results_paths)
    table = build_table(*merged(paths))
    out = out or MEASURED_DIR / f"{gpu_key(table.gpu) or table.gpu.split()[-1].lower()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table.model_dump(), indent=1) + "\n")
    return out
