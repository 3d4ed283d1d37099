"""FlashInfer's test_batch_prefill_kernels.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

Both batch prefill wrappers against the fp64 oracle, request by request, with FlashInfer's
tolerance (1e-3; 2e-3 for the wide head dims; 1e-2 for the split-KV case): paged caches as one
5-D tensor or a (k, v) tuple, NHD and HND, contiguous or strided, RoPE (LLaMA), causal, return_lse
with caller-owned out/lse buffers, CUDA-graph replay after a re-plan (GPU), custom masks (equal to
the causal answer), head dims 64..512 and (448, 256), fp8 KV, K and V pools with unequal strides,
and the edge rows (a single huge score, rows with no key: out 0 and lse -inf). On a GPU the cases
FlashInfer runs with ``backend="fa2"`` run with it too. NVFP4 KV caches (fp4 e2m1 values with fp8
scale factors, ``kv_cache_sf``) are checked against the oracle over the dequantized cache.
Multi-item scoring is refused, with an error that names the argument and what is allowed.
"""
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import dispatch
from _fi_semantics import GPU, alibi_slopes, close, grid, indptr, nvfp4, paged_pool, randn, single_ref, workspace

HKV = 4


def strided_copy(cache: torch.Tensor) -> torch.Tensor:
    """The same values in a view whose page, head and row strides are not those of a dense cache
    (every other slot of a parent twice as wide in each inner dim; the last dim stays dense)."""
    pages, two, a, b, d = cache.shape
    parent = torch.zeros(pages, two, 2, a, 2, b, 2, d, dtype=cache.dtype, device=cache.device)
    view = parent[:, :, 1, :, 1, :, 1, :]
    view.copy_(cache)
    assert not view.is_contiguous()
    return view


def paged_wrapper_run(device, backend, pool, qo_lens, num_qo_heads, head_dim, page_size, kv_layout, q, cache,
                      use_cuda_graph=False, **plan_kw):
    """plan + run(return_lse=True) as FlashInfer's test does; then run again into caller-owned out/lse
    buffers (must agree). With use_cuda_graph (GPU): plan a warm-up batch, capture run, re-plan
    the real batch into the same buffers and replay."""
    qo, pages = indptr(qo_lens), pool["indptr"]
    args = (num_qo_heads, HKV, head_dim, page_size)
    if not use_cuda_graph:
        wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), kv_layout, backend=backend)
        wrapper.plan(qo.to(device), pages.to(device), pool["indices"].to(device), pool["last"].to(device), *args,
                     **plan_kw)
        o, lse = wrapper.run(q, cache, return_lse=True)
        o_buffer, lse_buffer = torch.empty_like(o), torch.empty_like(lse)
        wrapper.run(q, cache, out=o_buffer, lse=lse_buffer, return_lse=True)
        close(o_buffer, o.double(), rtol=1e-3, atol=1e-3)
        close(lse_buffer, lse.double(), rtol=1e-3, atol=1e-3)
        return o, lse
    b, total = len(qo_lens), int(pages[-1])
    bufs = dict(qo_indptr_buf=torch.empty(b + 1, dtype=torch.int32, device=device),
                paged_kv_indptr_buf=torch.empty(b + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buf=torch.empty(total, dtype=torch.int32, device=device),
                paged_kv_last_page_len_buf=torch.empty(b, dtype=torch.int32, device=device))
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), kv_layout, use_cuda_graph=True,
                                                           backend=backend, **bufs)
    wrapper.plan(qo, torch.arange(b + 1).int(), torch.arange(b).int(), torch.full((b,), page_size, dtype=torch.int32),
                 *args, **plan_kw)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            wrapper.run(q, cache, return_lse=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = wrapper.run(q, cache, return_lse=True)
    wrapper.plan(qo, pages, pool["indices"], pool["last"], *args, **plan_kw)
    graph.replay()
    return o, lse


def check_requests(o, lse, q, pool, qo_lens, rtol=1e-3, atol=1e-3, **ref_kw):
    start = 0
    for i, n in enumerate(qo_lens):
        ref, ref_lse = single_ref(q[start:start + n], pool["ks"][i], pool["vs"][i], **ref_kw)
        close(o[start:start + n], ref, rtol=rtol, atol=atol)
        if lse is not None and ref_kw.get("alibi_slopes") is None:
            close(lse[start:start + n], ref_lse, rtol=rtol, atol=atol)
        start += n


PAGED_CPU = [(b, kv, qo, p, hq, d, c, layout, pos, contiguous)
             for (b, kv, qo) in ((2, 54, 37), (3, 17, 17), (2, 9, 17)) for p in (1, 5, 16) for hq in (4, 32)
             for d in (64, 128, 256) for c in (False, True) for layout in ("NHD", "HND")
             for pos in ("NONE", "ROPE_LLAMA") for contiguous in (True, False) if not (c and qo > kv)][::23]
PAGED_GPU = [(12, 54, 37, 16, 32, 128, True, "NHD", "NONE", True, False),
             (17, 512, 127, 5, 4, 256, False, "HND", "ROPE_LLAMA", False, False),
             (128, 2048, 577, 1, 32, 64, True, "NHD", "ROPE_LLAMA", True, False),
             (12, 97, 17, 16, 4, 128, True, "NHD", "NONE", True, True),
             (17, 512, 37, 5, 32, 256, False, "HND", "ROPE_LLAMA", True, True)]
PAGED_FIELDS = "batch_size, kv_len, qo_len, page_size, num_qo_heads, head_dim, causal, kv_layout, pos_encoding_mode, "


@grid(PAGED_FIELDS + "contiguous_kv, use_cuda_graph", [c + (False,) for c in PAGED_CPU], PAGED_GPU)
@pytest.mark.parametrize("tuple_kv", [False, True], ids=["5d", "tuple"])
def test_batch_prefill_with_paged_kv_cache(device, backend, batch_size, kv_len, qo_len, page_size, num_qo_heads,
                                           head_dim, causal, kv_layout, pos_encoding_mode, contiguous_kv,
                                           use_cuda_graph, tuple_kv):
    """Also FlashInfer's test_batch_prefill_with_tuple_paged_kv_cache (tuple_kv)."""
    qo_lens = [qo_len] * batch_size
    q = randn(batch_size * qo_len, num_qo_heads, head_dim, device=device)
    pool = paged_pool([kv_len] * batch_size, page_size, HKV, head_dim, layout=kv_layout, device=device,
                      shuffle=False)
    cache = pool["cache"] if contiguous_kv else strided_copy(pool["cache"])
    if tuple_kv:
        cache = (cache[:, 0], cache[:, 1])
    o, lse = paged_wrapper_run(device, backend, pool, qo_lens, num_qo_heads, head_dim, page_size, kv_layout, q, cache,
                               use_cuda_graph, causal=causal, pos_encoding_mode=pos_encoding_mode,
                               logits_soft_cap=0.0)
    check_requests(o, lse, q, pool, qo_lens, causal=causal, pos_encoding=pos_encoding_mode)


HEAD_DIM_512 = [(c, pos) for c in (False, True) for pos in ("NONE", "ROPE_LLAMA")]


@grid("causal, pos_encoding_mode", HEAD_DIM_512, HEAD_DIM_512, named="fa2")
def test_batch_prefill_with_paged_kv_cache_head_dim_512(device, backend, causal, pos_encoding_mode):
    batch_size, kv_len, qo_len, page_size, head_dim = 2, 97, 17, 16, 512
    q = randn(batch_size * qo_len, 4, head_dim, device=device)
    pool = paged_pool([kv_len] * batch_size, page_size, HKV, head_dim, device=device, shuffle=False)
    o, lse = paged_wrapper_run(device, backend, pool, [qo_len] * batch_size, 4, head_dim, page_size, "NHD", q,
                               pool["cache"], causal=causal, pos_encoding_mode=pos_encoding_mode,
                               q_data_type=torch.float16, kv_data_type=torch.float16)
    check_requests(o, lse, q, pool, [qo_len] * batch_size, causal=causal, pos_encoding=pos_encoding_mode)


def causal_masks(batch_size, qo_len, kv_len, device):
    """FlashInfer's flattened per-request masks spelling out bottom-right causal."""
    one = torch.tril(torch.ones(qo_len, kv_len, dtype=torch.bool, device=device), diagonal=kv_len - qo_len)
    return one.expand(batch_size, qo_len, kv_len).reshape(-1)


MASK_CPU = [(b, kv, qo, p, hq, d, layout, pos) for (b, kv, qo) in ((2, 54, 37), (1, 17, 17)) for p in (1, 16)
            for hq in (4, 32) for d in (128, 256) for layout in ("NHD", "HND") for pos in ("NONE", "ROPE_LLAMA")][::5]
MASK_GPU = [(12, 512, 127, 16, 32, 128, "NHD", "ROPE_LLAMA"), (1, 137, 137, 1, 4, 256, "HND", "NONE")]


@grid("batch_size, kv_len, qo_len, page_size, num_qo_heads, head_dim, kv_layout, pos_encoding_mode", MASK_CPU,
      MASK_GPU)
def test_batch_prefill_with_paged_kv_cache_custom_mask(device, backend, batch_size, kv_len, qo_len, page_size,
                                                       num_qo_heads, head_dim, kv_layout, pos_encoding_mode):
    q = randn(batch_size * qo_len, num_qo_heads, head_dim, device=device)
    pool = paged_pool([kv_len] * batch_size, page_size, HKV, head_dim, layout=kv_layout, device=device)
    qo_lens = [qo_len] * batch_size
    o_custom, lse_custom = paged_wrapper_run(device, backend, pool, qo_lens, num_qo_heads, head_dim, page_size,
                                             kv_layout, q, pool["cache"], pos_encoding_mode=pos_encoding_mode,
                                             custom_mask=causal_masks(batch_size, qo_len, kv_len, device))
    o_causal, lse_causal = paged_wrapper_run(device, backend, pool, qo_lens, num_qo_heads, head_dim, page_size,
                                             kv_layout, q, pool["cache"], pos_encoding_mode=pos_encoding_mode,
                                             causal=True)
    close(o_custom, o_causal.double(), rtol=1e-3, atol=1e-3)
    check_requests(o_custom, lse_custom, q, pool, qo_lens, causal=True, pos_encoding=pos_encoding_mode)


def ragged_inputs(batch_size, kv_len, qo_len, num_qo_heads, head_dim, device, head_dim_vo=None, dtype=torch.float16):
    q = randn(batch_size * qo_len, num_qo_heads, head_dim, dtype=dtype, device=device, seed=0)
    k = randn(batch_size * kv_len, HKV, head_dim, dtype=dtype, device=device, seed=1)
    v = randn(batch_size * kv_len, HKV, head_dim_vo or head_dim, dtype=dtype, device=device, seed=2)
    pool = dict(ks=list(k.split(kv_len)), vs=list(v.split(kv_len)))
    return q, k, v, pool


RAGGED_CPU = [(b, kv, qo, hq, d, c, pos) for (b, kv, qo) in ((2, 54, 37), (3, 17, 17), (2, 9, 17)) for hq in (4, 32)
              for d in (64, 128, 256) for c in (False, True) for pos in ("NONE", "ROPE_LLAMA")
              if not (c and qo > kv)][::4]
RAGGED_GPU = [(12, 54, 37, 32, 128, True, "ROPE_LLAMA"), (17, 2048, 577, 4, 256, False, "NONE"),
              (128, 97, 17, 32, 64, True, "NONE")]


@grid("batch_size, kv_len, qo_len, num_qo_heads, head_dim, causal, pos_encoding_mode", RAGGED_CPU, RAGGED_GPU)
def test_batch_prefill_with_ragged_kv_cache(device, backend, batch_size, kv_len, qo_len, num_qo_heads, head_dim,
                                            causal, pos_encoding_mode):
    q, k, v, pool = ragged_inputs(batch_size, kv_len, qo_len, num_qo_heads, head_dim, device)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    wrapper.plan(indptr([qo_len] * batch_size), indptr([kv_len] * batch_size), num_qo_heads, HKV, head_dim,
                 causal=causal, pos_encoding_mode=pos_encoding_mode, logits_soft_cap=0.0)
    o, lse = wrapper.run(q, k, v, return_lse=True)
    o_buffer, lse_buffer = torch.empty_like(o), torch.empty_like(lse)
    wrapper.run(q, k, v, out=o_buffer, lse=lse_buffer, return_lse=True)
    close(o_buffer, o.double(), rtol=1e-3, atol=1e-3)
    check_requests(o, lse, q, pool, [qo_len] * batch_size, causal=causal, pos_encoding=pos_encoding_mode)


@grid("causal, pos_encoding_mode", HEAD_DIM_512, HEAD_DIM_512, named="fa2")
def test_batch_prefill_with_ragged_kv_cache_head_dim_512(device, backend, causal, pos_encoding_mode):
    batch_size, kv_len, qo_len, head_dim = 2, 97, 17, 512
    q, k, v, pool = ragged_inputs(batch_size, kv_len, qo_len, 4, head_dim, device)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    wrapper.plan(indptr([qo_len] * batch_size), indptr([kv_len] * batch_size), 4, HKV, head_dim, causal=causal,
                 pos_encoding_mode=pos_encoding_mode, q_data_type=torch.float16, kv_data_type=torch.float16)
    o, lse = wrapper.run(q, k, v, return_lse=True)
    check_requests(o, lse, q, pool, [qo_len] * batch_size, causal=causal, pos_encoding=pos_encoding_mode)


RAGGED_MASK_CPU = [(b, kv, qo, hq, d, pos, cap, ret) for (b, kv, qo) in ((2, 54, 37), (1, 17, 17)) for hq in (4, 32)
                   for d in (128, 256) for pos in ("NONE", "ROPE_LLAMA", "ALIBI") for cap in (0.0, 30.0)
                   for ret in (True, False)][::5]
RAGGED_MASK_GPU = [(12, 512, 127, 32, 128, "ALIBI", 30.0, True), (1, 137, 137, 4, 256, "ROPE_LLAMA", 0.0, False)]


@grid("batch_size, kv_len, qo_len, num_qo_heads, head_dim, pos_encoding_mode, logits_soft_cap, return_lse",
      RAGGED_MASK_CPU, RAGGED_MASK_GPU)
def test_batch_prefill_with_ragged_kv_cache_custom_mask(device, backend, batch_size, kv_len, qo_len, num_qo_heads,
                                                        head_dim, pos_encoding_mode, logits_soft_cap, return_lse):
    q, k, v, pool = ragged_inputs(batch_size, kv_len, qo_len, num_qo_heads, head_dim, device)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    common = (indptr([qo_len] * batch_size), indptr([kv_len] * batch_size), num_qo_heads, HKV, head_dim)
    options = dict(pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap)
    wrapper.plan(*common, custom_mask=causal_masks(batch_size, qo_len, kv_len, device), **options)
    o_custom = wrapper.run(q, k, v, return_lse=return_lse)
    wrapper.plan(*common, causal=True, **options)
    o_causal = wrapper.run(q, k, v, return_lse=return_lse)
    if return_lse:
        (o_custom, lse_custom), (o_causal, lse_causal) = o_custom, o_causal
        close(lse_custom, lse_causal.double(), rtol=1e-3, atol=1e-3)
    close(o_custom, o_causal.double(), rtol=1e-3, atol=1e-3)
    alibi = alibi_slopes(num_qo_heads) if pos_encoding_mode == "ALIBI" else None
    check_requests(o_custom, None, q, pool, [qo_len] * batch_size, causal=True, soft_cap=logits_soft_cap,
                   pos_encoding="NONE" if alibi is not None else pos_encoding_mode, alibi_slopes=alibi,
                   alibi_query="row")  # FlashInfer's FA2: the bias counts from the query's row in its request


MULTI_ITEM = [(54, 37, 17, list(range(17)) + list(range(19)) + [0], 100, [18]),
              (97, 81, 16, list(range(80)) + [0], 97, [79])]


@grid("kv_len, qo_len, prefix_len, token_pos_in_items, token_pos_in_items_len, max_item_len", MULTI_ITEM, MULTI_ITEM)
def test_batch_prefill_with_paged_kv_cache_multi_item_scoring_refused(device, backend, kv_len, qo_len, prefix_len,
                                                                      token_pos_in_items, token_pos_in_items_len,
                                                                      max_item_len):
    pool = paged_pool([kv_len], 16, HKV, 128, device=device)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    with pytest.raises(ValueError, match=r"prefix_len_ptr=.*allowed None: multi-item scoring"):
        wrapper.plan(indptr([qo_len]), pool["indptr"], pool["indices"], pool["last"], 4, HKV, 128, 16, causal=True,
                     pos_encoding_mode="ROPE_LLAMA",
                     prefix_len_ptr=torch.tensor([prefix_len], dtype=torch.uint32, device=device),
                     token_pos_in_items_ptr=torch.tensor(token_pos_in_items, dtype=torch.uint16, device=device),
                     token_pos_in_items_len=token_pos_in_items_len,
                     max_item_len_ptr=torch.tensor(max_item_len, dtype=torch.uint16, device=device))


QK448 = [(torch.float16,), (torch.float8_e4m3fn,)]


@grid("kv_dtype", QK448, QK448, named="fa2")
def test_batch_prefill_paged_cta_tile_q_smem_probe_qk448_vo256(device, backend, kv_dtype):
    """Head dims (448, 256) with fp16 or fp8 KV (FlashInfer 0.7.2 only plans them, a probe of its tile
    choice; its later API declares the pair unsupported): here auto runs them, checked against the
    oracle over the stored values, and fa2, named, refuses them by the head dim before any kernel."""
    batch_size, qo_len, kv_len, page_size, heads, dqk, dvo = 2, 8, 65, 16, 2, 448, 256
    pages = -(-kv_len // page_size)
    q = randn(batch_size * qo_len, heads, dqk, device=device)
    k = randn(batch_size * pages, page_size, heads, dqk, dtype=kv_dtype, device=device, seed=1)
    v = randn(batch_size * pages, page_size, heads, dvo, dtype=kv_dtype, device=device, seed=2)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    plan_args = (indptr([qo_len] * batch_size), indptr([pages] * batch_size), torch.arange(batch_size * pages).int(),
                 torch.full((batch_size,), (kv_len - 1) % page_size + 1, dtype=torch.int32), heads, heads, dqk,
                 page_size)
    plan_kw = dict(head_dim_vo=dvo, causal=False, pos_encoding_mode="NONE", q_data_type=torch.float16,
                   kv_data_type=kv_dtype)
    if backend == "fa2":  # refused by name at plan() or at the first run, before any kernel
        with pytest.raises(ValueError, match="head_dim_qk=448"):
            wrapper.plan(*plan_args, **plan_kw)
            wrapper.run(q, (k, v))
        return
    wrapper.plan(*plan_args, **plan_kw)
    o = wrapper.run(q, (k, v))
    assert o.shape == (batch_size * qo_len, heads, dvo)
    for i in range(batch_size):
        ki = k[i * pages:(i + 1) * pages].reshape(-1, heads, dqk)[:kv_len]
        vi = v[i * pages:(i + 1) * pages].reshape(-1, heads, dvo)[:kv_len]
        ref, _ = single_ref(q[i * qo_len:(i + 1) * qo_len], ki.double(), vi.double())
        close(o[i * qo_len:(i + 1) * qo_len], ref, rtol=2e-3, atol=2e-3)


STRIDES = [(layout, qo) for layout in ("NHD", "HND") for qo in (17, 65)]


@grid("kv_layout, qo_len", STRIDES, STRIDES, named="fa2")
def test_batch_prefill_paged_shared_kv_smem_unequal_kv_strides(device, backend, kv_layout, qo_len):
    """K and V pools as views of parents padded differently along the heads: equal shapes, unequal
    strides (V must be read through its own strides)."""
    batch_size, kv_len, page_size, heads, head_dim = 2, 97, 16, 2, 512
    pool = paged_pool([kv_len] * batch_size, page_size, heads, head_dim, layout=kv_layout, device=device,
                      shuffle=False)
    head_dim_index = 2 if kv_layout == "NHD" else 1

    def padded(half: torch.Tensor, extra_heads: int) -> torch.Tensor:
        shape = list(half.shape)
        shape[head_dim_index] += extra_heads
        parent = randn(*shape, device=device, seed=7 + extra_heads)
        view = parent.narrow(head_dim_index, 0, heads)
        view.copy_(half)
        return view
    k, v = padded(pool["cache"][:, 0], 1), padded(pool["cache"][:, 1], 3)
    assert k.stride() != v.stride()
    q = randn(batch_size * qo_len, heads, head_dim, device=device)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), kv_layout, backend=backend)
    wrapper.plan(indptr([qo_len] * batch_size), pool["indptr"], pool["indices"], pool["last"], heads, heads,
                 head_dim, page_size, causal=True, q_data_type=torch.float16, kv_data_type=torch.float16)
    o = wrapper.run(q, (k, v))
    check_requests(o, None, q, pool, [qo_len] * batch_size, rtol=2e-3, atol=2e-3, causal=True)


DTYPES = [(torch.float16,), (torch.bfloat16,)]


@grid("dtype", DTYPES, DTYPES, named="fa2")
def test_ragged_prefill_one_valid_key(device, backend, dtype):
    """One key whose scaled score is about -46341: the output is exactly v and the LSE the score
    over ln 2 (masked logits are -inf, so any finite logit wins)."""
    hq, hkv, d = 32, 8, 128
    q = torch.full((1, hq, d), 64.0, dtype=dtype, device=device)
    k = torch.full((1, hkv, d), -64.0, dtype=dtype, device=device)
    v = torch.ones(1, hkv, d, dtype=dtype, device=device)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), kv_layout="NHD", backend=backend)
    wrapper.plan(qo_indptr=indptr([1], device), kv_indptr=indptr([1], device), num_qo_heads=hq, num_kv_heads=hkv,
                 head_dim_qk=d, causal=True, sm_scale=d ** -0.5, q_data_type=dtype, kv_data_type=dtype)
    o, lse = wrapper.run(q, k, v, return_lse=True)
    assert torch.equal(o.cpu(), torch.ones(1, hq, d, dtype=dtype))
    close(lse, torch.full((1, hq), -64.0 * 64.0 * d * d ** -0.5 / math.log(2.0), dtype=torch.float64),
          rtol=1e-5, atol=1e-3)


@grid("dtype", DTYPES, DTYPES, named="fa2")
def test_paged_prefill_fully_masked_rows(device, backend, dtype):
    """34 queries over 1 key, causal bottom-right: 33 rows see no key (out 0, LSE -inf), the last
    row sees the key (out v = 1, LSE 0 for a zero score)."""
    qo_len, hq, hkv, d = 34, 32, 8, 128
    q = torch.zeros(qo_len, hq, d, dtype=dtype, device=device)
    k_cache = torch.zeros(2, 1, hkv, d, dtype=dtype, device=device)
    v_cache = torch.ones_like(k_cache)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), kv_layout="NHD", backend=backend)
    wrapper.plan(qo_indptr=indptr([qo_len], device), paged_kv_indptr=indptr([1], device),
                 paged_kv_indices=torch.tensor([1], dtype=torch.int32, device=device),
                 paged_kv_last_page_len=torch.tensor([1], dtype=torch.int32, device=device), num_qo_heads=hq,
                 num_kv_heads=hkv, head_dim_qk=d, page_size=1, causal=True, sm_scale=d ** -0.5, q_data_type=dtype,
                 kv_data_type=dtype)
    o, lse = wrapper.run(q, (k_cache, v_cache), return_lse=True)
    o, lse = o.cpu(), lse.cpu()
    assert not o.isnan().any() and not lse.isnan().any()
    assert torch.equal(o[:-1], torch.zeros_like(o[:-1])) and torch.isneginf(lse[:-1]).all()
    assert torch.equal(o[-1:], torch.ones_like(o[-1:])) and torch.equal(lse[-1:], torch.zeros_like(lse[-1:]))


@grid("dtype", DTYPES, DTYPES, named="fa2")
def test_paged_prefill_split_kv_empty_chunk(device, backend, dtype):
    """Two causal rows over 129 keys in pages of 16: a row with no key in the last chunk merges
    without NaN (FlashInfer's tolerance 1e-2)."""
    qo_len, kv_len, hq, hkv, d, page_size = 2, 129, 8, 2, 128, 16
    pages = -(-kv_len // page_size)
    q = randn(qo_len, hq, d, dtype=dtype, device=device, scale=0.1)
    kv_data = randn(pages, 2, page_size, hkv, d, dtype=dtype, device=device, seed=1, scale=0.1)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), kv_layout="NHD", backend=backend)
    wrapper.plan(qo_indptr=indptr([qo_len], device), paged_kv_indptr=indptr([pages], device),
                 paged_kv_indices=torch.arange(pages, dtype=torch.int32, device=device),
                 paged_kv_last_page_len=torch.tensor([(kv_len - 1) % page_size + 1], dtype=torch.int32, device=device),
                 num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d, page_size=page_size, causal=True,
                 q_data_type=dtype, kv_data_type=dtype)
    o, lse = wrapper.run(q, kv_data, return_lse=True)
    k = kv_data[:, 0].reshape(-1, hkv, d)[:kv_len]
    v = kv_data[:, 1].reshape(-1, hkv, d)[:kv_len]
    ref, ref_lse = single_ref(q, k, v, causal=True)
    close(o, ref, rtol=1e-2, atol=1e-2)
    close(lse, ref_lse, rtol=1e-2, atol=1e-2)


COMPILE_SCRIPT = textwrap.dedent("""\
    import torch
    from dispatch import single_prefill_with_kv_cache

    torch.library.define("fi_semantics::op", "(Tensor q, Tensor k, Tensor v) -> Tensor")

    @torch.library.impl("fi_semantics::op", "cuda")
    def _impl(q, k, v):
        return single_prefill_with_kv_cache(q, k, v, causal=True)

    @torch.library.register_fake("fi_semantics::op")
    def _fake(q, k, v):
        return torch.empty_like(q)

    compiled = torch.compile(lambda q, k, v: torch.ops.fi_semantics.op(q, k, v), mode="reduce-overhead",
                             fullgraph=True)
    for _ in range(3):
        q, k, v = (torch.randn(128, 8, 128, device="cuda", dtype=torch.float16) for _ in range(3))
        o = compiled(q, k, v)
        assert o.shape == (128, 8, 128)
        ref = single_prefill_with_kv_cache(q, k, v, causal=True, backend="reference")
        assert (o.float() - ref.float()).abs().max().item() < 1e-2
    torch.cuda.synchronize()
    print("PASS")
""")


@GPU
def test_single_prefill_torch_compile_cuda_graph():
    """single_prefill_with_kv_cache inside a custom op under torch.compile(mode="reduce-overhead")
    (CUDA graphs): no error about the graph pool, and the replayed answers are right."""
    env = dict(os.environ, USER=os.environ.get("USER", "ci"))
    done = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0 and "PASS" in done.stdout, done.stderr[-2000:]


def nvfp4_pool(batch_size, kv_len, page_size, num_kv_heads, head_dim, device, head_dim_vo=None):
    """FlashInfer's NVFP4 paged cache: (pages, 2, page, Hkv, D / 2) fp4 pairs and (pages, 2, page,
    Hkv, D / 16) scale bytes; with each request's dequantized K and V for the oracle."""
    pages = -(-kv_len // page_size)
    total = pages * batch_size
    k, k_sf, k_values = nvfp4((total, page_size, num_kv_heads, head_dim // 2), device, seed=3)
    v, v_sf, v_values = nvfp4((total, page_size, num_kv_heads, (head_dim_vo or head_dim) // 2), device, seed=4)
    ks = [k_values[i * pages:(i + 1) * pages].reshape(-1, num_kv_heads, head_dim)[:kv_len] for i in range(batch_size)]
    vs = [v_values[i * pages:(i + 1) * pages].flatten(0, 1)[:kv_len] for i in range(batch_size)]
    return dict(k=k, v=v, k_sf=k_sf, v_sf=v_sf, ks=ks, vs=vs, indptr=indptr([pages] * batch_size),
                indices=torch.arange(total, dtype=torch.int32),
                last=torch.full((batch_size,), (kv_len - 1) % page_size + 1, dtype=torch.int32))


NVFP4_PAGED = [(b, kv, qo, p, 128, "NONE", dt) for (b, kv, qo) in ((1, 128, 64), (4, 256, 128), (2, 128, 128))
               for p in (16, 64) for dt in (torch.float16, torch.bfloat16)][::2] + [
    (2, 256, 64, 16, 512, "NONE", torch.float16), (2, 256, 64, 16, 512, "NONE", torch.bfloat16),
    (2, 128, 64, 16, 512, "ROPE_LLAMA", torch.float16), (2, 128, 64, 16, 512, "ROPE_LLAMA", torch.bfloat16)]


@grid("batch_size, kv_len, qo_len, page_size, head_dim, pos_encoding_mode, q_dtype", NVFP4_PAGED, NVFP4_PAGED)
def test_batch_prefill_with_paged_kv_cache_nvfp4(device, backend, batch_size, kv_len, qo_len, page_size, head_dim,
                                                 pos_encoding_mode, q_dtype):
    """Also FlashInfer's nvfp4_large_head(_bf16) and nvfp4_rope_large_head(_bf16) (head dim 512)."""
    heads = 1
    pool = nvfp4_pool(batch_size, kv_len, page_size, heads, head_dim, device)
    q = randn(batch_size * qo_len, heads, head_dim, dtype=q_dtype, device=device)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    wrapper.plan(indptr([qo_len] * batch_size), pool["indptr"], pool["indices"], pool["last"], heads, heads, head_dim,
                 page_size, causal=False, pos_encoding_mode=pos_encoding_mode, logits_soft_cap=0.0,
                 kv_data_type=torch.uint8, q_data_type=q_dtype)
    o = wrapper.run(q, torch.stack([pool["k"], pool["v"]], dim=1), k_scale=1.0, v_scale=1.0,
                    kv_cache_sf=torch.stack([pool["k_sf"], pool["v_sf"]], dim=1))
    check_requests(o, None, q, pool, [qo_len] * batch_size, rtol=1e-1, atol=1e-1, pos_encoding=pos_encoding_mode)


@grid("kv_layout", [("NHD",), ("HND",)], [("NHD",), ("HND",)])
def test_batch_prefill_with_paged_kv_cache_nvfp4_strided_scale_views(device, backend, kv_layout):
    """Scale factors as strided views sharing one parent with the packed values give the compact
    answer; a scale view whose last dim is strided is refused by name."""
    batch_size, kv_len, qo_len, page_size, heads, head_dim = 2, 128, 64, 16, 2, 128
    pool = nvfp4_pool(batch_size, kv_len, page_size, heads, head_dim, device)
    halves = [pool["k"], pool["v"], pool["k_sf"], pool["v_sf"]]
    if kv_layout == "HND":
        halves = [t.transpose(1, 2).contiguous() for t in halves]
    k, v, k_sf, v_sf = halves
    parent = torch.zeros(k.shape[0], 2, *k.shape[1:-1], head_dim // 2 + head_dim // 16, dtype=torch.uint8,
                         device=device)
    strided = []
    for side, (values, scales) in enumerate(((k, k_sf), (v, v_sf))):
        parent[:, side, ..., :head_dim // 2].copy_(values)
        parent[:, side, ..., head_dim // 2:].copy_(scales)
        strided.append((parent[:, side, ..., :head_dim // 2], parent[:, side, ..., head_dim // 2:]))
    q = randn(batch_size * qo_len, heads, head_dim, device=device)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), kv_layout, backend=backend)
    wrapper.plan(indptr([qo_len] * batch_size), pool["indptr"], pool["indices"], pool["last"], heads, heads, head_dim,
                 page_size, kv_data_type=torch.uint8, q_data_type=torch.float16)
    compact = wrapper.run(q, (k, v), k_scale=1.0, v_scale=1.0, kv_cache_sf=(k_sf, v_sf))
    out = wrapper.run(q, (strided[0][0], strided[1][0]), k_scale=1.0, v_scale=1.0,
                      kv_cache_sf=(strided[0][1], strided[1][1]))
    close(out, compact.double(), rtol=1e-3, atol=1e-3)
    check_requests(out, None, q, pool, [qo_len] * batch_size, rtol=1e-1, atol=1e-1)
    bad = torch.zeros(*k_sf.shape[:-1], k_sf.shape[-1] * 2, dtype=torch.uint8, device=device)[..., ::2]
    with pytest.raises(ValueError, match=r"kv_cache_sf"):
        wrapper.run(q, (k, v), k_scale=1.0, v_scale=1.0, kv_cache_sf=(bad, v_sf))


ASYMMETRIC = [(dqk, dvo, p, hkv) for (dqk, dvo) in ((512, 256), (256, 128)) for p in (1, 16) for hkv in (2, 8)][::3]


@grid("head_dim_qk, head_dim_vo, page_size, num_kv_heads", ASYMMETRIC, ASYMMETRIC)
def test_batch_prefill_with_paged_kv_cache_nvfp4_asymmetric(device, backend, head_dim_qk, head_dim_vo, page_size,
                                                            num_kv_heads):
    batch_size, kv_len, qo_len, hq = 2, 67, 9, 2 * num_kv_heads
    pool = nvfp4_pool(batch_size, kv_len, page_size, num_kv_heads, head_dim_qk, device, head_dim_vo=head_dim_vo)
    q = randn(batch_size * qo_len, hq, head_dim_qk, device=device)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    wrapper.plan(indptr([qo_len] * batch_size), pool["indptr"], pool["indices"], pool["last"], hq, num_kv_heads,
                 head_dim_qk, page_size, head_dim_vo=head_dim_vo, causal=True, kv_data_type=torch.uint8,
                 q_data_type=torch.float16)
    o = wrapper.run(q, (pool["k"], pool["v"]), k_scale=1.0, v_scale=1.0, kv_cache_sf=(pool["k_sf"], pool["v_sf"]))
    assert o.shape == (batch_size * qo_len, hq, head_dim_vo)
    check_requests(o, None, q, pool, [qo_len] * batch_size, rtol=1e-1, atol=1e-1, causal=True)


RAGGED_NVFP4 = [(128, 64, 128, "NONE", torch.float16), (256, 128, 128, "NONE", torch.bfloat16),
                (256, 64, 512, "NONE", torch.float16), (128, 64, 512, "ROPE_LLAMA", torch.float16)]


@grid("kv_len, qo_len, head_dim, pos_encoding_mode, q_dtype", RAGGED_NVFP4, RAGGED_NVFP4)
@pytest.mark.parametrize("batch_size", [1, 4])
def test_batch_prefill_with_ragged_kv_cache_nvfp4(device, backend, kv_len, qo_len, head_dim, pos_encoding_mode,
                                                  q_dtype, batch_size):
    """Also FlashInfer's ragged nvfp4_large_head and nvfp4_rope_large_head (head dim 512): packed fp4
    K/V rows with their scale factors at run(), against the oracle over the dequantized values."""
    k, k_sf, k_values = nvfp4((batch_size * kv_len, 1, head_dim // 2), device, seed=3)
    v, v_sf, v_values = nvfp4((batch_size * kv_len, 1, head_dim // 2), device, seed=4)
    q = randn(batch_size * qo_len, 1, head_dim, dtype=q_dtype, device=device)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), "NHD", backend=backend)
    wrapper.plan(indptr([qo_len] * batch_size), indptr([kv_len] * batch_size), 1, 1, head_dim, causal=False,
                 pos_encoding_mode=pos_encoding_mode, logits_soft_cap=0.0, kv_data_type=torch.uint8,
                 q_data_type=q_dtype)
    o = wrapper.run(q, k, v, k_scale=1.0, v_scale=1.0, kv_cache_sf=(k_sf, v_sf))
    pool = dict(ks=list(k_values.split(kv_len)), vs=list(v_values.split(kv_len)))
    check_requests(o, None, q, pool, [qo_len] * batch_size, rtol=1e-1, atol=1e-1, pos_encoding=pos_encoding_mode)
