"""The fit's ranking (tools/tables/estimate.py), what the choice tables are compiled from and what the
tools replay the router through (``ranking_by_the_fit``): rows measured at the problem's sizes, the
cost model where nothing was measured, ties, the entry point's own tier, the row that timed the
candidates side by side, and the cost model's occupancy term for query-tiled kernels."""
from __future__ import annotations

import dataclasses

import pytest

import capability_db
from dispatch import choice, router
from dispatch.benchmark.problems import SINGLE
from dispatch.benchmark.vendors import make_problem
from tools.tables import estimate, measured
from tools.tables.estimate import ranking_by_the_fit

H100 = capability_db.resolve_device("h100")
H200 = capability_db.resolve_device("h200")


@pytest.fixture
def by_the_fit():
    with ranking_by_the_fit():
        yield


def decode_problem(**kw):
    return make_problem(entry="BatchPrefillWithPagedKVCacheWrapper", phase="decode", num_qo_heads=32,
                        num_kv_heads=8, head_dim_qk=128, head_dim_vo=128, device_type="cuda", **kw)


def h100_grid_table() -> measured.TimingTable:
    """The H100's own timing table (a grid, no fitted times): the base of the synthetic tables here,
    whose rows the tests replace."""
    return measured.load_table(measured.MEASURED_DIR / "h100.json.gz")


def ranked_by(monkeypatch, rows: list[measured.TimingRow]) -> None:
    table = h100_grid_table().model_copy(update={"rows": rows})
    monkeypatch.setattr(estimate, "table_for", lambda device: table if device.kind == "cuda" else None)


def row(p, sizes, ms: dict, phase: str = "decode", causal: bool = False) -> measured.TimingRow:
    b, q, kv = sizes
    bucket = measured.Bucket(entry=p.entry, phase=phase, batch=b, q_len=q, kv_len=kv, gqa_group=4, head_dim_qk=128,
                             head_dim_vo=128, q_dtype="bfloat16", kv_dtype="bfloat16", causal=causal)
    return measured.TimingRow(bucket=bucket, ms=ms, source="test row")


def with_rows(monkeypatch, ms: dict[str, float]):
    """The H100 grid table with one decode row at the anchor sizes carrying ``ms``."""
    p = decode_problem()
    ranked_by(monkeypatch, [row(p, (64, 1, 4096), ms)])
    return p


def test_the_router_ranks_by_the_fit_within_and_by_its_tables_after():
    p = decode_problem()
    tables = router.decide(p, H100, live=False).ranking
    with ranking_by_the_fit():
        fit = router.decide(p, H100, live=False).ranking  # no decision cached before is reused
        with ranking_by_the_fit():  # nested (a tool inside another): the same ranking
            assert router.decide(p, H100, live=False).ranking == fit
        assert choice.rank is estimate.rank
    assert tables.startswith("expected time (capability_db/tables/h100.json; ")
    assert fit.startswith("measured time (68 matching rows of NVIDIA H200 (tools/tables/data; h200 table scaled to "
                          "this GPU (h100: bandwidth x0.70")
    assert choice.rank is not estimate.rank and router.decide(p, H100, live=False).ranking == tables


def test_the_fastest_measured_candidate_is_chosen_and_explained(monkeypatch, by_the_fit):
    p = with_rows(monkeypatch, {"fa2": 0.40, "xqa": 0.20, "cudnn": 0.41, "native-triton": 0.30})
    d = router.decide(p, H100, live=False)
    assert d.chosen == "xqa" and d.accepted()[:2] == ["xqa", "native-triton"]
    text = " ".join(d.explain().split())
    assert "measured: 0.2 ms at batch 64 x q 1 x kv 4096" in text
    assert text.count("test row") == 1  # the estimates' source, once
    assert d.ranking.startswith("measured time (1 matching rows")


def test_a_tie_keeps_the_priority_order(monkeypatch, by_the_fit):
    p = with_rows(monkeypatch, {"fa2": 0.400, "xqa": 0.395, "cudnn": 0.5, "native-triton": 0.6})
    assert router.decide(p, H100, live=False).chosen == "fa2"  # 1.3% apart: the priority list decides


def test_unmeasured_backends_get_the_cost_model(monkeypatch, by_the_fit):
    p = with_rows(monkeypatch, {"fa2": 0.40})
    d = router.decide(p, H100, live=False)
    est = {c.backend: c.estimate for c in d.candidates if c.accepted and c.ranked}
    assert est["fa2"].startswith("measured") and est["xqa"].startswith("model") and est["reference"].startswith("model")
    assert d.accepted()[-1] == "reference"  # the model knows the reference is slow


def test_the_entrys_own_list_stays_ahead(monkeypatch, by_the_fit):
    with_rows(monkeypatch, {"xqa": 0.3, "native-triton": 0.5, "cudnn": 0.6, "fa2": 0.1})
    p = dataclasses.replace(decode_problem(), entry="xqa_batch_decode_with_kv_cache")
    d = router.decide(p, H100, live=False)
    # fa2 is faster on the row, but this entry's lengths live on the device (fa2 re-plans per call)
    assert d.accepted()[:4] == ["xqa", "native-triton", "cudnn", "fa2"]


def test_the_problems_size_class_picks_the_row_measured_at_that_size(monkeypatch, by_the_fit):
    """A problem carries its size class: the choice follows the row measured at those sizes, not one
    order for every size of the problem."""
    p = make_problem(entry="BatchPrefillWithPagedKVCacheWrapper", phase="prefill", num_qo_heads=32, num_kv_heads=8,
                     head_dim_qk=128, head_dim_vo=128, device_type="cuda", causal=True)
    ranked_by(monkeypatch, [
        row(p, (64, 16, 2048), {"fa2": 0.2, "fa3": 0.7, "cudnn": 0.6, "native-triton": 0.9}, "prefill", True),
        row(p, (8, 2048, 2048), {"fa2": 0.85, "fa3": 0.59, "cudnn": 0.62, "native-triton": 1.0}, "prefill", True)])
    short = router.decide(dataclasses.replace(p, sizes=(64, 16, 2048)), H100, live=False)
    long = router.decide(dataclasses.replace(p, sizes=(8, 2048, 2048)), H100, live=False)
    assert short.accepted()[0] == "fa2" and long.accepted()[0] == "fa3"


def test_candidates_are_compared_at_the_row_that_timed_them_side_by_side(monkeypatch, by_the_fit):
    """A candidate timed only far away (its time scaled down by the model) does not jump ahead of
    those timed side by side nearest the call's sizes (seen on the H100: torch-flash, timed at
    kv 8192 only, was scaled to 2 us at kv 64 and chosen for a tiny single prefill)."""
    p = make_problem(entry=SINGLE, phase="decode", kv_storage="dense", page_size=0,
                     num_qo_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_vo=128, device_type="cuda")
    ranked_by(monkeypatch, [row(p, (1, 1, 1024), {"fa2": 0.008, "native-triton": 0.018, "cudnn": 0.025}),
                            row(p, (1, 1, 8192), {"torch-flash": 0.032, "fa2": 0.022})])
    d = router.decide(dataclasses.replace(p, sizes=(1, 1, 64)), H100, live=False)
    assert d.accepted()[0] == "fa2" and d.accepted().index("torch-flash") > d.accepted().index("cudnn")


def test_query_tiled_kernels_pay_for_idle_sms_and_split_kv_kernels_do_not():
    assert capability_db.backend_caps("cudnn").parallelism == "query_tiles"
    assert capability_db.backend_caps("fa2").parallelism == "split_kv"
    table = measured.table_for(H200)
    problem = make_problem(entry=SINGLE, kv_storage="dense", num_qo_heads=4, num_kv_heads=4, head_dim_qk=256,
                           head_dim_vo=256, device_type="cuda")
    few, full = (1, 91, 70435), (8, 2048, 2048)
    assert estimate.occupancy(table, "cudnn", problem, few) == 4 / 132  # 1 request x 4 heads x 1 tile
    assert estimate.occupancy(table, "cudnn", problem, full) == 1.0
    assert estimate.occupancy(table, "fa2", problem, few) == 1.0
    assert estimate.occupancy(table, "not-a-backend", problem, few) == 1.0
    ratio = estimate.model_ms(table, "cudnn", problem, few) / estimate.model_ms(table, "fa2", problem, few)
    assert ratio > 10  # measured on the H200: 1.75 ms against 0.136 (docs/benchmarks.md#known-limits)


def test_a_row_missing_a_backend_for_a_run_failure_is_no_evidence_against_it():
    from tools.lab.table import harness_failed
    built_failed = {"backends": [{"backend": "fa2", "status": "ok"},
                                 {"backend": "fa3", "status": "error", "note": "RuntimeError: Ninja build failed."}]}
    declared = {"backends": [{"backend": "fa2", "status": "ok"},
                             {"backend": "fa3", "status": "refused", "note": "has_sinks=True: allowed one of False"}]}
    assert harness_failed(built_failed) and not harness_failed(declared)
    bucket = measured.Bucket(entry="e", phase="prefill", batch=8, q_len=2048, kv_len=2048, gqa_group=4,
                             head_dim_qk=128, head_dim_vo=128, q_dtype="bfloat16", kv_dtype="bfloat16",
                             causal=True, window=False, soft_cap=False, sinks=False)
    rows = [measured.TimingRow(bucket=bucket, ms={"fa2": 1.0, "cudnn": 1.2}, source="a", complete=False)]
    problem = make_problem(entry="e", num_qo_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_vo=128)
    assert estimate.shared_row(rows, ["fa3", "fa2", "cudnn"], problem, (8, 2048, 2048)) is None
    rows.append(rows[0].model_copy(update={"complete": True}))
    assert estimate.shared_row(rows, ["fa3", "fa2", "cudnn"], problem, (8, 2048, 2048)) is rows[1]
