"""NVFP4 KV caches (FlashInfer 0.7.2's ``kv_cache_sf``) through dispatch, on the CPU.

Random fp32 K/V are quantized with the tests' own quantizer (tests/_nvfp4.py, FlashInfer's format);
the answer is checked against the fp64 oracle over the *dequantized* cache (dequantized in fp64 by
the tests' own decoder) times the global scales, within METHOD.md's band of the query dtype: the
dequantized values are exact in 16 bits, so NVFP4's rounding is not part of the error. Both backends
that serve NVFP4 run: the reference and native-triton (Triton's interpreter here; tests/conftest.py).
Argument errors name the argument, its value and what is allowed, and come before any kernel runs.
"""
from __future__ import annotations

import math

import pytest
import torch

import dispatch
from _nvfp4 import dequantize_fp64, quantize
from backends import get_backend
from backends.native import nvfp4
from capability_db import backend_caps, resolve_device
from dispatch.problem import AttentionProblem
from oracle import BANDS, attention_fp64, relative_error

BACKENDS = ["reference", "native-triton"]
K_SCALE, V_SCALE = 0.7, 1.5


def _close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    band = BANDS["float16" if dtype == torch.float16 else "bfloat16"]
    err = relative_error(got, ref)
    assert err < band, f"rel. error {err:.2e} >= {band}"


# -- the format ------------------------------------------------------------------------------------
def test_every_code_and_scale_decodes_as_flashinfer_defines_them():
    """All 16 e2m1 codes (low nibble first) times scale factors 1.0, 0.5, 448 and the smallest
    subnormal 2^-9, by both decoders (the package's and the tests' fp64 one)."""
    codes = torch.arange(16, dtype=torch.uint8)
    packed = codes | (codes.flip(0) << 4)  # 32 values: one row of two scale blocks
    values = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    row = [v for c in range(16) for v in (values[c], values[15 - c])]
    for sf_byte, scale in ((0x38, 1.0), (0x30, 0.5), (0x7E, 448.0), (0x01, 2.0 ** -9)):
        sf = torch.full((2,), sf_byte, dtype=torch.uint8)
        want = torch.tensor(row, dtype=torch.float64) * scale
        assert torch.equal(dequantize_fp64(packed, sf), want)
        assert torch.equal(nvfp4.dequantize(packed, sf).double(), want)
        assert torch.equal(nvfp4.dequantize(packed, sf.view(torch.float8_e4m3fn)).double(), want)


def test_quantizers_agree_and_round_trip():
    x = torch.randn(6, 3, 64) * 3
    x[0, 0, :16] = 0  # an all-zero block: scale factor 0, values 0
    for global_scale in (1.0, 0.25):
        ours, theirs = nvfp4.quantize(x, global_scale), quantize(x, global_scale)
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1].view(torch.uint8), theirs[1].view(torch.uint8))
        back = dequantize_fp64(*theirs, global_scale)
        assert relative_error(back, x.double()) < 0.15  # e2m1: 1 mantissa bit
        assert torch.equal(back[0, 0, :16], torch.zeros(16, dtype=torch.float64))


# -- single_prefill_with_kv_cache ------------------------------------------------------------------
def _single_ref(q, k, v, k_sf, v_sf, kv_layout, **kw):
    kd, vd = dequantize_fp64(k, k_sf, K_SCALE), dequantize_fp64(v, v_sf, V_SCALE)
    if kv_layout == "HND":
        kd, vd = kd.transpose(0, 1), vd.transpose(0, 1)
    return attention_fp64(q, kd, vd, sm_scale=1 / math.sqrt(q.shape[-1]), **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_layout,causal,dtype,sf_bytes", [
    ("NHD", True, torch.float16, False), ("HND", False, torch.bfloat16, True),
    ("NHD", False, torch.bfloat16, True), ("HND", True, torch.float16, False)])
def test_single_prefill_matches_fp64_over_the_dequantized_cache(backend, kv_layout, causal, dtype, sf_bytes):
    qo_len, kv_len, hq, hkv, d = 9, 21, 4, 2, 64
    shape = (kv_len, hkv, d) if kv_layout == "NHD" else (hkv, kv_len, d)
    q = torch.randn(qo_len, hq, d).to(dtype)
    (k, k_sf), (v, v_sf) = quantize(torch.randn(shape), sf_bytes=sf_bytes), quantize(torch.randn(shape))
    out, lse = dispatch.single_prefill_with_kv_cache(
        q, k, v, causal=causal, kv_layout=kv_layout, kv_cache_sf=(k_sf, v_sf), k_scale=K_SCALE, v_scale=V_SCALE,
        return_lse=True, backend=backend)
    ref, ref_lse = _single_ref(q, k, v, k_sf, v_sf, kv_layout, causal=causal)
    assert out.shape == (qo_len, hq, d) and out.dtype == dtype
    _close(out, ref, dtype)
    _close(lse, ref_lse, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_prefill_rope_and_distinct_head_dims(backend):
    """RoPE at head dim 128 (both K halves dequantized: the fused rotation's loads), and head_dim_vo
    64 beside head_dim_qk 128 (each from its own packed width)."""
    q = torch.randn(6, 2, 128).half()
    (k, k_sf), (v, v_sf) = quantize(torch.randn(13, 2, 128)), quantize(torch.randn(13, 2, 64))
    out = dispatch.single_prefill_with_kv_cache(q, k, v, causal=True, pos_encoding_mode="ROPE_LLAMA",
                                                kv_cache_sf=(k_sf, v_sf), k_scale=K_SCALE, v_scale=V_SCALE,
                                                backend=backend)
    ref, _ = _single_ref(q, k, v, k_sf, v_sf, "NHD", causal=True, pos_encoding="ROPE_LLAMA")
    assert out.shape == (6, 2, 64)
    _close(out, ref, torch.float16)


def test_auto_serves_nvfp4_with_a_backend_that_dequantizes():
    q = torch.randn(5, 2, 32).half()
    (k, k_sf), (v, v_sf) = quantize(torch.randn(8, 1, 32)), quantize(torch.randn(8, 1, 32))
    out = dispatch.single_prefill_with_kv_cache(q, k, v, kv_cache_sf=(k_sf, v_sf))
    assert dispatch.last_decision().chosen in BACKENDS
    _close(out, attention_fp64(q, dequantize_fp64(k, k_sf), dequantize_fp64(v, v_sf),
                               sm_scale=1 / math.sqrt(32))[0], torch.float16)


# -- BatchPrefillWithPagedKVCacheWrapper.run -----------------------------------------------------
PAGE, HQ, HKV, D = 4, 4, 2, 32
KV_LENS, Q_LENS = (9, 6), (3, 6)


def _paged_setup(kv_layout: str, sf_bytes: bool):
    """A shuffled page pool (2 spare pages), its page lists, and the whole (pages, 2, ...) cache and
    scale factors in ``kv_layout``."""
    pages = [math.ceil(n / PAGE) for n in KV_LENS]
    n_pages = sum(pages) + 2
    shape = (n_pages, 2, PAGE, HKV, D) if kv_layout == "NHD" else (n_pages, 2, HKV, PAGE, D)
    cache, sf = quantize(torch.randn(shape), sf_bytes=sf_bytes)
    ids = torch.randperm(n_pages)[:sum(pages)].to(torch.int32)
    indptr = torch.tensor([0, pages[0], sum(pages)], dtype=torch.int32)
    last = torch.tensor([(n - 1) % PAGE + 1 for n in KV_LENS], dtype=torch.int32)
    return cache, sf, ids, indptr, last


def _paged_ref(q, cache, sf, ids, indptr, kv_layout, causal):
    real = dequantize_fp64(cache, sf)
    qo = [0, Q_LENS[0], sum(Q_LENS)]
    outs, lses = [], []
    for b, kv_len in enumerate(KV_LENS):
        rows = ids[indptr[b]:indptr[b + 1]].long()
        k, v = real[rows, 0], real[rows, 1]
        if kv_layout == "HND":
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        k, v = k.reshape(-1, HKV, D)[:kv_len] * K_SCALE, v.reshape(-1, HKV, D)[:kv_len] * V_SCALE
        out, lse = attention_fp64(q[qo[b]:qo[b + 1]], k, v, sm_scale=1 / math.sqrt(D), causal=causal)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _wrapper(kv_layout, backend, causal, ids, indptr, last, dtype=torch.float16):
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1), kv_layout, backend=backend)
    qo_indptr = torch.tensor([0, Q_LENS[0], sum(Q_LENS)], dtype=torch.int32)
    w.plan(qo_indptr, indptr, ids, last, HQ, HKV, D, PAGE, causal=causal, q_data_type=dtype,
           kv_data_type=torch.uint8)
    return w


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_layout,causal,dtype,form", [
    ("NHD", True, torch.float16, "whole"), ("HND", False, torch.bfloat16, "pair"),
    ("NHD", False, torch.bfloat16, "pair"), ("HND", True, torch.float16, "whole")])
def test_paged_run_matches_fp64_and_writes_every_element(backend, kv_layout, causal, dtype, form):
    """The whole (pages, 2, ...) cache with its (pages, 2, ...) scale factors, or (k, v) and (k_sf, v_sf)
    pairs (uint8 scale-factor bytes); out and lse given, poisoned with NaN."""
    cache, sf, ids, indptr, last = _paged_setup(kv_layout, sf_bytes=form == "pair")
    w = _wrapper(kv_layout, backend, causal, ids, indptr, last, dtype)
    q = torch.randn(sum(Q_LENS), HQ, D).to(dtype)
    out = torch.full((sum(Q_LENS), HQ, D), float("nan"), dtype=dtype)
    lse = torch.full((sum(Q_LENS), HQ), float("nan"))
    kv, kv_sf = (cache, sf) if form == "whole" else ((cache[:, 0], cache[:, 1]), (sf[:, 0], sf[:, 1]))
    got, got_lse = w.run(q, kv, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=kv_sf, out=out, lse=lse,
                         return_lse=True)
    assert got is out and got_lse is lse and w.decision.chosen == backend
    ref, ref_lse = _paged_ref(q, cache, sf, ids, indptr, kv_layout, causal)
    _close(out, ref, dtype)
    _close(lse, ref_lse, dtype)


def test_paged_run_repeats_take_each_calls_scale_factors(gpu_like):
    """The path of CUDA tensors (fast lanes, checks once per key): a repeat with new scale factors of the
    same shape reads them, not the first call's."""
    cache, sf, ids, indptr, last = _paged_setup("NHD", sf_bytes=False)
    w = _wrapper("NHD", "reference", True, ids, indptr, last)
    q = torch.randn(sum(Q_LENS), HQ, D).half()
    for _ in range(2):
        sf = quantize(torch.randn(cache.shape[:-1] + (D,)))[1]
        out = w.run(q, cache, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=sf)
        _close(out, _paged_ref(q, cache, sf, ids, indptr, "NHD", True)[0], torch.float16)


# -- BatchPrefillWithRaggedKVCacheWrapper.run ----------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal,form", [(True, "pair"), (False, "whole")])
def test_ragged_run_matches_fp64(backend, causal, form):
    """(k_sf, v_sf), or one (tokens, 2, Hkv, D // 16) tensor (FlashInfer 0.7.2 unbinds its dim 1)."""
    kv = quantize(torch.randn(sum(KV_LENS), 2, HKV, D), sf_bytes=form == "pair")
    k, v = kv[0][:, 0], kv[0][:, 1]
    kv_cache_sf = (kv[1][:, 0], kv[1][:, 1]) if form == "pair" else kv[1]
    w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1), backend=backend)
    qo = torch.tensor([0, Q_LENS[0], sum(Q_LENS)], dtype=torch.int32)
    w.plan(qo, torch.tensor([0, KV_LENS[0], sum(KV_LENS)], dtype=torch.int32), HQ, HKV, D, causal=causal,
           q_data_type=torch.bfloat16, kv_data_type=torch.uint8)
    q = torch.randn(sum(Q_LENS), HQ, D).bfloat16()
    out = torch.full((sum(Q_LENS), HQ, D), float("nan"), dtype=torch.bfloat16)
    w.run(q, k, v, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=kv_cache_sf, out=out)
    real = dequantize_fp64(*kv)
    refs = [attention_fp64(q[qo[b]:qo[b + 1]], real[s:e, 0] * K_SCALE, real[s:e, 1] * V_SCALE,
                           sm_scale=1 / math.sqrt(D), causal=causal)[0]
            for b, (s, e) in enumerate(((0, KV_LENS[0]), (KV_LENS[0], sum(KV_LENS))))]
    _close(out, torch.cat(refs), torch.bfloat16)
    with pytest.raises(ValueError, match=r"kv_cache_sf=None: allowed the NVFP4 scale factors of the uint8 k and v"):
        w.run(q, k, v)


# -- xqa_batch_decode_with_kv_cache (FlashInfer 0.7.2's XQA serves NVFP4 on SM12x only; ours anywhere) -----
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_xqa_decode_matches_fp64(backend, kv_layout):
    cache, sf, ids, indptr, last = _paged_setup(kv_layout, sf_bytes=kv_layout == "HND")
    pages = [int(indptr[1]), int(indptr[2] - indptr[1])]
    table = torch.zeros(2, max(pages), dtype=torch.int32)
    table[0, :pages[0]], table[1, :pages[1]] = ids[:pages[0]], ids[pages[0]:]
    q = torch.randn(2, HQ, D).half()
    out = torch.full((2, HQ, D), float("nan"), dtype=torch.float16)
    with dispatch.use_backend(backend):
        dispatch.xqa_batch_decode_with_kv_cache(
            q, cache, torch.empty(1), table, torch.tensor(KV_LENS, dtype=torch.int32), max(KV_LENS),
            bmm1_scale=K_SCALE / math.sqrt(D), bmm2_scale=V_SCALE, out=out, kv_layout=kv_layout, kv_cache_sf=sf)
    assert dispatch.last_decision().chosen == backend
    real = dequantize_fp64(cache, sf)
    refs = []
    for b, kv_len in enumerate(KV_LENS):
        k, v = real[table[b, :pages[b]].long(), 0], real[table[b, :pages[b]].long(), 1]
        if kv_layout == "HND":
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        refs.append(attention_fp64(q[b:b + 1], k.reshape(-1, HKV, D)[:kv_len] * K_SCALE,
                                   v.reshape(-1, HKV, D)[:kv_len] * V_SCALE, sm_scale=1 / math.sqrt(D), causal=True)[0])
    _close(out, torch.cat(refs), torch.float16)
    with pytest.raises(ValueError, match=r"kv_cache_sf=None: allowed the NVFP4 scale factors of the uint8 kv_cache"):
        dispatch.xqa_batch_decode_with_kv_cache(q, cache, torch.empty(1), table,
                                                torch.tensor(KV_LENS, dtype=torch.int32), max(KV_LENS),
                                                kv_layout=kv_layout)


# -- errors: the argument, its value, what is allowed; nothing launched --------------------------
def _single_args():
    q = torch.randn(5, 2, 32).half()
    (k, k_sf), (v, v_sf) = quantize(torch.randn(8, 1, 32)), quantize(torch.randn(8, 1, 32))
    return q, k, v, k_sf, v_sf


@pytest.mark.parametrize("change,error,pattern", [
    (lambda a: dict(kv_cache_sf=None), ValueError, r"kv_cache_sf=None: allowed the NVFP4 scale factors"),
    (lambda a: dict(k=a["k"].float(), v=a["v"].float(), q=a["q"].float()), ValueError,
     r"kv_cache_sf=.*allowed None with a float32 cache"),
    (lambda a: dict(v=torch.randn(8, 1, 32).half()), ValueError, r"v\.dtype=float16: allowed uint8, the dtype of k"),
    (lambda a: dict(q=a["q"].float()), ValueError, r"q\.dtype=float32: allowed float16 or bfloat16 with an NVFP4"),
    (lambda a: dict(kv_cache_sf=a["k_sf"]), TypeError, r"kv_cache_sf=.*allowed a \(k_sf, v_sf\) tuple"),
    (lambda a: dict(kv_cache_sf=(a["k_sf"].half(), a["v_sf"])), ValueError,
     r"kv_cache_sf\[0\]\.dtype=float16: allowed float8_e4m3fn, uint8"),
    (lambda a: dict(kv_cache_sf=(a["k_sf"], a["v_sf"][:7])), ValueError,
     r"kv_cache_sf\[1\]\.shape=\(7, 1, 2\): allowed \(8, 1, 2\)"),
    (lambda a: dict(kv_cache_sf=(torch.zeros(8, 1, 4, dtype=torch.uint8)[..., ::2], a["v_sf"])), ValueError,
     r"kv_cache_sf\[0\]\.stride\(\)=\(4, 4, 2\): allowed a unit stride"),
    (lambda a: dict(k=a["k"][..., :15]), ValueError, r"k\.shape=\(8, 1, 15\): allowed head_dim 32"),
])
def test_single_prefill_refusals_name_the_argument(change, error, pattern):
    q, k, v, k_sf, v_sf = _single_args()
    args = dict(q=q, k=k, v=v, k_sf=k_sf, v_sf=v_sf, kv_cache_sf=(k_sf, v_sf))
    args.update(change(args))
    with pytest.raises(error, match=pattern):
        dispatch.single_prefill_with_kv_cache(args["q"], args["k"], args["v"], kv_cache_sf=args["kv_cache_sf"])


def test_head_dims_of_whole_scale_blocks_only():
    q = torch.randn(5, 2, 24).half()
    k = torch.zeros(8, 1, 12, dtype=torch.uint8)
    sf = torch.zeros(8, 1, 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"k\.shape=\(8, 1, 12\): allowed a last dim of head_dim // 2 with head_dim "
                                         r"a multiple of 16"):
        dispatch.single_prefill_with_kv_cache(q, k, k, kv_cache_sf=(sf, sf))
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1))
    one = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"head_dim_qk=24: allowed a multiple of 16 with an NVFP4 cache"):
        w.plan(one, one, one[:1], one[1:], 2, 1, 24, 4, kv_data_type=torch.uint8)


def test_paged_refusals_name_the_argument_before_any_kernel():
    cache, sf, ids, indptr, last = _paged_setup("NHD", sf_bytes=False)
    w = _wrapper("NHD", "reference", True, ids, indptr, last)
    q = torch.randn(sum(Q_LENS), HQ, D).half()
    out = torch.full((sum(Q_LENS), HQ, D), float("nan"), dtype=torch.float16)
    cases = [
        (None, r"kv_cache_sf=None: allowed the NVFP4 scale factors of the uint8 paged_kv_cache"),
        (sf[:, :, :, :, :1], r"kv_cache_sf \(k, as \(pages, page_size, heads, dim\)\)\.shape=\(7, 4, 2, 1\): allowed "
                             r"\(7, 4, 2, 2\)"),
        (sf.half(), r"kv_cache_sf \(k\)\.dtype=float16: allowed float8_e4m3fn, uint8"),
        ((sf[:, 0, 0], sf[:, 1, 0]), r"kv_cache_sf=.*allowed tensors of the rank of paged_kv_cache's"),
    ]
    for kv_cache_sf, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            w.run(q, cache, kv_cache_sf=kv_cache_sf, out=out)
    assert out.isnan().all(), "a refused call wrote its output"
    with pytest.raises(ValueError, match=r"q_data_type=float32: allowed float16 or bfloat16 with an NVFP4"):
        _wrapper("NHD", "reference", True, ids, indptr, last, dtype=torch.float32)
    # scale factors beside a 16-bit plan
    plain = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1), "NHD", backend="reference")
    plain.plan(torch.tensor([0, 3], dtype=torch.int32), indptr[:2], ids, last[:1], HQ, HKV, D, PAGE)
    with pytest.raises(ValueError, match=r"kv_cache_sf=.*allowed None with a float16 cache"):
        plain.run(q[:3], torch.randn(7, 2, PAGE, HKV, D).half(), kv_cache_sf=sf)


# -- capability data ---------------------------------------------------------------------------------
def test_capability_data_names_who_serves_nvfp4():
    """On an H100: reference, native-triton and fa2 (FlashInfer's single prefill and its wrappers, from
    0.6.18) accept NVFP4 K/V; each other vendor backend's refusal says what would serve them (XQA only
    on SM12x)."""
    problem = AttentionProblem(entry="single_prefill_with_kv_cache", phase="prefill", kv_storage="dense",
                               kv_layout="NHD", num_qo_heads=8, num_kv_heads=2, head_dim_qk=128, head_dim_vo=128,
                               q_dtype="bfloat16", kv_dtype="uint8", out_dtype="bfloat16", causal=True)
    h100 = resolve_device("h100")
    assert backend_caps("reference").check(problem, h100) == []
    assert backend_caps("native-triton").check(problem, h100) == []
    why = {name: " ".join(str(r) for r in backend_caps(name).check(problem, h100))
           for name in ("fa2", "fa3", "cudnn", "trtllm-gen", "xqa", "torch-flash")}
    assert why.pop("fa2") == ""
    assert all("kv_dtype='uint8'" in text for text in why.values()), why
    fi_fa2 = next(p for p in backend_caps("fa2").providers if p.module == "flashinfer")
    paged = AttentionProblem(**{**problem.__dict__, "entry": "BatchPrefillWithPagedKVCacheWrapper.run",
                                "kv_storage": "paged", "page_size": 16})
    assert fi_fa2.limits(problem.facts(), "0.7.2") == []
    assert "kv_dtype" in " ".join(str(r) for r in fi_fa2.limits(problem.facts(), "0.6.14"))
    assert fi_fa2.limits(paged.facts(), "0.7.2") == []
    assert "kv_dtype" in " ".join(str(r) for r in fi_fa2.limits(paged.facts(), "0.6.14"))
    decode = AttentionProblem(**{**problem.__dict__, "entry": "xqa_batch_decode_with_kv_cache", "phase": "decode",
                                 "kv_storage": "paged", "page_size": 16})
    assert backend_caps("native-triton").check(decode, h100) == []
    assert "SM12x GPUs only" in " ".join(str(r) for r in backend_caps("xqa").check(decode, h100))
    assert "SM12x GPUs only" in why["xqa"]
    assert "Blackwell (sm_100+)" in why["trtllm-gen"]
    odd = AttentionProblem(**{**problem.__dict__, "head_dim_qk": 72, "head_dim_vo": 72})
    assert any(r.field == "head_dim_qk" for r in backend_caps("native-triton").check(odd, h100))


def test_random_inputs_and_the_batch_oracle_read_nvfp4():
    """dispatch/inputs.py's make_batch (probe, autotune timings) builds NVFP4 K/V with their scale factors,
    and the package oracle's reference_of_batch dequantizes them as the tests' decoder does."""
    from dispatch.benchmark.oracle import nvfp4_fp64, reference_of_batch
    from dispatch.inputs import Case, make_batch

    packed, sf = quantize(torch.randn(5, 2, 48), sf_bytes=True)
    assert torch.equal(nvfp4_fp64(packed, sf), dequantize_fp64(packed, sf))
    problem = AttentionProblem(entry="test", phase="prefill", kv_storage="paged", kv_layout="HND", num_qo_heads=4,
                               num_kv_heads=2, head_dim_qk=32, head_dim_vo=32, q_dtype="float16", kv_dtype="uint8",
                               out_dtype="float16", page_size=4, causal=True, return_lse=True, device_type="cpu")
    batch = make_batch(Case("nvfp4", problem, (3, 5), (9, 7)), "cpu")
    assert batch.k.dtype == torch.uint8 and batch.k_sf is not None and batch.k_sf.shape[-1] == 2
    ref, ref_lse = reference_of_batch(problem, batch)
    backend = get_backend("reference")
    backend.run(backend.plan(problem, batch), batch)
    _close(batch.out, ref, torch.float16)
    _close(batch.lse, ref_lse, torch.float16)
