"""FlashInfer's test_logits_cap.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

The soft cap ``cap * tanh(sm_scale * q.k / cap)`` on fp16 single prefill, non-causal, equal query
and KV heads, caps 1, 30 and 50, against the fp64 oracle. FlashInfer's decode case calls
``single_decode_with_kv_cache`` (not an entry point of ours): its semantics are the one-row
prefill, checked here through ``single_prefill_with_kv_cache`` with a single query row.
FlashInfer's test names no backend: auto only.
"""
import dispatch
from _fi_semantics import close, grid, randn, single_ref

PREFILL_CPU = [(q, kv, h, d, cap) for (q, kv) in ((1, 1), (17, 17), (17, 81), (81, 17))
               for h in (4,) for d in (128, 256) for cap in (1.0, 30.0, 50.0)] + [(17, 81, 8, 128, 30.0)]
PREFILL_GPU = [(987, 31111, 32, 128, 30.0), (81, 987, 8, 256, 1.0), (987, 987, 4, 128, 50.0), (1, 31111, 32, 256, 1.0)]
DECODE_CPU = [(n, h, d, cap) for n in (1, 9, 81) for h in (4, 32) for d in (128, 256) for cap in (1.0, 30.0, 50.0)]
DECODE_GPU = [(33001, 32, 128, 30.0), (729, 8, 256, 1.0), (33001, 4, 256, 50.0)]


@grid("q_len, kv_len, num_heads, head_dim, soft_cap", PREFILL_CPU, PREFILL_GPU)
def test_single_prefill_logits_soft_cap(device, backend, q_len, kv_len, num_heads, head_dim, soft_cap):
    q = randn(q_len, num_heads, head_dim, device=device, seed=0)
    k = randn(kv_len, num_heads, head_dim, device=device, seed=1)
    v = randn(kv_len, num_heads, head_dim, device=device, seed=2)
    o = dispatch.single_prefill_with_kv_cache(q, k, v, logits_soft_cap=soft_cap, backend=backend)
    ref, _ = single_ref(q, k, v, soft_cap=soft_cap)
    close(o, ref, rtol=1e-2, atol=1e-2)


@grid("seq_len, num_heads, head_dim, soft_cap", DECODE_CPU, DECODE_GPU)
def test_single_decode_logits_soft_cap_as_one_row_prefill(device, backend, seq_len, num_heads, head_dim, soft_cap):
    q = randn(1, num_heads, head_dim, device=device, seed=0)
    k = randn(seq_len, num_heads, head_dim, device=device, seed=1)
    v = randn(seq_len, num_heads, head_dim, device=device, seed=2)
    o = dispatch.single_prefill_with_kv_cache(q, k, v, logits_soft_cap=soft_cap, backend=backend)
    ref, _ = single_ref(q, k, v, soft_cap=soft_cap)
    close(o, ref, rtol=1e-3, atol=1e-3)
