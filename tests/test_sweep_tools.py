"""The sweep's tools: warm-up workers (dispatch/benchmark/warm.py), the call-cost regret (runner.call_cost),
the replay of the router's choice against measured times (tools/lab/replay.py) and the tools that
read sweeps."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import capability_db
import pytest
from dispatch import router
from dispatch.benchmark import bench, runner, warm
from dispatch.benchmark.problems import PAGED, SINGLE, BenchProblem
from tools.lab import table


def test_a_small_copy_keeps_what_selects_a_module():
    p = BenchProblem(entry=PAGED, batch=77, q_len=900, kv_len=30000, num_qo_heads=32, num_kv_heads=8, head_dim=256,
                     dtype="float16", kv_dtype="float8_e4m3fn", page_size=32, causal=True, window_left=5000,
                     soft_cap=30.0, sinks=True, lse=True, kv_layout="HND", kv_pair=True)
    s = warm.small(p)
    assert (s.batch, s.q_len, s.kv_len) == (2, 16, 64) and 0 <= s.window_left <= 32
    keep = {f.name for f in dataclasses.fields(p)} - {"batch", "q_len", "kv_len", "window_left"}
    assert all(getattr(s, name) == getattr(p, name) for name in keep)
    decode = warm.small(dataclasses.replace(p, q_len=1, window_left=-1))
    assert decode.q_len == 1 and decode.window_left == -1


def test_a_sweep_with_warm_workers_waits_for_them_and_records_the_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert bench.main(["--random", "2", "--seed", "11", "--device", "cpu", "--warm-workers", "1",
                       "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench-random-2-seed-11-cpu.json").read_text())["results"]
    assert len(results) == 2 and all("backends" in r and r["warm_wait_s"] >= 0 for r in results)


class FakeClock:
    """``warm``'s clock: time passes only when the code under test sleeps, and ``on_sleep`` runs at
    each sleep (the sweep's side of a test acts there), so a test asserts what happened in which
    order, never how long a loaded machine took."""

    def __init__(self, on_sleep=lambda clock: None):
        self.now, self.sleeps, self.on_sleep = 0.0, 0, on_sleep

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1
        self.on_sleep(self)


def test_a_worker_starts_no_call_while_the_sweep_times_a_problem(tmp_path, monkeypatch):
    import contextlib

    warmup = warm.Warmup.__new__(warm.Warmup)  # its folder only: no worker processes
    warmup.dir = tmp_path
    events = []
    with contextlib.ExitStack() as sweep:
        sweep.enter_context(warmup.timing())

        def sweep_finishes_on_the_third_wait(clock):
            events.append("worker waits")
            if clock.sleeps == 3:
                sweep.close()  # the sweep's timing ends: the flag goes
                events.append("timing ended")
        monkeypatch.setattr(warm, "time", FakeClock(sweep_finishes_on_the_third_wait))
        warm.wait_while_timing(tmp_path)
        events.append("worker goes on")
    assert events == ["worker waits"] * 3 + ["timing ended", "worker goes on"]
    assert not (tmp_path / warm.TIMING_FLAG).exists()


def test_a_worker_waits_for_nothing_when_no_timing_is_under_way(tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(warm, "time", clock)
    warm.wait_while_timing(tmp_path)  # the bound would be 900 s
    assert clock.sleeps == 0


def test_a_worker_stops_waiting_for_a_sweep_that_died_mid_problem(tmp_path, monkeypatch):
    (tmp_path / warm.TIMING_FLAG).touch()  # the flag of a sweep that never removed it
    clock = FakeClock()
    monkeypatch.setattr(warm, "time", clock)
    warm.wait_while_timing(tmp_path, most_s=0.2)
    assert clock.sleeps > 0 and 0.2 <= clock.now < 0.25  # the bound, in the clock's own time
    assert (tmp_path / warm.TIMING_FLAG).exists()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_the_host_noise_experiment_stops_the_workers_and_their_children():
    spec = importlib.util.spec_from_file_location("host_noise_ab", Path("tools/host_noise_ab.py"))
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    worker = subprocess.Popen([sys.executable, "-c", f"import subprocess, time; subprocess.Popen({sleep!r}); time.sleep(60)"])
    try:
        deadline = time.time() + 20
        while not ab.descendants(worker.pid) and time.time() < deadline:
            time.sleep(0.05)
        pids = [worker.pid, *ab.descendants(worker.pid)]
        assert len(pids) == 2, "the worker's child did not start"
        with ab.stopped(SimpleNamespace(procs=[worker])):
            time.sleep(0.1)
            assert {_state(pid) for pid in pids} == {"T"}
        time.sleep(0.1)
        assert "T" not in {_state(pid) for pid in pids}
    finally:
        for pid in reversed(pids):
            os.kill(pid, signal.SIGKILL)
        worker.wait()


def test_call_cost_ranks_gpu_and_host_time_together():
    rows = [{"backend": "fa2", "status": "ok", "eager_ms": 0.010, "host_us": 40.0},
            {"backend": "native-triton", "status": "ok", "eager_ms": 0.015, "host_us": 20.0},
            {"backend": "auto", "status": "ok", "served": "fa2", "eager_ms": 0.010, "host_us": 41.0},
            {"backend": "flashinfer", "status": "ok", "eager_ms": 0.010, "host_us": 25.0}]
    s = runner.summarize(rows)
    assert s["fastest"] == "fa2" and s["regret"] == 0.0  # by GPU time
    assert s["cost_fastest"] == "native-triton"  # 35 us against fa2's 50
    assert abs(s["cost_regret"] - (0.050 / 0.035 - 1)) < 1e-9
    assert abs(s["cost_auto_over_flashinfer"] - 0.050 / 0.035) < 1e-9


def test_replay_judges_the_graph_choice_by_gpu_time_and_the_eager_choice_by_call_cost():
    """A captured call can run only a backend a CUDA graph can capture (fa2 and fa3 cannot through a
    function entry, whose lengths are per call): ``regret`` counts every backend, ``graph_regret`` the
    capturable ones; the eager choice is judged by GPU + host time (fa2 here by its eager time alone:
    it plans on every call through this entry, and that time holds its host path); both against
    FlashInfer's own call."""
    from tools.lab import replay
    problem = {"entry": "xqa_batch_decode_with_kv_cache", "batch": 64, "q_len": 1, "kv_len": 4096}
    own = {"backend": "flashinfer", "status": "ok", "eager_ms": 0.25, "host_us": 50.0}
    results = {"environment": {"gpu": "NVIDIA H200", "capability": "sm_90"}, "results": [
        {"name": "p", "problem": problem, "backends": [
            {"backend": "fa2", "status": "ok", "eager_ms": 0.20, "host_us": 30.0},
            {"backend": "xqa", "status": "ok", "eager_ms": 0.24, "host_us": 20.0},
            {"backend": "native-triton", "status": "ok", "eager_ms": 0.30, "host_us": 20.0}, own]}]}
    row = replay.replay(results)[0]
    assert row["chosen"] in ("xqa", "native-triton") and row["fastest"] == "fa2"  # fa2: not in a graph here
    ms = {"xqa": 0.24, "native-triton": 0.30}[row["chosen"]]
    assert row["regret"] == pytest.approx(ms / 0.20 - 1)
    assert row["graph_regret"] == pytest.approx(ms / 0.24 - 1)
    assert row["over_flashinfer"] == pytest.approx(ms / 0.25)
    assert row["cheapest"] == "fa2"
    cost = {"fa2": 0.20, "xqa": 0.26, "native-triton": 0.32}[row["eager_chosen"]]
    assert row["cost_regret"] == pytest.approx(cost / 0.20 - 1)
    assert row["cost_over_flashinfer"] == pytest.approx(cost / 0.30)
    assert row["cause"].startswith("fa2 not a candidate: cuda_graph=True")  # the miss, named


def test_replay_names_the_estimate_that_ranked_a_miss():
    """A miss (regret over 3%) carries its cause: which of the two estimates was off, by how much and
    on what basis, against the measured times; a hit carries none."""
    from types import SimpleNamespace

    from tools.lab import replay
    estimate = lambda ms: SimpleNamespace(ms=ms, basis="table")  # noqa: E731
    decision = SimpleNamespace(chosen="fa2", ranking="expected time", candidates=[
        SimpleNamespace(backend="fa2", accepted=True, ranked=True, evidence=estimate(0.10), reasons=[], why=""),
        SimpleNamespace(backend="native-triton", accepted=True, ranked=True, evidence=estimate(0.50), reasons=[],
                        why="")])
    cause = replay.miss_cause(decision, {"fa2": 0.12, "native-triton": 0.10}, "native-triton")
    assert "native-triton's estimate (table) off by 0.20x" in cause
    rows = [{"chosen": "fa2", "fastest": "native-triton", "cause": cause}, {"chosen": "fa2", "fastest": "fa2",
                                                                            "cause": ""}]
    assert replay.cause_kinds(rows) == [("the fastest's estimate too high (table)", 1)]
    decision.candidates[1].evidence = estimate(0.099)
    assert replay.miss_cause(decision, {"fa2": 0.12, "native-triton": 0.10}, "native-triton").startswith(
        "ranked fa2 first though it expected it 1.01x")


def test_replay_can_judge_the_eager_choice_by_todays_host_times():
    """Rows measured before a backend's host path changed carry the old path's host time: with
    ``host_now`` (a table's host_us) the eager cost takes today's figure where the table has one."""
    from tools.lab import replay
    problem = {"entry": "BatchPrefillWithPagedKVCacheWrapper.run", "batch": 1, "q_len": 1, "kv_len": 64}
    results = {"environment": {"gpu": "NVIDIA H200", "capability": "sm_90"}, "results": [
        {"name": "p", "problem": problem, "backends": [
            {"backend": "fa2", "status": "ok", "eager_ms": 0.010, "host_us": 34.0},
            {"backend": "native-triton", "status": "ok", "eager_ms": 0.012, "host_us": 14.0}]}]}
    then = replay.replay(results)[0]
    now = replay.replay(results, {"fa2": {"BatchPrefillWithPagedKVCacheWrapper": 15.0}})[0]
    chosen = then["eager_chosen"]
    assert now["eager_chosen"] == chosen
    then_cost, now_cost = {"fa2": 0.044, "native-triton": 0.026}, {"fa2": 0.025, "native-triton": 0.026}
    assert then["cost_regret"] == pytest.approx(then_cost[chosen] / 0.026 - 1)
    assert now["cost_regret"] == pytest.approx(now_cost[chosen] / 0.025 - 1)


def test_replay_of_an_autotune_sweep_decides_from_its_kept_times_and_never_times(tmp_path, monkeypatch):
    """``bench --replay ... --autotune-file``: the choice comes from the buckets the sweep's autotune
    kept (GPU ms and host us), nothing is timed, the file is left as it was, and a miss names the
    autotune's estimate against the problem's measured times."""
    from dispatch import autotune
    from tools.lab import replay
    monkeypatch.delenv(autotune.ENV_AUTOTUNE, raising=False)
    problem = {"entry": "xqa_batch_decode_with_kv_cache", "batch": 64, "q_len": 1, "kv_len": 4096}
    results = {"environment": {"gpu": "NVIDIA H200", "capability": "sm_90"}, "results": [
        {"name": "p", "problem": problem, "backends": [
            {"backend": "fa2", "status": "ok", "eager_ms": 0.20, "host_us": 30.0},
            {"backend": "xqa", "status": "ok", "eager_ms": 0.24, "host_us": 20.0},
            {"backend": "native-triton", "status": "ok", "eager_ms": 0.30, "host_us": 20.0}]}]}
    keys: list[str] = []
    real_key = autotune.bucket_key
    monkeypatch.setattr(autotune, "bucket_key", lambda *a: keys.append(real_key(*a)) or keys[-1])
    monkeypatch.setattr(autotune, "measure", lambda *a: pytest.fail("a replay timed a bucket"))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"buckets": {}}))
    replay.replay(results, autotune_file=empty)  # no bucket: the table decides
    assert keys and len(set(keys)) == 1  # graph and eager share one bucket
    kept = {"fa2": {"ms": 0.5, "host_us": 30.0}, "xqa": {"ms": 0.3, "host_us": 20.0},
            "native-triton": {"ms": 0.1, "host_us": 10.0}}
    sweep = tmp_path / "sweep-cache.json"
    sweep.write_text(json.dumps({"buckets": {keys[0]: kept}}))
    before = sweep.read_text()
    row = replay.replay(results, autotune_file=sweep)[0]
    assert row["chosen"] == row["eager_chosen"] == "native-triton"
    assert row["cheapest"] == "fa2" and "(autotune)" in row["eager_cause"]
    assert sweep.read_text() == before and autotune._replayed is None and not autotune.tuning()


def test_replay_reports_what_the_autotunes_timing_cost_per_bucket(tmp_path):
    from tools.lab import replay
    path = tmp_path / "cache.json"
    path.write_text(json.dumps({"buckets": {
        "a": {"fa2": {"ms": 0.1, "host_us": 9.0, "tune_s": 1.5}, "native-triton": {"ms": 0.2, "tune_s": 0.5}},
        "b": {"fa2": {"ms": 0.1, "tune_s": 0.25}, "xqa": None}}}))
    text = replay.tuning_text(path)
    assert "2 buckets" in text and "max 2.00 s" in text and "p50 2.00 s" in text and "2 s in all" in text
    path.write_text(json.dumps({"buckets": {"a": {"fa2": 0.1}}}))  # a file written before tune_s
    assert "does not record" in replay.tuning_text(path)
    path.write_text(json.dumps({"buckets": {"a": {"measured": "2026-11-28T07:00:00+00:00", "times": {  # the warm-up's
        "fa2": {"ms": 0.1, "tune_s": 1.5}, "xqa": None}}}}))
    assert "1 buckets" in replay.tuning_text(path) and "max 1.50 s" in replay.tuning_text(path)


def test_replay_never_serves_a_backend_a_known_defect_of_the_sweeps_version_keeps_out():
    """Live, the router rejects a backend whose installed version has a known defect for the problem
    (XQA on FlashInfer 0.7.2: defects.json); off the GPU nothing is installed, so the replay reads the
    sweep's versions: it serves the next backend, and a miss against that backend names the defect."""
    from tools.lab import replay
    problem = {"entry": "xqa_batch_decode_with_kv_cache", "batch": 8, "q_len": 1, "kv_len": 1024}
    backends = [{"backend": "xqa", "status": "ok", "eager_ms": 0.010, "host_us": 10.0},
                {"backend": "native-triton", "status": "ok", "eager_ms": 0.020, "host_us": 10.0}]
    env = {"gpu": "NVIDIA H200", "capability": "sm_90"}
    rows = {version: replay.replay({"environment": {**env, "flashinfer": version},
                                    "results": [{"name": "p", "problem": problem, "backends": backends}]})[0]
            for version in ("0.7.2", "not installed (ModuleNotFoundError)")}
    gated = rows["0.7.2"]
    assert gated["chosen"] == gated["eager_chosen"] == "native-triton" and gated["fastest"] == "xqa"
    assert gated["cause"] == "xqa not chosen automatically: known defect xqa-nonfinite-at-extreme-logits of its version"
    # no version: nothing to gate (which backend the table then ranks first is the table's business)
    assert "known defect" not in rows["not installed (ModuleNotFoundError)"]["cause"]
    bench_problem = table.problem_of(BenchProblem(**problem))
    h200 = capability_db.device_for_capability(9, 0, env["gpu"])
    assert replay.defect_gated({"flashinfer": "not installed (ModuleNotFoundError)"}, bench_problem, h200) == {}
    assert replay.defect_gated({"flashinfer": "0.7.2"}, bench_problem, h200) == {"xqa": "xqa-nonfinite-at-extreme-logits"}


def test_replay_counts_apart_the_problems_whose_fastest_the_automatic_choice_cannot_serve():
    from tools.lab import replay
    rows = [{"regret": 0.0, "cause": ""}, {"regret": 0.5, "cause": "xqa not chosen automatically: known defect d"},
            {"regret": 0.2, "cause": "fa2 not a candidate: cuda_graph=True"},
            {"regret": 0.2, "cause": "expected ...: fa2's estimate (table) off by 2x"}]
    text = replay._servable_text(rows)
    assert "(2 left out" in text and "within 3% on 1 of 2 (50%)" in text and "more than 10% over on 1" in text


def test_jit_prebuild_lists_the_modules_a_sweep_builds_most_needed_first(monkeypatch):
    """tools/jit_prebuild.py: which FlashInfer modules a problem makes the sweep build, named as the
    device named the ones it compiled (its .jit directory), and the plan's order: device seconds saved
    per second of building here."""
    spec = importlib.util.spec_from_file_location("jit_prebuild", Path("tools/offline/prebuild_kernels.py"))
    tool = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "jit_prebuild", tool)  # its dataclass looks its module up there
    spec.loader.exec_module(tool)
    plain = BenchProblem(entry=PAGED, batch=4, q_len=16, kv_len=1950, num_qo_heads=4, num_kv_heads=2, head_dim=128)
    fa2, fa3 = tool.needed(plain)
    stem = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_"
            "head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False")
    assert (tool.name(fa2), tool.name(fa3)) == (stem + "_kv_stride_equal", stem + "_sm90")  # as the H100 built them
    fp8 = dataclasses.replace(plain, dtype="float16", kv_dtype="float8_e4m3fn", head_dim=256, soft_cap=30.0)
    assert [tool.name(m) for m in tool.needed(fp8)] == [  # fa3 takes no fp8 KV here: fa2's module alone
        "batch_prefill_with_kv_cache_dtype_q_f16_dtype_kv_e4m3_dtype_o_f16_dtype_idx_i32_head_dim_qk_256_"
        "head_dim_vo_256_posenc_0_use_swa_False_use_logits_cap_True_f16qk_False_kv_stride_equal"]
    assert tool.needed(dataclasses.replace(plain, sinks=True)) == []  # neither serves sinks: no module
    single = dataclasses.replace(plain, entry=SINGLE, batch=1, head_dim=64, window_left=100)
    assert [tool.name(m) for m in tool.needed(single)] == [
        "single_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_head_dim_qk_64_head_dim_vo_64_"
        "posenc_0_use_swa_True_use_logits_cap_False_f16qk_False" + tail for tail in ("", "_sm90")]
    decode = dataclasses.replace(plain, entry="xqa_batch_decode_with_kv_cache", q_len=1, num_qo_heads=8)
    assert tool.name(tool.needed(decode)[-1]) == (  # XQA's, as the H100 built it for a decode of group 4
        "xqa_input_bf16_kv_cache_bf16_output_bf16_page_size_16_head_dim_128_head_group_ratio_4_"
        "use_sliding_window_False_use_spec_dec_False_spec_q_seq_len_1")
    assert tool.needed(dataclasses.replace(decode, page_size=8))[-1].kind != "xqa"  # XQA takes pages of 16-128
    plan = tool.plan(2000, seed=1)
    worth = [share * tool.DEVICE_S[m.backend] / tool.HERE_S[(m.kind, m.backend)] for m, share in plan]
    assert worth == sorted(worth, reverse=True) and all(0 < share < 1 for _, share in plan)
    assert plan == tool.plan(2000, seed=1) and len({m for m, _ in plan}) == len(plan)


def test_jit_prebuild_carries_what_saves_the_most_device_seconds_per_mb(tmp_path, monkeypatch):
    """``--carry-mb``: modules the plan does not know first, then by share x device seconds / xz'd MB,
    within the budget."""
    spec = importlib.util.spec_from_file_location("jit_prebuild", Path("tools/offline/prebuild_kernels.py"))
    tool = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "jit_prebuild", tool)
    spec.loader.exec_module(tool)
    plan = tool.plan(500, seed=2)
    common, rare = tool.name(plan[0][0]), tool.name(min(plan, key=lambda ms: ms[1])[0])
    for name, size in ((common, 300_000), (rare, 300_000), ("quantization", 300_000)):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.so").write_bytes(os.urandom(size))  # random bytes: xz keeps their size
    assert tool.carried(tmp_path, 0.7, 500, seed=2) == ["quantization", common]  # the third would pass 0.7 MB
    assert tool.carried(tmp_path, 1.0, 500, seed=2) == ["quantization", common, rare]
    everything = {tool.name(m) for m, _ in plan}  # the plan of those very draws: no problem compiles
    assert tool.covered(everything, 500, seed=2) == 1.0 and tool.covered(set(), 500, seed=2) < 0.2


def test_estimate_error_compares_the_routers_estimates_with_the_measured_times(tmp_path):
    """tools/estimate_error.py: per (backend, phase, basis), log2(measured / estimated) of each problem."""
    spec = importlib.util.spec_from_file_location("estimate_error", Path("tools/estimate_error.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    problem = {"entry": PAGED, "batch": 8, "q_len": 1, "kv_len": 4096, "num_qo_heads": 32,
               "num_kv_heads": 8, "head_dim": 128}
    backends = [{"backend": "fa2", "status": "ok", "eager_ms": 0.05}, {"backend": "native-triton", "status": "ok",
                 "eager_ms": 0.08}, {"backend": "auto", "status": "ok", "eager_ms": 0.01}]
    results = {"environment": {"gpu": "NVIDIA H200", "capability": "sm_90"},
               "results": [{"name": "p", "problem": problem, "backends": backends}]}
    errs = tool.errors(results)
    assert {(b, phase) for b, phase, _ in errs} == {("fa2", "decode"), ("native-triton", "decode")}  # not auto
    device = capability_db.device_for_capability(9, 0, "NVIDIA H200")
    decision = router.decide(dataclasses.replace(table.problem_of(BenchProblem(**problem)), cuda_graph=True),
                             device, live=False)
    fa2 = next(c for c in decision.candidates if c.backend == "fa2").evidence
    assert errs[("fa2", "decode", fa2.basis)] == [pytest.approx(math.log2(0.05 / fa2.ms))]
    assert "| fa2 | decode |" in tool.markdown(["x.json"], "NVIDIA H200", errs)


def test_judge_repeat_scores_the_first_runs_fastest_by_the_second_runs_times(tmp_path):
    """tools/judge_repeat.py: per problem both runs timed, the first run's fastest judged by the
    second run's times (GPU ms, and GPU ms + host us for the call cost); auto and FlashInfer's own
    call are not candidates."""
    spec = importlib.util.spec_from_file_location("judge_repeat", Path("tools/judge_repeat.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)

    def run(fa2, cudnn, fa2_host, cudnn_host):
        rows = [{"backend": "fa2", "status": "ok", "eager_ms": fa2, "host_us": fa2_host},
                {"backend": "cudnn", "status": "ok", "eager_ms": cudnn, "host_us": cudnn_host},
                {"backend": "auto", "status": "ok", "eager_ms": 0.001, "host_us": 1.0}]
        return {"results": [{"name": "p", "backends": rows}, {"name": "only in one run"}]}
    first, second = run(0.010, 0.011, 10.0, 30.0), run(0.012, 0.010, 20.0, 10.0)
    fig = tool.figures(first, second)
    assert fig["problems"] == 1
    # GPU: fa2 fastest first (0.010), then 0.012 against cudnn's 0.010: 20% over
    assert fig["gpu"]["within_3pct"] == 0 and fig["gpu"]["max"] == pytest.approx(0.2)
    # cost: fa2 first (0.020 ms against 0.041), then 0.032 against cudnn's 0.020: 60% over
    assert fig["cost"]["max"] == pytest.approx(0.6)
    host = fig["spread_host_us"]  # fa2 10 -> 20, cudnn 30 -> 10, auto 1 -> 1
    assert host["count"] == 3 and host["p50"] == pytest.approx(2.0 / 3.0) and host["p90"] == pytest.approx(1.0)
    same = tool.figures(first, first)
    assert same["gpu"]["within_3pct"] == same["cost"]["within_3pct"] == 1
    assert "| call cost (an eager call's) | 1 | 0 (0%)" in tool.markdown(["a", "b"], fig, "host: x")


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(f"tools/{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_graph_vs_eager_counts_the_ceiling_of_an_eager_judge_and_the_inflated_rows():
    gve = _tool("graph_vs_eager")
    row = lambda name, eager, graph: {"backend": name, "status": "ok", "eager_ms": eager, "graph_ms": graph}
    results = [  # eager ranks cudnn first, the graph native-triton: 10% off by graph time
        {"backends": [row("cudnn", 0.010, 0.0099), row("native-triton", 0.011, 0.009), row("auto", 0.001, 0.001)]},
        {"backends": [row("fa2", 0.50, 0.50), row("xqa", 0.40, 0.30)], "warm_wait_s": 2.0},  # xqa inflated, waited
        {"backends": [row("fa2", 0.30, 0.30)]}]  # one backend: no ceiling row
    f = gve.figures(results)
    assert [round(x, 3) for x in f["ceiling_regrets"]] == [0.0, 0.1]
    assert f["inflated_eager"] == {"waited": [1, 2], "not waited": [0, 1]}
    assert f["ratios"]["native-triton / eager <= 0.03 ms"] == [0.009 / 0.011]
    assert "auto / eager <= 0.03 ms" not in f["ratios"]
    assert "within 3% on 1 of 2 (50.0%)" in gve.markdown(f, ["a.json"])


def test_live_per_seed_counts_each_sweeps_own_choice():
    lps = _tool("live_per_seed")
    rows = [{"problem": {"entry": PAGED}, "regret": 0.0, "auto": "fa2", "auto_over_flashinfer": 0.9,
             "backends": [{"backend": "fa2", "status": "ok", "eager_ms": 0.010, "host_us": 10.0},
                          {"backend": "auto", "status": "ok", "served": "fa2", "eager_ms": 0.010, "host_us": 10.0},
                          {"backend": "flashinfer", "status": "ok", "eager_ms": 0.010, "host_us": 5.0}]},
            {"problem": {"entry": PAGED}, "regret": 0.5, "auto": "fa2", "auto_over_flashinfer": 1.2,
             "backends": [{"backend": "fa2", "status": "ok", "eager_ms": 0.015, "host_us": 10.0},
                          {"backend": "cudnn", "status": "ok", "eager_ms": 0.010, "host_us": 10.0}]}]
    f = lps.figures(rows)
    assert f["gpu"] == [1, 2, 0.5] and f["cost"] == [1, 2]
    assert f["own_gpu"] == [1, 2, 1] and f["own_cost"] == [0, 1, 1]  # 20 us against FlashInfer's 15
