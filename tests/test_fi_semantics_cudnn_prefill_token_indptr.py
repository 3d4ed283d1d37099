"""FlashInfer's test_cudnn_prefill_token_indptr.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

``cudnn_batch_prefill_with_kv_cache`` on ragged K/V: token-unit indptrs
(``batch_offsets_units="tokens"``) give what element offsets give (FlashInfer's 1e-2), both
against the fp64 oracle, head dims (128, 128) and (192, 128), with the LSE; and with token
indptrs the per-request lengths may be left out (derived from the indptrs, bitwise the same).
FlashInfer's ``direct`` switch picks between two of its internal cuDNN graphs, not a user
parameter: here it is a repeat of the case. On a GPU the calls also run with ``backend="cudnn"``.
"""
import torch

import dispatch
from _fi_semantics import close, grid, indptr, per_request, randn, sample, workspace

CASES = [(b, sq, skv, hkv, dqk, dvo, c, direct) for b in (1, 4) for sq in (32, 87) for skv in (87, 512)
         for hkv in (1, 4) for (dqk, dvo) in ((128, 128), (192, 128)) for c in (True, False)
         for direct in (True, False) if sq <= skv]
CPU_CASES = [(b, min(sq, 9), min(skv, 23), hkv, dqk, dvo, c, d) for (b, sq, skv, hkv, dqk, dvo, c, d)
             in sample(CASES, 10)]
GPU_CASES = sample(CASES, 6, seed=2)


def ragged_case(batch_size, s_qo, s_kv, num_kv_heads, head_dim_qk, head_dim_vo, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    seq_q = torch.randint(1, s_qo + 1, (batch_size,), generator=g, dtype=torch.int32)
    seq_kv = torch.randint(s_qo, s_kv + 1, (batch_size,), generator=g, dtype=torch.int32)
    q = randn(int(seq_q.sum()), 8, head_dim_qk, dtype=torch.bfloat16, device=device, seed=seed + 1)
    k = randn(int(seq_kv.sum()), num_kv_heads, head_dim_qk, dtype=torch.bfloat16, device=device, seed=seed + 2)
    v = randn(int(seq_kv.sum()), num_kv_heads, head_dim_vo, dtype=torch.bfloat16, device=device, seed=seed + 3)
    return seq_q, seq_kv, q, k, v


@grid("batch_size, s_qo, s_kv, num_kv_heads, head_dim_qk, head_dim_vo, causal, direct", CPU_CASES, GPU_CASES,
      named="cudnn")
def test_cudnn_prefill_token_indptr(device, backend, batch_size, s_qo, s_kv, num_kv_heads, head_dim_qk, head_dim_vo,
                                    causal, direct):
    seq_q, seq_kv, q, k, v = ragged_case(batch_size, s_qo, s_kv, num_kv_heads, head_dim_qk, head_dim_vo, device)
    qo, kv = indptr(seq_q.tolist(), device), indptr(seq_kv.tolist(), device)
    common = dict(max_token_per_sequence=s_qo, max_sequence_kv=s_kv,
                  actual_seq_lens_q=seq_q.view(-1, 1, 1, 1), actual_seq_lens_kv=seq_kv.view(-1, 1, 1, 1),
                  causal=causal, return_lse=True, backend=None if backend == "auto" else backend)
    out_ref, lse_ref = dispatch.cudnn_batch_prefill_with_kv_cache(
        q, k, v, head_dim_qk ** -0.5, workspace(device), **common, batch_offsets_q=qo * (8 * head_dim_qk),
        batch_offsets_o=qo * (8 * head_dim_vo), batch_offsets_k=kv * (num_kv_heads * head_dim_qk),
        batch_offsets_v=kv * (num_kv_heads * head_dim_vo))
    out, lse = dispatch.cudnn_batch_prefill_with_kv_cache(
        q, k, v, head_dim_qk ** -0.5, workspace(device), **common, batch_offsets_q=qo, batch_offsets_k=kv,
        batch_offsets_units="tokens")
    close(out, out_ref.double(), rtol=1e-2, atol=1e-2)
    close(lse, lse_ref.double(), rtol=1e-2, atol=1e-2)
    q_lens = seq_q.tolist()
    rows = torch.cat([lse[b, :n] for b, n in enumerate(q_lens)])
    per_request(out, q, q_lens, list(k.split(seq_kv.tolist())), list(v.split(seq_kv.tolist())), rtol=1e-2,
                atol=1e-2, lse=rows, causal=causal)


OMIT = [(True,), (False,)]


@grid("direct", OMIT, OMIT, named="cudnn")
def test_cudnn_prefill_token_indptr_omit_actual_seq_lens(device, backend, direct):
    batch_size, s_qo, s_kv, hkv, d = 4, 9, 23, 4, 128
    seq_q, seq_kv, q, k, v = ragged_case(batch_size, s_qo, s_kv, hkv, d, d, device, seed=5)
    common = dict(max_token_per_sequence=s_qo, max_sequence_kv=s_kv, causal=True, return_lse=True,
                  batch_offsets_q=indptr(seq_q.tolist(), device), batch_offsets_k=indptr(seq_kv.tolist(), device),
                  batch_offsets_units="tokens", backend=None if backend == "auto" else backend)
    out_with, lse_with = dispatch.cudnn_batch_prefill_with_kv_cache(
        q, k, v, d ** -0.5, workspace(device), actual_seq_lens_q=seq_q.view(-1, 1, 1, 1),
        actual_seq_lens_kv=seq_kv.view(-1, 1, 1, 1), **common)
    out_without, lse_without = dispatch.cudnn_batch_prefill_with_kv_cache(q, k, v, d ** -0.5, workspace(device),
                                                                          **common)
    assert torch.equal(out_without, out_with) and torch.equal(lse_without, lse_with)
