"""The choice counts what the call costs (GPU time + host path when eager, GPU time alone in a CUDA
graph) and reads per-GPU choice tables (a GPU without its own table borrows its SM's, scaled by its
peaks). CPU only: the devices are descriptions, the tables synthetic (tests/_tables.py) or the
compiled ones (capability_db/tables). How the timing tables behind them are written and fitted:
tools/tests."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

import capability_db
from _tables import synthetic_table, use_table
from capability_db import choice_table
from capability_db.choice_table import key_of
from dispatch import choice, devices, router
from test_autotune import decode_problem

H100 = capability_db.resolve_device("h100")
H200 = capability_db.resolve_device("h200")
GH200 = capability_db.device_for_capability(9, 0, "NVIDIA GH200 480GB")  # sm_90, no table of its own
PAGED_ENTRY = "BatchPrefillWithPagedKVCacheWrapper"


@pytest.fixture(autouse=True)
def fresh():
    router.clear_caches()
    yield
    router.clear_caches()


def costed(monkeypatch, ms: dict, host_us: dict):
    """The decode problem, ranked by a table with GPU ``ms`` and host us ``host_us`` (backend -> us on
    its entry point) per backend."""
    p = decode_problem()
    use_table(monkeypatch, synthetic_table(p, ms, {n: {p.entry: us} for n, us in host_us.items()}))
    return p


def test_host_cost_flips_the_eager_choice_but_not_the_captured_one(monkeypatch):
    # xqa's kernel is faster (20 vs 30 us), its host path slower (60 vs 5 us): eager 80 vs 35 us
    p = costed(monkeypatch, {"xqa": 0.020, "fa2": 0.030}, {"xqa": 60.0, "fa2": 5.0})
    eager = router.decide(p, H100, live=False)
    assert eager.chosen == "fa2" and eager.accepted()[:2] == ["fa2", "xqa"]
    assert "host time per eager call" in eager.ranking
    assert "+ host 5 us (measured) = 0.035 ms" in " ".join(eager.explain().split())
    graph = router.decide(dataclasses.replace(p, cuda_graph=True), H100, live=False)
    assert graph.chosen == "xqa" and "GPU time only (CUDA graph)" in graph.ranking
    monkeypatch.setattr(choice, "capturing", lambda device: True)  # decided during capture: GPU time only
    captured = router.decide(p, H100, live=False)
    assert captured.chosen == "xqa" and captured is not eager  # the capture state is part of the key


def test_the_tables_host_figure_is_counted_else_the_default(monkeypatch):
    # fa2's measured 5 us against xqa's default (25): 35 us against 45
    p = costed(monkeypatch, {"xqa": 0.020, "fa2": 0.030}, {"fa2": 5.0})
    d = router.decide(p, H100, live=False)
    assert d.chosen == "fa2"
    text = " ".join(d.explain().split())
    assert f"+ host {choice.DEFAULT_HOST_US['xqa']:.3g} us (default)" in text and "+ host 5 us (measured)" in text
    router.clear_caches()
    p = costed(monkeypatch, {"xqa": 0.020, "fa2": 0.030}, {})  # no host figure: both defaults, 45 us against 55
    assert router.decide(p, H100, live=False).chosen == "xqa"
    figure = choice.host_us(synthetic_table(p, {"xqa": 0.02}, {"xqa": {"xqa_batch_decode_with_kv_cache": 9.0}}),
                            "xqa", PAGED_ENTRY)
    assert figure == (choice.DEFAULT_HOST_US["xqa"], "default")  # a figure of another entry point is not this one's


def test_an_h100_and_an_h200_rank_by_their_own_compiled_tables():
    for device, key in ((H100, "h100"), (H200, "h200")):
        table = choice_table.table_for(device)
        assert (table.gpu, table.scaling) == (key, "") and table.source == f"capability_db/tables/{key}.json"
        assert table.data["keys"]
        d = router.decide(decode_problem(), device, live=False)
        assert d.ranking.startswith(f"expected time (capability_db/tables/{key}.json; ")
    assert choice_table.table_for(capability_db.CPU_DEVICE) is None


def test_a_gpu_without_its_own_table_borrows_its_sms_scaled_by_its_peaks():
    borrowed = choice_table.table_for(GH200)
    own = choice_table.table_for(capability_db.resolve_device(borrowed.gpu))  # the same file, unscaled
    ratio = 4.0 / borrowed.data["peak_tb_per_s"]  # the GH200's 4.0 TB/s over the table's GPU's
    assert borrowed.data is own.data and borrowed.bandwidth_ratio == pytest.approx(ratio)
    assert borrowed.compute_ratio == pytest.approx(989.0 / borrowed.data["peak_tflops"])
    assert borrowed.scaling == (f"{borrowed.gpu} table scaled to NVIDIA GH200 480GB "
                                f"(bandwidth x{ratio:.2f}, compute x{borrowed.compute_ratio:.2f})")
    p = decode_problem()
    for sizes in ((1, 1, 256), (64, 1, 4096), (256, 1, 65536)):
        here, point = borrowed.gpu_ms(p, sizes)
        there, _ = own.gpu_ms(p, sizes)
        assert here and set(here) == set(there)
        for name, ms in there.items():
            floor = min(ms, own.data["launch_us"].get(name, 0.0) / 1e3)
            assert here[name] == pytest.approx(floor + (ms - floor) / ratio)
    d = router.decide(p, GH200, live=False)
    assert borrowed.scaling in " ".join(d.explain().split())


def test_a_gpu_without_its_own_table_borrows_the_table_of_the_gpu_its_sms_fit_was_measured_on():
    """h100.json was compiled from the H200's fit scaled once already: a GH200 scales h200.json."""
    assert choice_table.load(choice_table.TABLES_DIR / "h100.json")["measured_on"] == "h200"
    assert choice_table.table_for(GH200).scaling.startswith("h200 table scaled to NVIDIA GH200 480GB (bandwidth x0.83")


def test_unknown_names_scale_compute_by_sm_count_or_say_they_are_unscaled():
    sm90 = capability_db.resolve_device("sm_90")
    by_sms = choice_table.table_for(dataclasses.replace(sm90, sm_count=66))
    assert by_sms.scaling.endswith("table scaled to sm_90 (bandwidth x1.00, compute x0.50)")
    bare = choice_table.table_for(sm90)
    assert bare.scaling.endswith("table unscaled: no peak figures for sm_90")
    assert (bare.bandwidth_ratio, bare.compute_ratio) == (1.0, 1.0)
    described = dataclasses.replace(sm90, peak_tb_per_s=2 * bare.data["peak_tb_per_s"], peak_tflops=989.0)
    assert "bandwidth x2.00" in choice_table.table_for(described).scaling
    assert choice_table.table_for(capability_db.resolve_device("a100")) is None  # no sm_80 table


def test_the_flags_a_key_leaves_out_multiply_by_their_factor():
    """fp8 KV, a window, a soft cap, sinks and LSE share the key of the plain problem; each multiplies
    a backend's time by the table's factor for it on that entry point."""
    p = decode_problem()
    table = synthetic_table(p, {"fa2": 0.1, "xqa": 0.2})
    data = {**table.data, "factors": {f"{p.entry}|decode": {"soft_cap": {"fa2": 3.0}, "fp8_kv": {"xqa": 0.5}}}}
    table = dataclasses.replace(table, data=data)
    capped = dataclasses.replace(p, logits_soft_cap=30.0, kv_dtype="float8_e4m3fn")
    assert key_of(capped) == key_of(p)
    assert table.gpu_ms(capped, (64, 1, 4096))[0] == pytest.approx({"fa2": 0.3, "xqa": 0.1})
    assert table.gpu_ms(p, (64, 1, 4096))[0] == pytest.approx({"fa2": 0.1, "xqa": 0.2})


def test_device_properties_give_sm_count_and_bandwidth():
    props = SimpleNamespace(multi_processor_count=132, memory_clock_rate=2619000, memory_bus_width=5120)
    d = devices.with_properties(H100, props)
    assert d.sm_count == 132 and d.peak_tb_per_s == pytest.approx(3.352, abs=1e-3)
    assert devices.with_properties(H100, SimpleNamespace(multi_processor_count=132)).peak_tb_per_s == 0.0


@pytest.mark.parametrize("name, key", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                       ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA GH200 480GB", "gh200"),
                                       ("NVIDIA H20", "h20"), ("h100", "h100"), ("Some GPU", "")])
def test_gpu_names_match_the_known_table(name, key):
    assert choice_table.gpu_key(name) == key


def test_every_compiled_table_names_its_sm_and_peaks():
    for path in sorted(choice_table.TABLES_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        assert data["sm"] == 90 and data["peak_tb_per_s"] > 0 and data["peak_tflops"] > 0, path.name
        assert choice_table.gpu_key(path.stem) == path.stem  # the file's name is a known GPU's key
