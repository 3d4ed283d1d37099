"""``attn-dispatch bench --trace`` on the CPU: every entry point through an engine-shaped trace, its
outputs checked against the fp64 oracle; the traces change the batch every step and stay inside
their stated bounds; FlashInfer's side (a stand-in here) is timed beside ours, compared output for
output, and a failing vendor call is a result, not a crash."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from dispatch import cli
from dispatch.benchmark import trace


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    rc = cli.main(["bench", "--trace", "--device", "cpu", "--steps", "6", "--warmup-steps", "3", "--seed", "7",
                   "--out", str(out)])
    return rc, out, json.loads((out / "trace-cpu-seed-7.json").read_text())


def test_trace_runs_every_entry_on_the_cpu(cpu_run):
    rc, out, rep = cpu_run
    assert rc == 0 and rep["ok"]
    assert rep["seed"] == 7 and rep["seed_source"] == "given" and "--seed 7" in rep["again"]
    assert set(rep["entries"]) == set(trace.ENTRIES)
    for name, r in rep["entries"].items():
        assert r["entry"] == trace.ENTRIES[name].entry
        assert r["steps"] == 6 and r["warmup_steps"] == 3 and r["layers"] == 4 and len(r["per_step"]) == 6
        ours = r["ours"]
        assert ours["steps"] == 6 and len(ours["per_step_host_ms"]) == 6 and ours["error"] is None
        assert ours["gpu_ms"] is None and ours["first_step_host_ms"] > 0  # the CPU has host time only
        assert r["flashinfer"]["not_run"].startswith("not run: ")
        assert r["over_flashinfer_worst_plus_1ms"] is None
        assert [c["step"] for c in r["checks"]] == [0, 2, 5]  # --check-steps 3: spread, first and last
        for c in r["checks"]:
            assert c["finite"] and c["ok"] and c["rows"] > 0
            assert 0 < c["rel_err_vs_fp64"] <= c["band"] == 1e-5
    wrappers = {part for name in ("paged", "ragged") for part in rep["entries"][name]["ours"]["parts_ms"]}
    assert wrappers == {"plan", "first_run", "gc"}
    md = (out / "trace-cpu-seed-7.md").read_text()
    assert "Seed 7 (given)" in md and "## The trace" in md
    for name, spec in trace.ENTRIES.items():
        assert f"| {name} | " in md and f"`{spec.entry}`" in md


def test_seed_is_drawn_and_recorded_without_seed(tmp_path):
    assert trace.main(["--device", "cpu", "--steps", "2", "--warmup-steps", "0", "--entries", "single",
                       "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("trace-cpu-seed-*.json")
    rep = json.loads(path.read_text())
    assert path.name == f"trace-cpu-seed-{rep['seed']}.json" and rep["seed_source"].startswith("drawn at run time")
    assert list(rep["entries"]) == ["single"] and rep["entries"]["single"]["warmup_steps"] == 0


def cfg(*argv: str) -> trace.Config:
    p = trace.parser()
    return trace.config(p, p.parse_args(["--device", "cpu", *argv]))


ENGINE = trace.Config(**{**vars(cfg()), "bounds": trace.BOUNDS["cuda"], "max_batch": 64})  # the GPU's distribution


def test_continuous_batching_changes_the_batch_every_step_within_bounds():
    b, steps = ENGINE.bounds, trace.draw("continuous", 11, "timed", 300, ENGINE)
    seen: dict[int, tuple] = {}
    for prev, step in zip([None] + steps, steps):
        ids = [r.id for r in step.requests]
        assert 1 <= len(ids) <= ENGINE.max_batch and len(set(ids)) == len(ids)
        assert prev is None or ids != [r.id for r in prev.requests]
        pages = [p for r in step.requests for p in r.pages]
        assert len(set(pages)) == len(pages)  # no page shared by two requests
        for r in step.requests:
            assert len(r.pages) == trace.pages_for(r.kv_len, ENGINE.page)
            if r.id not in seen:  # joins with its prefill chunk, no cached keys
                assert b.prefill[0] <= r.q_len == r.kv_len <= b.prefill[1]
                seen[r.id] = (r.kv_len, r.pages)
            else:  # decodes one token a step, keeping its pages
                first_kv, first_pages = seen[r.id]
                assert r.q_len == 1 and r.kv_len - first_kv <= b.output[1] - 1
                assert r.pages[:len(first_pages)] == first_pages
    assert max(len(s.requests) for s in steps) == ENGINE.max_batch  # the batch fills up and keeps turning over
    assert len(seen) >= len(steps)  # someone joins every step


@pytest.mark.parametrize("kind", ["decode", "context", "single"])
def test_fresh_batch_traces_change_every_step_within_bounds(kind):
    b, steps = ENGINE.bounds, trace.draw(kind, 5, "timed", 200, ENGINE)
    batch, q, prefix = {"decode": (b.decode_batch, (1, 1), None),
                        "context": (b.context_batch, b.context_q, b.context_prefix),
                        "single": ((1, 1), b.context_q, b.context_prefix)}[kind]
    for prev, step in zip([None] + steps, steps):
        assert batch[0] <= len(step.requests) <= batch[1]
        assert prev is None or prev.q_lens != step.q_lens or prev.kv_lens != step.kv_lens
        for r in step.requests:
            assert q[0] <= r.q_len <= q[1]
            if prefix is None:
                assert b.decode_kv[0] <= r.kv_len <= b.decode_kv[1]
            else:
                assert prefix[0] <= r.kv_len - r.q_len <= prefix[1]
            assert len(r.pages) == (0 if kind == "single" else trace.pages_for(r.kv_len, ENGINE.page))
        pages = [p for r in step.requests for p in r.pages]
        assert len(set(pages)) == len(pages)
    assert len({len(s.requests) for s in steps}) > (1 if kind != "single" else 0)


def test_draw_depends_on_seed_and_phase_only():
    a = trace.draw("continuous", 3, "timed", 40, ENGINE)
    assert a == trace.draw("continuous", 3, "timed", 40, ENGINE)
    assert a != trace.draw("continuous", 3, "warm-up", 40, ENGINE)
    assert a != trace.draw("continuous", 4, "timed", 40, ENGINE)


def stand_in_flashinfer(monkeypatch, **replace):
    """FlashInfer's side played by our own calls (FlashInfer runs on CUDA only), some replaced."""
    api = SimpleNamespace(**{**vars(trace.ours_api()), **replace})
    monkeypatch.setattr(trace, "flashinfer_api", lambda device: (api, ""))
    return trace.flashinfer_api("cpu")


def test_flashinfer_side_is_timed_and_compared_step_by_step(monkeypatch):
    config = cfg("--steps", "5", "--warmup-steps", "2", "--layers", "2", "--check-steps", "2")
    fi = stand_in_flashinfer(monkeypatch)
    for name in ("paged", "xqa"):
        r = trace.run_entry(name, config, 1, fi)
        assert r["flashinfer"]["steps"] == r["ours"]["steps"] == 5
        assert len(r["checks"]) == 2 and all(c["rel_err_vs_flashinfer"] < 1e-6 for c in r["checks"])  # step for step
        worst = r["flashinfer"]["host_ms"]["max"]
        over = {o["step"] for o in r["over_flashinfer_worst_plus_1ms"]}
        assert over == {i for i, t in enumerate(r["ours"]["per_step_host_ms"]) if t > worst + trace.SLACK_MS}
        assert trace.entry_ok(r)


def test_a_failing_flashinfer_call_is_reported_not_raised(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("trtllm-gen kernels need sm_100")
    fi = stand_in_flashinfer(monkeypatch, trtllm_batch_context_with_kv_cache=refuse)
    r = trace.run_entry("trtllm", cfg("--steps", "3", "--warmup-steps", "1"), 2, fi)
    why = "not run: failed at warm-up step 0: RuntimeError: trtllm-gen kernels need sm_100"
    assert r["flashinfer"] == {"not_run": why}
    assert r["ours"]["steps"] == 3 and trace.entry_ok(r)
    assert "- flashinfer: not run: failed at warm-up step 0" in "\n".join(trace.entry_section("trtllm", r))


def test_check_catches_a_wrong_output(monkeypatch):
    real = trace.ours_api()
    wrong = SimpleNamespace(**{**vars(real), "single_prefill_with_kv_cache":
                               lambda *a, **k: real.single_prefill_with_kv_cache(*a, **k) * 1.001})
    monkeypatch.setattr(trace, "ours_api", lambda: wrong)
    r = trace.run_entry("single", cfg("--steps", "2", "--warmup-steps", "0"), 3, (None, "not run: test"))
    assert r["checks"] and all(not c["ok"] and c["finite"] for c in r["checks"])
    assert all(c["rel_err_vs_fp64"] > c["band"] and math.isfinite(c["rel_err_vs_fp64"]) for c in r["checks"])
    assert not trace.entry_ok(r)


def test_bad_options_name_the_value_and_what_is_allowed(capsys):
    for argv, message in ((["--heads", "6/4"], "--heads 6/4: allowed HQ/HKV with HKV >= 1 and HQ a multiple"),
                          (["--entries", "paged", "decode"], "--entries decode: allowed paged, ragged, xqa"),
                          (["--steps", "0"], "--steps 0: allowed an integer >= 1")):
        with pytest.raises(SystemExit) as exc:
            trace.main(["--device", "cpu", *argv])
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_steps_garbage_collection_is_its_own_part():
    """A full collection inside a step is counted apart from the calls (a spike it causes is not a call's)."""
    import gc

    def step(x, parts):
        gc.collect()
        return x

    host, gpu, out, parts = trace.timed_step(step, {"a": 1}, cuda=False)
    assert out == {"a": 1} and gpu is None and 0 < parts["gc"] <= host
    assert trace.timed_step(lambda x, parts: x, {}, cuda=False)[3]["gc"] == 0


def test_first_calls_run_each_side_in_a_fresh_process(tmp_path):
    rc = cli.main(["bench", "--trace", "--first-call", "--device", "cpu", "--entries", "single", "--seed", "3",
                   "--out", str(tmp_path)])
    rep = json.loads((tmp_path / "first-call-cpu-seed-3.json").read_text())
    row = rep["first_call"]["single"]
    assert rc == 0 and rep["benchmark"] == "first-call" and rep["seed"] == 3
    assert row["prime"]["host_ms"] > 0 and row["ours"]["host_ms"] > 0 and row["ours"]["import_ms"] > 0
    assert row["ours"]["synced_ms"] >= row["ours"]["host_ms"]
    assert row["flashinfer"]["not_run"].startswith("not run: ") and row["ours_less_flashinfer_ms"] is None
    imported = row["ours_imported"]  # the vendors imported before the step (none installed here but triton)
    assert imported["host_ms"] > 0 and imported["vendor_import_ms"] >= 0 and row["imported_less_flashinfer_ms"] is None
    md = (tmp_path / "first-call-cpu-seed-3.md").read_text()
    assert "| single | " in md and "- flashinfer: not run: " in md


def test_tune_runs_our_warm_up_pass_inside_autotune(tmp_path, monkeypatch):
    import contextlib

    opened = []

    @contextlib.contextmanager
    def recording(tune_mode=True, cache=None):
        opened.append((tune_mode, cache))
        yield

    monkeypatch.setattr(trace.autotune, "autotune", recording)
    rc = cli.main(["bench", "--trace", "--device", "cpu", "--steps", "2", "--warmup-steps", "2", "--seed", "5",
                   "--entries", "single", "xqa", "--tune", "--out", str(tmp_path)])
    rep = json.loads((tmp_path / "trace-cpu-seed-5-tuned.json").read_text())
    cache = str(tmp_path / "trace-cpu-seed-5-tuned-autotune.json")
    assert rc == 0 and opened == [(True, cache)] * 2 and rep["config"]["tune_cache"] == cache
    assert rep["again"].endswith(" --tune")
    assert "Ours tuned in the warm-up pass" in (tmp_path / "trace-cpu-seed-5-tuned.md").read_text()
