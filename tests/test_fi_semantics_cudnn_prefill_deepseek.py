"""FlashInfer's test_cudnn_prefill_deepseek.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

DeepSeek's head dims (192 for q.k, 128 for v) on ragged K/V whose requests are packed by their
actual lengths: the ragged wrapper with ``backend="cudnn"`` (element offsets, separate
``v_indptr``/``o_indptr``, cuDNN's lengths and maxima) on a GPU, refused by device on the CPU;
the same problem through the wrapper with auto and token offsets, and through
``cudnn_batch_prefill_with_kv_cache``, against the fp64 oracle everywhere (FlashInfer's 1e-2
against its FA2 answer; here against fp64 at atol 3e-3, rtol 1e-2, its cuDNN tolerance).
"""
import pytest
import torch

import dispatch
from _fi_semantics import grid, indptr, per_request, randn, sample, workspace

DQK, DVO = 192, 128
CASES = [(b, sq, skv, hkv, hq, c) for b in (1, 4) for sq in (32, 64, 87, 256) for skv in (32, 87, 512)
         for hkv in (1, 4) for hq in (1, 8) for c in (True, False) if sq <= skv and hq >= hkv]
CPU_CASES = [(b, min(sq, 9), min(skv, 21), hkv, hq, c) for (b, sq, skv, hkv, hq, c) in sample(CASES, 8)]


@grid("batch_size, s_qo, s_kv, num_kv_heads, num_qo_heads, causal", CPU_CASES, sample(CASES, 5, seed=4),
      named="cudnn")
def test_cudnn_prefill_deepseek(device, backend, batch_size, s_qo, s_kv, num_kv_heads, num_qo_heads, causal):
    g = torch.Generator().manual_seed(0)
    seq_q = torch.randint(1, s_qo + 1, (batch_size,), generator=g, dtype=torch.int32)
    seq_kv = torch.randint(s_qo, s_kv + 1, (batch_size,), generator=g, dtype=torch.int32)
    q = randn(int(seq_q.sum()), num_qo_heads, DQK, dtype=torch.bfloat16, device=device, seed=1)
    k = randn(batch_size * s_kv, num_kv_heads, DQK, dtype=torch.bfloat16, device=device, seed=2)
    v = randn(batch_size * s_kv, num_kv_heads, DVO, dtype=torch.bfloat16, device=device, seed=3)
    qo, kv = indptr(seq_q.tolist(), device), indptr(seq_kv.tolist(), device)
    q_lens, kv_lens = seq_q.tolist(), seq_kv.tolist()
    ks, vs = list(k[:sum(kv_lens)].split(kv_lens)), list(v[:sum(kv_lens)].split(kv_lens))
    cudnn_wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), "NHD", backend="cudnn")

    def cudnn_call():
        cudnn_wrapper.plan(qo_indptr=qo * DQK * num_qo_heads, kv_indptr=kv * DQK * num_kv_heads,
                           num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=DQK, head_dim_vo=DVO,
                           causal=causal, sm_scale=DQK ** -0.5, q_data_type=torch.bfloat16,
                           kv_data_type=torch.bfloat16, o_data_type=torch.bfloat16,
                           seq_lens=seq_kv.view(-1, 1, 1, 1).to(device), seq_lens_q=seq_q.view(-1, 1, 1, 1).to(device),
                           max_token_per_sequence=s_qo, max_sequence_kv=s_kv, v_indptr=kv * DVO * num_kv_heads,
                           o_indptr=qo * DVO * num_qo_heads)
        return cudnn_wrapper.run(q, k, v)
    if device == "cpu":
        with pytest.raises(dispatch.BackendRefusedError, match=r"device_kind='cpu': allowed one of 'cuda'"):
            cudnn_call()
    elif backend == "cudnn":
        per_request(cudnn_call(), q, q_lens, ks, vs, rtol=1e-2, atol=3e-3, causal=causal)
    token_backend = "auto" if backend == "cudnn" else backend  # the cuDNN wrapper takes element offsets (above)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), kv_layout="NHD", backend=token_backend)
    wrapper.plan(qo, kv, num_qo_heads, num_kv_heads, DQK, head_dim_vo=DVO, causal=causal, q_data_type=torch.bfloat16)
    per_request(wrapper.run(q, k, v), q, q_lens, ks, vs, rtol=1e-2, atol=3e-3, causal=causal)
    out, _ = dispatch.cudnn_batch_prefill_with_kv_cache(
        q, k, v, DQK ** -0.5, workspace(device), max_token_per_sequence=s_qo, max_sequence_kv=s_kv,
        actual_seq_lens_q=seq_q.view(-1, 1, 1, 1), actual_seq_lens_kv=seq_kv.view(-1, 1, 1, 1), causal=causal,
        return_lse=False, batch_offsets_q=qo, batch_offsets_k=kv, batch_offsets_units="tokens",
        backend=None if backend == "auto" else backend)
    per_request(out, q, q_lens, ks, vs, rtol=1e-2, atol=3e-3, causal=causal)
