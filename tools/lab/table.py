"""Bench results -> the timing table of one GPU (tools/tables/data/<gpu>.json.gz), what the choice tables compile from.

Every problem's backends that agreed with the oracle become one row (bucket + GPU ms per backend
+ host us per eager call per backend, where the bench measured it); each backend's efficiency
(achieved / peak bandwidth on decode rows, achieved / peak FLOP/s on prefill rows: the best of
its rows) and launch floor (its fastest call) feed the cost model of buckets nobody measured.
The table's host time per (backend, entry point) is the median of its rows' (host-cost matrix
JSONs, ``python -m tools.lab.host_cost --matrix``, given beside the bench JSONs take precedence:
their figures are measured on purpose, per entry x backend x size). Peaks come from
capability_db.choice_table.GPU_PEAKS (vendor datasheets) by GPU name; the file is tools/tables/data/<gpu key>.json.gz
(an H200 run: h200.json). The fit needs scikit-learn for its trees (without it, linear only). The router
reads none of this: ``python -m tools.tables.compile`` turns the fit into its tables (capability_db/tables).

    python -m tools.lab.table BENCH.json [BENCH.json ...] [--out FILE]
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

import capability_db
from dispatch.benchmark.problems import (CUDNN, RAGGED, SINGLE, SINGLE_LSE, TRTLLM, XQA, BenchProblem, entry_of,
                                   problem_of)
from dispatch.problem import DeviceDesc
from tools.tables.estimate import plans_per_call
from capability_db.choice_table import GPU_PEAKS
from tools.tables.measured import (MEASURED_DIR, Bucket, Efficiency, FittedTimes, TimingRow, TimingTable,
                                   Tree, features, gpu_key, gpu_peaks, pair_row)

__all__ = ["BenchProblem", "CUDNN", "RAGGED", "SINGLE", "SINGLE_LSE", "TRTLLM", "XQA", "entry_of", "problem_of"]


def recorded_problem(result: dict) -> BenchProblem:
    """The bench problem one result of a bench JSON recorded (its JSON holds ``backends`` as a list)."""
    return BenchProblem(**{**result["problem"], "backends": tuple(result["problem"].get("backends", ()))})


def sweep_device(environment: dict) -> DeviceDesc:
    """The DeviceDesc a bench JSON's environment names (its GPU and capability): what a replay
    decides for, off the GPU."""
    major, minor = divmod(int(environment["capability"].removeprefix("sm_")), 10)
    return capability_db.device_for_capability(major, minor, environment["gpu"])


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
                         "(capability_db/choice_table.py GPU_PEAKS)")
    return known.tb_per_s, known.tflops


def harness_failed(result: dict) -> bool:
    """A side-by-side row with a candidate missing for a failure, not a declared limit: a backend
    that raised, or a vendor that failed while planning (a JIT build, say). The choice reads a
    backend absent from a complete row as one that could not serve it (estimate.UNMEASURED_BEHIND);
    such a row is kept with ``complete=False`` and never used that way (fa3's modules failing to
    build on a fresh machine, say)."""
    return any(b["status"] == "error" or (b["status"] == "refused" and "at plan time" in b.get("note", ""))
               for b in result["backends"] if b["backend"] not in NOT_BACKENDS)


NOT_BACKENDS = ("auto", "flashinfer")  # bench columns that are not a backend the router can choose


def build_table(results: dict, source: str, settings: Optional[FitSettings] = None) -> TimingTable:
    """The timing table of one GPU's bench results (``merged``'s), its fit by ``settings`` (default ``FIT``)."""
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
                       fitted=fit_times(results["results"], source, settings or FIT))


# The trees correcting the linear fits (``FittedTimes.trees``), gradient-boosted on their errors:
# scikit-learn's GradientBoostingRegressor with these settings, chosen by cross-validation over the
# H200's random sweeps (tools/crossval_choice.py, 5 folds, graph choice within 3% of the fastest):
# 300 trees of depth 5 at rate 0.1 gave 75%, 800 of depth 7 at rate 0.05 77%, 1200 of depth 8 78%
# at half again the cost of a decision; each split drawn from half the features gained a little more
# (1886-1894 of 2297 problems against 1873 with all of them). Only over ``min_tree_samples`` timed
# (problem, backend) pairs: trees fitted on a few dozen would learn their noise.
TREES = {"n_estimators": 800, "learning_rate": 0.05, "max_depth": 7, "min_samples_leaf": 10, "max_features": 0.5}
# The pairwise model (``FittedTimes.pair_trees``): scikit-learn's HistGradientBoostingRegressor on every
# ordered pair of backends timed on one problem. Chosen the same way: 1000 trees of depth 7 at rate 0.05
# (84.1% of 2297 problems within 3%; the eager choice 1787 against 1761 without the model).
PAIR_TREES = {"max_iter": 1000, "learning_rate": 0.05, "max_depth": 7, "max_leaf_nodes": 63, "min_samples_leaf": 20,
              "early_stopping": False, "random_state": 0}


@dataclass(frozen=True)
class FitSettings:
    """How ``fit_times`` fits: the ridge penalty on coefficients (intercept aside; chosen by
    tools/crossval_choice.py), the fewest problems a backend is fitted on (below, its rows and the
    cost model serve), the boosted trees' settings and the fewest samples they are fitted on."""
    ridge: float = 0.1
    min_fit_rows: int = 8
    trees: dict = field(default_factory=lambda: dict(TREES))
    pair_trees: dict = field(default_factory=lambda: dict(PAIR_TREES))
    min_tree_samples: int = 400


FIT = FitSettings()  # what the tables are fitted with


def fit_times(results: list[dict], source: str, settings: FitSettings = FIT) -> Optional[FittedTimes]:
    """Per backend, a ridge regression of log2 GPU ms on ``features`` over every problem it was
    timed on, through any entry point but those where it plans per call (capability data
    ``plans_per_call``: its times there hold host syncs); then the trees that correct its errors
    (``fit_trees``) and the pairwise model (``fit_pairs``)."""
    samples = fit_samples(results)
    names = list(dict.fromkeys(k for rows in samples.values() for values, _ in rows for k in values))
    coef, counts = {}, {}
    for name, rows in sorted(samples.items()):
        if len(rows) < settings.min_fit_rows:
            continue
        x = torch.tensor([[values.get(k, 0.0) for k in names] for values, _ in rows], dtype=torch.float64)
        y = torch.tensor([t for _, t in rows], dtype=torch.float64)
        penalty = torch.full((len(names),), settings.ridge, dtype=torch.float64)
        penalty[names.index("one")] = 0.0
        solved = torch.linalg.solve(x.T @ x + torch.diag(penalty), x.T @ y)
        coef[name], counts[name] = [round(float(c), 6) for c in solved], len(rows)
    if not coef:
        return None
    linear = FittedTimes(names=names, coef=coef, rows=counts, ridge=settings.ridge, source=f"ridge fit over {source}")
    corrected = fit_trees(linear, {name: rows for name, rows in samples.items() if name in coef}, source, settings)
    return fit_pairs(corrected, problem_samples(results), source, settings)


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
              source: str, settings: FitSettings = FIT) -> FittedTimes:
    """``linear`` with boosted trees fitted to its errors over every (problem, backend) pair, the
    backend a 0/1 feature; ``linear`` unchanged where the pairs are too few or scikit-learn (the
    ``bench`` extra) is not installed (the source says which)."""
    pairs = sum(len(rows) for rows in samples.values())
    if pairs < settings.min_tree_samples:
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
    trees = trees_of(GradientBoostingRegressor(init="zero", random_state=0, **settings.trees).fit(x, y))
    return linear.model_copy(update={"trees": trees, "tree_features": columns, "source":
                                     f"ridge fit + {len(trees)} boosted trees on its errors over {source}"})


def fit_pairs(fit: FittedTimes, problems: list[tuple[dict[str, float], dict[str, float]]],
              source: str, settings: FitSettings = FIT) -> FittedTimes:
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
    if len(x) < settings.min_tree_samples:
        return fit
    try:
        from sklearn.ensemble import HistGradientBoostingRegressor
    except ImportError:
        return fit.model_copy(update={"pair_source": "none: scikit-learn, the bench extra, is not installed"})
    boosted = HistGradientBoostingRegressor(**settings.pair_trees).fit(x, y)
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
    their GPU time (on an H100, fa3 through the cuDNN entry: 1.1 ms at 20 us of work, 28.4 ms at
    28.9 ms of GPU time)."""
    seen: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        for name, us in row.host_us.items():
            seen.setdefault((name, row.bucket.entry), []).append(us)
    seen = {(name, entry): [min(values)] if entry in plans_per_call(name) else values
            for (name, entry), values in seen.items()}
    measured: dict[tuple[str, str], list[float]] = {}
    for r in host_cost_rows:  # host-cost matrix rows: entry, backend, size, host_us
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
    host_cost = [row for run in runs if "matrix" in run for row in run["matrix"]]  # host-cost matrix runs
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
    """The timing table of one GPU's bench JSONs (``merged``), written to ``out`` (default:
    tools/tables/data/<gpu key>.json.gz; a name ending in .gz is written gzipped)."""
    paths = [results_paths] if isinstance(results_paths, (str, Path)) else list(results_paths)
    table = build_table(*merged(paths))
    out = out or MEASURED_DIR / f"{gpu_key(table.gpu) or table.gpu.split()[-1].lower()}.json.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(table.model_dump(), indent=1) + "\n"
    if out.suffix == ".gz":
        with gzip.open(out, "wt") as f:
            f.write(text)
    else:
        out.write_text(text)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lab.table", description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", nargs="+", type=Path, metavar="JSON",
                        help="bench JSONs of one GPU (and host-cost matrix JSONs of it)")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help="where to write the table (default: tools/tables/data/<gpu>.json.gz)")
    args = parser.parse_args(argv)
    try:
        path = write_from_results(args.bench, args.out)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    print(f"timing table written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
