"""The timing table's fit (tools/lab/table.py fit_times, tools/tables/measured.py FittedTimes):
what the choice tables are compiled from where no row was measured at the problem's sizes, and the
cross-validation that judges it (tools/crossval_choice.py) on problems its table never saw. The
boosted trees are fitted with few, shallow trees on a few hundred synthetic samples (``SMALL``): what
is checked is what they learn and how the table keeps them, not the settings the tables ship with."""
from __future__ import annotations

import dataclasses
import json
import random
import struct
import sys
from pathlib import Path
from unittest import mock

import capability_db
import pytest
from dispatch import router
from dispatch.benchmark.problems import CUDNN, PAGED
from tools import crossval_choice, gpu_ratio, table_choice
from tools.lab import table
from tools.tables import estimate, measured

H200 = capability_db.resolve_device("h200")
ENVIRONMENT = {"gpu": "NVIDIA H200", "capability": "sm_90"}
SMALL = table.FitSettings(
    trees={**table.TREES, "n_estimators": 60, "learning_rate": 0.2, "max_depth": 4},
    pair_trees={**table.PAIR_TREES, "max_iter": 60, "learning_rate": 0.2, "max_depth": 4, "max_leaf_nodes": 15},
    min_tree_samples=200)


def result(name: str, problem: dict, times: dict[str, float]) -> dict:
    work = problem["batch"] * problem["kv_len"] * 8 * 256 * 2  # bytes of K and V (8 KV heads, d128, bf16)
    return {"name": name, "problem": problem, "work": work,
            "backends": [{"backend": n, "status": "ok", "eager_ms": ms, "host_us": 20.0} for n, ms in times.items()]}


def synthetic(seed: int, count: int = 40) -> list[dict]:
    """Paged decode problems at random sizes; native-triton streams the K/V at 3 TB/s, fa2 at 2 TB/s
    (and plans per call through the cuDNN entry, 10x slower there)."""
    rng, out = random.Random(seed), []
    for i in range(count):
        entry = CUDNN if i % 4 == 0 else PAGED
        p = {"entry": entry, "batch": rng.choice([1, 3, 8, 17, 64]), "q_len": 1, "kv_len": rng.randint(256, 60000)}
        gb = p["batch"] * p["kv_len"] * 8 * 256 * 2 / 1e9  # K and V, 8 heads, d128, bf16
        fa2 = gb / 2.0 * (10 if entry == CUDNN else 1)
        out.append(result(f"{entry} {i}", p, {"native-triton": gb / 3.0 + 0.004, "fa2": fa2 + 0.004}))
    return out


def test_the_fit_predicts_a_problem_it_never_saw():
    fit = table.fit_times(synthetic(1), "synthetic")
    problem = table.problem_of(table.BenchProblem(entry=PAGED, batch=32, q_len=1, kv_len=20000))
    gb = 32 * 20000 * 8 * 256 * 2 / 1e9
    for name, truth in (("native-triton", gb / 3.0 + 0.004), ("fa2", gb / 2.0 + 0.004)):
        got = 2 ** fit.log2_ms(name, measured.features(problem, (32, 1, 20000)))
        assert got == pytest.approx(truth, rel=0.15), name


def test_the_fit_leaves_out_a_backends_times_where_it_plans_per_call():
    assert CUDNN in capability_db.backend_caps("fa2").plans_per_call
    results = synthetic(2)
    fit = table.fit_times(results, "synthetic")
    through_cudnn = sum(r["problem"]["entry"] == CUDNN for r in results)
    assert fit.rows == {"fa2": len(results) - through_cudnn, "native-triton": len(results)}
    tab = table.build_table({"environment": ENVIRONMENT, "results": results}, "synthetic")
    on_cudnn = table.problem_of(table.BenchProblem(entry=CUDNN, batch=8, q_len=1, kv_len=4096))
    assert estimate.fitted_ms(tab, "fa2", on_cudnn, (8, 1, 4096)) is None  # never captured there
    assert estimate.fitted_ms(tab, "native-triton", on_cudnn, (8, 1, 4096)) is not None
    # an eager call: its kernel's time as the fit of its other entry points gives it (the rows through
    # cuDNN's entry took 10x: the host path they hold is its host time's, which the eager choice adds)
    on_paged = table.problem_of(table.BenchProblem(entry=PAGED, batch=8, q_len=1, kv_len=4096))
    kernel = estimate.fitted_ms(tab, "fa2", on_paged, (8, 1, 4096))
    eager = estimate.fitted_times(tab, on_cudnn, (8, 1, 4096), eager=True)
    assert eager["fa2"] == pytest.approx(kernel, rel=0.3)


def test_a_fit_without_the_entry_point_or_of_other_features_is_not_used():
    fit = table.fit_times(synthetic(3), "synthetic")
    values = measured.features(table.problem_of(table.BenchProblem(entry=PAGED, batch=8, q_len=1, kv_len=4096)),
                               (8, 1, 4096))
    assert fit.log2_ms("native-triton", values) is not None
    assert fit.log2_ms("cudnn", values) is None  # never timed
    unseen = {**{k: v for k, v in values.items() if not k.startswith(measured.PER_ENTRY)}, "entry xqa": 1.0}
    assert fit.log2_ms("native-triton", unseen) is None
    stale = fit.model_copy(update={"names": fit.names[:-1] + ["a feature no longer computed"]})
    assert stale.log2_ms("native-triton", values) is None


def test_the_choice_takes_the_fit_over_the_entry_points_list():
    """Through the cuDNN entry the entry's list puts cuDNN first where no row of that entry timed two
    candidates side by side (here each such row timed one); the fit, which saw rows of that entry,
    ranks them instead, and the faster by the fit wins there."""
    sizes = [(2 ** (i % 7), 512 * (1 + i)) for i in range(18)]
    times = [{"cudnn": b * kv * 4096 / 1e9 + 0.01, "native-triton": b * kv * 4096 / 3e9 + 0.004} for b, kv in sizes]
    rows = [result(f"p{i}", {"entry": PAGED, "batch": b, "q_len": 1, "kv_len": kv}, t)
            if i % 3 else result(f"p{i}", {"entry": CUDNN, "batch": b, "q_len": 1, "kv_len": kv},
                                 {n: t[n] for n in (("cudnn",) if i % 2 else ("native-triton",))})
            for i, ((b, kv), t) in enumerate(zip(sizes, times))]
    tab = table.build_table({"environment": ENVIRONMENT, "results": rows}, "synthetic")
    problem = table.problem_of(table.BenchProblem(entry=CUDNN, batch=4, q_len=1, kv_len=35000))
    with mock.patch.object(estimate, "table_for", return_value=tab):
        ranking = estimate.rank(problem, H200, ["cudnn", "native-triton"], problem.sizes)
    assert ranking.order[0] == "native-triton"
    assert ranking.estimates["native-triton"].basis == "fitted"


def test_crossval_judges_each_fold_by_a_table_built_without_it():
    """Each fold's choice comes from its own table: a cached table of an earlier fold (or the repo's,
    which holds every problem) would judge problems the table has seen."""
    problem = {"entry": PAGED, "batch": 4, "q_len": 1, "kv_len": 1024}
    test = {"environment": ENVIRONMENT, "results": [result("t", problem, {"fa2": 0.01, "native-triton": 0.01})]}

    def fold(fast: str) -> dict:
        slow = "native-triton" if fast == "fa2" else "fa2"
        return {"environment": ENVIRONMENT, "results": [result("r", problem, {fast: 0.01, slow: 0.05})]}
    router.clear_caches()
    device = capability_db.device_for_capability(9, 0, ENVIRONMENT["gpu"])  # the device replay decides for
    measured.table_for(device)  # the repo's table, cached first
    first = crossval_choice.replay_fold([fold("fa2")], test, "fold a")[0]["chosen"]
    second = crossval_choice.replay_fold([fold("native-triton")], test, "fold b")[0]["chosen"]
    assert (first, second) == ("fa2", "native-triton")
    assert len(measured.table_for(device).rows) > 100  # the repo's table again once the folds are done


def test_learning_curve_builds_each_fold_from_the_share_it_names():
    """``--learning-curve``: each share's tables hold that share of the other folds' problems, and
    the figures are replays against measured times (a synthetic sweep the fit learns: native-triton
    is the fastest on every paged problem, which the choice finds with most of the problems)."""
    parts = crossval_choice.folds({"environment": ENVIRONMENT, "results": synthetic(3, 50)}, 5)
    curve = crossval_choice.learning_curve(parts, "synthetic", [0.25, 1.0], draws=2)
    assert [c["training_problems"] for c in curve] == [10, 40]
    assert curve[-1]["graph_within_3pct"] > 0.9
    router.clear_caches()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q, kv, window", [(8, 16, 2), (1, 40, 5), (16, 16, 0), (6, 30, -1), (30, 30, 100)])
def test_work_counts_the_pairs_the_oracle_keeps_and_the_keys_any_query_sees(q, kv, window, causal):
    """The FLOPs of the (query, key) pairs the oracle's mask keeps (a non-causal window sees every key
    after its start, not window + 1 keys a query as an earlier count had it), and the bytes of every
    key from the first query's window start on, read once."""
    from dispatch.benchmark.oracle import allowed_keys
    p = table.problem_of(table.BenchProblem(entry="single_prefill_with_kv_cache", batch=3, q_len=q, kv_len=kv,
                                            num_qo_heads=4, num_kv_heads=2, head_dim=64, causal=causal,
                                            window_left=window))
    moved, flops = measured.work(p, (3, q, kv))
    pairs = int(allowed_keys(q, kv, causal, window).sum())
    assert flops == 2.0 * 4 * (64 + 64) * 3 * max(pairs, q)
    keys = min(kv, q + window) if window >= 0 else kv
    assert moved == 3 * (keys * 2 * 128 * 2 + q * 4 * 128 * 2)


def test_the_fit_learns_a_kernel_that_pays_for_keys_outside_the_window():
    """FlashInfer fa2's single-request prefill walks every key up to the diagonal and masks the
    window (H200: 10.9 ms against fa3's 0.028 on 1 x 266 x 129196, window 118); fa3 skips the keys
    left of it. The fit sees each backend's cost of a window ("window saving"), so a narrow window
    over many keys it never saw ranks fa2 behind, by about the keys the window leaves out."""
    rng, rows = random.Random(4), []
    for i in range(48):
        q, kv = rng.choice([1, 16, 128, 512]), rng.randint(1024, 65536)
        window = rng.choice([-1, -1, rng.randint(16, 512)])
        p = {"entry": "single_prefill_with_kv_cache", "batch": 1, "q_len": q, "kv_len": kv, "causal": False,
             "window_left": window}
        problem = table.problem_of(table.BenchProblem(**p))
        walked = measured.work(dataclasses.replace(problem, window_left=-1), problem.sizes)[1]
        kept = measured.work(problem, problem.sizes)[1]
        rows.append(result(f"single {i}", p, {"fa2": walked / 2e14 * 1e3 + 0.006, "fa3": kept / 2e14 * 1e3 + 0.006}))
    fit = table.fit_times(rows, "synthetic")
    unseen = table.problem_of(table.BenchProblem(entry="single_prefill_with_kv_cache", batch=1, q_len=256,
                                                 kv_len=100000, window_left=100))
    values = measured.features(unseen, unseen.sizes)
    assert values["window saving"] > 9  # log2 of the keys the window leaves out
    fa2, fa3 = (2 ** fit.log2_ms(n, values) for n in ("fa2", "fa3"))
    assert fa2 > 20 * fa3


def banded(seed: int, count: int) -> list[dict]:
    """Paged decode problems where native-triton takes twice its streaming time on 4k-8k keys (a bend
    no linear term of the features draws) and fa2 streams at 2 TB/s everywhere."""
    rng, out = random.Random(seed), []
    for i in range(count):
        p = {"entry": PAGED, "batch": rng.choice([1, 2, 4, 8, 16, 32, 64]), "q_len": 1, "kv_len": rng.randint(512, 32768)}
        gb = p["batch"] * p["kv_len"] * 8 * 256 * 2 / 1e9
        native = gb / 3.0 * (2 if 4096 < p["kv_len"] <= 8192 else 1)
        out.append(result(f"paged {i}", p, {"native-triton": native + 0.004, "fa2": gb / 2.0 + 0.004}))
    return out


def test_the_trees_correct_what_the_linear_fit_cannot_draw():
    """Over enough problems the fit adds boosted trees on the linear fits' errors: inside the band
    where native-triton is slow, the linear fit alone ranks it first; with the trees, fa2 is first."""
    fit = table.fit_times(banded(5, 150), "synthetic", SMALL)
    assert fit.trees and fit.tree_features[-2:] == ["backend fa2", "backend native-triton"]
    linear = fit.model_copy(update={"trees": []})
    problem = table.problem_of(table.BenchProblem(entry=PAGED, batch=24, q_len=1, kv_len=6000))
    values = measured.features(problem, (24, 1, 6000))
    gb = 24 * 6000 * 8 * 256 * 2 / 1e9
    native, fa2 = (2 ** fit.log2_ms(n, values) for n in ("native-triton", "fa2"))
    assert native == pytest.approx(gb / 1.5 + 0.004, rel=0.25) and fa2 < native
    assert 2 ** linear.log2_ms("native-triton", values) < 2 ** linear.log2_ms("fa2", values)
    saved = measured.FittedTimes.model_validate_json(fit.model_dump_json())  # the table's JSON keeps them
    assert saved.log2_ms("native-triton", values) == fit.log2_ms("native-triton", values)
    fewer = fit.model_copy(update={"trees": fit.trees[:5]})  # a copy walks its own trees, not the packed ones
    x = [values.get(n, float(n == "backend fa2")) for n in fit.tree_features]
    x = list(struct.unpack(f"{len(x)}f", struct.pack(f"{len(x)}f", *x)))
    assert fewer.log2_ms("fa2", values) == pytest.approx(linear.log2_ms("fa2", values) + sum(t.leaf(x) for t in fit.trees[:5]))


def test_the_plain_trees_sum_to_what_scikit_learn_predicts():
    """``trees_of`` + ``Tree.leaf`` give the fitted regressor's predictions, at its thresholds too
    (where the float32 rounding of the inputs decides the side)."""
    from sklearn.ensemble import GradientBoostingRegressor
    rng = random.Random(6)
    x = [[rng.uniform(-3, 3) for _ in range(4)] for _ in range(300)]
    y = [a * a - b + (c > 0.7) * 2 + rng.gauss(0, 0.1) for a, b, c, _ in x]
    boosted = GradientBoostingRegressor(init="zero", random_state=0, **SMALL.trees).fit(x, y)
    trees = table.trees_of(boosted)
    on_threshold = [[t.threshold[0] if i == t.feature[0] else 0.5 for i in range(4)] for t in trees[:20]]
    probes = [[rng.uniform(-4, 4) for _ in range(4)] for _ in range(50)] + on_threshold
    for point, want in zip(probes, boosted.predict(probes)):
        rounded = list(struct.unpack("4f", struct.pack("4f", *point)))
        assert sum(t.leaf(rounded) for t in trees) == pytest.approx(want, abs=1e-6)


def test_the_trees_walked_at_once_reach_the_leaves_each_tree_reaches():
    """``PackedTrees`` (every tree in one full layout, walked together) sums the leaves ``Tree.leaf``
    reaches: trees of uneven depth, points on a threshold, a NaN (Tree.leaf sends it right)."""
    from sklearn.ensemble import GradientBoostingRegressor
    rng = random.Random(8)
    x = [[rng.uniform(-3, 3) for _ in range(5)] for _ in range(400)]
    y = [a * a - b + (c > 0.7) * 2 + (d < -1) * e + rng.gauss(0, 0.1) for a, b, c, d, e in x]
    trees = table.trees_of(GradientBoostingRegressor(init="zero", random_state=0, n_estimators=60, max_depth=6,
                                                     min_samples_leaf=25).fit(x, y))
    stump = measured.Tree(feature=[2, -2, 0, -2, -2], threshold=[0.5, -2.0, 1.0, -2.0, -2.0], left=[1, -1, 3, -1, -1],
                          right=[2, -1, 4, -1, -1], value=[0.0, 7.0, 0.0, -3.0, 11.0])  # a leaf at depth 1, two at 2
    trees.append(stump)
    assert len({measured._depth(t) for t in trees}) > 1
    packed = measured.PackedTrees(trees)
    on_threshold = [[t.threshold[0] if i == t.feature[0] else 0.5 for i in range(5)] for t in trees[:20]]
    probes = [[rng.uniform(-4, 4) for _ in range(5)] for _ in range(60)] + on_threshold + [[float("nan")] * 5]
    for point in probes:
        rounded = list(struct.unpack("5f", struct.pack("5f", *point)))
        assert packed.total(rounded) == pytest.approx(sum(t.leaf(rounded) for t in trees), abs=1e-9)
    assert packed.total([0.0, 0, 0.4, 0, 0]) - sum(t.leaf([0.0, 0, 0.4, 0, 0]) for t in trees[:-1]) == pytest.approx(7.0)


def shared_noise(seed: int, count: int) -> list[dict]:
    """Paged decode problems whose times all move together by up to 2.8x either way from one problem to
    the next (what one problem's facts cost every backend alike, which no feature names), while
    native-triton takes 1.3x fa2's time on more than 8k keys and 1/1.3 of it below."""
    rng, out = random.Random(seed), []
    for i in range(count):
        p = {"entry": PAGED, "batch": rng.choice([1, 2, 4, 8, 16, 32, 64]), "q_len": 1, "kv_len": rng.randint(512, 32768)}
        fa2 = p["batch"] * p["kv_len"] * 8 * 256 * 2 / 1e9 / 2.0 * 2 ** rng.uniform(-1.5, 1.5)
        native = fa2 * (1.3 if p["kv_len"] > 8192 else 1 / 1.3)
        out.append(result(f"paged {i}", p, {"native-triton": native, "fa2": fa2}))
    return out


def test_the_pairwise_model_orders_backends_whose_times_move_together():
    """Each backend's own estimate carries the noise every backend shares; the pairwise model fits
    the ratio, where it cancels: on problems it never saw, it puts each backend 1.3x from the other
    on the right side of 8k keys, and keeps the mean of their own estimates."""
    fit = table.fit_times(shared_noise(11, 150), "synthetic", SMALL)
    assert fit.pair_trees and fit.pair_features[-4:] == ["first fa2", "first native-triton", "second fa2",
                                                        "second native-triton"]
    for kv, want in ((2000, 1 / 1.3), (5000, 1 / 1.3), (12000, 1.3), (30000, 1.3)):
        problem = table.problem_of(table.BenchProblem(entry=PAGED, batch=12, q_len=1, kv_len=kv))
        values = measured.features(problem, (12, 1, kv))
        both = fit.log2_ms_among(["native-triton", "fa2"], values)
        assert 2 ** (both["native-triton"] - both["fa2"]) == pytest.approx(want, rel=0.02), kv  # alone: 1.4-4.2% off at these four
        own = [fit.log2_ms(n, values) for n in ("native-triton", "fa2")]
        assert sum(both.values()) == pytest.approx(sum(own))
        assert fit.log2_ms_among(["fa2"], values) == {"fa2": own[1]}  # one backend: its own estimate
    saved = measured.FittedTimes.model_validate_json(fit.model_dump_json())  # the table's JSON keeps them
    assert saved.log2_ms_among(["native-triton", "fa2"], values) == both
    older = fit.model_copy(update={"pair_trees": [], "pair_features": []})  # a table fitted before
    assert older.log2_ms_among(["native-triton", "fa2"], values) == dict(zip(("native-triton", "fa2"), own))


def test_the_pairwise_trees_sum_to_what_scikit_learn_predicts():
    """``hist_trees_of`` + ``Tree.leaf`` (and ``PackedTrees.totals``) on float64 inputs give the
    HistGradientBoostingRegressor's predictions less its starting constant, at its thresholds too."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    rng = random.Random(9)
    x = [[rng.uniform(-3, 3) for _ in range(4)] for _ in range(500)]
    y = [a * a - b + (c > 0.7) * 2 + rng.gauss(0, 0.1) for a, b, c, _ in x]
    boosted = HistGradientBoostingRegressor(**SMALL.pair_trees).fit(x, y)
    trees = table.hist_trees_of(boosted)
    start = float(boosted._baseline_prediction.ravel()[0])
    on_threshold = [[t.threshold[0] if i == t.feature[0] else 0.5 for i in range(4)] for t in trees[:20]]
    probes = [[rng.uniform(-4, 4) for _ in range(4)] for _ in range(50)] + on_threshold
    packed = measured.PackedTrees(trees).totals(probes)
    for point, want, walked in zip(probes, boosted.predict(probes), packed):
        assert sum(t.leaf(point) for t in trees) + start == pytest.approx(want, abs=1e-6)
        assert walked + start == pytest.approx(want, abs=1e-6)


def test_the_choice_ranks_by_the_pairwise_estimates():
    """``estimate.fitted_times`` (what the fit's ranking reads) places the backends by the pairwise model."""
    tab = table.build_table({"environment": ENVIRONMENT, "results": shared_noise(12, 150)}, "synthetic", SMALL)
    problem = table.problem_of(table.BenchProblem(entry=PAGED, batch=12, q_len=1, kv_len=20000))
    times = estimate.fitted_times(tab, problem, (12, 1, 20000))
    assert times["native-triton"] / times["fa2"] == pytest.approx(1.3, rel=0.02)
    assert estimate.fitted_ms(tab, "fa2", problem, (12, 1, 20000)) == times["fa2"]
    said = estimate.estimate(tab, [], "fa2", problem, (12, 1, 20000), "the test's table")
    assert said.basis == "fitted" and said.ms == times["fa2"] and "pairwise model" in said.note


def test_without_scikit_learn_the_fit_is_linear_and_says_so():
    with mock.patch.dict(sys.modules, {"sklearn.ensemble": None}):
        fit = table.fit_times(banded(7, 300), "synthetic")
    assert not fit.trees and "scikit-learn" in fit.source
    assert table.fit_times(banded(7, 100), "synthetic").trees == []  # 200 pairs: too few for trees


def test_table_choice_replays_one_gpus_problems_under_each_table_alone(tmp_path):
    """tools/table_choice.py: the H100's problems judged by a table of its own and by the H200's,
    each alone in the measured folder; the H200's is scaled to the H100 and says so."""
    h100_env = {"gpu": "NVIDIA H100 80GB HBM3", "capability": "sm_90"}
    problem = {"entry": PAGED, "batch": 4, "q_len": 1, "kv_len": 1024}
    measured_here = {"environment": h100_env, "results": [result("t", problem, {"fa2": 0.010, "native-triton": 0.020})]}

    def table_file(env: dict, fast: str) -> Path:
        slow = "native-triton" if fast == "fa2" else "fa2"
        rows = {"environment": env, "results": [result("r", problem, {fast: 0.01, slow: 0.05})]}
        path = tmp_path / f"{measured.gpu_key(env['gpu'])}.json"
        path.write_text(table.build_table(rows, "synthetic").model_dump_json())
        return path
    own, other = table_file(h100_env, "native-triton"), table_file(ENVIRONMENT, "fa2")
    rows, how = table_choice.replay_under(measured_here, own)
    assert rows[0]["chosen"] == "native-triton" and rows[0]["regret"] == pytest.approx(1.0)
    assert how == "h100 table, unscaled (the GPU's own)"
    report = table_choice.markdown(h100_env, ["t.json"], [{"table": own.name, "how": how, "figures": table_choice.figures(rows),
                                                     "rows": rows}])
    assert "the 1 graph choice more than 3% off, and why" in report  # the miss, listed with its cause
    assert f"| t | native-triton | fa2 | 100.0% | {rows[0]['cause']} |" in report and rows[0]["cause"]
    assert "| ? | 0 / 1 (0%), max 100.0% |" in report  # per seed: this result names no sweep file
    assert "| all but the xqa entry | 0 / 1 (0%), max 100.0% |" in report
    assert table.seed_of("bench-random-150-seed-42-h100-from-3.json") == "42" and table.seed_of("grid.json") == "grid.json"
    rows, how = table_choice.replay_under(measured_here, other)
    assert rows[0]["chosen"] == "fa2" and rows[0]["regret"] == 0.0
    assert how.startswith("h200 table scaled to this GPU (NVIDIA H100 80GB HBM3: bandwidth x0.70")
    assert len(measured.table_for(capability_db.resolve_device("h200")).rows) > 100  # the repo's tables again


def test_gpu_ratio_divides_one_gpus_times_by_the_others_on_the_same_problems(tmp_path, capsys, monkeypatch):
    """tools/gpu_ratio.py: per phase and backend, (time on A) / (time on B) over the problems both timed."""
    problem = {"entry": PAGED, "batch": 4, "q_len": 1, "kv_len": 1024}  # q_len 1: decode
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"environment": {"gpu": "NVIDIA H100 80GB HBM3", "capability": "sm_90"},
                             "results": [result("p", problem, {"xqa": 0.013, "fa2": 0.030})]}))
    b.write_text(json.dumps({"environment": ENVIRONMENT, "results": [result("p", problem, {"xqa": 0.010})]}))
    monkeypatch.setattr(sys, "argv", ["gpu_ratio", "--a", str(a), "--b", str(b)])
    gpu_ratio.main()
    out = capsys.readouterr().out
    assert "| decode | xqa | 1 | 1.30 | 1.30 | 1.30 |" in out and "fa2" not in out.split("| phase")[1]


def per_call_plans(seed: int, count: int = 60) -> list[dict]:
    """Paged decode problems: fa2's kernel streams the K/V at 6 TB/s, native-triton's at 3; through
    the cuDNN entry fa2 plans on every call (800 us of host time, a sync), which its eager time holds."""
    rng, out = random.Random(seed), []
    for i in range(count):
        entry = CUDNN if i % 4 == 0 else PAGED
        p = {"entry": entry, "batch": rng.choice([1, 3, 8, 17, 64]), "q_len": 1, "kv_len": rng.randint(256, 60000)}
        gb = p["batch"] * p["kv_len"] * 8 * 256 * 2 / 1e9
        kernel = gb / 6.0 + 0.004
        row = result(f"{entry} {i}", p, {"native-triton": gb / 3.0 + 0.004, "fa2": kernel})
        if entry == CUDNN:
            fa2 = next(b for b in row["backends"] if b["backend"] == "fa2")
            fa2["eager_ms"] = kernel + 0.8
            fa2["host_us"] = 800.0 + kernel * 1e3 * 0.95  # each call's host time waits for the last kernel
        out.append(row)
    return out


def test_an_eager_call_takes_a_backend_that_plans_per_call_where_its_kernel_and_plan_cost_least(monkeypatch):
    """Through the cuDNN entry fa2 plans (and syncs) on every call: never captured in a graph there, and
    for an eager call estimated at its kernel's fitted time plus the plan's host time. It wins a long
    decode, where its kernel saves more than the plan costs, and loses a short one."""
    tab = table.build_table({"environment": ENVIRONMENT, "results": per_call_plans(5)}, "synthetic")
    monkeypatch.setattr(estimate, "table_for", lambda device: tab if device.kind == "cuda" else None)
    assert 800 < tab.host_us["fa2"][CUDNN] < 900  # the plan's, the least of the rows through the entry
    long_decode, short_decode = (64, 1, 60000), (1, 1, 512)
    for sizes, first in ((long_decode, "fa2"), (short_decode, "native-triton")):
        problem = table.problem_of(table.BenchProblem(entry=CUDNN, batch=sizes[0], q_len=1, kv_len=sizes[2]))
        eager = estimate.rank(problem, H200, ["native-triton", "fa2"], problem.sizes)
        assert eager.order[0] == first, (sizes, eager.order)
        assert eager.estimates["fa2"].host_us == tab.host_us["fa2"][CUDNN]
    # a graph's choice never places it (a graph cannot capture it there): the others keep their places
    assert set(estimate.fitted_times(tab, problem, long_decode)) == {"native-triton"}
    assert set(estimate.fitted_times(tab, problem, long_decode, eager=True)) == {"native-triton", "fa2"}
