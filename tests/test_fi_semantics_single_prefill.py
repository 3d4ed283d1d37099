"""FlashInfer's test_single_prefill.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

Single prefill of fp16 q/k/v (one KV head, 4 or 7 query heads, head dims 64/128/256, causal or
not) against the fp64 oracle with FlashInfer's tolerance (1e-3 both ways), through auto and, on a
GPU, through ``backend="fa2"`` as FlashInfer's test asks. Its NVFP4 KV cases (``kv_cache_sf``) are
refused: the refusal names the argument and what is allowed.
"""
import pytest
import torch

import dispatch
from _fi_semantics import close, grid, randn, single_ref

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


def nvfp4_kv(kv_len, num_kv_heads, head_dim, device):
    """Packed fp4 e2m1 pairs (uint8, head_dim / 2) and fp8 scale factors (uint8, head_dim / 16)."""
    g = torch.Generator().manual_seed(3)
    packed = torch.randint(0, 256, (kv_len, num_kv_heads, head_dim // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(0x30, 0x40, (kv_len, num_kv_heads, head_dim // 16), generator=g, dtype=torch.uint8)
    return packed.to(device), scales.to(device)


NVFP4_CASES = [(128, 64, 1, 1, 128, "NONE", torch.float16), (128, 64, 1, 1, 128, "NONE", torch.bfloat16),
               (256, 64, 1, 1, 512, "NONE", torch.float16), (128, 64, 1, 1, 512, "ROPE_LLAMA", torch.float16)]


@grid("kv_len, qo_len, num_kv_heads, num_qo_heads, head_dim, pos_encoding_mode, q_dtype", NVFP4_CASES,
      NVFP4_CASES, named="fa2")
def test_single_prefill_with_kv_cache_nvfp4_refused(device, backend, kv_len, qo_len, num_kv_heads, num_qo_heads,
                                                    head_dim, pos_encoding_mode, q_dtype):
    """FlashInfer's nvfp4, nvfp4_large_head and nvfp4_rope_large_head: NVFP4 KV is refused."""
    q = randn(qo_len, num_qo_heads, head_dim, dtype=q_dtype, device=device)
    k, k_sf = nvfp4_kv(kv_len, num_kv_heads, head_dim, device)
    v, v_sf = nvfp4_kv(kv_len, num_kv_heads, head_dim, device)
    with pytest.raises(ValueError, match=r"kv_cache_sf=.*allowed None \(NVFP4 KV is not supported\)"):
        dispatch.single_prefill_with_kv_cache(q, k, v, causal=False, pos_encoding_mode=pos_encoding_mode,
                                              logits_soft_cap=0.0, k_scale=0.5, v_scale=0.5,
                                              kv_cache_sf=(k_sf, v_sf), backend=backend)
