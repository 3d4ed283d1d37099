"""FlashInfer's test_single_prefill.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

Single prefill of fp16 q/k/v (one KV head, 4 or 7 query heads, head dims 64/128/256, causal or
not) against the fp64 oracle with FlashInfer's tolerance (1e-3 both ways), through auto and, on a
GPU, through ``backend="fa2"`` as FlashInfer's test asks; and its NVFP4 KV cases (fp4 e2m1 K/V
with fp8 scale factors in ``kv_cache_sf``) against the oracle over the dequantized cache.
"""
import pytest
import torch

import dispatch
from _fi_semantics import close, grid, nvfp4, randn, single_ref

CPU_CASES = [(kv, qo, 1, hq, d, causal)
             for (kv, qo) in ((17, 5), (9, 9)) for hq in (4, 7) for d in (64, 128, 256) for causal in (True, False)]
GPU_CASES = [(501, 37, 1, 4, 64, True), (2042, 127, 1, 7, 128, False), (3771, 577, 1, 4, 256, True),
             (4932, 1024, 1, 7, 128, True), (501, 1024, 1, 4, 256, False)]


@grid("kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim, causal", CPU_CASES, GPU_CASES, named="fa2")
def test_single_prefill_with_kv_cache(device, backend, kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim,
                                      causal):
    if qo_len > kv_len and causal:
        pytest.skip("FlashInfer's test leaves out causal with qo_len > kv_len")
    q = randn(qo_len, num_qo_heads, head_dim, device=device, seed=0)
    k = randn(kv_len, num_kv_heads, head_dim, device=device, seed=1)
    v = randn(kv_len, num_kv_heads, head_dim, device=device, seed=2)
    o = dispatch.single_prefill_with_kv_cache(q, k, v, causal=causal, pos_encoding_mode="NONE", backend=backend)
    ref, _ = single_ref(q, k, v, causal=causal)
    assert o.dtype == torch.float16 and o.shape == (qo_len, num_qo_heads, head_dim)
    close(o, ref, rtol=1e-3, atol=1e-3)


NVFP4_CASES = [(kv, qo, 1, 1, 128, "NONE", dt) for kv in (128, 256) for qo in (64, 128) for dt in (torch.float16,
                                                                                          torch.bfloat16)][::2]
NVFP4_LARGE_HEAD = [(256, 64, 1, 1, 512, "NONE", torch.float16), (128, 64, 1, 1, 512, "ROPE_LLAMA", torch.float16)]


@grid("kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim, pos_encoding_mode, q_dtype",
      NVFP4_CASES + NVFP4_LARGE_HEAD, NVFP4_CASES + NVFP4_LARGE_HEAD, named="fa2")
def test_single_prefill_with_kv_cache_nvfp4(device, backend, kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim,
                                            pos_encoding_mode, q_dtype):
    """Also FlashInfer's nvfp4_large_head and nvfp4_rope_large_head (head dim 512): fp4 K/V with fp8
    scale factors (kv_cache_sf), against the oracle over the dequantized values (their 1e-1)."""
    q = randn(qo_len, num_qo_heads, head_dim, dtype=q_dtype, device=device)
    k, k_sf, k_values = nvfp4((kv_len, num_kv_heads, head_dim // 2), device, seed=3)
    v, v_sf, v_values = nvfp4((kv_len, num_kv_heads, head_dim // 2), device, seed=4)
    o = dispatch.single_prefill_with_kv_cache(q, k, v, causal=False, pos_encoding_mode=pos_encoding_mode,
                                              logits_soft_cap=0.0, k_scale=1.0, v_scale=1.0,
                                              kv_cache_sf=(k_sf, v_sf), backend=backend)
    assert o.dtype == q_dtype and o.shape == (qo_len, num_qo_heads, head_dim)
    ref, _ = single_ref(q, k_values, v_values, pos_encoding=pos_encoding_mode)
    close(o, ref, rtol=1e-1, atol=1e-1)
