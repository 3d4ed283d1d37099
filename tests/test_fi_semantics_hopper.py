"""FlashInfer's test_hopper.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

FlashInfer checks its fa3 (Hopper) kernels against its fa2 ones, output and base-2 LSE at 1e-3;
here each backend is checked against the fp64 oracle at the same tolerance (bf16 deepseek shapes
at 1e-2, as FlashInfer's). Single prefill with ``return_lse`` and soft cap, ragged and paged
(tuple K/V) wrappers, and the deepseek head dims (192 for q.k, 128 for v). On a GPU each case runs
through auto, ``backend="fa2"`` and ``backend="fa3"`` (refused by compute capability off Hopper).
Multi-item scoring (``prefix_len_ptr`` and its companions) is refused by name.
"""
import pytest
import torch

import dispatch
from _fi_semantics import (close, expect_hardware_refusal, grid, indptr, needs_other_hardware, paged_pool, randn,
                           single_ref, workspace)

BACKENDS = ("fa2", "fa3")
SINGLE_CPU = [(n, hq, hkv, c, d, cap) for n in (11, 33) for (hq, hkv) in ((1, 1), (4, 1), (8, 4))
              for c in (False, True) for d in (64, 128, 256) for cap in (0.0, 30.0)][::3]
SINGLE_GPU = [(1763, 8, 4, True, 128, 30.0), (9999, 4, 1, False, 256, 0.0), (99, 1, 1, True, 64, 0.0)]


@grid("seq_len, num_qo_heads, num_kv_heads, causal, head_dim, logits_soft_cap", SINGLE_CPU, SINGLE_GPU,
      named=BACKENDS)
def test_single_prefill(device, backend, seq_len, num_qo_heads, num_kv_heads, causal, head_dim, logits_soft_cap):
    q = randn(seq_len, num_qo_heads, head_dim, device=device, seed=0)
    k = randn(seq_len, num_kv_heads, head_dim, device=device, seed=1)
    v = randn(seq_len, num_kv_heads, head_dim, device=device, seed=2)

    def call():
        return dispatch.single_prefill_with_kv_cache_return_lse(q, k, v, causal=causal,
                                                                logits_soft_cap=logits_soft_cap, backend=backend)
    if needs_other_hardware(device, backend):
        return expect_hardware_refusal(call)
    o, lse = call()
    ref, ref_lse = single_ref(q, k, v, causal=causal, soft_cap=logits_soft_cap)
    close(lse, ref_lse, rtol=1e-3, atol=1e-3)
    close(o, ref, rtol=1e-3, atol=1e-3)


RAGGED_CPU = [(b, n, hq, hkv, c, cap) for b in (1, 4) for n in (11, 33) for (hq, hkv) in ((1, 1), (4, 1), (8, 4))
              for c in (False, True) for cap in (0.0, 30.0)][::4]
RAGGED_GPU = [(16, 1763, 8, 4, True, 30.0), (4, 9999, 4, 1, False, 0.0), (8, 99, 1, 1, True, 0.0)]


@grid("batch_size, seq_len, num_qo_heads, num_kv_heads, causal, logits_soft_cap", RAGGED_CPU, RAGGED_GPU,
      named=BACKENDS)
def test_batch_ragged_prefill(device, backend, batch_size, seq_len, num_qo_heads, num_kv_heads, causal,
                              logits_soft_cap):
    head_dim = 128
    q = randn(batch_size * seq_len, num_qo_heads, head_dim, device=device, seed=0)
    k = randn(batch_size * seq_len, num_kv_heads, head_dim, device=device, seed=1)
    v = randn(batch_size * seq_len, num_kv_heads, head_dim, device=device, seed=2)
    lens = indptr([seq_len] * batch_size)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), backend=backend)

    def call():
        wrapper.plan(lens, lens, num_qo_heads, num_kv_heads, head_dim, causal=causal, logits_soft_cap=logits_soft_cap)
        return wrapper.run_return_lse(q, k, v)
    if needs_other_hardware(device, backend):
        return expect_hardware_refusal(call)
    o, lse = call()
    for i in range(batch_size):
        rows = slice(i * seq_len, (i + 1) * seq_len)
        ref, ref_lse = single_ref(q[rows], k[rows], v[rows], causal=causal, soft_cap=logits_soft_cap)
        close(lse[rows], ref_lse, rtol=1e-3, atol=1e-3)
        close(o[rows], ref, rtol=1e-3, atol=1e-3)


DEEPSEEK_CPU = [(b, n, h, c, dt) for b in (1, 4) for n in (11, 33) for h in (4, 32) for c in (False, True)
                for dt in (torch.half, torch.bfloat16)][::3]
DEEPSEEK_GPU = [(16, 1763, 128, True, torch.bfloat16), (4, 9999, 32, False, torch.half), (1, 99, 4, True, torch.half)]


@grid("batch_size, seq_len, num_heads, causal, dtype", DEEPSEEK_CPU, DEEPSEEK_GPU, named=BACKENDS)
def test_deepseek_prefill(device, backend, batch_size, seq_len, num_heads, causal, dtype):
    head_dim_qk, head_dim_vo = 192, 128
    q = randn(batch_size * seq_len, num_heads, head_dim_qk, dtype=dtype, device=device, seed=0)
    k = randn(batch_size * seq_len, num_heads, head_dim_qk, dtype=dtype, device=device, seed=1)
    v = randn(batch_size * seq_len, num_heads, head_dim_vo, dtype=dtype, device=device, seed=2)
    lens = torch.arange(0, batch_size * seq_len + 1, seq_len).int()
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), backend=backend)

    def call():
        wrapper.plan(lens, lens, num_heads, num_heads, head_dim_qk, causal=causal, head_dim_vo=head_dim_vo,
                     q_data_type=dtype, kv_data_type=dtype)
        return wrapper.run_return_lse(q, k, v)
    if needs_other_hardware(device, backend):
        return expect_hardware_refusal(call)
    o, lse = call()
    tol = 1e-3 if dtype == torch.half else 1e-2
    assert o.shape == (batch_size * seq_len, num_heads, head_dim_vo)
    for i in range(batch_size):
        rows = slice(i * seq_len, (i + 1) * seq_len)
        ref, ref_lse = single_ref(q[rows], k[rows], v[rows], causal=causal)
        close(lse[rows], ref_lse, rtol=tol, atol=tol)
        close(o[rows], ref, rtol=tol, atol=tol)


PAGED_CPU = [(b, n, p, hq, hkv, c, d, cap) for b in (1, 4) for n in (11, 12) for p in (1, 16)
             for (hq, hkv) in ((1, 1), (4, 1), (8, 4)) for c in (False, True) for d in (64, 128, 256)
             for cap in (0.0, 30.0)][::13]
PAGED_GPU = [(16, 1763, 16, 8, 4, True, 128, 30.0), (4, 9999, 1, 4, 1, False, 256, 0.0),
             (8, 12, 16, 1, 1, True, 64, 0.0)]


@grid("batch_size, seq_len, page_size, num_qo_heads, num_kv_heads, causal, head_dim, logits_soft_cap", PAGED_CPU,
      PAGED_GPU, named=BACKENDS)
def test_batch_paged_prefill(device, backend, batch_size, seq_len, page_size, num_qo_heads, num_kv_heads, causal,
                             head_dim, logits_soft_cap):
    q = randn(batch_size * seq_len, num_qo_heads, head_dim, device=device, seed=0)
    pool = paged_pool([seq_len] * batch_size, page_size, num_kv_heads, head_dim, device=device, shuffle=False)
    k, v = pool["cache"][:, 0].contiguous(), pool["cache"][:, 1].contiguous()
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), backend=backend)

    def call():
        wrapper.plan(indptr([seq_len] * batch_size), pool["indptr"], pool["indices"], pool["last"], num_qo_heads,
                     num_kv_heads, head_dim, page_size, causal=causal, logits_soft_cap=logits_soft_cap)
        return wrapper.run_return_lse(q, (k, v))
    if needs_other_hardware(device, backend):
        return expect_hardware_refusal(call)
    o, lse = call()
    for i in range(batch_size):
        rows = slice(i * seq_len, (i + 1) * seq_len)
        ref, ref_lse = single_ref(q[rows], pool["ks"][i], pool["vs"][i], causal=causal, soft_cap=logits_soft_cap)
        close(lse[rows], ref_lse, rtol=1e-3, atol=1e-3)
        close(o[rows], ref, rtol=1e-3, atol=1e-3)


MULTI_ITEM = [(54, 37, 17, list(range(17)) + list(range(19)) + [0], 100, [18]),
              (97, 81, 16, list(range(80)) + [0], 97, [79])]


@grid("kv_len, qo_len, prefix_len, token_pos_in_items, token_pos_in_items_len, max_item_len", MULTI_ITEM,
      MULTI_ITEM, named=BACKENDS)
@pytest.mark.parametrize("batch_size", [1, 2])
def test_batch_prefill_with_paged_kv_cache_multi_item_scoring_fa3_refused(
        device, backend, kv_len, qo_len, prefix_len, token_pos_in_items, token_pos_in_items_len, max_item_len,
        batch_size):
    """FlashInfer's multi_item_scoring_fa3 and _bsz2: the item masks are refused, never dropped."""
    page_size, num_kv_heads, num_qo_heads, head_dim = 16, 4, 4, 128
    pool = paged_pool([kv_len] * batch_size, page_size, num_kv_heads, head_dim, device=device)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    with pytest.raises(ValueError, match=r"prefix_len_ptr=.*allowed None: multi-item scoring"):
        wrapper.plan(indptr([qo_len] * batch_size), pool["indptr"], pool["indices"], pool["last"], num_qo_heads,
                     num_kv_heads, head_dim, page_size, causal=True,
                     prefix_len_ptr=torch.tensor([prefix_len] * batch_size, dtype=torch.uint32, device=device),
                     token_pos_in_items_ptr=torch.tensor(token_pos_in_items * batch_size, dtype=torch.uint16,
                                                         device=device),
                     token_pos_in_items_len=token_pos_in_items_len,
                     max_item_len_ptr=torch.tensor(max_item_len * batch_size, dtype=torch.uint16, device=device))
