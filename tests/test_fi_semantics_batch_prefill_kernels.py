"""FlashInfer's test_batch_prefill_kernels.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

Both batch prefill wrappers against the fp64 oracle, request by request, with FlashInfer's
tolerance (1e-3; 2e-3 for the wide head dims; 1e-2 for the split-KV case): paged caches as one
5-D tensor or a (k, v) tuple, NHD and HND, contiguous or strided, RoPE (LLaMA), causal, return_lse
with caller-owned out/lse buffers, CUDA-graph replay after a re-plan (GPU), custom masks (equal to
the causal answer), head dims 64..512 and (448, 256), fp8 KV, K and V pools with unequal strides,
and the edge rows (a single huge score, rows with no key: out 0 and lse -inf). On a GPU the cases
FlashInfer runs with ``backend="fa2"`` run with it too. NVFP4 KV (``kv_cache_sf``) and multi-item
scoring are refused, with errors that name the argument and what is allowed.
"""
import pytest
import torch

import dispatch
from _fi_semantics import alibi_slopes, close, grid, indptr, paged_pool, randn, single_ref, workspace

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
