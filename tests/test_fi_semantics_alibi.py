"""FlashInfer's test_alibi.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

``pos_encoding_mode="ALIBI"`` on fp16 single prefill, causal or not, against the fp64 oracle with
ALiBi's standard head slopes (as FlashInfer's test reference states them). FlashInfer's decode
case calls ``single_decode_with_kv_cache`` (not an entry point of ours): checked as the one-row
prefill. FlashInfer's test names no backend: auto only.
"""
import dispatch
from _fi_semantics import alibi_slopes, close, grid, randn, single_ref

PREFILL_CPU = [(q, kv, h, d, causal) for (q, kv) in ((1, 1), (1, 17), (17, 17), (17, 81), (81, 17))
               for h in (4, 8) for d in (128, 256) for causal in (False, True)
               if not (causal and q > kv)] + [(17, 81, 32, 128, True)]  # FlashInfer leaves out causal q > kv
PREFILL_GPU = [(987, 987, 32, 128, True), (81, 987, 8, 256, False), (987, 81, 4, 128, False), (17, 987, 32, 256, True)]
DECODE_CPU = [(n, h, d) for n in (1, 9, 81) for h in (4, 8, 32) for d in (128, 256)]
DECODE_GPU = [(729, 32, 128), (4096, 32, 128), (81, 8, 256)]


@grid("q_len, kv_len, num_heads, head_dim, causal", PREFILL_CPU, PREFILL_GPU)
def test_single_prefill_alibi(device, backend, q_len, kv_len, num_heads, head_dim, causal):
    q = randn(q_len, num_heads, head_dim, device=device, seed=0)
    k = randn(kv_len, num_heads, head_dim, device=device, seed=1)
    v = randn(kv_len, num_heads, head_dim, device=device, seed=2)
    o = dispatch.single_prefill_with_kv_cache(q, k, v, causal=causal, pos_encoding_mode="ALIBI", backend=backend)
    ref, _ = single_ref(q, k, v, causal=causal, alibi_slopes=alibi_slopes(num_heads))
    close(o, ref, rtol=1e-2, atol=1e-2)


@grid("seq_len, num_heads, head_dim", DECODE_CPU, DECODE_GPU)
def test_single_decode_alibi_as_one_row_prefill(device, backend, seq_len, num_heads, head_dim):
    q = randn(1, num_heads, head_dim, device=device, seed=0)
    k = randn(seq_len, num_heads, head_dim, device=device, seed=1)
    v = randn(seq_len, num_heads, head_dim, device=device, seed=2)
    o = dispatch.single_prefill_with_kv_cache(q, k, v, pos_encoding_mode="ALIBI", backend=backend)
    ref, _ = single_ref(q, k, v, alibi_slopes=alibi_slopes(num_heads))
    close(o, ref, rtol=1e-3, atol=1e-3)
