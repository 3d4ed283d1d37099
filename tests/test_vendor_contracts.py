"""Contract tests of the fa2 / fa3 / trtllm-gen / xqa adapters against FAKE vendor modules (CPU).

The fakes (tests/_fake_vendors.py) stand in sys.modules for flashinfer, flash_attn and
flash_attn_interface: they record each call and compute in the vendor's own
convention, so these tests check the translation argument by argument *and* by
value against an fp64 oracle of our semantics (dispatch/problem.py).
"""
from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

import _fake_vendors as fv
from _fake_vendors import make_batch, make_problem, reference
from oracle import BANDS
import capability_db
from backends import BackendRejected, _vendor, get_backend
from backends.fa2 import FA2Backend
from backends.fa3 import FA3Backend
from dispatch import router

VENDOR_MODULES = ("flashinfer", "flashinfer.decode", "flashinfer.prefill", "flash_attn", "flash_attn_interface")
BF16_BAND = 1e-2


@pytest.fixture
def fakes(monkeypatch):
    """Install fake vendor modules; returns (recorder, install(**which))."""
    rec = fv.Recorder()

    def install(flashinfer=False, new_api=False, flash_attn=False, fa3=False, version="0.5.3"):
        mods = {}
        if flashinfer:
            mods.update(fv.make_flashinfer(rec, version=version, new_api=new_api))
        if flash_attn:
            mods.update(fv.make_flash_attn(rec))
        if fa3:
            mods.update(fv.make_flash_attn_interface(rec))
        for name in VENDOR_MODULES:
            monkeypatch.setitem(sys.modules, name, mods.get(name))  # None = "not installed"
        _reset()
    yield rec, install
    _reset()


def _reset():
    _vendor.forget_imports()
    for cls in (FA2Backend, FA3Backend):
        for p in cls.providers:
            getattr(p, "_wrappers", {}).clear()


def run_backend(name, problem, batch):
    backend = get_backend(name)
    backend.run(backend.plan(problem, batch), batch)


def assert_agrees(problem, batch, refs, band=BF16_BAND):
    out_ref, lse_ref = reference(problem, batch, refs)
    assert not torch.isnan(batch.out).any(), "every output element must be written"
    err = (batch.out.double() - out_ref).norm() / out_ref.norm()
    assert err < band, f"rel. Frobenius error {err:.2e} >= {band}"
    if batch.lse is not None:
        assert not torch.isnan(batch.lse).any()
        assert torch.equal(torch.isinf(batch.lse), torch.isinf(lse_ref))
        fin = torch.isfinite(lse_ref)
        lerr = (batch.lse.double()[fin] - lse_ref[fin]).norm() / lse_ref[fin].norm()
        assert lerr < 1e-5, f"LSE rel. error {lerr:.2e}"
    return err


# -- xqa --------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float8_e4m3fn"])
def test_xqa_compensates_bmm2_scale(fakes, layout, kv_dtype):
    """out_scale 0.7 with a fake that reproduces FlashInfer 0.5.3's scale folding: the adapter
    passes bmm2_scale=1 and scales the output itself, so both cache dtypes agree."""
    rec, install = fakes
    install(flashinfer=True)
    p = make_problem(phase="decode", kv_layout=layout, kv_dtype=kv_dtype, window_left=20, head_dim_qk=64)
    batch, refs = make_batch(p, [1, 1, 1], [5, 40, 33], out_scale=0.7, sinks=True)
    run_backend("xqa", p, batch)
    call = rec.last("xqa")
    assert call["bmm2_scale"] == 1.0 and call["bmm1_scale"] == pytest.approx(0.11)
    assert call["kv_layout"] == layout and call["window_left"] == 20
    assert call["sinks"] is batch.sinks and call["seq_lens"] is batch.kv_lens
    assert call["block_tables"] is batch.block_table and call["max_seq_len"] == 40
    assert call["kv_cache"][0].shape[1 if layout == "NHD" else 2] == p.page_size
    assert assert_agrees(p, batch, refs, band=6e-2 if kv_dtype != "bfloat16" else BF16_BAND) >= 0


def test_xqa_raw_bmm2_would_be_wrong(fakes):
    """The fake really reproduces the vendor's behaviour: passing bmm2=0.7 straight through fails."""
    rec, install = fakes
    install(flashinfer=True)
    p = make_problem(phase="decode")
    batch, refs = make_batch(p, [1, 1], [30, 17], out_scale=0.7)
    fi = sys.modules["flashinfer.decode"]
    k, v, _ = _vendor.physical_kv(p, batch.k, batch.v)
    ws = torch.zeros(9 * 2 ** 20, dtype=torch.uint8)
    fi.xqa_batch_decode_with_kv_cache(batch.q, (k, v), ws, batch.block_table, batch.kv_lens, 30, 0.11, 0.7,
                                      out=batch.out)
    out_ref, _ = reference(p, batch, refs)
    assert (batch.out.double() - out_ref).norm() / out_ref.norm() > 0.1


def test_xqa_tensor_scales_and_strided_out(fakes):
    rec, install = fakes
    install(flashinfer=True)
    p = make_problem(phase="decode")
    batch, refs = make_batch(p, [1, 1], [9, 64], sm_scale=torch.tensor(0.2), out_scale=torch.tensor([0.5]))
    wide = torch.full((2, p.num_qo_heads, 2 * p.head_dim_vo), math.nan, dtype=torch.bfloat16)
    batch.out = wide[..., : p.head_dim_vo]  # not contiguous: the adapter writes through a twin
    run_backend("xqa", p, batch)
    assert isinstance(rec.last("xqa")["bmm1_scale"], torch.Tensor)
    assert torch.isnan(wide[..., p.head_dim_vo:]).all()
    assert_agrees(p, batch, refs)


@pytest.mark.parametrize("out_scale", [0.7, torch.tensor([1.3])])
def test_xqa_fp8_out_with_flashinfer_07_scales_before_the_kernel_rounds(fakes, out_scale):
    """FlashInfer 0.7's XQA writes an fp8 output from an fp8 cache: out_scale goes in as bmm2_scale
    (the kernel's kv_scale for a quantized cache) and nothing multiplies the rounded output again."""
    rec, install = fakes
    install(flashinfer=True, new_api=True, version="0.7.2")
    p = make_problem(phase="decode", kv_dtype="float8_e4m3fn", out_dtype="float8_e4m3fn", has_sinks=True)
    assert get_backend("xqa").check(p, capability_db.resolve_device("h100")) == []
    batch, refs = make_batch(p, [1, 1, 1], [7, 50, 33], out_scale=out_scale, sinks=True)
    batch.out = torch.full_like(batch.out, math.nan)  # poisoned: every element must be written
    run_backend("xqa", p, batch)
    bmm2 = rec.last("xqa")["bmm2_scale"]
    assert float(bmm2) == pytest.approx(float(out_scale))
    assert isinstance(bmm2, torch.Tensor) == isinstance(out_scale, torch.Tensor)
    assert_agrees(p, batch, refs, band=BANDS["fp8"])


@pytest.mark.parametrize("version, refused", [("0.6.18", True), ("0.7.2", False)])
def test_xqa_fp8_out_is_refused_before_flashinfer_07(fakes, version, refused):
    _, install = fakes
    install(flashinfer=True, new_api=True, version=version)
    p = make_problem(phase="decode", kv_dtype="float8_e4m3fn", out_dtype="float8_e4m3fn")
    reasons = get_backend("xqa").check(p, capability_db.resolve_device("h100"))
    assert [(r.field, r.value) for r in reasons] == ([("out_dtype", "float8_e4m3fn")] if refused else [])
    assert not refused or f"flashinfer {version}" in reasons[0].allowed
    p16 = make_problem(phase="decode", kv_dtype="bfloat16", out_dtype="float8_e4m3fn")  # fp8 out needs fp8 K/V
    assert "kv_dtype" in [r.field for r in get_backend("xqa").check(p16, capability_db.resolve_device("h100"))]


def test_xqa_spec_decode_rejected_by_old_flashinfer(fakes):
    _, install = fakes
    install(flashinfer=True)
    p = make_problem(phase="spec_decode", q_len_per_req=3, causal=True)
    batch, _ = make_batch(p, [3, 3], [10, 20])
    with pytest.raises(BackendRejected, match="0.5.3 asserts q_len_per_req == 1"):
        get_backend("xqa").plan(p, batch)


@pytest.mark.parametrize("q_lens, causal", [([3, 3], True), ([3, 3], False), ([2, 4, 1], True)])
def test_xqa_spec_decode_with_new_flashinfer(fakes, q_lens, causal):
    rec, install = fakes
    install(flashinfer=True, new_api=True)
    fixed = len(set(q_lens)) == 1
    p = make_problem(phase="spec_decode", q_len_per_req=q_lens[0] if fixed else 0, causal=causal)
    batch, refs = make_batch(p, q_lens, [10 + n for n in q_lens], out_scale=0.7)
    run_backend("xqa", p, batch)
    call = rec.last("xqa")
    assert call["mask"].dtype == torch.uint16 and call["q_len_per_req"] == max(q_lens)
    assert (call["q_cu_seq_lens"] is None) == fixed
    assert_agrees(p, batch, refs)


def test_draft_mask_bits():
    from backends.xqa import draft_mask
    m = draft_mask(torch.tensor([0, 3, 5]), 3, True, "cpu")
    words = m.view(torch.int32).reshape(-1).tolist()
    assert words == [0b1, 0b11, 0b111, 0b1, 0b11]


# -- trtllm-gen -------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal, window", [(True, -1), (True, 7), (False, -1)])
def test_trtllm_translation(fakes, layout, causal, window):
    rec, install = fakes
    install(flashinfer=True, new_api=True)
    p = make_problem(kv_layout=layout, causal=causal, window_left=window, has_sinks=True, return_lse=True)
    batch, refs = make_batch(p, [5, 1, 12], [5, 30, 40], out_scale=0.6, sinks=True, lse=True)
    run_backend("trtllm-gen", p, batch)
    call = rec.last("trtllm")
    assert call["bmm1_scale"] == pytest.approx(0.11) and call["bmm2_scale"] == pytest.approx(0.6)
    assert call["kv_layout"] == layout and call["causal"] is causal and call["window_left"] == window
    assert call["lse"] is batch.lse and call["cum_seq_lens_q"] is batch.qo_indptr
    assert (call["max_q_len"], call["max_kv_len"], call["batch_size"]) == (12, 40, 3)
    assert_agrees(p, batch, refs)


def test_trtllm_separate_page_tables(fakes):
    """K and V pages with ids of their own (v_block_table) go as FlashInfer's (batch, 2, pages) table
    with uses_shared_paged_kv_idx=False; V's pages moved to other ids give the oracle's result."""
    rec, install = fakes
    install(flashinfer=True, new_api=True)
    p = dataclasses.replace(make_problem(kv_layout="HND"), uses_shared_paged_kv_idx=False)
    batch, refs = make_batch(p, [5, 1, 12], [5, 30, 40])
    moved = torch.randperm(batch.v.shape[0], generator=torch.Generator().manual_seed(1))
    v = batch.v.clone()  # same strides: FlashInfer reads V with K's
    v[moved] = batch.v
    batch = dataclasses.replace(batch, v=v, v_block_table=moved[batch.block_table.long()].to(torch.int32))
    run_backend("trtllm-gen", p, batch)
    call = rec.last("trtllm")
    assert call["uses_shared_paged_kv_idx"] is False and call["block_tables"].shape[1] == 2
    assert torch.equal(call["block_tables"][:, 1], batch.v_block_table)
    assert_agrees(p, batch, refs)


def test_trtllm_old_flashinfer_refuses_lse_and_non_causal(fakes):
    _, install = fakes
    install(flashinfer=True)
    for kw, field in ((dict(causal=False), "causal"), (dict(causal=True, return_lse=True), "return_lse"),
                      (dict(causal=True, uses_shared_paged_kv_idx=False), "uses_shared_paged_kv_idx")):
        p = make_problem(**kw)
        batch, _ = make_batch(p, [2], [8], lse=kw.get("return_lse", False))
        with pytest.raises(BackendRejected) as info:
            get_backend("trtllm-gen").plan(p, batch)
        assert info.value.reasons[0].field == field


# -- fa2 / fa3 through FlashInfer -------------------------------------------------------------
@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_flashinfer_paged_provider(fakes, backend, layout):
    rec, install = fakes
    install(flashinfer=True)
    p = make_problem(kv_layout=layout, causal=True, window_left=9, logits_soft_cap=20.0, return_lse=True)
    batch, refs = make_batch(p, [4, 1, 16], [4, 33, 20], out_scale=0.7, lse=True)
    run_backend(backend, p, batch)
    assert rec.last("wrapper_init") == {"kv_layout": layout, "backend": backend}
    plan = rec.last("paged_plan")
    assert plan["sm_scale"] == pytest.approx(0.11) and plan["window_left"] == 9 and plan["causal"] is True
    assert plan["logits_soft_cap"] == 20.0 and plan["q_data_type"] == torch.bfloat16
    assert plan["kv_indptr"].tolist() == [0, 1, 4, 6] and plan["last"].tolist() == [4, 1, 4]
    assert plan["seq_lens"] is batch.kv_lens
    assert rec.last("paged_run")["lse"] is batch.lse and rec.last("paged_run")["out"] is batch.out
    assert_agrees(p, batch, refs)


def test_flashinfer_fa2_ragged_custom_mask_and_replan(fakes):
    rec, install = fakes
    install(flashinfer=True)
    p = make_problem(kv_storage="ragged", mask="custom", return_lse=True)
    b1, r1 = make_batch(p, [3, 6], [7, 6], custom_mask=True, lse=True)
    b2, r2 = make_batch(p, [2], [9], custom_mask=True, lse=True)
    fa2 = get_backend("fa2")
    plan1, plan2 = fa2.plan(p, b1), fa2.plan(p, b2)  # same problem: one wrapper, planned twice
    fa2.run(plan1, b1)  # must re-plan for b1 ...
    fa2.run(plan2, b2)  # ... and again for b2
    fa2.run(plan2, b2)  # no re-plan: it was the last one applied
    assert len([c for c in rec.calls if c[0] == "ragged_plan"]) == 4
    assert rec.last("ragged_plan")["custom_mask"] is b2.custom_mask
    assert_agrees(p, b1, r1)
    assert_agrees(p, b2, r2)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_flashinfer_single_request_kernel_for_dense(fakes, layout):
    """One request (single_prefill): FlashInfer's single-request kernel on the caller's physical
    layout, no batch wrapper plan; a new scale per call is passed, never a cached one."""
    rec, install = fakes
    install(flashinfer=True)
    p = make_problem(kv_storage="dense", kv_layout=layout, causal=True, window_left=5, return_lse=True)
    batch, refs = make_batch(p, [6], [11], lse=True)
    fa2 = get_backend("fa2")
    plan = fa2.plan(p, batch)
    fa2.run(plan, batch)
    call = rec.last("single_prefill_op")  # flashinfer 0.5.x: the compiled op, into our own out/lse
    assert call["layout"] == (1 if layout == "HND" else 0) and call["q"] is batch.q
    assert call["o"] is batch.out and call["lse"] is batch.lse
    assert not [c for c in rec.calls if c[0] in ("single_prefill", "ragged_plan", "paged_plan")]
    assert_agrees(p, batch, refs)
    fa3 = get_backend("fa3")
    fa3.run(fa3.plan(p, batch), batch)  # fa3's single kernel ignores HND: it gets the NHD view
    assert rec.last("single_prefill_op")["layout"] == 0 and rec.last("single_prefill_op")["k"] is batch.k
    assert_agrees(p, batch, refs)
    batch.sm_scale = 0.5
    fa2.run(plan, batch)
    assert rec.last("single_prefill_op")["sm_scale"] == 0.5


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_flashinfer_single_prefill_takes_nvfp4_with_its_scale_factors(fakes, layout):
    """NVFP4 K/V (FlashInfer >= 0.6.18's fa2): FlashInfer's public single prefill with kv_cache_sf, the
    scale factors as their bytes in K's physical layout, the answer the fp64 oracle's over the
    dequantized cache; FlashInfer 0.6.14's fa2 refuses the dtype."""
    from dispatch.benchmark.oracle import reference_of_batch
    from dispatch.inputs import Case, make_batch as random_batch

    rec, install = fakes
    install(flashinfer=True, new_api=True, version="0.7.2")
    p = make_problem(kv_storage="dense", kv_layout=layout, causal=True, kv_dtype="uint8", q_dtype="float16",
                     out_dtype="float16", head_dim_qk=64, head_dim_vo=64)
    batch = random_batch(Case("nvfp4", p, (6,), (11,)), "cpu", seed=5)
    fa2 = get_backend("fa2")
    fa2.run(fa2.plan(p, batch), batch)
    call = rec.last("single_prefill")
    sf_k = call["kv_cache_sf"][0]
    assert sf_k.dtype == torch.uint8 and sf_k.shape[0] == (2 if layout == "HND" else 11)
    assert call["kv_layout"] == layout
    ref, _ = reference_of_batch(p, batch)
    err = (batch.out.double() - ref).norm() / ref.norm()
    assert not torch.isnan(batch.out).any() and err < BF16_BAND, err
    install(flashinfer=True, new_api=True, version="0.6.14")
    assert any(r.field == "kv_dtype" for r in fa2.providers[1].limits(p))


def test_flashinfer_single_request_kernel_packs_a_custom_mask_per_call(fakes):
    """A custom mask takes the compiled op too (not FlashInfer's Python function and an out copy):
    packed little-endian by FlashInfer's packbits on every call, as its public function does, in
    the mask mode CUSTOM; a new mask on the next call is the one applied."""
    rec, install = fakes
    install(flashinfer=True)
    p = make_problem(kv_storage="dense", mask="custom", return_lse=True)
    batch, refs = make_batch(p, [6], [11], custom_mask=True, lse=True)
    fa2 = get_backend("fa2")
    plan = fa2.plan(p, batch)
    fa2.run(plan, batch)
    call = rec.last("single_prefill_op")
    assert call["mask_mode"] == 2 and call["o"] is batch.out and call["lse"] is batch.lse
    assert rec.last("packbits")["bitorder"] == "little" and rec.last("packbits")["x"] is batch.custom_mask
    assert not [c for c in rec.calls if c[0] == "single_prefill"]
    assert_agrees(p, batch, refs)
    batch2, refs2 = make_batch(p, [6], [11], custom_mask=True, lse=True)  # another mask, same shapes
    fa2.run(plan, batch2)
    assert rec.last("packbits")["x"] is batch2.custom_mask
    assert_agrees(p, batch2, refs2)


def test_flashinfer_fa3_limits_reject_at_plan(fakes):
    _, install = fakes
    install(flashinfer=True)
    p = make_problem(head_dim_qk=96, head_dim_vo=96)
    batch, _ = make_batch(p, [2], [5])
    with pytest.raises(BackendRejected, match="head_dim_qk"):
        get_backend("fa3").plan(p, batch)


# -- fa2 / fa3 through Dao-AILab FlashAttention ------------------------------------------------
@pytest.mark.parametrize("causal, window", [(True, -1), (True, 5), (False, 5), (False, -1)])
def test_flash_attn_paged_window_and_lse(fakes, causal, window):
    rec, install = fakes
    install(flash_attn=True)
    p = make_problem(page_size=256, causal=causal, window_left=window, return_lse=True)
    batch, refs = make_batch(p, [3, 1], [2, 300], out_scale=0.8, lse=True)  # 3 queries on 2 keys: an empty row
    run_backend("fa2", p, batch)
    call = rec.last("fa2")
    assert call["window_size"] == ((window, 0) if causal else (window, -1))
    assert call["block_table"] is batch.block_table and call["cu_k"].tolist() == [0, 2, 302]
    assert call["return_attn_probs"] is True and call["scale"] == pytest.approx(0.11)
    if causal:
        assert batch.lse[0].isneginf().all() and (batch.out[0] == 0).all()
    assert_agrees(p, batch, refs)


def test_flash_attn_alibi_matches_flashinfer_slopes(fakes):
    rec, install = fakes
    install(flash_attn=True)
    p = make_problem(kv_storage="ragged", causal=True, pos_encoding="ALIBI", num_qo_heads=6, num_kv_heads=3)
    batch, (rk, rv, _) = make_batch(p, [4, 2], [9, 5])
    run_backend("fa2", p, batch)
    slopes = rec.last("fa2")["alibi"]
    assert torch.allclose(slopes[:4], torch.tensor([2.0 ** (-2 * i) for i in range(1, 5)]))
    assert torch.allclose(slopes[4:], torch.tensor([2.0 ** -1, 2.0 ** -3]))
    outs = []
    for b, (a, z) in enumerate(((0, 4), (4, 6))):
        o, _ = fv.attend(batch.q[a:z].float(), rk[b].float(), rv[b].float(), scale=0.11, hi=0, alibi=slopes)
        outs.append(o)
    ref = torch.cat(outs)
    assert (batch.out.double() - ref).norm() / ref.norm() < BF16_BAND


def test_flash_attn_page_16_falls_to_flashinfer_or_rejects(fakes):
    rec, install = fakes
    install(flash_attn=True)
    p = make_problem(page_size=16)
    batch, refs = make_batch(p, [2], [20])
    with pytest.raises(BackendRejected) as info:
        get_backend("fa2").plan(p, batch)
    fields = [r.field for r in info.value.reasons]
    assert "flash_attn: page_size" in fields and "provider flashinfer fa2" in fields
    install(flash_attn=True, flashinfer=True)
    run_backend("fa2", p, batch)
    assert rec.last("paged_plan")["page_size"] == 16
    assert_agrees(p, batch, refs)


@pytest.mark.parametrize("storage", ["paged", "ragged"])
def test_flash_attn_interface_fa3(fakes, storage):
    rec, install = fakes
    install(fa3=True)
    p = make_problem(kv_storage=storage, page_size=16, causal=True, window_left=6, logits_soft_cap=15.0,
                     return_lse=True)
    batch, refs = make_batch(p, [5, 3], [5, 40], out_scale=torch.tensor(0.9), lse=True)
    run_backend("fa3", p, batch)
    call = rec.last("fa3_kvcache" if storage == "paged" else "fa3_varlen")
    assert call["window_size"] == (6, 0) and call["causal"] is True
    if storage == "paged":
        assert call["page_table"] is batch.block_table and call["cache_seqlens"] is batch.kv_lens
        assert call["cu_q"] is batch.qo_indptr and call["softcap"] == 15.0
    assert_agrees(p, batch, refs)


# -- availability and hardware reasons ---------------------------------------------------------
@pytest.mark.parametrize("name", ["fa2", "fa3", "trtllm-gen", "xqa"])
def test_not_installed_and_cpu_reasons(fakes, name):
    _, install = fakes
    install()  # nothing installed
    p = make_problem(phase="decode")
    reasons = router.backend_reasons(name, p, capability_db.CPU_DEVICE, live=True)
    texts = [str(r) for r in reasons]
    assert "not installed" in texts[0] and "pip install 'attn-dispatch[" in texts[0]
    assert any(r.field == "device_kind" and r.value == "cpu" for r in reasons)


def test_installed_has_version(fakes):
    _, install = fakes
    install(flashinfer=True, flash_attn=True)
    assert get_backend("xqa").available() is None and get_backend("xqa").version() == "0.5.3"
    assert get_backend("fa2").version() == "flash_attn 2.8.4, flashinfer fa2 0.5.3"


@pytest.mark.parametrize("name, gpu, field", [
    ("trtllm-gen", "h100", "sm"), ("fa3", "a100", "sm"), ("fa3", "b200", "sm"), ("xqa", "a100", "sm"),
    ("xqa", "thor", "sm"), ("trtllm-gen", "thor", "sm"),
])
def test_hardware_reasons(name, gpu, field):
    p = make_problem(phase="decode", device_type="cuda")
    reasons = get_backend(name).check(p, capability_db.resolve_device(gpu))
    assert [r.field for r in reasons] == [field]


@pytest.mark.parametrize("name, kw, field", [
    ("xqa", dict(phase="decode", return_lse=True), "return_lse"),
    ("xqa", dict(phase="decode", page_size=8), "page_size"),
    ("xqa", dict(phase="prefill"), "phase"),
    ("xqa", dict(phase="spec_decode", head_dim_qk=512, head_dim_vo=512), "head_dim_qk"),
    ("trtllm-gen", dict(page_size=24), "page_size"),
    ("trtllm-gen", dict(causal=False, window_left=5), "has_window"),
    ("trtllm-gen", dict(logits_soft_cap=30.0), "has_soft_cap"),
    ("trtllm-gen", dict(kv_dtype="float8_e4m3fn"), "kv_dtype"),
    ("xqa", dict(phase="decode", uses_shared_paged_kv_idx=False), "uses_shared_paged_kv_idx"),
    ("fa2", dict(uses_shared_paged_kv_idx=False), "uses_shared_paged_kv_idx"),
    ("fa3", dict(uses_shared_paged_kv_idx=False), "uses_shared_paged_kv_idx"),
    ("fa2", dict(has_sinks=True), "has_sinks"),
    ("fa2", dict(head_dim_qk=1024, head_dim_vo=1024), "head_dim_qk"),  # 512: a provider limit by version
    ("fa3", dict(pos_encoding="ALIBI"), "pos_encoding"),
    ("fa3", dict(q_dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", out_dtype="float8_e4m3fn"), "out_dtype"),
])
def test_capability_reasons(name, kw, field):
    gpu = {"trtllm-gen": "b200"}.get(name, "h100")
    p = make_problem(device_type="cuda", **kw)
    assert field in [r.field for r in get_backend(name).check(p, capability_db.resolve_device(gpu))]


def test_every_constraint_cites_a_source():
    for name in ("fa2", "fa3", "trtllm-gen", "xqa"):
        caps = capability_db.backend_caps(name)
        assert all(c.source for c in caps.constraints), name
        assert caps.hardware.status != "verified" or caps.hardware.report == "docs/benchmarks.md"


# -- negative softmax scales --------------------------------------------------------------------
@pytest.mark.parametrize("name, phase, install_kw", [
    ("fa2", "prefill", dict(flashinfer=True)), ("fa2", "prefill", dict(flash_attn=True)),
    ("fa3", "prefill", dict(flashinfer=True)), ("xqa", "decode", dict(flashinfer=True)),
    ("trtllm-gen", "prefill", dict(flashinfer=True, new_api=True)),
])
def test_negative_scale_is_refused_before_launch(fakes, name, phase, install_kw):
    """The vendors' online softmax assumes sm_scale > 0: plan and run refuse, nothing is called."""
    rec, install = fakes
    install(**install_kw)
    p = make_problem(phase=phase, page_size=256 if install_kw.get("flash_attn") else 16)
    batch, _ = make_batch(p, [1, 1] if phase == "decode" else [3, 2], [9, 17], sm_scale=-0.2)
    backend = get_backend(name)
    with pytest.raises(BackendRejected) as err:
        backend.plan(p, batch)
    assert [(r.field, r.value) for r in err.value.reasons] == [("sm_scale", -0.2)]
    assert "> 0 on" in err.value.reasons[0].allowed
    plan = backend.plan(p, dataclasses.replace(batch, sm_scale=0.2))
    with pytest.raises(BackendRejected):
        backend.run(plan, batch)  # a later call with a negative float scale: refused before launch
    launches = [n for n, _ in rec.calls if n in ("xqa", "trtllm", "paged_run", "ragged_run", "fa2", "fa3")]
    assert launches == [], "a kernel was called"



# -- xqa's known defect, guarded on decode: native-triton's fix-up after each launch ----------------
def _defective_xqa(monkeypatch, request: int):
    """The fake XQA with the defect of capability_db/defects.json reproduced: request ``request``'s rows
    (every logit below XQA's floor) come out NaN; the others are right."""
    fi = sys.modules["flashinfer.decode"]
    honest = fi.xqa_batch_decode_with_kv_cache

    def defective(*args, **kw):
        result = honest(*args, **kw)
        kw["out"][request] = math.nan
        return result

    monkeypatch.setattr(fi, "xqa_batch_decode_with_kv_cache", defective)


def _extreme_decode(request: int):
    """A decode batch whose request ``request`` has logits far past the fix-up's bound (q x 3000)."""
    p = make_problem(phase="decode", window_left=20, head_dim_qk=64)
    batch, refs = make_batch(p, [1, 1, 1], [5, 40, 33], out_scale=0.7, sinks=True)
    batch.q[request] = batch.q[request].float() * 3000
    return p, batch, refs


def test_xqa_decode_rows_it_gets_wrong_are_recomputed(fakes, monkeypatch):
    _, install = fakes
    install(flashinfer=True)
    _defective_xqa(monkeypatch, request=1)
    p, batch, refs = _extreme_decode(request=1)
    xqa = get_backend("xqa")
    plan = xqa.plan(p, batch)
    assert plan.fixup is not None and plan.fixup.constexprs["FIXUP"]
    xqa.run(plan, batch)
    assert_agrees(p, batch, refs)


def test_xqa_launcher_runs_the_fixup_after_xqa(fakes):
    """The launcher's composition (for FlashInfer's kernel entry): XQA's launch, then the fix-up's."""
    from backends.xqa import _NATIVE, _then_fixup
    _, install = fakes
    install(flashinfer=True)
    p, batch, refs = _extreme_decode(request=2)
    out_ref, _ = reference(p, batch, refs)

    def launch_xqa(b) -> None:  # what the defective kernel writes
        b.out.copy_(out_ref)
        b.out[2] = math.nan

    _then_fixup(launch_xqa, _NATIVE.plan(p, batch, fixup=True), batch)(batch)
    assert_agrees(p, batch, refs)
    assert _then_fixup(launch_xqa, None, batch) is launch_xqa


def test_xqa_spec_decode_has_no_fixup(fakes):
    """Draft rows may not see their own key (a mask): the fix-up cannot bound them, so spec decode
    keeps the defect (the router holds xqa back there: tests/test_known_defects.py)."""
    _, install = fakes
    install(flashinfer=True, new_api=True)
    p = make_problem(phase="spec_decode", q_len_per_req=3, causal=True)
    batch, _ = make_batch(p, [3, 3], [10, 20])
    assert get_backend("xqa").plan(p, batch).fixup is None
