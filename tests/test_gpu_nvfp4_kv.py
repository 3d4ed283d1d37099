"""On a GPU: NVFP4 KV caches (FlashInfer 0.7.2's ``kv_cache_sf``) through native-triton's compiled
kernel, which dequantizes each K/V tile where it loads it, and through auto.

Sizes a GPU serves in earnest (head dims 128 and 512, kv lengths in the thousands, split-KV decode),
checked against the fp64 oracle over the cache dequantized by the tests' own decoder (tests/_nvfp4.py)
within METHOD.md's band of the query dtype; outputs poisoned with NaN. The wrapper's repeats take the
fast launcher (each call's scale factors read, not the first call's), and a CUDA graph replays with
the scale factors' new contents. Where FlashInfer is installed, its fa2 NVFP4 answer on the same
inputs agrees with ours (the same format, read the same way).

Runs on the GPU host (``pytest tests/test_gpu_nvfp4_kv.py``); without CUDA every test skips.
"""
from __future__ import annotations

import math

import pytest
import torch

import dispatch
from _nvfp4 import dequantize_fp64, quantize
from oracle import BANDS, attention_fp64, relative_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEV = "cuda"
K_SCALE, V_SCALE = 0.6, 1.7


def _band(dtype: torch.dtype) -> float:
    return BANDS["float16" if dtype == torch.float16 else "bfloat16"]


def _check(got, ref, dtype):
    assert not got.isnan().any(), "some output elements were never written"
    err = relative_error(got, ref)
    assert err < _band(dtype), f"rel. error {err:.2e} >= {_band(dtype)}"
    return err


def _quantized(shape):
    packed, sf = quantize(torch.randn(shape, device=DEV))
    return packed, sf, dequantize_fp64(packed, sf)


@pytest.mark.parametrize("backend", ["native-triton", "fa2", "auto"])
@pytest.mark.parametrize("qo_len,kv_len,hq,hkv,d,causal,pos,dtype", [
    (128, 1000, 8, 2, 128, True, "NONE", torch.bfloat16),
    (64, 256, 1, 1, 128, False, "NONE", torch.float16),  # FlashInfer's test_single_prefill_with_kv_cache_nvfp4
    (64, 256, 1, 1, 512, False, "NONE", torch.float16),  # ... _nvfp4_large_head
    (64, 128, 1, 1, 512, False, "ROPE_LLAMA", torch.float16),  # ... _nvfp4_rope_large_head
    (1, 4097, 32, 8, 128, True, "NONE", torch.bfloat16),  # decode: split-KV
])
def test_single_prefill_nvfp4_matches_fp64(backend, qo_len, kv_len, hq, hkv, d, causal, pos, dtype):
    q = torch.randn(qo_len, hq, d, device=DEV).to(dtype)
    k, k_sf, kd = _quantized((kv_len, hkv, d))
    v, v_sf, vd = _quantized((kv_len, hkv, d))
    out, lse = dispatch.single_prefill_with_kv_cache(
        q, k, v, causal=causal, pos_encoding_mode=pos, kv_cache_sf=(k_sf, v_sf), k_scale=K_SCALE, v_scale=V_SCALE,
        return_lse=True, backend=backend)
    # auto: native-triton, or FlashInfer's fa2 single prefill where its provider serves the case
    assert dispatch.last_decision().chosen in ({backend} if backend != "auto" else {"native-triton", "fa2"})
    ref, ref_lse = attention_fp64(q.cpu(), kd * K_SCALE, vd * V_SCALE, sm_scale=1 / math.sqrt(d), causal=causal,
                                  pos_encoding=pos)
    _check(out.cpu(), ref, dtype)
    _check(lse.cpu(), ref_lse, dtype)


def _paged(kv_layout, batch, kv_len, page, hkv, d):
    pages = -(-kv_len // page)
    n_pages = pages * batch + 3
    shape = (n_pages, 2, page, hkv, d) if kv_layout == "NHD" else (n_pages, 2, hkv, page, d)
    cache, sf, real = _quantized(shape)
    ids = torch.randperm(n_pages)[:pages * batch].to(torch.int32)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    last = torch.full((batch,), (kv_len - 1) % page + 1, dtype=torch.int32)
    return cache, sf, real, ids, indptr, last


def _paged_ref(q, real, ids, indptr, kv_layout, batch, qo_len, kv_len, hkv, d, causal):
    outs = []
    for b in range(batch):
        rows = ids[indptr[b]:indptr[b + 1]].long()
        k, v = real[rows, 0], real[rows, 1]
        if kv_layout == "HND":
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        k, v = k.reshape(-1, hkv, d)[:kv_len] * K_SCALE, v.reshape(-1, hkv, d)[:kv_len] * V_SCALE
        outs.append(attention_fp64(q[b * qo_len:(b + 1) * qo_len].cpu(), k, v, sm_scale=1 / math.sqrt(d),
                                   causal=causal)[0])
    return torch.cat(outs)


def _planned(kv_layout, batch, qo_len, ids, indptr, last, hq, hkv, d, page, causal, dtype, backend="native-triton",
             **kw):
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=DEV), kv_layout,
                                                     backend=backend, **kw)
    qo = torch.arange(batch + 1, dtype=torch.int32) * qo_len
    w.plan(qo.to(DEV), indptr.to(DEV), ids.to(DEV), last.to(DEV), hq, hkv, d, page, causal=causal, q_data_type=dtype,
           kv_data_type=torch.uint8)
    return w


@pytest.mark.parametrize("kv_layout,batch,qo_len,kv_len,page,hq,hkv,d,causal,dtype", [
    ("NHD", 4, 128, 256, 16, 1, 1, 128, False, torch.float16),  # FlashInfer's test_batch_prefill_..._nvfp4
    ("HND", 4, 128, 256, 64, 1, 1, 128, False, torch.bfloat16),
    ("NHD", 8, 300, 2000, 16, 32, 8, 128, True, torch.bfloat16),
    ("HND", 16, 1, 3000, 16, 32, 8, 128, True, torch.float16),  # decode: split-KV
    ("NHD", 2, 64, 256, 16, 1, 1, 512, False, torch.float16),  # head dim 512
])
def test_paged_wrapper_nvfp4_matches_fp64(kv_layout, batch, qo_len, kv_len, page, hq, hkv, d, causal, dtype):
    cache, sf, real, ids, indptr, last = _paged(kv_layout, batch, kv_len, page, hkv, d)
    w = _planned(kv_layout, batch, qo_len, ids, indptr, last, hq, hkv, d, page, causal, dtype)
    q = torch.randn(batch * qo_len, hq, d, device=DEV).to(dtype)
    out = torch.full((batch * qo_len, hq, d), float("nan"), device=DEV, dtype=dtype)
    w.run(q, cache, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=sf, out=out)
    assert w.decision.chosen == "native-triton"
    _check(out.cpu(), _paged_ref(q, real, ids, indptr, kv_layout, batch, qo_len, kv_len, hkv, d, causal), dtype)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_paged_wrapper_fa2_nvfp4_matches_fp64(kv_layout):
    """backend="fa2": FlashInfer's fa2 wrapper with the scale factors forwarded to its run(), each run's
    own (two runs, new scale factors in new tensors), against the oracle over the dequantized cache."""
    batch, qo_len, kv_len, page, hq, hkv, d, dtype = 4, 64, 700, 16, 8, 2, 128, torch.float16
    cache, sf, real, ids, indptr, last = _paged(kv_layout, batch, kv_len, page, hkv, d)
    w = _planned(kv_layout, batch, qo_len, ids, indptr, last, hq, hkv, d, page, True, dtype, backend="fa2")
    q = torch.randn(batch * qo_len, hq, d, device=DEV).to(dtype)
    for _ in range(2):
        sf = quantize(torch.randn(sf.shape[:-1] + (d,), device=DEV))[1]
        out = torch.full((batch * qo_len, hq, d), float("nan"), device=DEV, dtype=dtype)
        w.run(q, cache, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=sf, out=out)
        assert w.decision.chosen == "fa2"
        _check(out.cpu(), _paged_ref(q, dequantize_fp64(cache, sf), ids, indptr, kv_layout, batch, qo_len, kv_len, hkv,
                                     d, True), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ragged_wrapper_nvfp4_matches_fp64(dtype):
    """FlashInfer's test_batch_prefill_with_ragged_kv_cache_nvfp4 form: one (tokens, 2, Hkv, D/16) scale tensor."""
    batch, qo_len, kv_len, hq, hkv, d = 4, 128, 256, 8, 2, 128
    packed, sf, real = _quantized((batch * kv_len, 2, hkv, d))
    w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=DEV),
                                                      backend="native-triton")
    qo = (torch.arange(batch + 1, dtype=torch.int32) * qo_len).to(DEV)
    w.plan(qo, (torch.arange(batch + 1, dtype=torch.int32) * kv_len).to(DEV), hq, hkv, d, causal=True,
           q_data_type=dtype, kv_data_type=torch.uint8)
    q = torch.randn(batch * qo_len, hq, d, device=DEV).to(dtype)
    out = w.run(q, packed[:, 0], packed[:, 1], k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=sf)
    rows = [slice(b * kv_len, (b + 1) * kv_len) for b in range(batch)]
    ref = torch.cat([attention_fp64(q[b * qo_len:(b + 1) * qo_len].cpu(), real[r, 0] * K_SCALE, real[r, 1] * V_SCALE,
                                    sm_scale=1 / math.sqrt(d), causal=True)[0] for b, r in enumerate(rows)])
    _check(out.cpu(), ref, dtype)
    if dtype == torch.float16:  # FlashInfer's fa2 ragged wrapper, the scale factors forwarded to its run()
        fa2 = dispatch.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=DEV),
                                                            backend="fa2")
        fa2.plan(qo, (torch.arange(batch + 1, dtype=torch.int32) * kv_len).to(DEV), hq, hkv, d, causal=True,
                 q_data_type=dtype, kv_data_type=torch.uint8)
        out = fa2.run(q, packed[:, 0], packed[:, 1], k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=sf)
        assert fa2.decision.chosen == "fa2"
        _check(out.cpu(), ref, dtype)


def test_xqa_entry_nvfp4_decode_matches_fp64():
    """xqa_batch_decode_with_kv_cache with an NVFP4 cache: served by native-triton; the xqa backend refuses it
    by name (FlashInfer's own XQA NVFP4 kernels are SM12x only, and our adapter does not pass the scales)."""
    batch, kv_len, page, hq, hkv, d, dtype = 16, 3000, 16, 32, 8, 128, torch.bfloat16
    cache, sf, real, ids, indptr, last = _paged("HND", batch, kv_len, page, hkv, d)
    table = ids.reshape(batch, -1).to(DEV)
    q = torch.randn(batch, hq, d, device=DEV).to(dtype)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device=DEV)
    out = dispatch.xqa_batch_decode_with_kv_cache(q, cache, torch.empty(1 << 20, dtype=torch.uint8, device=DEV), table,
                                                  lens, kv_len, bmm1_scale=K_SCALE / math.sqrt(d), bmm2_scale=V_SCALE,
                                                  kv_layout="HND", kv_cache_sf=sf)
    assert dispatch.last_decision().chosen == "native-triton"
    _check(out.cpu(), _paged_ref(q, real, ids, indptr, "HND", batch, 1, kv_len, hkv, d, True), dtype)
    with dispatch.use_backend("xqa"), pytest.raises((dispatch.BackendRefusedError, dispatch.NoBackendError),
                                                    match=r"kv_dtype='uint8'"):
        dispatch.xqa_batch_decode_with_kv_cache(q, cache, torch.empty(1 << 20, dtype=torch.uint8, device=DEV), table,
                                                lens, kv_len, kv_layout="HND", kv_cache_sf=sf)


def test_paged_repeats_and_cuda_graph_read_each_calls_scale_factors():
    """The fast launcher (exact repeats) and a captured graph take the scale factors' addresses per call
    / the captured tensor's contents at replay."""
    batch, qo_len, kv_len, page, hq, hkv, d, dtype = 4, 1, 700, 16, 16, 4, 128, torch.bfloat16
    cache, sf, real, ids, indptr, last = _paged("NHD", batch, kv_len, page, hkv, d)
    w = _planned("NHD", batch, qo_len, ids, indptr, last, hq, hkv, d, page, True, dtype, use_cuda_graph=True)
    q = torch.randn(batch * qo_len, hq, d, device=DEV).to(dtype)
    for _ in range(3):  # new scale factors each call, same shapes: the lane's launcher
        sf = quantize(torch.randn(sf.shape[:-1] + (d,), device=DEV))[1]
        out = w.run(q, cache, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=sf)
        _check(out.cpu(), _paged_ref(q, dequantize_fp64(cache, sf), ids, indptr, "NHD", batch, qo_len, kv_len, hkv, d,
                                     True), dtype)
    out = torch.empty(batch * qo_len, hq, d, device=DEV, dtype=dtype)
    w.run(q, cache, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=sf, out=out)  # once outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, k_scale=K_SCALE, v_scale=V_SCALE, kv_cache_sf=sf, out=out)
    sf.copy_(quantize(torch.randn(sf.shape[:-1] + (d,), device=DEV))[1])
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check(out.cpu(), _paged_ref(q, dequantize_fp64(cache, sf), ids, indptr, "NHD", batch, qo_len, kv_len, hkv, d,
                                 True), dtype)


def test_flashinfer_fa2_reads_the_same_nvfp4_cache_the_same_way():
    """FlashInfer 0.7's own fa2 NVFP4 single prefill on the same inputs (its tests' uint8 scale bytes):
    our native-triton answer agrees with it within the 16-bit band."""
    flashinfer = pytest.importorskip("flashinfer")
    q = torch.randn(64, 4, 128, device=DEV).half()
    k, k_sf = quantize(torch.randn(256, 2, 128, device=DEV), sf_bytes=True)
    v, v_sf = quantize(torch.randn(256, 2, 128, device=DEV), sf_bytes=True)
    kw = dict(causal=True, kv_cache_sf=(k_sf, v_sf), k_scale=K_SCALE, v_scale=V_SCALE)
    try:
        theirs = flashinfer.single_prefill_with_kv_cache(q, k, v, backend="fa2", **kw)
    except Exception as exc:  # noqa: BLE001 - an older FlashInfer without NVFP4 KV
        pytest.skip(f"flashinfer {flashinfer.__version__}: {type(exc).__name__}: {str(exc)[:160]}")
    ours = dispatch.single_prefill_with_kv_cache(q, k, v, backend="native-triton", **kw)
    assert relative_error(ours, theirs.double()) < _band(torch.float16)
