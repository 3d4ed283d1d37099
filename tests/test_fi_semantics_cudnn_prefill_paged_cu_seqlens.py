"""FlashInfer's test_cudnn_prefill_paged_cu_seqlens.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

Paged ``cudnn_batch_prefill_with_kv_cache`` with token-unit query offsets
(``batch_offsets_units="tokens"``, K/V through the block table): the answer FlashInfer's two
internal cuDNN graphs must agree on, here checked against the fp64 oracle (FlashInfer compares
the two at bf16 rounding; the oracle check uses its cuDNN tolerance, atol 3e-3 rtol 1e-2), and
equal to the element-offset form. On a GPU also with ``backend="cudnn"``.
"""
import dispatch
from _fi_semantics import close, cudnn_paged_case, grid, per_request, sample, workspace

CASES = [(b, sq, skv, p, hkv, c) for b in (1, 4) for (sq, skv) in ((64, 512), (17, 200)) for p in (16, 64)
         for hkv in (1, 2) for c in (True, False)]
CPU_CASES = [(b, min(sq, 9), min(skv, 40), p, hkv, c) for (b, sq, skv, p, hkv, c) in sample(CASES, 8)]


@grid("batch_size, s_qo, s_kv, page_size, num_kv_heads, causal", CPU_CASES, sample(CASES, 6, seed=3), named="cudnn")
def test_cudnn_paged_prefill_cu_seqlens_direct_matches_legacy(device, backend, batch_size, s_qo, s_kv, page_size,
                                                              num_kv_heads, causal):
    hq, d = 8, 128
    c = cudnn_paged_case(batch_size, s_qo, s_kv, page_size, num_kv_heads, hq, d, device)
    common = dict(max_token_per_sequence=s_qo, max_sequence_kv=s_kv, actual_seq_lens_q=c["seq_q"].view(-1, 1, 1, 1),
                  actual_seq_lens_kv=c["seq_kv"].view(-1, 1, 1, 1), block_tables=c["block_tables"], causal=causal,
                  return_lse=False, backend=None if backend == "auto" else backend)
    qo = c["qo_indptr"].to(device)
    out, _ = dispatch.cudnn_batch_prefill_with_kv_cache(c["q"], c["k_cache"], c["v_cache"], d ** -0.5,
                                                        workspace(device), batch_offsets_q=qo,
                                                        batch_offsets_units="tokens", **common)
    out_elements, _ = dispatch.cudnn_batch_prefill_with_kv_cache(c["q"], c["k_cache"], c["v_cache"], d ** -0.5,
                                                                 workspace(device), batch_offsets_q=qo * hq * d,
                                                                 batch_offsets_o=qo * hq * d, **common)
    close(out, out_elements.double(), rtol=1e-2, atol=1e-2)
    per_request(out, c["q"], c["seq_q"].tolist(), c["ks"], c["vs"], rtol=1e-2, atol=3e-3, causal=causal)
