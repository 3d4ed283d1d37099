"""The timing tables the choice tables are compiled from (tools/tables/measured.py, tools/lab/table.py):
which table a GPU's fit comes from (its own fitted one, else its SM's fitted one scaled by its peaks),
and how bench results become a table with GPU and host times. CPU only: the devices are descriptions."""
from __future__ import annotations

import dataclasses
import json

import pytest

import capability_db
from dispatch.benchmark import runner
from dispatch.benchmark.problems import PAGED, BenchProblem
from tools.lab import table
from tools.tables import measured

H100 = capability_db.resolve_device("h100")
H200 = capability_db.resolve_device("h200")
GH200 = capability_db.device_for_capability(9, 0, "NVIDIA GH200 480GB")  # sm_90, no table of its own


def test_the_h100s_own_table_is_a_grid_without_a_fit_and_the_cpu_has_none():
    t = measured.load_table(measured.MEASURED_DIR / "h100.json.gz")
    assert t.sm == 90 and t.rows and {"fa2", "fa3", "cudnn", "xqa"} <= set(t.efficiency)
    assert t.fitted is None
    assert measured.table_for(capability_db.CPU_DEVICE) is None


def test_the_h200_uses_its_own_measured_table():
    h200 = measured.table_for(H200)
    assert h200.scaling == "" and h200.gpu == "NVIDIA H200" and h200.rows and h200.fitted is not None


def test_a_gpu_without_its_own_table_borrows_its_sms_scaled_by_its_peaks():
    own, scaled = measured.table_for(H200), measured.table_for(GH200)
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


def test_a_fitted_table_of_the_sm_beats_a_gpus_own_table_without_a_fit():
    """The H100's own table is a 68-problem grid without fitted times; the H200's is fitted over
    thousands of random problems: the H100's choice table is compiled from the H200's fit, scaled."""
    t = measured.table_for(H100)
    assert t.gpu == "NVIDIA H200" and t.fitted is not None
    assert t.scaling == ("h200 table scaled to this GPU (h100: bandwidth x0.70, compute x1.00); "
                         "its own h100 table has no fitted times (78 rows)")


def test_a_gpus_own_fitted_table_stays_its_own(tmp_path, monkeypatch):
    """Of two fitted tables of one SM, a GPU's fit is its own, unscaled; a third GPU of that SM
    borrows the one with the most rows."""
    h200 = measured.read_json(measured.MEASURED_DIR / "h200.json.gz")
    small = {**h200, "gpu": "NVIDIA H100 80GB HBM3", "rows": h200["rows"][:5]}
    (tmp_path / "h200.json").write_text(json.dumps(h200))
    (tmp_path / "h100.json").write_text(json.dumps(small))
    monkeypatch.setattr(measured, "MEASURED_DIR", tmp_path)
    measured.forget()
    try:
        assert measured.table_for(H100).scaling == "" and len(measured.table_for(H100).rows) == 5
        assert measured.table_for(GH200).scaling.startswith("h200 table scaled to this GPU")
    finally:
        measured.forget()


def test_unknown_names_scale_compute_by_sm_count_or_say_they_are_unscaled():
    by_sms = dataclasses.replace(capability_db.resolve_device("sm_90"), sm_count=66)
    t = measured.table_for(by_sms)
    assert "compute x0.50" in t.scaling and "bandwidth x1.00" in t.scaling
    bare = measured.table_for(capability_db.resolve_device("sm_90"))
    assert bare.scaling.startswith("h200 table unscaled: no peak figures for sm_90")
    described = dataclasses.replace(capability_db.resolve_device("sm_90"), peak_tb_per_s=9.6, peak_tflops=989.0)
    assert "bandwidth x2.00" in measured.table_for(described).scaling


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
    assert table.MEASURED_DIR == measured.MEASURED_DIR
    assert measured.MEASURED_DIR.parts[-3:] == ("tools", "tables", "data")
    monkeypatch.setattr(table, "MEASURED_DIR", tmp_path / "data")
    path = table.write_from_results([tmp_path / "bench.json", tmp_path / "host.json"])
    assert path == tmp_path / "data" / "h200.json.gz"
    t = measured.TimingTable.model_validate(measured.read_json(path))
    assert t.peak_tb_per_s == 4.8 and t.rows[0].ms == {"xqa": 0.28, "fa2": 0.3}
    assert t.rows[0].host_us == {"xqa": 21.5, "fa2": 30.0}  # auto's host time stands for the backend it ran
    entry = "BatchPrefillWithPagedKVCacheWrapper"
    # the host-cost run wins, its least figure: a kernel-bound size times the GPU, not the host
    assert t.host_us == {"xqa": {entry: 18.0}, "fa2": {entry: 30.0}}
