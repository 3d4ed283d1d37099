"""``attn-dispatch bench`` on the CPU: the quick grid end to end through the CLI, the fp64 check
(poisoned rows and wrong values caught), the rate formulas against the oracle's mask, user
problem files, and bench results turned into a timing table."""
from __future__ import annotations

import contextlib
import json

import pytest
import torch

from dispatch import cli
from dispatch.benchmark import build, grids, problems, report, runner
from dispatch.benchmark.oracle import allowed_keys, band
from dispatch.benchmark.problems import PAGED, XQA, BenchProblem
from tools.lab import table


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert cli.main(["bench", "--device", "cpu", "--quick", "--out", str(out)]) == 0
    return out, json.loads((out / "bench-quick-cpu.json").read_text())


def test_quick_bench_checks_and_times_every_entry_point_on_the_cpu(quick_report):
    out, rep = quick_report
    assert {r["problem"]["entry"] for r in rep["results"]} == set(problems.ENTRY_NAMES)
    for r in rep["results"]:
        by = {b["backend"]: b for b in r["backends"]}
        ref = by["reference"]
        assert ref["status"] == "ok", r["name"]
        assert 0 < ref["rel_err"] <= band(r["problem"]["dtype"], r["problem"]["kv_dtype"] or r["problem"]["dtype"])
        assert ref["eager_ms"] > 0 and ref["rate"] > 0
        assert by["auto"]["served"] == "reference" and by["auto"]["status"] == "ok"
        assert r["regret"] >= 0 and r["fastest"] in by
        if r["fastest"] == r["auto"]:  # two runs of one backend: noise, not regret
            assert r["regret"] == 0 and r["fastest_ms"] <= r["auto_ms"] and r["noise"] is not None
        if r["problem"]["lse"]:
            assert ref["lse_rel_err"] is not None and ref["lse_rel_err"] <= 1e-5
    assert rep["regret"]["count"] == len(rep["results"])
    md = (out / "bench-quick-cpu.md").read_text()
    assert "| problem | fastest | auto | regret |" in md and "Regret of the automatic choice" in md


def test_check_catches_unwritten_rows_and_wrong_values():
    p = BenchProblem(PAGED, 2, 4, 24, num_qo_heads=4, num_kv_heads=2, head_dim=16, dtype="float32", page_size=8,
                     causal=True, lse=True)
    b = build.build(p, "cpu")
    call = b.call()
    b.poison()
    out, lse = call(b.operands[0])
    err, lse_err, tol = b.check((out, lse))
    assert 0 < err < tol and lse_err < tol
    wrong = out.clone()
    wrong[-1, 0, 0] = float("nan")  # one unwritten (poisoned) element of a sampled row
    assert b.check((wrong, lse))[0] == float("inf")
    assert b.check((out * 1.01, lse))[0] > tol


@pytest.mark.parametrize("window", [-1, 300])
def test_check_catches_a_call_that_dropped_the_sinks_at_long_kv(window):
    """The sinks the bench draws carry weight however long the KV: FlashInfer 0.7.2's paged wrapper
    passed the check at long KV and disagreed only where the KV was short (H200 random problems)."""
    p = BenchProblem(PAGED, 2, 1, 3000, num_qo_heads=4, num_kv_heads=2, head_dim=16, dtype="bfloat16", page_size=16,
                     window_left=window, sinks=True)
    b = build.build(p, "cpu")
    b.poison()
    out = b.call()(b.operands[0])
    err, _, tol = b.check(out)
    assert err < tol
    b.sinks = None  # what the call would be checked against had it dropped the sinks
    assert b.check(out)[0] > 5 * tol


@pytest.mark.parametrize("q, kv, causal, window", [(1, 9, False, -1), (5, 9, True, -1), (5, 9, True, 2),
                                                   (7, 7, False, 3), (3, 40, True, 0)])
def test_visible_pairs_counts_the_oracles_mask(q, kv, causal, window):
    assert runner.visible_pairs(q, kv, causal, window) == int(allowed_keys(q, kv, causal, window).sum())


def test_decode_rate_reads_the_window_only():
    p = BenchProblem(XQA, 4, 1, 1000, window_left=99)
    assert runner.work(p) == (2.0 * 4 * 100 * 8 * 128 * 2, "TB/s")


@pytest.mark.parametrize("item, says", [
    ({"entry": "nope", "batch": 1, "q_len": 1, "kv_len": 8}, "allowed one of single"),
    ({"entry": "xqa", "batch": 1, "q_len": 2, "kv_len": 8}, r"decode \(q_len 1\)"),
    ({"entry": "cudnn", "batch": 1, "q_len": 2, "kv_len": 8, "window_left": 3}, "window"),
    ({"entry": "paged", "batch": 1, "q_len": 1, "kv_len": 8, "colour": 1}, "unknown field"),
])
def test_problem_file_errors_name_the_field(item, says):
    with pytest.raises(ValueError, match=says):
        problems.problem_from_json(item)


def test_user_problem_file_runs(tmp_path, capsys):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"entry": "ragged", "batch": 2, "q_len": 3, "kv_len": 11, "heads": "4/1",
                                 "head_dim": 16, "dtype": "float32", "causal": True, "backends": ["reference"]}]))
    assert cli.main(["bench", "--device", "cpu", "--problems", str(path), "--out", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["regret"]["count"] == 1
    rep = json.loads((tmp_path / "bench-mine-cpu.json").read_text())
    assert [b["backend"] for b in rep["results"][0]["backends"]] == ["reference", "auto", "flashinfer"]


def test_a_recheck_times_the_listed_backends_only(tmp_path):
    """``--recheck``: new rows for the listed backends, checked and timed, and no auto or FlashInfer row."""
    path = tmp_path / "again.json"
    path.write_text(json.dumps([{"entry": "paged", "batch": 2, "q_len": 1, "kv_len": 30, "heads": "4/2",
                                 "head_dim": 16, "dtype": "float32", "window_left": 7, "backends": ["reference"]}]))
    assert cli.main(["bench", "--device", "cpu", "--problems", str(path), "--out", str(tmp_path), "--recheck"]) == 0
    rows = json.loads((tmp_path / "bench-again-cpu.json").read_text())["results"][0]["backends"]
    assert [(b["backend"], b["status"]) for b in rows] == [("reference", "ok")] and rows[0]["eager_ms"] > 0


def test_profile_names_where_each_backends_host_time_goes(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"entry": "paged", "batch": 2, "q_len": 1, "kv_len": 9, "heads": "4/1",
                                 "head_dim": 16, "dtype": "float32", "kv_layout": "HND", "kv_pair": True,
                                 "backends": ["reference"]}]))
    assert cli.main(["bench", "--device", "cpu", "--problems", str(path), "--out", str(tmp_path),
                     "--profile", "4"]) == 0
    rows = json.loads((tmp_path / "bench-mine-cpu.json").read_text())["results"][0]["backends"]
    profiles = {b["backend"]: b["profile"] for b in rows if "profile" in b}
    assert set(profiles) == {"reference", "auto"}  # FlashInfer's own call runs on a GPU only
    assert all(len(lines) == 4 and "us own" in lines[0] for lines in profiles.values())
    assert any("reference.py" in line for line in profiles["reference"])
    md = (tmp_path / "bench-mine-cpu.md").read_text()
    assert "profile of paged 2x1x9" in md and ", auto (served by reference): host" in md


def test_h100_grid_covers_the_issue():
    g = grids.grid("h100")
    assert len(g) >= 60 and {p.entry for p in g} == set(problems.ENTRY_NAMES)
    assert all(problems.check_entry(p) is None for p in g)
    assert {p.num_qo_heads // p.num_kv_heads for p in g} >= {1, 4, 8} and {p.head_dim for p in g} >= {64, 128, 256}
    lengths = {p.kv_len for p in g}
    assert min(lengths) <= 16 and max(lengths) >= 32768 and min(p.batch for p in g) == 1
    assert max(p.batch for p in g) == 256
    assert any(p.window_left >= 0 for p in g) and any(p.soft_cap for p in g) and any(p.sinks for p in g)
    assert any(p.kv_type.startswith("float8") for p in g) and any(p.causal for p in g)


def test_results_become_a_timing_table(tmp_path):
    p = BenchProblem(PAGED, 64, 1, 4096)
    amount, unit = runner.work(p)
    results = {"environment": {"gpu": "NVIDIA H100 80GB HBM3", "capability": "sm_90", "torch": "x"},
               "results": [{"problem": p.to_json(), "name": p.name, "work": amount, "unit": unit, "backends": [
                   {"backend": "fa2", "status": "ok", "eager_ms": 0.4}, {"backend": "xqa", "status": "ok", "eager_ms": 0.5},
                   {"backend": "fa3", "status": "DISAGREES"}, {"backend": "auto", "status": "ok", "eager_ms": 0.4}]}]}
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(results))
    t = table.build_table(json.loads(src.read_text()), "bench.json")
    assert t.sm == 90 and t.rows[0].ms == {"fa2": 0.4, "xqa": 0.5}  # neither auto nor a disagreeing backend
    assert t.efficiency["fa2"].bandwidth == pytest.approx(amount / 0.4e-3 / 1e12 / 3.35, abs=1e-3)
    written = table.write_from_results(src, tmp_path / "t.json")
    assert json.loads(written.read_text())["rows"][0]["bucket"]["entry"] == "BatchPrefillWithPagedKVCacheWrapper"


def test_timer_wall_clock_counts_calls():
    from dispatch import timing

    calls = []
    assert timing.wall_ms(lambda: calls.append(torch.ones(1)), reps=3, warmup=2, calls=4) >= 0
    assert len(calls) == 2 + 3 * 4


def test_replay_reads_todays_choice_against_measured_times(tmp_path):
    """--replay: the router's choice now (the H100 table, not live) for each measured problem,
    its measured time against the fastest; a choice the sweep never timed is not judged."""
    from tools.lab import replay
    problem = {"entry": "BatchPrefillWithPagedKVCacheWrapper.run", "batch": 64, "q_len": 1, "kv_len": 4096}
    results = {"environment": {"gpu": "NVIDIA H100 80GB HBM3", "capability": "sm_90"}, "results": [
        {"name": "p", "problem": problem, "auto": "fa2", "regret": 0.0, "backends": [
            {"backend": "fa2", "status": "ok", "eager_ms": 0.40}, {"backend": "cudnn", "status": "ok", "eager_ms": 0.30},
            {"backend": "native-triton", "status": "ok", "eager_ms": 0.41}]},
        {"name": "q", "problem": problem, "backends": [{"backend": "cudnn", "status": "ok", "eager_ms": 0.30}]}]}
    rows = replay.replay(results)
    chosen = rows[0]["chosen"]
    assert chosen in ("fa2", "cudnn", "native-triton", "xqa")
    want = {"fa2": 0.40, "cudnn": 0.30, "native-triton": 0.41}.get(chosen)
    assert rows[0]["chosen_ms"] == want and rows[0]["fastest"] == "cudnn"
    assert rows[0]["regret"] == (None if want is None else pytest.approx(want / 0.30 - 1))
    assert rows[1]["regret"] is None or rows[1]["chosen"] == "cudnn"  # only cudnn was timed there
    path = tmp_path / "r.json"
    path.write_text(__import__("json").dumps(results))
    md, _ = replay.write([path], tmp_path)
    assert "Regret of today's choice" in md.read_text()


@pytest.mark.parametrize("version, counted", [("0.7.2", False), ("0.6.18", True)])
def test_replay_leaves_out_a_flashinfer_call_known_to_get_the_sinks_wrong(version, counted):
    """FlashInfer 0.7.2's paged wrapper on sm_90 is far from the oracle once sinks carry weight
    (build.OWN_CALL_WRONG): its time on a sinks problem is no comparison; another version's still
    is (nothing was seen of it)."""
    from tools.lab import replay
    problem = {"entry": PAGED, "batch": 8, "q_len": 1, "kv_len": 4096, "sinks": True}
    results = {"environment": {"gpu": "NVIDIA H200", "capability": "sm_90", "flashinfer": version}, "results": [
        {"name": "p", "problem": problem, "backends": [
            {"backend": "native-triton", "status": "ok", "eager_ms": 0.30},
            {"backend": "xqa", "status": "ok", "eager_ms": 0.30},
            {"backend": "flashinfer", "status": "ok", "eager_ms": 0.10}]}]}
    row = replay.replay(results)[0]
    assert row["chosen_ms"] == 0.30
    assert row["over_flashinfer"] == (pytest.approx(3.0) if counted else None)


@pytest.mark.parametrize("entry, layout, capability, runs", [
    ("trtllm", "NHD", (9, 0), False), ("trtllm", "NHD", (10, 0), True),  # trtllm-gen: SM100+ only
    ("single", "HND", (9, 0), False), ("single", "NHD", (9, 0), True), ("paged", "HND", (9, 0), True)])
def test_flashinfer_own_call_is_not_made_where_it_cannot_run(monkeypatch, entry, layout, capability, runs):
    """The bench neither times nor warms FlashInfer's own call where it fails or kills the process
    on this GPU (build.flashinfer_own_not_run); elsewhere it is made."""
    from dispatch.benchmark import runner
    from dispatch.benchmark.problems import problem_from_json
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    p = problem_from_json({"entry": entry, "batch": 1 if entry == "single" else 2, "q_len": 4, "kv_len": 64,
                           "heads": "4/2", "head_dim": 16, "dtype": "float32", "kv_layout": layout})
    assert (build.flashinfer_own_not_run(p) is None) == runs
    monkeypatch.setattr(runner, "flashinfer_api", lambda: ({p.entry: object()}, ""))
    monkeypatch.setattr(runner, "measure", lambda *a: {"backend": runner.FLASHINFER, "status": "ok"})
    row = runner._flashinfer_row(build.build(p, "cpu"), "cuda", 1)
    assert row["status"] == ("ok" if runs else "absent")


def test_flashinfer_column_measures_its_own_call_beside_auto(monkeypatch):
    """The ``flashinfer`` row: FlashInfer's own entry point with the same inputs, checked against
    fp64 and timed like ours (here our own functions stand in for FlashInfer: none on the CPU);
    ``auto_over_flashinfer`` compares auto with it, and the Markdown says how often auto wins."""
    from dispatch.benchmark import build, report, runner
    from dispatch.benchmark.problems import BenchProblem
    monkeypatch.setattr(runner, "flashinfer_api", lambda: (build.OURS, ""))
    monkeypatch.setattr(runner, "_flashinfer_row", lambda b, device, reps, profile=0, calls=None: runner.measure(
        b, runner.FLASHINFER, device, reps, runner.flashinfer_api()[0], profile, calls))
    p = BenchProblem(entry="xqa_batch_decode_with_kv_cache", batch=2, q_len=1, kv_len=40, num_qo_heads=4,
                     num_kv_heads=2, head_dim=16, dtype="float32", page_size=8, backends=("reference",))
    result = runner.run_problem(p, "cpu", reps=1, l2_bytes=0)
    fi = next(r for r in result["backends"] if r["backend"] == runner.FLASHINFER)
    assert fi["status"] == "ok" and fi["rel_err"] <= fi["band"] and fi["eager_ms"] > 0
    assert result["auto_over_flashinfer"] == pytest.approx(result["auto_ms"] / fi["eager_ms"])
    text = report.markdown({"environment": {}, "grid": "t", "method": "", "regret": {}, "results": [result]})
    assert "Auto against FlashInfer's own call" in text and "| flashinfer" in text.replace("| auto | regret | ", "| ")


def test_host_rounds_keep_each_backends_least_time_in_interleaved_turns(monkeypatch):
    """On a GPU, the host time of every row whose GPU time can let host time decide is timed again in
    rounds that take the backends in turn (rotating order), each in its own backend's scope, and
    becomes the least of its timings; a row of long GPU time keeps its one figure."""
    p = BenchProblem(entry="single_prefill_with_kv_cache", batch=1, q_len=4, kv_len=16, num_qo_heads=2,
                     num_kv_heads=2, head_dim=16, dtype="float32")
    built = build.build(p, "cpu")
    turns, scopes = [], []
    monkeypatch.setattr(runner, "_sync", lambda device: None)  # no GPU here: the rounds' syncs are no-ops
    monkeypatch.setattr(runner, "backend_scope", lambda name: scopes.append(name) or contextlib.nullcontext())
    times = iter([30.0, 5.0, 40.0, 6.0, 50.0, 7.0, 60.0, 8.0])
    monkeypatch.setattr(runner, "_host_us", lambda call, b, device, repeats=3: (turns.append(call), next(times))[1])
    rows = [{"backend": "fa2", "host_us": 20.0, "eager_ms": 0.01}, {"backend": "cudnn", "host_us": 9.0, "eager_ms": 0.02},
            {"backend": "fa3", "host_us": 70.0, "eager_ms": 5.0}, {"backend": "auto", "host_us": None}]
    calls = {"fa2": "fa2-call", "cudnn": "cudnn-call", "fa3": "fa3-call"}
    runner._host_rounds(rows, calls, built, "cuda")
    order = ["fa2", "cudnn", "cudnn", "fa2"] * 2  # HOST_ROUNDS rounds, each starting one later
    assert runner.HOST_ROUNDS == 4 and scopes == order and turns == [f"{name}-call" for name in order]
    assert [r["host_us"] for r in rows] == [6.0, 5.0, 70.0, None]  # fa2: 20 then 30, 6, 50, 8; cudnn: 9 then 5, ...
    assert rows[0].get("host_rounds") == runner.HOST_ROUNDS and "host_rounds" not in rows[2]
    runner._host_rounds(rows, calls, built, "cpu")  # the CPU's figure is the whole call: no rounds
    assert len(turns) == len(order)


def test_flashinfer_column_says_why_it_is_absent():
    from dispatch.benchmark import runner
    from dispatch.benchmark.problems import BenchProblem
    p = BenchProblem(entry="single_prefill_with_kv_cache", batch=1, q_len=4, kv_len=9, num_qo_heads=4,
                     num_kv_heads=2, head_dim=16, dtype="float32", backends=("reference",))
    row = next(r for r in runner.run_problem(p, "cpu", reps=1, l2_bytes=0)["backends"] if r["backend"] == "flashinfer")
    assert row["status"] == "absent" and row["note"]


# --------------------------------------------------------------------- tools/ over bench
ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "tools" / "grids").glob("*.json")), ids=lambda p: p.name)
def test_every_problems_file_in_tools_grids_is_a_valid_bench_input(path):
    """The former GPU scripts are ``attn-dispatch bench --problems tools/grids/<name>.json``: each
    file must parse (fields, entry points, what each entry can express) and name real backends."""
    from backends import REGISTRY

    items = json.loads(path.read_text())
    assert isinstance(items, list) and items
    parsed = [problems.problem_from_json(item) for item in items]
    assert all(set(p.backends) <= set(REGISTRY) for p in parsed), [p.backends for p in parsed]
    listed = cli.main(["bench", "--problems", str(path), "--list", "--device", "cpu"])
    assert listed == 0


def test_no_tool_imports_tests():
    """tools/ never imports tests/ (nor puts it on sys.path): the shared inputs and the one oracle
    live in dispatch/ (lab*.py, bench/oracle.py)."""
    import ast

    test_modules = {p.stem for p in (ROOT / "tests").glob("*.py")} | {"tests"}
    for tool in sorted((ROOT / "tools").glob("*.py")):
        source = tool.read_text()
        for node in ast.walk(ast.parse(source)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not {n.split(".")[0] for n in names} & test_modules, f"{tool.name} imports {names}"
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.path.insert", "sys.path.append"):
                assert "tests" not in ast.get_source_segment(source, node), f"{tool.name} puts tests/ on sys.path"


def test_the_terminal_summary_fits_100_columns_and_names_failing_backends():
    """report.summary_text: long problem names get a line of their own, a backend whose output
    disagreed with the oracle (or raised) is named under its problem, nothing passes 100 columns."""
    from dispatch.benchmark import report

    long_name = "paged 64x1x4096 h32/8 d128 bf16 window1023,softcap30,sinks,lse,and-more-features"
    rows = [{"name": "xqa 2x1x16 h4/2 d32 fp32", "fastest": "reference", "fastest_ms": 1.5, "auto": "reference",
             "auto_ms": 1.52, "regret": 0.013, "backends": [{"backend": "reference", "status": "ok"}]},
            {"name": long_name, "fastest": "native-triton", "fastest_ms": 0.25, "auto": "cudnn", "auto_ms": 0.5,
             "regret": 1.0, "backends": [{"backend": "cudnn", "status": "DISAGREES"},
                                          {"backend": "fa2", "status": "error", "note": "x" * 300}]},
            {"name": "single 1x1x8 h4/2 d32 fp32", "error": "skipped: --budget-s spent"}]
    rep = {"grid": "mine", "environment": {"gpu": None}, "results": rows, "regret": report.regret_figures(rows)}
    text = report.summary_text(rep)
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines)
    assert lines[0] == "attn-dispatch bench: mine on CPU, 3 problems" and "max 100.0%" in lines[1]
    i = lines.index(long_name)
    assert lines[i + 1].split() == ["native-triton", "0.25", "cudnn", "0.5", "100.0%", "-"]  # "-": no noise figure
    assert lines[i + 2].startswith("  ! cudnn DISAGREES; fa2 error (xxx")
    assert any(line.startswith("xqa 2x1x16 h4/2 d32 fp32") and line.split()[-2] == "1.3%" for line in lines)
    assert lines[-1] == "single 1x1x8 h4/2 d32 fp32: skipped: --budget-s spent"


def test_flashinfer_column_calls_an_older_trtllm_signature():
    """FlashInfer 0.5.3's trtllm_batch_context_with_kv_cache takes no causal=/return_lse=/lse= (it is
    causal, without LSE): the column calls it without them, and names what it lacks otherwise."""
    from types import SimpleNamespace
    seen = {}

    def trtllm_053(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
                   bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left=-1, out=None, out_dtype=None,
                   o_sf_scale=None, o_sf_vec_size=None, kv_layout="HND", enable_pdl=None, sinks=None):
        seen.update(window_left=window_left, kv_layout=kv_layout)
        return out

    def built(causal, lse):
        problem = SimpleNamespace(causal=causal, lse=lse, q_len=4, kv_len=8, batch=2, window_left=-1, kv_layout="NHD")
        case = {k: None for k in ("q", "table", "seq", "qo", "kv_tokens")}
        return SimpleNamespace(problem=problem, case={**case, "device": "cpu"}, scale=0.1, out=None, sinks=None,
                               lse=torch.empty(3) if lse else None)
    build._trtllm(built(True, False), trtllm_053)("kv")
    assert seen == {"window_left": -1, "kv_layout": "NHD"}
    for causal, lse, words in ((False, False, "takes no causal="), (True, True, "takes no return_lse, lse=")):
        with pytest.raises(NotImplementedError, match=words):
            build._trtllm(built(causal, lse), trtllm_053)


def test_merged_results_keep_the_backends_a_later_file_did_not_run(tmp_path):
    """A recheck that re-runs one backend of a problem replaces that backend's time only: the
    table keeps the others (a merge that took the later result whole made the router pick a
    backend 2.9x slower, its time having gone from the table); FlashInfer's column is no backend."""
    env = {"gpu": "NVIDIA H100 80GB HBM3", "capability": "sm_90"}
    problem = BenchProblem(entry=PAGED, batch=64, q_len=16, kv_len=2048, num_qo_heads=32, num_kv_heads=8,
                           head_dim=128, causal=True)
    fields = {f: getattr(problem, f) for f in problem.__dataclass_fields__}

    def result(times: dict) -> dict:
        return {"name": "paged 64x16x2048", "problem": {**fields, "backends": []}, "work": 1e9,
                "backends": [{"backend": b, "status": "ok", "eager_ms": t} for b, t in times.items()]}
    first, recheck = tmp_path / "run.json", tmp_path / "recheck.json"
    measured = {**result({"cudnn": 0.57, "fa2": 0.20, "fa3": 0.67}), "auto": "cudnn", "regret": 1.85}
    first.write_text(json.dumps({"environment": env, "results": [measured]}))
    recheck.write_text(json.dumps({"environment": env, "results": [{**result({"fa2": 0.19, "flashinfer": 0.66}),
                                                                    "auto": None, "regret": None}]}))
    results, _ = table.merged([first, recheck])
    built = table.build_table(results, "test")
    assert built.rows[0].ms == {"cudnn": 0.57, "fa2": 0.19, "fa3": 0.67}
    # the row names the files its times came from, not every file merged (the H200's table repeated
    # its 89 sources in each of 2326 rows: 16.9 MB, 6.5 MB without)
    assert built.rows[0].source == "run.json + recheck.json: paged 64x16x2048"
    assert (results["results"][0]["auto"], results["results"][0]["regret"]) == ("cudnn", 1.85)  # as measured
    again = tmp_path / "again.json"  # a whole re-run, auto included, brings its own summary
    again.write_text(json.dumps({"environment": env, "results": [{**result({"fa2": 0.18, "auto": 0.18}),
                                                                  "auto": "fa2", "regret": 0.0}]}))
    results, _ = table.merged([first, recheck, again])
    assert (results["results"][0]["auto"], results["results"][0]["regret"]) == ("fa2", 0.0)
    assert table.build_table(results, "test").rows[0].ms == {"cudnn": 0.57, "fa2": 0.18, "fa3": 0.67}
    assert table.build_table(table.merged([again])[0], "test").rows[0].source == "again.json: paged 64x16x2048"


# ------------------------------------------------- regret, noise, skipped backends, plots
def _row(backend, ms, served=None):
    row = {"backend": backend, "status": "ok", "eager_ms": ms}
    return {**row, "served": served} if served else row


@pytest.mark.parametrize("rows, want", [
    # auto served the fastest: two runs of one backend differ by noise, never by regret
    ([_row("reference", 1.0), _row("auto", 0.8, "reference")],
     dict(fastest="reference", fastest_ms=0.8, regret=0.0, noise=pytest.approx(0.2))),
    ([_row("reference", 0.8), _row("auto", 1.0, "reference")],
     dict(fastest="reference", fastest_ms=0.8, regret=0.0, noise=pytest.approx(0.25))),
    # auto served a slower backend: regret between the two backends' best times
    ([_row("a", 1.0), _row("b", 2.0), _row("auto", 1.8, "b")],
     dict(fastest="a", fastest_ms=1.0, regret=pytest.approx(0.8), noise=pytest.approx(0.1))),
    # auto's own run makes the served backend the fastest: the fastest column says so
    ([_row("a", 1.0), _row("b", 1.1), _row("auto", 0.95, "b")],
     dict(fastest="b", fastest_ms=0.95, regret=0.0)),
    # auto served a backend not forced here: regret from auto's own time, never negative
    ([_row("a", 1.0), _row("auto", 0.9, "c")], dict(fastest="c", fastest_ms=0.9, regret=0.0, noise=None)),
])
def test_regret_compares_backends_and_noise_compares_runs(rows, want):
    got = runner.summarize(rows)
    assert {k: got[k] for k in want} == want
    shown = [ms for ms in (r["eager_ms"] for r in rows)]
    assert got["fastest_ms"] == min(shown), "the fastest column shows a slower time than one in the row"


def test_a_backend_not_usable_here_is_named_with_how_to_enable_it(monkeypatch):
    from backends.native.triton_backend import NativeTritonBackend
    from dispatch.benchmark import report

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(NativeTritonBackend, "_available", None)
    p = BenchProblem(entry=XQA, batch=2, q_len=1, kv_len=40, num_qo_heads=4, num_kv_heads=2, head_dim=16,
                     dtype="float32", page_size=8, backends=("reference", "native-triton"))
    result = runner.run_problem(p, "cpu", reps=1, l2_bytes=0)
    skipped = {b["backend"]: b for b in result["backends"] if b["status"] == "skipped"}
    assert list(skipped) == ["native-triton"] and "TRITON_INTERPRET=1" in skipped["native-triton"]["note"]
    rep = {"grid": "t", "environment": {}, "method": "", "results": [result],
           "regret": report.regret_figures([result])}
    text = report.summary_text(rep)
    assert "not run here: native-triton (device: no CUDA device; to enable: a CUDA GPU, or TRITON_INTERPRET=1" in text
    assert "- not run here: native-triton" in report.markdown(rep)
    assert "| native-triton" not in report.markdown(rep)  # no column of "skipped" cells


def test_the_figures_report_noise_apart_from_regret():
    from dispatch.benchmark import report

    results = [{"name": "x", "fastest": "reference", "auto": "reference", "regret": 0.0, "noise": 0.3},
               {"name": "y", "fastest": "a", "auto": "b", "regret": 0.2, "noise": 0.01}]
    fig = report.regret_figures(results)
    assert fig["max"] == 0.2 and fig["auto_served_fastest"] == 1 and fig["noise_max"] == 0.3
    assert "noise (two timings of the same backend): p50 1.0%, max 30.0%" in report._figures_text(fig)


class _Axes:
    """Records what a panel draws (matplotlib is an optional extra: the layout is tested without it)."""

    def __init__(self):
        self.points, self.separators, self.labels, self.ticks = [], [], [], []

    def plot(self, x, y, **style):
        assert style.get("linestyle") == "none", "a line joins problems that are unrelated"
        self.points.append((x, y, style.get("marker")))

    def axvline(self, x, **_):
        self.separators.append(x)

    def annotate(self, text, xy, **_):
        self.labels.append((text, xy[0]))

    def set_xticklabels(self, labels, **_):
        self.ticks = list(labels)

    def __getattr__(self, name):  # set_title, set_yscale, ...: nothing to check
        return lambda *a, **k: None


def test_a_rate_panel_draws_points_per_problem_grouped_by_feature_set():
    from dispatch.benchmark import report

    def result(kv, causal, rates):
        p = BenchProblem(PAGED, 2, 16, kv, num_qo_heads=4, num_kv_heads=2, head_dim=16, dtype="float32", causal=causal)
        return {"name": p.name, "problem": p.to_json(), "unit": "TFLOP/s",
                "backends": [{"backend": n, "status": "ok", "rate": r} for n, r in rates.items()]}

    rs = [result(64, True, {"reference": 1.0, "auto": 1.0}), result(32, False, {"reference": 2.0, "auto": 2.0}),
          result(32, True, {"reference": 3.0, "native-triton": 0.5, "auto": 3.0})]
    ax = _Axes()
    report._rate_panel(ax, "paged", "prefill", "TFLOP/s", rs, {"reference": "C0", "native-triton": "C1"})
    assert [t for t, _ in ax.labels] == ["h4/2 d16 fp32", "h4/2 d16 fp32 causal"] and ax.separators == [0.5]
    assert ax.ticks == ["2x16x32", "2x16x32", "2x16x64"]  # by feature set, then size
    assert sorted((x, y) for x, y, m in ax.points if m == "x") == [(0, 2.0), (1, 3.0), (2, 1.0)]
    assert len([p for p in ax.points if p[2] == "o"]) == 4


def test_plot_titles_name_device_grid_and_versions():
    from dispatch.benchmark import report

    env = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.9.0", "triton": "3.5.0", "attn-dispatch": "0.1.0",
           "flashinfer": "not installed (ImportError)"}
    title = report.plot_title({"grid": "h100", "environment": env}, "rate")
    assert "grid h100 on NVIDIA H100 80GB HBM3" in title
    assert "attn-dispatch 0.1.0, torch 2.9.0, triton 3.5.0, flashinfer not installed" in title


def test_a_sweep_with_the_warm_up_autotune_says_so(tmp_path, monkeypatch):
    """--tune: the sweep runs inside the autotune context (auto's column is what timing on this
    machine chose); the run's environment and file names say so, and its times are kept beside it."""
    from dispatch import autotune, router
    monkeypatch.setenv(autotune.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setattr(autotune, "_known", {})
    monkeypatch.setattr(autotune, "_read_default", set())
    router.clear_caches()
    try:
        assert cli.main(["bench", "--device", "cpu", "--quick", "--limit", "1", "--tune", "--out", str(tmp_path)]) == 0
    finally:
        router.clear_caches()
    rep = json.loads((tmp_path / "bench-quick-cpu-autotune.json").read_text())
    assert rep["environment"]["autotune"].startswith("tuning") and rep["results"][0]["auto"]
    assert not autotune.tuning()


def test_a_gpu_run_records_the_table_auto_ranked_by(monkeypatch):
    """The environment of a run on a GPU names the choice table in force: an H100's auto column
    ranks by the H100's own compiled table (no GPU here: its name, capability and description are faked)."""
    import capability_db
    from capability_db import choice_table
    from dispatch import devices
    from dispatch.benchmark import bench
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(devices, "live_device", lambda tensor: capability_db.resolve_device("h100"))
    monkeypatch.setattr(bench.torch, "empty", lambda *a, **k: None)
    env = report.environment("cuda")
    assert env["timing_table"] == choice_table.describe(capability_db.resolve_device("h100"))
    assert env["timing_table"].startswith("tables/h100.json (") and env["timing_table"].endswith("; this GPU's own")
    assert "timing_table" not in report.environment("cpu")
