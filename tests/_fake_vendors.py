"""Fake vendor modules for tests/test_vendor_contracts.py (CPU, no vendor package needed).

Each fake records its calls and computes its result *in the vendor's own convention*
(natural-log head-major LSE for FlashAttention, FlashInfer's CSR page lists, XQA's
scale folding as FlashInfer 0.5.3 does it, ...), from an fp64 attention core. A
wrong translation in an adapter therefore shows up as a wrong number, not only as
a wrong argument. The fp64 core (``attend``), the batch builders and the reference of our
semantics live in dispatch/benchmark/vendors.py (the one oracle in a vendor's terms); they are
re-exported here for the contract tests.
"""
from __future__ import annotations

import math
import sys
import types

import torch

from backends.native.nvfp4 import dequantize
from dispatch.checks import unpack_bits
from dispatch.benchmark.oracle import packbits_little
from dispatch.benchmark.vendors import attend, make_batch, make_problem, reference, to_device

__all__ = ["Recorder", "attend", "make_batch", "make_flash_attn", "make_flash_attn_interface", "make_flashinfer",
           "make_problem", "reference", "to_device"]


def _pages_to_seq(cache, pages, length, layout):
    """Gather one request's tokens from a 4-D page cache in ``layout``."""
    if layout == "HND":
        cache = cache.transpose(1, 2)
    return cache[pages].reshape(-1, cache.shape[2], cache.shape[3])[:length]


class Recorder:
    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def add(self, name, **kw):
        self.calls.append((name, kw))

    def last(self, name):
        return [kw for n, kw in self.calls if n == name][-1]


# -- flashinfer ------------------------------------------------------------------------------
def make_flashinfer(rec: Recorder, version="0.5.3", new_api=False):
    """flashinfer with decode.xqa_batch_decode_with_kv_cache, prefill.trtllm_batch_context_with_kv_cache
    and the two prefill wrappers. ``new_api``: the >= 0.6.17 signatures (mask/causal/lse)."""
    fi = types.ModuleType("flashinfer")
    fi.__version__ = version
    decode, prefill = types.ModuleType("flashinfer.decode"), types.ModuleType("flashinfer.prefill")
    fi.decode, fi.prefill = decode, prefill
    decode.xqa_batch_decode_with_kv_cache = _xqa_new(rec) if new_api else _xqa_053(rec)
    prefill.trtllm_batch_context_with_kv_cache = _trtllm_new(rec) if new_api else _trtllm_053(rec)
    prefill.BatchPrefillWithPagedKVCacheWrapper = _paged_wrapper(rec)
    prefill.BatchPrefillWithRaggedKVCacheWrapper = _ragged_wrapper(rec)
    prefill.single_prefill_with_kv_cache = _single_prefill(rec)
    _single_prefill_internals(prefill, rec)
    return {"flashinfer": fi, "flashinfer.decode": decode, "flashinfer.prefill": prefill}


def install_flashinfer(monkeypatch, rec: Recorder) -> dict:
    """``make_flashinfer``'s modules in sys.modules for the test (monkeypatch restores them); the
    backends' import cache forgotten, so they import the fakes. Call ``_vendor.forget_imports()``
    again once the test is done."""
    from backends import _vendor
    mods = make_flashinfer(rec)
    for name in ("flashinfer", "flashinfer.decode", "flashinfer.prefill"):
        monkeypatch.setitem(sys.modules, name, mods.get(name))
    _vendor.forget_imports()
    return mods


def _xqa_compute(rec, query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale, bmm2_scale,
                 window_left, out, sinks, kv_layout, q_len_per_req=1, mask=None, q_cu_seq_lens=None):
    k_cache, v_cache = kv_cache
    assert workspace_buffer.dtype == torch.uint8 and workspace_buffer.numel() >= 8 * 2 ** 20
    assert int(workspace_buffer[: 8 * 2 ** 20].count_nonzero()) == 0, "semaphores must be zeroed"
    quantized = k_cache.dtype.itemsize < 2
    bmm1 = float(bmm1_scale.item() if isinstance(bmm1_scale, torch.Tensor) else bmm1_scale)
    bmm2 = float(bmm2_scale.item() if isinstance(bmm2_scale, torch.Tensor) else bmm2_scale)
    # FlashInfer 0.5.3 folds bmm2 into kv_scale, which the kernel applies only to a quantized cache.
    logit_scale, out_mult = (bmm1, bmm2) if quantized else (bmm1 / bmm2, 1.0)
    b = block_tables.shape[0]
    psize = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
    qo = q_cu_seq_lens if q_cu_seq_lens is not None else torch.arange(b + 1) * q_len_per_req
    rows = mask.reshape(-1, mask.shape[-1]) if mask is not None else None
    for i in range(b):
        n = int(seq_lens[i])
        pages = block_tables[i, : (n + psize - 1) // psize].long()
        k = _pages_to_seq(k_cache, pages, n, kv_layout).float()
        v = _pages_to_seq(v_cache, pages, n, kv_layout).float()
        q = query[int(qo[i]): int(qo[i + 1])]
        dm = None
        if rows is not None:  # bit j of row r (uint32 words from uint16 pairs): draft r sees draft j
            words = rows[int(qo[i]): int(qo[i + 1])].view(torch.int32).long() & 0xFFFFFFFF
            bits = ((words[:, :, None] >> torch.arange(32)) & 1).reshape(q.shape[0], -1)[:, : q.shape[0]].bool()
            dm = torch.cat([torch.ones(q.shape[0], n - q.shape[0], dtype=torch.bool), bits], 1)
        o, _ = attend(q, k, v, scale=logit_scale, lo=window_left if window_left >= 0 else None,
                      sinks=sinks.reshape(-1) if sinks is not None else None, mask=dm)
        out[int(qo[i]): int(qo[i + 1])] = (o * out_mult).to(out.dtype)
    return out


def _xqa_053(rec):
    def xqa_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len,
                                       bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, sinks=None,
                                       kv_layout="NHD", enable_pdl=None, q_len_per_req=1, o_scale=1.0):
        assert q_len_per_req == 1, "xqa not support speculative decoding yet"
        rec.add("xqa", query=query, kv_cache=kv_cache, block_tables=block_tables, seq_lens=seq_lens,
                max_seq_len=max_seq_len, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, window_left=window_left,
                out=out, sinks=sinks, kv_layout=kv_layout)
        return _xqa_compute(rec, query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale,
                            bmm2_scale, window_left, out, sinks, kv_layout)
    return xqa_batch_decode_with_kv_cache


def _xqa_new(rec):
    def xqa_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len,
                                       bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, sinks=None,
                                       kv_layout="NHD", enable_pdl=None, q_len_per_req=1, o_scale=1.0, mask=None,
                                       kv_cache_sf=None, q_cu_seq_lens=None):
        assert q_len_per_req == 1 or mask is not None
        assert mask is None or mask.dtype == torch.uint16
        rec.add("xqa", query=query, bmm2_scale=bmm2_scale, q_len_per_req=q_len_per_req, mask=mask,
                q_cu_seq_lens=q_cu_seq_lens, kv_layout=kv_layout, window_left=window_left)
        return _xqa_compute(rec, query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale,
                            bmm2_scale, window_left, out, sinks, kv_layout, q_len_per_req, mask, q_cu_seq_lens)
    return xqa_batch_decode_with_kv_cache


def _trtllm_compute(query, kv_cache, block_tables, seq_lens, bmm1_scale, bmm2_scale, cum_seq_lens_q,
                    window_left, out, kv_layout, sinks, causal, lse):
    k_cache, v_cache = kv_cache
    psize = k_cache.shape[2] if kv_layout == "HND" else k_cache.shape[1]
    bmm1 = float(bmm1_scale.item() if isinstance(bmm1_scale, torch.Tensor) else bmm1_scale)
    bmm2 = float(bmm2_scale.item() if isinstance(bmm2_scale, torch.Tensor) else bmm2_scale)
    if window_left >= 0 and not causal:
        raise NotImplementedError("sliding window requires causal")
    for i in range(block_tables.shape[0]):
        n = int(seq_lens[i])
        # a (batch, 2, pages) table (uses_shared_paged_kv_idx=False): K's page ids, then V's
        k_ids, v_ids = (block_tables[i, 0], block_tables[i, 1]) if block_tables.dim() == 3 else (block_tables[i],) * 2
        k = _pages_to_seq(k_cache, k_ids[: (n + psize - 1) // psize].long(), n, kv_layout).float()
        v = _pages_to_seq(v_cache, v_ids[: (n + psize - 1) // psize].long(), n, kv_layout).float()
        a, z = int(cum_seq_lens_q[i]), int(cum_seq_lens_q[i + 1])
        o, l = attend(query[a:z], k, v, scale=bmm1, lo=window_left if window_left >= 0 else None,
                      hi=0 if causal else None, sinks=sinks)
        out[a:z] = (o * bmm2).to(out.dtype)
        if lse is not None:
            lse[a:z] = (l / math.log(2.0)).float()  # base 2, token-major
    return out


def _trtllm_053(rec):
    def trtllm_batch_context_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len,
                                           max_kv_len, bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q,
                                           cum_seq_lens_kv, window_left=-1, out=None, out_dtype=None,
                                           o_sf_scale=None, o_sf_vec_size=None, kv_layout="HND",
                                           enable_pdl=None, sinks=None):
        rec.add("trtllm", bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, kv_layout=kv_layout)
        return _trtllm_compute(query, kv_cache, block_tables, seq_lens, bmm1_scale, bmm2_scale, cum_seq_lens_q,
                               window_left, out, kv_layout, sinks, True, None)
    return trtllm_batch_context_with_kv_cache


def _trtllm_new(rec):
    def trtllm_batch_context_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len,
                                           max_kv_len, bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q,
                                           cum_seq_lens_kv, window_left=-1, out=None, out_dtype=None,
                                           o_sf_scale=None, o_sf_vec_size=None, kv_layout="HND", enable_pdl=None,
                                           sinks=None, kv_cache_sf=None, skip_softmax_threshold_scale_factor=None,
                                           uses_shared_paged_kv_idx=True, causal=True, lse=None, return_lse=False):
        rec.add("trtllm", query=query, block_tables=block_tables, seq_lens=seq_lens, max_q_len=max_q_len,
                max_kv_len=max_kv_len, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, batch_size=batch_size,
                cum_seq_lens_q=cum_seq_lens_q, window_left=window_left, out=out, kv_layout=kv_layout,
                sinks=sinks, causal=causal, lse=lse, uses_shared_paged_kv_idx=uses_shared_paged_kv_idx)
        assert block_tables.dim() == (2 if uses_shared_paged_kv_idx else 3), "FlashInfer's block_tables rank rule"
        return _trtllm_compute(query, kv_cache, block_tables, seq_lens, bmm1_scale, bmm2_scale, cum_seq_lens_q,
                               window_left, out, kv_layout, sinks, causal, lse)
    return trtllm_batch_context_with_kv_cache


class _WrapperBase:
    rec: Recorder

    def __init__(self, float_workspace_buffer, kv_layout="NHD", backend="auto"):
        self.kv_layout, self.backend = kv_layout, backend
        self.rec.add("wrapper_init", kv_layout=kv_layout, backend=backend)

    def _run(self, q, k_of, v_of, out, lse):
        kw = self.kw
        assert q.dtype == kw["q_data_type"], "q dtype must equal the planned q_data_type"
        lo = kw["window_left"] if kw["window_left"] >= 0 else None
        hi = 0 if kw["causal"] else None
        masks = self._masks()
        for b in range(len(self.qo) - 1):
            a, z = int(self.qo[b]), int(self.qo[b + 1])
            k, v = k_of(b), v_of(b)
            o, l = attend(q[a:z].float(), k.float(), v.float(), scale=kw["sm_scale"], lo=lo, hi=hi,
                          soft_cap=kw["logits_soft_cap"] or 0.0, mask=masks[b] if masks else None)
            out[a:z] = o.to(out.dtype)
            if lse is not None:
                lse[a:z] = (l / math.log(2.0)).float()
        return (out, lse) if lse is not None else out

    def _masks(self):
        cm = self.kw.get("custom_mask")
        if cm is None:
            return None
        masks, off = [], 0
        for b in range(len(self.qo) - 1):
            lq, lk = int(self.qo[b + 1] - self.qo[b]), self._kv_len(b)
            masks.append(cm[off: off + lq * lk].reshape(lq, lk))
            off += lq * lk
        return masks


def _paged_wrapper(rec):
    class BatchPrefillWithPagedKVCacheWrapper(_WrapperBase):
        def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                 num_kv_heads, head_dim_qk, page_size, **kw):
            self.qo, self.indptr, self.indices, self.last = qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len
            self.page_size, self.kw = page_size, kw
            rec.add("paged_plan", qo_indptr=qo_indptr, kv_indptr=paged_kv_indptr, indices=paged_kv_indices,
                    last=paged_kv_last_page_len, heads=(num_qo_heads, num_kv_heads), head_dim=head_dim_qk,
                    page_size=page_size, **kw)

        def _kv_len(self, b):
            n = int(self.indptr[b + 1] - self.indptr[b])
            return 0 if n == 0 else (n - 1) * self.page_size + int(self.last[b])

        def run(self, q, paged_kv_cache, out=None, lse=None, return_lse=False):
            k_cache, v_cache = paged_kv_cache
            rec.add("paged_run", q=q, out=out, lse=lse, return_lse=return_lse, k_cache=k_cache)

            def gather(cache):
                return lambda b: _pages_to_seq(cache, self.indices[int(self.indptr[b]): int(self.indptr[b + 1])].long(),
                                               self._kv_len(b), self.kv_layout)
            return self._run(q, gather(k_cache), gather(v_cache), out, lse if return_lse else None)
    BatchPrefillWithPagedKVCacheWrapper.rec = rec
    return BatchPrefillWithPagedKVCacheWrapper


def _ragged_wrapper(rec):
    class BatchPrefillWithRaggedKVCacheWrapper(_WrapperBase):
        def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, **kw):
            self.qo, self.kv, self.kw = qo_indptr, kv_indptr, kw
            rec.add("ragged_plan", qo_indptr=qo_indptr, kv_indptr=kv_indptr, **kw)

        def _kv_len(self, b):
            return int(self.kv[b + 1] - self.kv[b])

        def run(self, q, k, v, out=None, lse=None, return_lse=False):
            rec.add("ragged_run", q=q, out=out, lse=lse)
            sl = lambda t: (lambda b: t[int(self.kv[b]): int(self.kv[b + 1])])
            return self._run(q, sl(k), sl(v), out, lse if return_lse else None)
    BatchPrefillWithRaggedKVCacheWrapper.rec = rec
    return BatchPrefillWithRaggedKVCacheWrapper


def _single_prefill(rec):
    """FlashInfer's single-request prefill (0.5.3 keywords); returns fresh out (and base-2 lse)."""
    def single_prefill_with_kv_cache(q, k, v, custom_mask=None, causal=False, kv_layout="NHD",
                                     pos_encoding_mode="NONE", sm_scale=None, window_left=-1, logits_soft_cap=None,
                                     rope_scale=None, rope_theta=None, backend="auto", return_lse=False,
                                     kv_cache_sf=None):
        rec.add("single_prefill", q=q, k=k, kv_layout=kv_layout, backend=backend, sm_scale=sm_scale,
                causal=causal, window_left=window_left, custom_mask=custom_mask, kv_cache_sf=kv_cache_sf)
        if kv_cache_sf is not None:  # FlashInfer >= 0.6.18: NVFP4 K/V (uint8) with their scale-factor bytes
            assert k.dtype == v.dtype == torch.uint8 and all(sf.dtype == torch.uint8 for sf in kv_cache_sf)
            k, v = (dequantize(x, sf) for x, sf in zip((k, v), kv_cache_sf))
        if kv_layout == "HND":
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        o, l = attend(q.float(), k.float(), v.float(), scale=sm_scale, lo=window_left if window_left >= 0 else None,
                      hi=0 if causal else None, soft_cap=logits_soft_cap or 0.0, mask=custom_mask)
        out = o.to(q.dtype)
        return (out, (l / math.log(2.0)).float()) if return_lse else out
    return single_prefill_with_kv_cache


def _single_prefill_internals(prefill, rec):
    """flashinfer 0.5.x's compiled single-prefill op and the helpers its public function uses."""
    import enum
    prefill.MaskMode = enum.Enum("MaskMode", {"NON_CAUSAL": 0, "CAUSAL": 1, "CUSTOM": 2})
    prefill.TensorLayout = enum.Enum("TensorLayout", {"NHD": 0, "HND": 1})
    prefill.PosEncodingMode = enum.Enum("PosEncodingMode", {"NONE": 0, "ROPE_LLAMA": 1, "ALIBI": 2})
    prefill._get_cache_alibi_slopes_buf = lambda heads, device: torch.zeros(heads, device=device)

    def packbits(x, bitorder="big"):
        """FlashInfer's quantization.packbits of a 1-D tensor (the little bit order alone here)."""
        rec.add("packbits", x=x, bitorder=bitorder)
        assert bitorder == "little", "the fake packs little-endian only"
        return packbits_little(x.to(torch.bool)).to(x.device)
    prefill.packbits = packbits

    def run(q, k, v, tmp, o, lse, mask_mode, layout, window_left, packed_mask, alibi, soft_cap, sm_scale,
            scale_q, scale_k, scale_v, rope_scale, rope_theta):
        rec.add("single_prefill_op", q=q, k=k, o=o, lse=lse, mask_mode=mask_mode, layout=layout, sm_scale=sm_scale,
                packed_mask=packed_mask)
        if layout == 1:
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        mask = None
        if mask_mode == 2:  # MaskMode.CUSTOM: the little-endian packed (q_len, kv_len) mask
            n = q.shape[0] * k.shape[0]
            mask = unpack_bits(packed_mask, [packed_mask.numel()], [n]).view(q.shape[0], k.shape[0])
        res, l = attend(q.float(), k.float(), v.float(), scale=sm_scale, lo=window_left if window_left >= 0 else None,
                        hi=0 if mask_mode == 1 else None, soft_cap=soft_cap, mask=mask)
        o.copy_(res.to(o.dtype))
        if lse is not None:
            lse.copy_((l / math.log(2.0)).float())

    prefill.get_single_prefill_module = lambda backend, *args: types.SimpleNamespace(run=run)


# -- Dao-AILab FlashAttention ----------------------------------------------------------------
def _fa_window(causal, window_size):
    left, right = window_size
    if causal:
        right = 0
    return (left if left >= 0 else None), (right if right >= 0 else None)


def _fa_compute(q, kv_of, cu_q, nb, scale, causal, window_size, softcap, alibi, head_major_lse, empty_lse):
    lo, hi = _fa_window(causal, window_size)
    out = torch.empty(q.shape, dtype=q.dtype)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32)
    for b in range(nb):
        a, z = int(cu_q[b]), int(cu_q[b + 1])
        k, v = kv_of(b)
        o, l = attend(q[a:z].float(), k.float(), v.float(), scale=scale, lo=lo, hi=hi, soft_cap=softcap, alibi=alibi)
        out[a:z] = o.to(q.dtype)
        lse[:, a:z] = l.transpose(0, 1).float().nan_to_num(neginf=empty_lse)  # natural log, head-major
    return out, lse


def make_flash_attn(rec: Recorder):
    fa = types.ModuleType("flash_attn")
    fa.__version__ = "2.8.4"

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        assert isinstance(softmax_scale, float)
        if block_table is not None and k.shape[1] % 256:
            raise RuntimeError("Paged KV cache block size must be divisible by 256")
        rec.add("fa2", cu_q=cu_seqlens_q, cu_k=cu_seqlens_k, max_q=max_seqlen_q, max_k=max_seqlen_k,
                scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                alibi=alibi_slopes, block_table=block_table, return_attn_probs=return_attn_probs)

        def kv_of(b):
            n = int(cu_seqlens_k[b + 1] - cu_seqlens_k[b])
            if block_table is None:
                return k[int(cu_seqlens_k[b]): int(cu_seqlens_k[b + 1])], v[int(cu_seqlens_k[b]): int(cu_seqlens_k[b + 1])]
            pages = block_table[b, : (n + k.shape[1] - 1) // k.shape[1]].long()
            return _pages_to_seq(k, pages, n, "NHD"), _pages_to_seq(v, pages, n, "NHD")
        out, lse = _fa_compute(q, kv_of, cu_seqlens_q, len(cu_seqlens_q) - 1, softmax_scale, causal, window_size,
                               softcap, alibi_slopes, True, math.inf)  # FA2: +inf on rows with no key
        return (out, lse, None) if return_attn_probs else out
    fa.flash_attn_varlen_func = flash_attn_varlen_func
    return {"flash_attn": fa}


def make_flash_attn_interface(rec: Recorder):
    fai = types.ModuleType("flash_attn_interface")

    def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, page_table=None, cu_seqlens_q=None,
                                max_seqlen_q=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                                softcap=0.0, return_softmax_lse=False, **unused):
        rec.add("fa3_kvcache", cache_seqlens=cache_seqlens, page_table=page_table, cu_q=cu_seqlens_q,
                max_q=max_seqlen_q, scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap)

        def kv_of(b):
            n = int(cache_seqlens[b])
            pages = page_table[b, : (n + k_cache.shape[1] - 1) // k_cache.shape[1]].long()
            return _pages_to_seq(k_cache, pages, n, "NHD"), _pages_to_seq(v_cache, pages, n, "NHD")
        out, lse = _fa_compute(q, kv_of, cu_seqlens_q, len(cu_seqlens_q) - 1, softmax_scale, causal, window_size,
                               softcap, None, True, -math.inf)
        return (out, lse) if return_softmax_lse else out

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                               causal=False, window_size=(-1, -1), softcap=0.0, return_attn_probs=False, **unused):
        rec.add("fa3_varlen", scale=softmax_scale, causal=causal, window_size=window_size)
        kv_of = lambda b: (k[int(cu_seqlens_k[b]): int(cu_seqlens_k[b + 1])], v[int(cu_seqlens_k[b]): int(cu_seqlens_k[b + 1])])
        out, lse = _fa_compute(q, kv_of, cu_seqlens_q, len(cu_seqlens_q) - 1, softmax_scale, causal, window_size,
                               softcap, None, True, -math.inf)
        return (out, lse) if return_attn_probs else out
    fai.flash_attn_with_kvcache = flash_attn_with_kvcache
    fai.flash_attn_varlen_func = flash_attn_varlen_func
    return {"flash_attn_interface": fai}
