"""The choice counts what the call costs (GPU time + host path when eager, GPU time alone in a CUDA
graph) and per-GPU tables (a GPU without its own table borrows its SM's, scaled by its peaks);
bench results carry host times into the table and an H200 run writes h200.json. CPU only: the
devices are descriptions, the tables synthetic or the committed H100 one."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

import capability_db
from capability_db import measured
from dispatch import choice, router
from dispatch.lab import runner
from dispatch.lab.problems import PAGED, BenchProblem
from tools.lab import table
from test_autotune import decode_problem, h100_grid_table

H100 = capability_db.resolve_device("h100")
H200 = capability_db.resolve_device("h200")


@pytest.fixture(autouse=True)
def fresh():
    router.clear_caches()
    yield
    router.clear_caches()


def synthetic(monkeypatch, ms: dict, host_us: dict, table_host: dict | None = None):
    """The H100 grid table with one decode row at the anchor sizes: GPU ``ms`` and row ``host_us``."""
    real = h100_grid_table()
    p = decode_problem()
    bucket = measured.Bucket(entry=p.entry, phase="decode", batch=64, q_len=1, kv_len=4096, gqa_group=4,
                             head_dim_qk=128, head_dim_vo=128, q_dtype="bfloat16", kv_dtype="bfloat16", causal=False)
    row = measured.TimingRow(bucket=bucket, ms=ms, source="test row", host_us=host_us)
    t = real.model_copy(update={"rows": [row], "host_us": table_host or {}})
    monkeypatch.setattr(choice, "table_for", lambda device: t if device.kind == "cuda" else None)
    return p


def test_host_cost_flips_the_eager_choice_but_not_the_captured_one(monkeypatch):
    # xqa's kernel is faster (20 vs 30 us), its host path slower (60 vs 5 us): eager 80 vs 35 us
    p = synthetic(monkeypatch, {"xqa": 0.020, "fa2": 0.030}, {"xqa": 60.0, "fa2": 5.0})
    eager = router.decide(p, H100, live=False)
    assert eager.chosen == "fa2" and eager.accepted()[:2] == ["fa2", "xqa"]
    text = eager.explain().replace("\n", " ")
    assert "host time per eager call" in eager.ranking and "+ host 5 us (measured rows) = 0.035 ms" in " ".join(
        text.split())
    graph = router.decide(dataclasses.replace(p, cuda_graph=True), H100, live=False)
    assert graph.chosen == "xqa" and "GPU time only (CUDA graph)" in graph.ranking
    monkeypatch.setattr(choice, "capturing", lambda device: True)  # decided during capture: GPU time only
    captured = router.decide(p, H100, live=False)
    assert captured.chosen == "xqa" and captured is not eager  # the capture state is part of the key


def test_the_tables_host_figure_wins_over_the_rows_and_old_tables_use_defaults(monkeypatch):
    p = synthetic(monkeypatch, {"xqa": 0.020, "fa2": 0.030}, {"xqa": 60.0, "fa2": 5.0},
                  table_host={"xqa": {"BatchPrefillWithPagedKVCacheWrapper": 4.0}})
    assert router.decide(p, H100, live=False).chosen == "xqa"  # 24 us against fa2's 35
    router.clear_caches()
    p = synthetic(monkeypatch, {"xqa": 0.020, "fa2": 0.030}, {})  # a table from before host times
    d = router.decide(p, H100, live=False)
    assert d.chosen == "xqa"
    assert f"+ host {choice.DEFAULT_HOST_US['xqa']:.3g} us (default)" in " ".join(d.explain().split())


def test_a_gpu_without_its_own_table_borrows_its_sms_scaled_by_its_peaks():
    gh200 = capability_db.device_for_capability(9, 0, "NVIDIA GH200 480GB")  # sm_90, no table of its own
    own, scaled = measured.table_for(H200), measured.table_for(gh200)
    assert own.scaling == "" and scaled is not own
    assert scaled.scaling == "h200 table scaled to this GPU (NVIDIA GH200 480GB: bandwidth x0.83, compute x1.00)"
    assert (scaled.peak_tb_per_s, scaled.peak_tflops) == (4.0, 989.0)
    ratio = 4.0 / 4.8
    for a, b in list(zip(own.rows, scaled.rows))[::50]:
        for name, ms in a.ms.items():
            floor = min(ms, own.efficiency[name].launch_us / 1e3) if name in own.efficiency else 0.0
            want = floor + (ms - floor) / (ratio if a.bucket.phase == "decode" else 1.0)
            assert b.ms[name] == pytest.approx(want, rel=1e-3, abs=2e-5)
    assert any(b.ms != a.ms for a, b in zip(own.rows, scaled.rows) if a.bucket.phase == "decode")
    d = router.decide(decode_problem(), gh200, live=False)
    assert "h200 table scaled to this GPU (NVIDIA GH200 480GB: bandwidth x0.83" in " ".join(d.explain().split())


def test_a_fitted_table_of_the_sm_beats_a_gpus_own_table_without_a_fit():
    """The H100's own table is a 68-problem grid without fitted times; the H200's is fitted over
    thousands of random problems. Scaled to the H100 it chose within 3% of the fastest on 27 of 30
    random problems measured on an H100, the H100's own table on 21 (h100-table-choice-s19.md)."""
    t = measured.table_for(H100)
    assert t.gpu == "NVIDIA H200" and t.fitted is not None
    assert t.scaling == ("h200 table scaled to this GPU (h100: bandwidth x0.70, compute x1.00); "
                         "its own h100 table has no fitted times (78 rows)")
    d = router.decide(decode_problem(), H100, live=False)
    assert "its own h100 table has no fitted times" in " ".join(d.explain().split())


def test_a_gpus_own_fitted_table_stays_its_own(tmp_path, monkeypatch):
    """Of two fitted tables of one SM, a GPU ranks by its own, unscaled; a third GPU of that SM
    borrows the one with the most rows."""
    h200 = json.loads((measured.MEASURED_DIR / "h200.json").read_text())
    small = {**h200, "gpu": "NVIDIA H100 80GB HBM3", "rows": h200["rows"][:5]}
    (tmp_path / "h200.json").write_text(json.dumps(h200))
    (tmp_path / "h100.json").write_text(json.dumps(small))
    monkeypatch.setattr(measured, "MEASURED_DIR", tmp_path)
    measured.forget()
    try:
        assert measured.table_for(H100).scaling == "" and len(measured.table_for(H100).rows) == 5
        gh200 = capability_db.device_for_capability(9, 0, "NVIDIA GH200 480GB")
        assert measured.table_for(gh200).scaling.startswith("h200 table scaled to this GPU")
    finally:
        measured.forget()


def test_the_h200_uses_its_own_measured_table():
    h200 = measured.table_for(H200)
    assert h200.scaling == "" and h200.gpu == "NVIDIA H200" and h200.rows


def test_unknown_names_scale_compute_by_sm_count_or_say_they_are_unscaled():
    by_sms = dataclasses.replace(capability_db.resolve_device("sm_90"), sm_count=66)
    t = measured.table_for(by_sms)
    assert "compute x0.50" in t.scaling and "bandwidth x1.00" in t.scaling
    bare = measured.table_for(capability_db.resolve_device("sm_90"))
    assert bare.scaling.startswith("h200 table unscaled: no peak figures for sm_90")
    described = dataclasses.replace(capability_db.resolve_device("sm_90"), peak_tb_per_s=9.6, peak_tflops=989.0)
    assert "bandwidth x2.00" in measured.table_for(described).scaling


def test_device_properties_give_sm_count_and_bandwidth():
    props = SimpleNamespace(multi_processor_count=132, memory_clock_rate=2619000, memory_bus_width=5120)
    d = choice.with_properties(H100, props)
    assert d.sm_count == 132 and d.peak_tb_per_s == pytest.approx(3.352, abs=1e-3)
    assert choice.with_properties(H100, SimpleNamespace(multi_processor_count=132)).peak_tb_per_s == 0.0


@pytest.mark.parametrize("name, key", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                       ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA GH200 480GB", "gh200"),
                                       ("NVIDIA H20", "h20"), ("h100", "h100"), ("Some GPU", "")])
def test_gpu_names_match_the_known_table(name, key):
    assert measured.gpu_key(name) == key


def test_an_h200_run_writes_h200_json_with_gpu_and_host_times(tmp_path, monkeypatch):
    p = BenchProblem(PAGED, 64, 1, 4096)
    amount, unit = runner.work(p)
    run = {"environment": {"gpu": "NVIDIA H200", "capability": "sm_90", "torch": "x"},
           "results": [{"problem": p.to_json(), "name": p.name, "work": amount, "unit": unit, "auto": "fa2",
                        "auto_ms": 0.3, "backends": [
                            {"backend": "xqa", "status": "ok", "eager_ms": 0.28, "host_us": 21.5},
                            {"backend": "auto", "status": "ok", "eager_ms": 0.3, "host_us": 30.0},
                            {"backend": "flashinfer", "status": "ok", "eager_ms": 0.3, "host_us": 25.0}]}]}
    host = {"environment": {"gpu": "NVIDIA H200"}, "matrix": [
        {"entry": PAGED, "backend": "xqa", "size": "tiny", "host_us": 18.0},
        {"entry": PAGED, "backend": "xqa", "size": "decode 64", "host_us": 20.0},
        {"entry": PAGED, "backend": "auto", "size": "tiny", "host_us": 9.0},  # not a backend: no figure
        {"entry": PAGED, "backend": "flashinfer", "size": "tiny", "host_us": 9.0}]}
    (tmp_path / "bench.json").write_text(json.dumps(run))
    (tmp_path / "host.json").write_text(json.dumps(host))
    monkeypatch.setattr(table, "MEASURED_DIR", tmp_path / "measured")
    path = table.write_from_results([tmp_path / "bench.json", tmp_path / "host.json"])
    assert path == tmp_path / "measured" / "h200.json"
    t = measured.TimingTable.model_validate(json.loads(path.read_text()))
    assert t.peak_tb_per_s == 4.8 and t.rows[0].ms == {"xqa": 0.28, "fa2": 0.3}
    assert t.rows[0].host_us == {"xqa": 21.5, "fa2": 30.0}  # auto's host time stands for the backend it ran
    entry = "BatchPrefillWithPagedKVCacheWrapper"
    # the host-cost run wins, its least figure: a kernel-bound size times the GPU, not the host
    assert t.host_us == {"xqa": {entry: 18.0}, "fa2": {entry: 30.0}}
