"""Known defects as capability data (capability_db/defects.json), gated by the installed provider
version: never chosen automatically, run on an explicit choice with one WARNING, shown by ``info``.

CPU only: fake vendor modules (tests/_fake_vendors.py) stand in for flashinfer / flash_attn with
the version each test names; the device is a description (h100), so every adapter's checks pass.
"""
from __future__ import annotations

import logging
import sys

import pytest
from pathlib import Path
from pydantic import ValidationError

import _fake_vendors as fv
import capability_db
from backends import BackendRejected, _vendor, get_backend
from backends._providers import active_provider, installed_defects
from backends.fa2 import FA2Backend
from backends.fa3 import FA3Backend
from capability_db.vocabulary import Reason
from capability_db.schema import CONTRACT_BANDS, DefectTable, KnownDefect, VersionRange, version_tuple
from dispatch import cli, router
from dispatch.benchmark import oracle
from _fake_vendors import make_problem

VENDOR_MODULES = ("flashinfer", "flashinfer.decode", "flashinfer.prefill", "flash_attn", "flash_attn_interface")
H100 = capability_db.resolve_device("h100")
SENTINEL = "flashinfer-finite-mask-sentinel"
PREFILL = make_problem(device_type="cuda", causal=True, head_dim_qk=128, head_dim_vo=128)
DECODE = make_problem(device_type="cuda", phase="decode", head_dim_qk=128, head_dim_vo=128)


@pytest.fixture
def vendors(monkeypatch):
    """install(flashinfer=<version or None>, flash_attn=bool): fake vendor modules in sys.modules."""
    def install(flashinfer=None, flash_attn=False):
        mods = fv.make_flashinfer(fv.Recorder(), version=flashinfer) if flashinfer else {}
        if flash_attn:
            mods.update(fv.make_flash_attn(fv.Recorder()))
        for name in VENDOR_MODULES:
            monkeypatch.setitem(sys.modules, name, mods.get(name))  # None = "not installed"
        _reset()
    yield install
    _reset()


def _reset():
    _vendor.forget_imports()
    router.clear_caches()
    for cls in (FA2Backend, FA3Backend):
        for p in cls.providers:
            getattr(p, "_wrappers", {}).clear()


def candidate(decision, name):
    return next(c for c in decision.candidates if c.backend == name)


# -- the data --------------------------------------------------------------------------------
def test_version_ranges_read_release_numbers():
    assert version_tuple("0.7.2.post1") == (0, 7, 2) and version_tuple("v0.6.18rc7") == (0, 6, 18)
    assert version_tuple("0.5.3+cu130") == (0, 5, 3)
    with pytest.raises(ValueError, match="'abc' is not a version"):
        version_tuple("abc")
    fixed = VersionRange(fixed="0.7.0")
    assert [fixed.contains(v) for v in ("0.5.3", "0.6.18", "0.6.18.post1", "0.7.0", "0.7.2.post1")] == [
        True, True, True, False, False]
    window = VersionRange(introduced="0.6.0", fixed="0.7.0")
    assert not window.contains("0.5.3") and window.contains("0.6.1")
    with pytest.raises(ValidationError, match="must be below fixed"):
        VersionRange(introduced="0.7.0", fixed="0.6.0")


def _record(**kw):
    base = dict(id="x", provider="flashinfer", versions={"fixed": "1.0"}, backends=["xqa"], paths=["p"],
                sources=["https://github.com/flashinfer-ai/flashinfer/issues/1"], description="wrong")
    base.update(kw)
    return KnownDefect.model_validate(base)


@pytest.mark.parametrize("bad,match", [
    (dict(sources=[]), "public sources"),
    (dict(sources=["github.com/x"]), "public https URLs"),
    (dict(measured_error=0.1), "needs a value > 0, 'where_measured' and the 'report'"),
    (dict(description="two\nlines"), "one line"),
    (dict(id="Bad Id"), "pattern"),
])
def test_a_defect_record_must_be_sourced_and_one_line(bad, match):
    with pytest.raises(ValidationError, match=match):
        _record(**bad)


def test_defect_ids_are_unique():
    with pytest.raises(ValidationError, match="defect ids repeat"):
        DefectTable(defects=[_record(), _record()])


def test_the_flashinfer_sentinel_record():
    (d,) = [d for d in capability_db.known_defects() if d.id == SENTINEL]
    assert d.versions.fixed == "0.7.0" and set(d.backends) == {"fa2", "fa3"}
    assert "https://github.com/flashinfer-ai/flashinfer/pull/4401" in d.sources
    assert "fixed in flashinfer 0.7.0" in d.summary()
    assert capability_db.defects_affecting("fa2", "flashinfer", "0.5.3", PREFILL.facts()) == [d]
    assert capability_db.defects_affecting("fa2", "flashinfer", "0.7.2", PREFILL.facts()) == []
    assert d not in capability_db.defects_affecting("xqa", "flashinfer", "0.5.3", DECODE.facts())  # its own kernels


def test_the_measured_xqa_records():
    """XQA's own measured defects (H200 runs, no vendor fix known): non-finite rows at extreme logits on
    every version; its fp8 KV error recorded but inside the fp8 band, so fp8 decode keeps it a candidate."""
    records = {d.id: d for d in capability_db.known_defects()}
    nonfinite, fp8 = records["xqa-nonfinite-at-extreme-logits"], records["xqa-fp8-kv-quantized-query"]
    assert nonfinite.report and nonfinite.versions.fixed is None
    assert capability_db.defects_affecting("xqa", "flashinfer", "0.7.2", DECODE.facts()) == [nonfinite]
    assert fp8.measured_error < CONTRACT_BANDS["fp8"]
    fp8_decode = make_problem(device_type="cuda", phase="decode", head_dim_qk=128, head_dim_vo=128,
                              kv_dtype="float8_e4m3fn")
    assert fp8 not in capability_db.defects_affecting("xqa", "flashinfer", "0.7.2", fp8_decode.facts())
    for path in (nonfinite.report, fp8.report):
        assert (Path(__file__).resolve().parents[1] / path).is_file(), path


def test_contract_bands_are_the_oracles():
    assert CONTRACT_BANDS == oracle.BANDS


# -- the router ------------------------------------------------------------------------------
@pytest.mark.parametrize("problem", [PREFILL, DECODE], ids=["prefill", "decode"])
def test_a_defective_version_is_never_chosen_automatically(vendors, problem):
    vendors(flashinfer="0.5.3")
    decision = router.decide(problem, H100, strict=False, live=True)
    assert decision.chosen not in ("fa2", "fa3")
    fa2 = candidate(decision, "fa2")
    (reason,) = [r for r in fa2.reasons if r.field == "known defect"]
    assert SENTINEL in str(reason.value) and "0.5.3" in str(reason.value)
    assert "flashinfer >= 0.7.0" in reason.allowed and reason.source.startswith("https://github.com/flashinfer-ai")


def test_the_fixed_version_is_chosen_again(vendors):
    vendors(flashinfer="0.7.2")
    decision = router.decide(PREFILL, H100, strict=False, live=True)
    assert candidate(decision, "fa2").accepted
    assert all(r.field != "known defect" for c in decision.candidates for r in c.reasons)


def test_the_defect_follows_the_provider_that_serves(vendors):
    """fa2 through Dao's flash_attn (first provider) carries no FlashInfer defect."""
    vendors(flashinfer="0.5.3", flash_attn=True)
    ragged = make_problem(device_type="cuda", kv_storage="ragged", head_dim_qk=128, head_dim_vo=128)
    assert active_provider(get_backend("fa2"), ragged) == ("flash_attn", "2.8.4")
    assert candidate(router.decide(ragged, H100, strict=False, live=True), "fa2").accepted
    custom = make_problem(device_type="cuda", kv_storage="ragged", mask="custom", head_dim_qk=128,
                          head_dim_vo=128)  # a custom mask: FlashInfer's fa2 only
    assert active_provider(get_backend("fa2"), custom) == ("flashinfer", "0.5.3")
    assert any(r.field == "known defect" for r in candidate(router.decide(custom, H100, live=True), "fa2").reasons)


def test_an_explicit_choice_runs_with_one_warning(vendors, caplog):
    vendors(flashinfer="0.5.3")
    with caplog.at_level(logging.WARNING, logger="attn_dispatch"):
        decision = router.decide(PREFILL, H100, explicit=("fa2", "backend="), strict=False, live=True)
        router.decide(DECODE, H100, explicit=("fa2", "backend="), strict=False, live=True)
    assert decision.chosen == "fa2"
    warned = [r.getMessage() for r in caplog.records if SENTINEL in r.getMessage()]
    assert len(warned) == 1 and "fa2" in warned[0] and "0.7.0" in warned[0] and "4401" in warned[0]


def test_strict_mode_does_not_count_a_held_back_backend_as_a_fallback(vendors):
    vendors(flashinfer="0.5.3")
    assert router.decide(PREFILL, H100, strict=True, live=True).chosen not in ("fa2", "fa3")


def test_query_without_a_live_device_shows_the_data_only(vendors):
    vendors(flashinfer="0.5.3")
    assert candidate(router.decide(PREFILL, H100, strict=False, live=False), "fa2").accepted


# -- measured errors: a backend outside the contract's band on a configuration ---------------
def _measured(error):
    return _record(id="xqa-fp8-measured", versions={}, when={"kv_dtype": ["float8_e4m3fn"], "phase": ["decode"]},
                   measured_error=error, where_measured="H200, flashinfer 0.5.3", report="docs/benchmarks.md",
                   sources=[])


@pytest.mark.parametrize("error,held", [(0.09, True), (0.037, False)])
def test_a_measured_error_outside_the_band_holds_back_that_configuration_only(vendors, monkeypatch, error, held):
    vendors(flashinfer="0.7.2")
    monkeypatch.setattr(capability_db, "known_defects", lambda: (_measured(error),))
    fp8 = make_problem(device_type="cuda", phase="decode", head_dim_qk=128, head_dim_vo=128, kv_dtype="float8_e4m3fn")
    reasons = candidate(router.decide(fp8, H100, strict=False, live=True), "xqa").reasons
    assert any(r.field == "known defect" and "xqa-fp8-measured" in str(r.value) for r in reasons) == held
    assert "known defect" not in [r.field for r in candidate(router.decide(DECODE, H100, live=True), "xqa").reasons]


# -- info ------------------------------------------------------------------------------------
def test_info_lists_the_defects_of_the_installed_version(vendors):
    vendors(flashinfer="0.5.3")
    assert [d.id for d in installed_defects(get_backend("fa2"))] == [SENTINEL]
    row = cli.backend_info("fa2", H100)
    assert [d["id"] for d in row["defects"]] == [SENTINEL]
    assert any("known defect" in line and "0.7.0" in line for line in cli._info_lines(row))
    assert {d["id"] for d in cli.backend_info("xqa", H100)["defects"]} == {"xqa-nonfinite-at-extreme-logits",
                                                                         "xqa-fp8-kv-quantized-query"}
    vendors(flashinfer="0.7.2")
    assert cli.backend_info("fa2", H100)["defects"] == []


# -- provider limits by version: FlashInfer fa2 serves head dim 512 from 0.6.14, fp8 KV there from 0.7.1 --
@pytest.mark.parametrize("version,serves,fp8", [("0.5.3", False, False), ("0.6.13", False, False),
                                                ("0.6.14", True, False), ("0.7.0", True, False),
                                                ("0.7.1", True, True), ("0.7.2", True, True)])
def test_fa2_head_dim_512_follows_the_flashinfer_version(vendors, version, serves, fp8):
    vendors(flashinfer=version)
    p512 = make_problem(device_type="cuda", head_dim_qk=512, head_dim_vo=512)
    assert get_backend("fa2").check(p512, H100) == []  # the backend's data: some provider may serve it
    if serves:
        assert get_backend("fa2").choose(p512).label == "flashinfer fa2"
        fp8_kv = make_problem(device_type="cuda", head_dim_qk=512, head_dim_vo=512, kv_dtype="float8_e4m3fn")
        if fp8:
            assert get_backend("fa2").choose(fp8_kv).label == "flashinfer fa2"
        else:
            refused = r"kv_dtype='float8_e4m3fn': allowed one of 'float16', 'bfloat16' \(when head_dim_qk in \[512\]\)"
            with pytest.raises(BackendRejected, match=refused):
                get_backend("fa2").choose(fp8_kv)
    else:
        with pytest.raises(BackendRejected, match=rf"head_dim_qk=512: allowed one of 64, 128, 192, 256 with flashinfer "
                                                  rf"{version}") as info:
            get_backend("fa2").choose(p512)
        assert "0.6.14" in str(info.value)
    assert get_backend("fa2").choose(make_problem(device_type="cuda", head_dim_qk=128, head_dim_vo=128))


def test_flash_attn_keeps_its_256_limit(vendors):
    vendors(flash_attn=True)
    ragged = make_problem(device_type="cuda", kv_storage="ragged", head_dim_qk=512, head_dim_vo=512)
    with pytest.raises(BackendRejected, match="head_dim_qk=512: allowed <= 256 with flash_attn 2.8.4"):
        get_backend("fa2").choose(ragged)


# -- a defect the adapter guards: xqa's non-finite rows, fixed up on decode ------------------------
NONFINITE = "xqa-nonfinite-at-extreme-logits"


def _xqa_defects(problem) -> list[str]:
    decision = router.decide(problem, H100, strict=False, live=True)
    return [str(r.value) for r in candidate(decision, "xqa").reasons if r.field == "known defect"]


def test_xqa_is_chosen_where_its_fixup_guards_the_defect(vendors, monkeypatch):
    """Decode: native-triton's fix-up follows every XQA launch (backends/xqa.py), so the defect holds
    nothing back; spec decode, or no native-triton to run the fix-up: held back as before."""
    from backends.native.triton_backend import NativeTritonBackend
    vendors(flashinfer="0.7.2")
    assert not any(NONFINITE in v for v in _xqa_defects(DECODE))
    spec = make_problem(device_type="cuda", phase="spec_decode", q_len_per_req=3, head_dim_qk=128,
                        head_dim_vo=128)
    assert any(NONFINITE in v for v in _xqa_defects(spec))
    monkeypatch.setattr(NativeTritonBackend, "_available", (Reason("triton", "not installed", "pip install triton"),))
    router.clear_caches()
    assert any(NONFINITE in v for v in _xqa_defects(DECODE))


def test_info_says_where_a_defect_is_guarded(vendors):
    vendors(flashinfer="0.7.2")
    row = cli.backend_info("xqa", H100)
    (guarded,) = [d for d in row["defects"] if d["id"] == NONFINITE]
    assert "fix-up" in guarded["guarded"]
    shown = [" ".join(line.split()) for line in cli._info_lines(row)]  # as read, whatever the wrapping
    assert any(NONFINITE in line and "guarded on decode" in line for line in shown)


def test_a_replay_gates_xqa_unless_its_row_was_timed_with_the_guard():
    from tools.lab.replay import defect_gated
    env = {"flashinfer": "0.7.2"}
    assert defect_gated(env, DECODE, H100).get("xqa") == NONFINITE
    timed = [{"backend": "xqa", "status": "ok", "guarded": [NONFINITE]}]
    assert "xqa" not in defect_gated(env, DECODE, H100, timed)


def test_the_runner_marks_rows_timed_with_a_guard():
    from dispatch.benchmark.problems import BenchProblem, XQA
    from dispatch.benchmark.runner import _mark_guarded
    rows = [{"backend": "xqa", "status": "ok"}, {"backend": "fa2", "status": "ok"}, {"backend": "auto", "status": "ok"}]
    _mark_guarded(rows, BenchProblem(XQA, 4, 1, 512))
    assert rows[0]["guarded"] == [NONFINITE] and "guarded" not in rows[1] and "guarded" not in rows[2]
