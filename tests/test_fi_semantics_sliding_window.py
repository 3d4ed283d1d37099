"""FlashInfer's test_sliding_window.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

``window_left`` (inclusive: the query's own key and ``window_left`` before it) on single prefill
and both batch prefill wrappers, against the fp64 oracle with FlashInfer's tolerance (1e-3), and
the window equal to the custom mask that spells it out. FlashInfer's decode cases call
``single_decode_with_kv_cache`` and ``BatchDecodeWithPagedKVCacheWrapper`` (not entry points of
ours): their semantics are one query row per request, checked through single prefill and the
paged prefill wrapper. The wrapper cases run through auto and, on a GPU, ``backend="fa2"``.
"""
import torch

import dispatch
from _fi_semantics import close, grid, indptr, paged_pool, randn, single_ref, workspace

DECODE_CPU = [(n, w, hkv, hq, d) for n in (1, 3, 19, 99) for w in (3, 13, 43) for (hkv, hq) in ((1, 4), (4, 8))
              for d in (64, 512)] + [(19, 23, 4, 4, 128), (19, 37, 1, 8, 256)]
DECODE_GPU = [(1999, 43, 4, 8, 128), (1177, 37, 1, 4, 512), (199, 3, 4, 4, 256)]


@grid("seq_len, window_left, num_kv_heads, num_qo_heads, head_dim", DECODE_CPU, DECODE_GPU)
def test_single_decode_sliding_window_as_one_row_prefill(device, backend, seq_len, window_left, num_kv_heads,
                                                         num_qo_heads, head_dim):
    """The window keeps the last window_left + 1 keys: the same answer as those keys alone."""
    q = randn(1, num_qo_heads, head_dim, device=device, seed=0)
    k = randn(seq_len, num_kv_heads, head_dim, device=device, seed=1)
    v = randn(seq_len, num_kv_heads, head_dim, device=device, seed=2)
    o = dispatch.single_prefill_with_kv_cache(q, k, v, window_left=window_left, backend=backend)
    o_sliced = dispatch.single_prefill_with_kv_cache(q, k[-(window_left + 1):], v[-(window_left + 1):],
                                                     backend=backend)
    ref, _ = single_ref(q, k[-(window_left + 1):], v[-(window_left + 1):])
    close(o, ref, rtol=1e-3, atol=1e-3)
    close(o, o_sliced.double(), rtol=1e-3, atol=1e-3)


@grid("seq_len, window_left, num_kv_heads, num_qo_heads, head_dim", DECODE_CPU[::3], DECODE_GPU)
def test_single_decode_prefill_sliding_window_match(device, backend, seq_len, window_left, num_kv_heads,
                                                    num_qo_heads, head_dim):
    """One query row: the causal prefill call and the decode-style (non-causal) call agree, both with
    the window (the row sits at the last position, so causal keeps every key the window keeps)."""
    q = randn(1, num_qo_heads, head_dim, device=device, seed=0)
    k = randn(seq_len, num_kv_heads, head_dim, device=device, seed=1)
    v = randn(seq_len, num_kv_heads, head_dim, device=device, seed=2)
    o = dispatch.single_prefill_with_kv_cache(q, k, v, window_left=window_left, causal=True, backend=backend)
    o_decoded = dispatch.single_prefill_with_kv_cache(q, k, v, window_left=window_left, backend=backend)
    ref, _ = single_ref(q, k, v, window_left=window_left, causal=True)
    close(o, ref, rtol=1e-3, atol=1e-3)
    close(o, o_decoded.double(), rtol=1e-3, atol=1e-3)


PREFILL_CPU = [(n, w, hkv, hq, d) for n in (19, 99) for w in (5, 43) for (hkv, hq) in ((1, 4), (4, 8))
               for d in (64, 512)]
PREFILL_GPU = [(1999, 233, 4, 8, 128), (199, 43, 1, 4, 512), (1999, 43, 1, 8, 256)]


@grid("seq_len, window_left, num_kv_heads, num_qo_heads, head_dim", PREFILL_CPU, PREFILL_GPU)
def test_single_prefill_sliding_window(device, backend, seq_len, window_left, num_kv_heads, num_qo_heads,
                                       head_dim):
    q = randn(seq_len, num_qo_heads, head_dim, device=device, seed=0)
    k = randn(seq_len, num_kv_heads, head_dim, device=device, seed=1)
    v = randn(seq_len, num_kv_heads, head_dim, device=device, seed=2)
    row = torch.arange(seq_len, device=device)[:, None]
    col = torch.arange(seq_len, device=device)[None, :]
    mask = (row >= col) & (row - window_left <= col)
    o_mask = dispatch.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, backend=backend)
    o = dispatch.single_prefill_with_kv_cache(q, k, v, window_left=window_left, causal=True, backend=backend)
    ref, _ = single_ref(q, k, v, window_left=window_left, causal=True)
    close(o, ref, rtol=1e-3, atol=1e-3)
    close(o, o_mask.double(), rtol=1e-3, atol=1e-3)


PAGED_CPU = [(b, kv, qo, w, hkv, hq, d, p) for (b, kv, qo) in ((3, 54, 1), (2, 21, 7)) for w in (13, 33)
             for (hkv, hq) in ((1, 4), (4, 8)) for d in (64, 512) for p in (1, 16)][::2] + [
    (2, 17, 17, 111, 8, 8, 128, 16)]
PAGED_GPU = [(12, 397, 37, 33, 4, 8, 128, 16), (17, 1177, 47, 111, 1, 4, 512, 1), (30, 54, 1, 13, 8, 8, 256, 16)]


@grid("batch_size, kv_len, qo_len, window_left, num_kv_heads, num_qo_heads, head_dim, page_size", PAGED_CPU,
      PAGED_GPU, named="fa2")
def test_batch_paged_prefill_sliding_window(device, backend, batch_size, kv_len, qo_len, window_left, num_kv_heads,
                                            num_qo_heads, head_dim, page_size):
    q = randn(batch_size * qo_len, num_qo_heads, head_dim, device=device, seed=0)
    pool = paged_pool([kv_len] * batch_size, page_size, num_kv_heads, head_dim, device=device, shuffle=False)
    k_data, v_data = pool["cache"][:, 0], pool["cache"][:, 1]
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    wrapper.plan(indptr([qo_len] * batch_size, device), pool["indptr"].to(device), pool["indices"].to(device),
                 pool["last"].to(device), num_qo_heads, num_kv_heads, head_dim, page_size, window_left=window_left,
                 causal=True)
    o = wrapper.run(q, (k_data, v_data))
    for i in range(batch_size):
        ref, _ = single_ref(q[i * qo_len:(i + 1) * qo_len], pool["ks"][i], pool["vs"][i], window_left=window_left,
                            causal=True)
        close(o[i * qo_len:(i + 1) * qo_len], ref, rtol=1e-3, atol=1e-3)


RAGGED_CPU = [(b, kv, qo, w, hkv, hq, d) for (b, kv, qo) in ((3, 54, 37), (2, 21, 7)) for w in (13, 33)
              for (hkv, hq) in ((1, 4), (4, 8)) for d in (64, 512)][::2]
RAGGED_GPU = [(12, 397, 37, 33, 4, 8, 128), (17, 54, 47, 13, 1, 4, 512), (12, 397, 47, 13, 4, 4, 256)]


@grid("batch_size, kv_len, qo_len, window_left, num_kv_heads, num_qo_heads, head_dim", RAGGED_CPU, RAGGED_GPU,
      named="fa2")
def test_batch_ragged_prefill_sliding_window(device, backend, batch_size, kv_len, qo_len, window_left, num_kv_heads,
                                             num_qo_heads, head_dim):
    q = randn(batch_size * qo_len, num_qo_heads, head_dim, device=device, seed=0)
    k = randn(batch_size * kv_len, num_kv_heads, head_dim, device=device, seed=1)
    v = randn(batch_size * kv_len, num_kv_heads, head_dim, device=device, seed=2)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    wrapper.plan(indptr([qo_len] * batch_size, device), indptr([kv_len] * batch_size, device), num_qo_heads,
                 num_kv_heads, head_dim, window_left=window_left, causal=True)
    o = wrapper.run(q, k, v)
    for i in range(batch_size):
        ref, _ = single_ref(q[i * qo_len:(i + 1) * qo_len], k[i * kv_len:(i + 1) * kv_len],
                            v[i * kv_len:(i + 1) * kv_len], window_left=window_left, causal=True)
        close(o[i * qo_len:(i + 1) * qo_len], ref, rtol=1e-3, atol=1e-3)


BATCH_DECODE_CPU = [(b, kv, w, hkv, hq, d, p) for (b, kv) in ((1, 1), (3, 99)) for w in (33,)
                    for (hkv, hq) in ((1, 4), (4, 8)) for d in (64, 512) for p in (1, 16)][::2]
BATCH_DECODE_GPU = [(32, 1999, 533, 4, 8, 128, 16), (13, 199, 33, 1, 4, 512, 1)]


@grid("batch_size, kv_len, window_left, num_kv_heads, num_qo_heads, head_dim, page_size", BATCH_DECODE_CPU,
      BATCH_DECODE_GPU, named="fa2")
def test_batch_decode_sliding_window_as_one_row_paged_prefill(device, backend, batch_size, kv_len, window_left,
                                                              num_kv_heads, num_qo_heads, head_dim, page_size):
    q = randn(batch_size, num_qo_heads, head_dim, device=device, seed=0)
    pool = paged_pool([kv_len] * batch_size, page_size, num_kv_heads, head_dim, device=device)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    wrapper.plan(indptr([1] * batch_size, device), pool["indptr"].to(device), pool["indices"].to(device),
                 pool["last"].to(device), num_qo_heads, num_kv_heads, head_dim, page_size, window_left=window_left)
    o = wrapper.run(q, pool["cache"])
    for i in range(batch_size):
        ref, _ = single_ref(q[i:i + 1], pool["ks"][i], pool["vs"][i], window_left=window_left)
        close(o[i:i + 1], ref, rtol=1e-3, atol=1e-3)
