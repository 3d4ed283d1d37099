"""FlashInfer's test_non_contiguous_prefill.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

q, k and v as column slices of one packed qkv projection (row stride (Hq + 2 Hkv) * D, not
contiguous) give the same output as their contiguous copies (FlashInfer's tolerance), and that
output is checked against the fp64 oracle too. Single prefill and both batch prefill wrappers;
FlashInfer's test names no backend: auto only.
"""
import dispatch
from _fi_semantics import close, grid, indptr, paged_pool, randn, single_ref, workspace


def packed_qkv(rows, num_qo_heads, num_kv_heads, head_dim, device):
    qkv = randn(rows, (num_qo_heads + 2 * num_kv_heads) * head_dim, device=device)
    q, k, v = qkv.split((num_qo_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim), dim=-1)
    q, k, v = (q.view(rows, num_qo_heads, head_dim), k.view(rows, num_kv_heads, head_dim),
               v.view(rows, num_kv_heads, head_dim))
    assert rows == 1 or not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    return q, k, v


SINGLE_CPU = [(n, hkv, hq, d, c) for n in (1, 7, 33) for (hkv, hq) in ((1, 4), (4, 8), (8, 32)) for d in (64, 256)
              for c in (True, False)][::2] + [(7, 4, 4, 128, True)]
SINGLE_GPU = [(3579, 8, 32, 128, True), (999, 1, 4, 256, False), (127, 4, 8, 64, True)]


@grid("seq_len, num_kv_heads, num_qo_heads, head_dim, causal", SINGLE_CPU, SINGLE_GPU)
def test_single_prefill_packed_input(device, backend, seq_len, num_kv_heads, num_qo_heads, head_dim, causal):
    q, k, v = packed_qkv(seq_len, num_qo_heads, num_kv_heads, head_dim, device)
    o_packed = dispatch.single_prefill_with_kv_cache(q, k, v, causal=causal, backend=backend)
    o_contiguous = dispatch.single_prefill_with_kv_cache(q.contiguous(), k.contiguous(), v.contiguous(),
                                                         causal=causal, backend=backend)
    close(o_packed, o_contiguous.double(), rtol=1e-3, atol=1e-3)
    close(o_packed, single_ref(q, k, v, causal=causal)[0], rtol=1e-3, atol=1e-3)


RAGGED_CPU = [(b, n, hkv, hq, d, c) for b in (1, 3) for n in (1, 7, 19) for (hkv, hq) in ((1, 4), (4, 8), (8, 8))
              for d in (64, 256) for c in (True, False)][::3]
RAGGED_GPU = [(99, 257, 8, 8, 128, True), (19, 127, 1, 4, 256, False), (1, 7, 4, 8, 64, True)]


@grid("batch_size, seq_len, num_kv_heads, num_qo_heads, head_dim, causal", RAGGED_CPU, RAGGED_GPU)
def test_batch_ragged_prefill_packed_input(device, backend, batch_size, seq_len, num_kv_heads, num_qo_heads,
                                           head_dim, causal):
    nnz = batch_size * seq_len
    q, k, v = packed_qkv(nnz, num_qo_heads, num_kv_heads, head_dim, device)
    qo_indptr = indptr([seq_len] * batch_size, device)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), backend=backend)
    wrapper.plan(qo_indptr, qo_indptr, num_qo_heads, num_kv_heads, head_dim, causal=causal)
    o_packed = wrapper.run(q, k, v)
    o_contiguous = wrapper.run(q.contiguous(), k.contiguous(), v.contiguous())
    close(o_packed, o_contiguous.double(), rtol=1e-3, atol=1e-3)
    for i in range(batch_size):
        rows = slice(i * seq_len, (i + 1) * seq_len)
        close(o_packed[rows], single_ref(q[rows], k[rows], v[rows], causal=causal)[0], rtol=1e-3, atol=1e-3)


PAGED_CPU = [(b, p, n, hkv, hq, d, c) for b in (1, 3) for p in (1, 5) for n in (1, 7, 19)
             for (hkv, hq) in ((1, 4), (4, 8), (8, 8)) for d in (64, 256) for c in (True, False)][::5]
PAGED_GPU = [(99, 5, 257, 8, 8, 128, True), (19, 1, 127, 1, 4, 256, False), (1, 5, 7, 4, 8, 64, True)]


@grid("batch_size, page_size, seq_len, num_kv_heads, num_qo_heads, head_dim, causal", PAGED_CPU, PAGED_GPU)
def test_batch_paged_prefill_packed_input(device, backend, batch_size, page_size, seq_len, num_kv_heads,
                                          num_qo_heads, head_dim, causal):
    pool = paged_pool([seq_len] * batch_size, page_size, num_kv_heads, head_dim, device=device, shuffle=False)
    paged_kv_cache = (pool["cache"][:, 0].contiguous(), pool["cache"][:, 1].contiguous())
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), backend=backend)
    wrapper.plan(qo_indptr=indptr([seq_len] * batch_size, device), paged_kv_indptr=pool["indptr"].to(device),
                 paged_kv_indices=pool["indices"].to(device), paged_kv_last_page_len=pool["last"].to(device),
                 num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim_qk=head_dim, page_size=page_size,
                 causal=causal)
    q, _, _ = packed_qkv(batch_size * seq_len, num_qo_heads, num_kv_heads, head_dim, device)
    o_packed = wrapper.run(q, paged_kv_cache)
    o_contiguous = wrapper.run(q.contiguous(), paged_kv_cache)
    close(o_packed, o_contiguous.double(), rtol=1e-3, atol=2e-3)
    for i in range(batch_size):
        rows = slice(i * seq_len, (i + 1) * seq_len)
        close(o_packed[rows], single_ref(q[rows], pool["ks"][i], pool["vs"][i], causal=causal)[0],
              rtol=1e-3, atol=2e-3)
