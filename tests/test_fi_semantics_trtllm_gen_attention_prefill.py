"""FlashInfer's test_trtllm_gen_attention_prefill.py, restated through ``dispatch`` (see docs/flashinfer-tests.md).

``trtllm_batch_context_with_kv_cache`` against the fp64 oracle with FlashInfer's tolerances (1e-2;
fp8 q 4e-2/6e-2 with a 16-bit output, 5e-2/7e-2 with an fp8 output): HND and NHD paged caches, K and
V sharing page ids or with ids of their own (``uses_shared_paged_kv_idx=False``: FlashInfer's test
interleaves the pages into one pool, K of page p at 2p and V at 2p + 1, a (batch, 2, pages) table into
``(pool, pool)``), causal or not, sinks, window, fp8 q/KV/out with their scales folded into
``bmm1_scale``/``bmm2_scale``, a non-contiguous query, head dims 128/256/512, page sizes up to 1024,
and the LSE contract (returned, caller-provided, base 2). The skip-softmax threshold FlashInfer's
test sets (1e-30) is a speed hint here. On a GPU the cases also run with ``backend="trtllm-gen"``
(FlashInfer 0.7's argument on this entry): it has kernels for compute capability 10 only,
elsewhere the refusal names the capability. NVFP4 (KV or
output) is refused by name. FlashInfer's ``trtllm_ragged_attention_deepseek`` tests
(test_trtllm_gen_prefill*) call an entry point ``dispatch`` does not have.
"""
import math

import pytest
import torch

import dispatch
import dispatch.prefill  # FlashInfer's tests call flashinfer.prefill.<entry>
from _fi_semantics import (CPU_KERNEL, INTERPRETED, close, expect_hardware_refusal, grid, needs_other_hardware, nvfp4,
                           randn, sample, smallest, workspace)
from oracle import attention_fp64

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
TOLERANCES = {("fp8", "fp8"): 5e-2, ("fp8", "bf16"): 4e-2, ("fp8", "fp16"): 4e-2}


def fp8_of(values: torch.Tensor):
    """FlashInfer's to_float8: the largest magnitude at a tenth of fp8's range; the dequantizing scale."""
    scale = torch.finfo(torch.float8_e4m3fn).max / values.abs().max().clamp_min(1e-12) * 0.1
    return (values * scale).to(torch.float8_e4m3fn), float(1.0 / scale)


def stored(values: torch.Tensor, dtype: str):
    """(tensor as stored, dequantizing scale, the fp64 values the kernel sees)."""
    if dtype == "fp8":
        t, scale = fp8_of(values)
        return t, scale, t.double() * scale
    t = values.to(DTYPES[dtype])
    return t, 1.0, t.double()


def make_case(batch_size, page_size, num_kv_heads, head_grp_size, head_dim, q_dtype, kv_dtype, kv_layout,
              max_q_len, max_kv_len, uses_shared_paged_kv_idx, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_lens = torch.randint(1, max_q_len + 1, (batch_size,), generator=g)
    q_lens[-1] = max_q_len
    in_kv = torch.randint(0, max_kv_len + 1, (batch_size,), generator=g)
    in_kv[-1] = max_kv_len
    seq_lens = (q_lens + in_kv).tolist()
    q_lens = q_lens.tolist()
    hq = num_kv_heads * head_grp_size
    ref_dtype = "bf16" if q_dtype == "fp8" else q_dtype
    q, q_scale, q_seen = stored(torch.randn(sum(q_lens), hq, head_dim, generator=g).to(DTYPES[ref_dtype]).float(),
                                q_dtype)
    per = -(-max(seq_lens) // page_size)
    table = torch.randperm(batch_size * per, generator=g).reshape(batch_size, per).to(torch.int32)
    k, k_scale, k_seen = stored(torch.randn(batch_size * per, page_size, num_kv_heads, head_dim,
                                            generator=g).to(DTYPES[ref_dtype]).float(), kv_dtype)
    v, v_scale, v_seen = stored(torch.randn(batch_size * per, page_size, num_kv_heads, head_dim,
                                            generator=g).to(DTYPES[ref_dtype]).float(), kv_dtype)
    ks = [k_seen[table[b].long()].flatten(0, 1)[:n] for b, n in enumerate(seq_lens)]
    vs = [v_seen[table[b].long()].flatten(0, 1)[:n] for b, n in enumerate(seq_lens)]
    if kv_layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    cache = torch.stack([k, v], dim=1)
    if not uses_shared_paged_kv_idx:  # TensorRT-LLM's form: K of page p at 2p, V at 2p + 1
        pool = cache.reshape(cache.shape[0] * 2, *cache.shape[2:])
        cache, table = (pool, pool), torch.stack([2 * table, 2 * table + 1], dim=1)
    return dict(q=q.to(device), q_seen=q_seen, q_lens=q_lens, seq_lens=seq_lens, cache=cache, table=table, ks=ks,
                vs=vs, hq=hq, scales=(q_scale, k_scale, v_scale))


def to_device(value, device):
    return tuple(t.to(device) for t in value) if isinstance(value, tuple) else value.to(device)


def reference(c, causal, window_left, sinks, sm_scale, device):
    """fp64 per request, on ``device`` (a GPU computes FlashInfer's large sizes in seconds)."""
    outs, lses, start = [], [], 0
    for n, k, v in zip(c["q_lens"], c["ks"], c["vs"]):
        out, lse = attention_fp64(c["q_seen"][start:start + n].to(device), k.to(device), v.to(device),
                                  sm_scale=sm_scale, causal=causal, window_left=window_left,
                                  sinks=None if sinks is None else sinks.to(device))
        outs.append(out)
        lses.append(lse)
        start += n
    return torch.cat(outs), torch.cat(lses)


def run_case(device, backend, kv_layout, batch_size, page_size, num_kv_heads, head_grp_size, causal, window_left,
             q_dtype, kv_dtype, o_dtype, enable_sink, max_q_len, max_kv_len, head_dim, non_contiguous_query=False,
             uses_shared_paged_kv_idx=True, return_lse=None, provide_lse=False, skips_softmax=False):
    c = make_case(batch_size, page_size, num_kv_heads, head_grp_size, head_dim, q_dtype, kv_dtype, kv_layout,
                  max_q_len, max_kv_len, uses_shared_paged_kv_idx, device)
    g = torch.Generator().manual_seed(5)
    sinks = torch.rand(c["hq"], generator=g) * 5 if enable_sink else None
    o_scale = 0.5 + 0.5 * float(torch.rand(1, generator=g)) if o_dtype == "fp8" else 1.0
    q_scale, k_scale, v_scale = c["scales"]
    sm_scale = 1.0 / math.sqrt(head_dim)
    q = c["q"]
    if non_contiguous_query:
        wide = torch.zeros(*q.shape[:-1], 2 * head_dim, dtype=q.dtype, device=device)
        wide[..., :head_dim] = q
        q = wide[..., :head_dim]
    lse = torch.full((sum(c["q_lens"]), c["hq"]), math.nan, device=device) if provide_lse else None
    cu_q = torch.tensor([0] + torch.tensor(c["q_lens"]).cumsum(0).tolist(), dtype=torch.int32, device=device)
    pages = [-(-n // page_size) for n in c["seq_lens"]]
    cu_kv = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32, device=device)

    def call():
        return dispatch.prefill.trtllm_batch_context_with_kv_cache(
            q, to_device(c["cache"], device), workspace(device), c["table"].to(device),
            torch.tensor(c["seq_lens"], dtype=torch.int32, device=device), max(c["q_lens"]), max(c["seq_lens"]),
            q_scale * k_scale * sm_scale, v_scale / o_scale, batch_size, cu_q, cu_kv, window_left, causal=causal,
            out_dtype=DTYPES[o_dtype], kv_layout=kv_layout, sinks=sinks.to(device) if enable_sink else None,
            skip_softmax_threshold_scale_factor=1e-30 if skips_softmax else None,
            uses_shared_paged_kv_idx=uses_shared_paged_kv_idx, lse=lse, return_lse=bool(return_lse), backend=backend)
    if needs_other_hardware(device, backend):
        return expect_hardware_refusal(call)
    if return_lse is None:  # FlashInfer checks the LSE where its reference has one it trusts
        return_lse = not (enable_sink or skips_softmax or q_dtype == "fp8")
    result = call()
    output, lse_out = result if return_lse else (result, lse)
    ref, ref_lse = reference(c, causal, window_left, sinks, sm_scale, device)
    tol = TOLERANCES.get((q_dtype, o_dtype), 1e-2)
    close(output.float() * o_scale, ref, rtol=tol, atol=tol + (2e-2 if q_dtype == "fp8" else 0.0))
    if lse_out is not None:
        check_lse(lse_out, ref_lse, lse if provide_lse else None, (sum(c["q_lens"]), c["hq"]))


def check_lse(lse_out, ref_lse, provided, shape) -> None:
    """fp32 (tokens, Hq), base 2 (1e-3); a caller's buffer is the one returned."""
    assert lse_out.dtype == torch.float32 and lse_out.shape == shape
    assert provided is None or lse_out is provided
    close(lse_out, ref_lse, rtol=1e-3, atol=1e-3)

SHAPES = [(4, 16, 2, 1), (4, 32, 4, 5), (4, 64, 4, 8), (128, 16, 2, 5), (128, 32, 4, 1), (128, 64, 2, 8),
          (256, 16, 4, 8), (256, 32, 2, 8), (256, 64, 4, 1), (256, 64, 4, 5)]
SERVED_DTYPES = [("bf16", "bf16", "bf16"), ("fp16", "fp16", "fp16"), ("fp8", "fp8", "bf16"), ("fp8", "fp8", "fp16"),
                 ("fp8", "fp8", "fp8")]
PREFILL_CPU = sample([(layout, 3, p, hkv, grp, dt, sink, d, ncq, shared, causal)
                      for layout in ("HND", "NHD") for (_, p, hkv, grp) in SHAPES[:3] for dt in SERVED_DTYPES
                      for sink in (True, False) for d in (128, 256) for ncq in (False, True)
                      for shared in (True, False) for causal in (True, False)], 20)
PREFILL_GPU = [("HND", b, p, hkv, grp, dt, sink, d, ncq, shared, causal)
               for (b, p, hkv, grp), dt, sink, d, ncq, shared, causal in (
                   (SHAPES[3], SERVED_DTYPES[0], True, 128, False, True, True),
                   (SHAPES[6], SERVED_DTYPES[4], False, 256, True, False, True),
                   (SHAPES[9], SERVED_DTYPES[2], True, 128, False, False, False))]
FIELDS = ("kv_layout, batch_size, page_size, num_kv_heads, head_grp_size, dtypes, enable_sink, head_dim, "
          "non_contiguous_query, uses_shared_paged_kv_idx, causal")


@grid(FIELDS, PREFILL_CPU, PREFILL_GPU, named="trtllm-gen")
@pytest.mark.parametrize("skips_softmax", [False, True])
def test_trtllm_batch_prefill(device, backend, kv_layout, batch_size, page_size, num_kv_heads, head_grp_size, dtypes,
                              enable_sink, head_dim, non_contiguous_query, uses_shared_paged_kv_idx, causal,
                              skips_softmax):
    max_q, max_kv = (31, 97) if device == "cpu" else (511, 2047)
    run_case(device, backend, kv_layout, batch_size, page_size, num_kv_heads, head_grp_size, causal, -1, *dtypes,
             enable_sink, max_q, max_kv, head_dim, non_contiguous_query, uses_shared_paged_kv_idx,
             skips_softmax=skips_softmax)


LSE_CONTRACT = [(r, p) for r in (False, True) for p in (False, True)]


@grid("return_lse, provide_lse", LSE_CONTRACT, LSE_CONTRACT, named="trtllm-gen")
def test_trtllm_batch_prefill_lse_contract(device, backend, return_lse, provide_lse):
    """The LSE is fp32 (tokens, Hq) base 2; a caller's lse tensor is filled in place and returned."""
    run_case(device, backend, "HND", 2, 16, 2, 2, True, -1, "fp16", "fp16", "fp16", False, 64, 128, 128,
             return_lse=return_lse, provide_lse=provide_lse)


BS1_CPU = [(layout, d, shared) for layout in ("HND", "NHD") for d in (128, 256) for shared in (True, False)][::3]


@grid("kv_layout, head_dim, uses_shared_paged_kv_idx", BS1_CPU, [("HND", 128, True), ("NHD", 256, False)],
      named="trtllm-gen")
def test_trtllm_batch_prefill_bs1(device, backend, kv_layout, head_dim, uses_shared_paged_kv_idx):
    length = 160 if device == "cpu" else 8192
    run_case(device, backend, kv_layout, 1, 16, 2, 8, True, -1, "bf16", "bf16", "bf16", False, length, length,
             head_dim, uses_shared_paged_kv_idx=uses_shared_paged_kv_idx)


CUBIN = [(d, w, dt, sink) for (d, w) in ((128, -1), (256, -1), (128, 27)) for dt in SERVED_DTYPES[2:]
         for sink in (False, True)][::2]


@grid("head_dim, window_left, dtypes, enable_sink", CUBIN, CUBIN[:3], named="trtllm-gen",
      native=smallest(CUBIN, lambda c: c[2][2] == "fp8"))  # fp8 q, KV and output
def test_trtllm_batch_prefill_cubin_variants(device, backend, head_dim, window_left, dtypes, enable_sink):
    """fp8 q/KV with 16-bit or fp8 output, head dims 128/256, sliding window, sinks."""
    max_q, max_kv = (23, 61) if device == "cpu" else (511, 2047)
    run_case(device, backend, "HND", 4, 16, 2, 1, True, window_left, *dtypes, enable_sink, max_q, max_kv, head_dim)


PAGE_SIZES = [(p, shared) for p in (128, 256, 512, 1024) for shared in (True, False)][::3]


@grid("page_size, uses_shared_paged_kv_idx", PAGE_SIZES, PAGE_SIZES, named="trtllm-gen")
def test_trtllm_batch_prefill_dynamic_page_size_gqa(device, backend, page_size, uses_shared_paged_kv_idx):
    run_case(device, backend, "HND", 2, page_size, 2, 8, True, -1, "bf16", "bf16", "bf16", False, 17, 300, 128,
             uses_shared_paged_kv_idx=uses_shared_paged_kv_idx)


HEAD_DIM_512 = [(layout, q, kv, shared) for layout in ("HND", "NHD") for (q, kv) in ((1, 61), (31, 61), (17, 130))
                for shared in (True, False)][::3]


@grid("kv_layout, max_q_len, max_kv_len, uses_shared_paged_kv_idx", HEAD_DIM_512,
      [("HND", 255, 511, True), ("NHD", 511, 2047, False)], named="trtllm-gen")
def test_trtllm_batch_prefill_head_dim_512(device, backend, kv_layout, max_q_len, max_kv_len,
                                           uses_shared_paged_kv_idx):
    run_case(device, backend, kv_layout, 4, 16, 2, 2, True, -1, "bf16", "bf16", "bf16", False, max_q_len, max_kv_len,
             512, uses_shared_paged_kv_idx=uses_shared_paged_kv_idx)


NVFP4_CASES = [("fp8", "fp8", "nvfp4"), ("fp8", "nvfp4", "fp8")]


@grid("q_dtype, kv_dtype, o_dtype", NVFP4_CASES, NVFP4_CASES, named="trtllm-gen")
def test_trtllm_batch_prefill_nvfp4_refused(device, backend, q_dtype, kv_dtype, o_dtype):
    """FlashInfer's NVFP4 rows of test_trtllm_batch_prefill: an NVFP4 output (o_sf_scale,
    o_sf_vec_size) or an NVFP4 KV cache (kv_cache_sf) is refused by name."""
    batch_size, page_size, hkv, head_dim, seq = 2, 16, 2, 128, 40
    per = -(-seq // page_size)
    q = randn(batch_size * 8, hkv, head_dim, device=device).to(torch.float8_e4m3fn)
    kw = {}
    if kv_dtype == "nvfp4":
        k, k_sf, _ = nvfp4((batch_size * per, hkv, page_size, head_dim // 2), device, seed=3)
        cache, kw["kv_cache_sf"] = (k, k), (k_sf, k_sf)
    else:
        cache = randn(batch_size * per, 2, hkv, page_size, head_dim, device=device).to(torch.float8_e4m3fn)
    if o_dtype == "nvfp4":
        kw.update(o_sf_scale=1.0, o_sf_vec_size=16)
    table = torch.arange(batch_size * per, dtype=torch.int32, device=device).reshape(batch_size, per)
    cu_q = torch.tensor([0, 8, 16], dtype=torch.int32, device=device)
    named = r"(kv_cache_sf|kv_block_scales|o_sf_scale|o_sf_vec_size|kv_cache\.dtype)=.*allowed"
    with pytest.raises((ValueError, TypeError, dispatch.BackendRefusedError), match=named):
        dispatch.prefill.trtllm_batch_context_with_kv_cache(
            q, cache, workspace(device), table, torch.full((batch_size,), seq, dtype=torch.int32, device=device), 8,
            seq, head_dim ** -0.5, 1.0, batch_size, cu_q, cu_q, kv_layout="HND", backend=backend, **kw)


def separate_tables_case(seed=3, pages=20, page_size=4, hkv=2, group=2, head_dim=64, q_lens=(3, 1, 5),
                         kv_lens=(9, 14, 21)):
    """A (k_cache, v_cache) pair of NHD pools and (batch, 2, pages) tables whose K and V ids differ:
    request b's K pages at k_ids[b], its V pages at v_ids[b] (another permutation of the pool)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(pages, page_size, hkv, head_dim, generator=g).half()
    v = torch.randn(pages, page_size, hkv, head_dim, generator=g).half()
    per = -(-max(kv_lens) // page_size)
    k_ids = torch.randperm(pages, generator=g)[: len(kv_lens) * per].reshape(len(kv_lens), per).to(torch.int32)
    v_ids = torch.randperm(pages, generator=g)[: len(kv_lens) * per].reshape(len(kv_lens), per).to(torch.int32)
    q = torch.randn(sum(q_lens), hkv * group, head_dim, generator=g).half()
    return q, (k, v), k_ids, v_ids


def call_trtllm(q, cache, table, kv_lens, q_lens, backend, shared, **kw):
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return dispatch.prefill.trtllm_batch_context_with_kv_cache(
        q, cache, workspace("cpu"), table, torch.tensor(kv_lens, dtype=torch.int32), max(q_lens), max(kv_lens),
        q.shape[-1] ** -0.5, 1.0, len(kv_lens), cu_q, cu_q, kv_layout="NHD", uses_shared_paged_kv_idx=shared,
        backend=backend, **kw)


@pytest.mark.parametrize("backend", ["reference", pytest.param(CPU_KERNEL, marks=INTERPRETED)])
def test_separate_page_tables_conversion(backend):
    """uses_shared_paged_kv_idx=False: K's ids index k_cache's pages, V's ids v_cache's (FlashInfer's
    semantics); with ids that differ the result is the oracle's over those pages, the same pages in
    one interleaved pool (FlashInfer's test's form) give it exactly, and a (batch, 2, pages) table
    holding the same ids twice equals the shared table's result exactly."""
    q_lens, kv_lens = (3, 1, 5), (9, 14, 21)
    q, (k, v), k_ids, v_ids = separate_tables_case(q_lens=q_lens, kv_lens=kv_lens)
    out = call_trtllm(q, (k, v), torch.stack([k_ids, v_ids], dim=1), kv_lens, q_lens, backend, False)
    start, ref = 0, []
    for b, (n, kv) in enumerate(zip(q_lens, kv_lens)):
        keys = k[k_ids[b].long()].flatten(0, 1)[:kv].double()
        values = v[v_ids[b].long()].flatten(0, 1)[:kv].double()
        ref.append(attention_fp64(q[start:start + n].double(), keys, values, sm_scale=q.shape[-1] ** -0.5,
                                  causal=True)[0])
        start += n
    close(out.float(), torch.cat(ref), rtol=1e-2, atol=1e-2)
    pool = torch.stack([k, v], dim=1).flatten(0, 1)  # TensorRT-LLM's pool: K of page p at 2p, V at 2p + 1
    interleaved = call_trtllm(q, (pool, pool), torch.stack([2 * k_ids, 2 * v_ids + 1], dim=1), kv_lens, q_lens,
                              backend, False)
    assert torch.equal(interleaved, out)
    shared = call_trtllm(q, (k, v), k_ids, kv_lens, q_lens, backend, True)
    twice = call_trtllm(q, (k, v), torch.stack([k_ids, k_ids], dim=1), kv_lens, q_lens, backend, False)
    assert torch.equal(shared, twice)


def test_separate_page_tables_refusals():
    """Named refusals, the caller's out untouched: a 2-D table with separate ids, a (batch, 3, pages)
    table, a V id past the cache's pages, and a backend with one table for K and V."""
    q_lens, kv_lens = (3, 1, 5), (9, 14, 21)
    q, cache, k_ids, v_ids = separate_tables_case(q_lens=q_lens, kv_lens=kv_lens)
    out = torch.full((q.shape[0], q.shape[1], q.shape[2]), 7.0, dtype=q.dtype)
    bad_v = v_ids.clone()
    bad_v[2, 0] = 20
    cases = [(k_ids, "auto", r"block_tables=.*allowed a 3-D tensor \(batch_size, 2, max_pages\) with "
                             r"uses_shared_paged_kv_idx=False"),
             (torch.stack([k_ids, v_ids, v_ids], dim=1), "auto",
              r"block_tables\.shape=\(3, 3, 6\): allowed \(batch_size, 2, max_pages\)"),
             (torch.stack([k_ids, bad_v], dim=1), "auto", r"block_tables\[:, 1\]=20: allowed page ids in \[0, 20\)"),
             (torch.stack([k_ids, v_ids], dim=1), "fa2", r"uses_shared_paged_kv_idx=False: allowed True")]
    for table, backend, named in cases:
        with pytest.raises((ValueError, TypeError, dispatch.BackendRefusedError), match=named):
            call_trtllm(q, cache, table, kv_lens, q_lens, backend, False, out=out)
        assert bool((out == 7.0).all())
