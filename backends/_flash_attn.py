"""Dao-AILab FlashAttention providers: ``flash_attn`` (FA2) and ``flash_attn_interface`` (FA3, Hopper).

Translation (flash_attn/flash_attn_interface.py and hopper/flash_attn_interface.py signatures):
* paged: FA2 ``flash_attn_varlen_func(..., block_table=)`` with cu_seqlens_k built from
  kv_lens; FA3 ``flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=,
  page_table=, cu_seqlens_q=, max_seqlen_q=)``; ragged/dense: ``flash_attn_varlen_func``;
* our logical NHD page views are passed as they are (FlashAttention reads strides);
* window_left -> window_size=(W, 0) causal, (W, -1) otherwise (_numerics.flash_window);
* scales: softmax_scale = sm_scale (host float), out_scale applied after the kernel;
  fp8 (FA3): descales left at 1 because our scales are already folded;
* LSE: natural log, head-major (Hq, total_q) -> base 2, token-major, in place.
Caches: none of their own (ALiBi slopes: backends/_numerics.alibi_tensor, keyed on heads,
device with index and dtype, lru_cache(maxsize=64)).
"""
from __future__ import annotations

import torch

from backends import _numerics, _vendor
from backends._device import device_key
from backends._providers import Provider
from backends.base import Reason

SRC_FA2 = "Dao-AILab/flash-attention csrc/flash_attn/flash_api.cpp"
SRC_FA3 = "Dao-AILab/flash-attention hopper/flash_api.cpp"


def alibi_slopes(num_heads: int, device) -> torch.Tensor:
    """FlashInfer's slopes, fp32 (Hq,), made once per (heads, GPU) instead of per call."""
    return _numerics.alibi_tensor(num_heads, device_key(device))


def _host_scale(label: str, batch) -> float:
    """softmax_scale is a host float here (a device tensor is read: a sync); its sign is
    checked now that it is known, still before the launch (see _vendor.refuse_negative_scale)."""
    scale = _vendor.host_float(batch.sm_scale)
    _vendor.refuse_negative_scale(label, scale, label)
    return scale


def _split(result, want_lse: bool):
    """Vendors return out, or (out, lse, ...) when asked for the LSE."""
    if isinstance(result, (tuple, list)):
        return result[0], (result[1] if want_lse else None)
    return result, None


def _finish(batch, out_v: torch.Tensor, lse) -> None:
    batch.out.copy_(out_v.reshape(batch.out.shape))
    _vendor.apply_out_scale(batch.out, batch.out_scale)
    if batch.lse is not None:
        _numerics.write_lse_base2(batch.lse, lse)


class DaoFA2(Provider):
    label = "flash_attn"
    module = "flash_attn"
    extra = "fa2"

    def limits(self, problem) -> list[Reason]:
        out = self.data_limits("fa2", problem)  # head_dim <= 256: capability_db/backends/fa2.json
        if problem.kv_storage == "paged" and problem.page_size % 256:
            out.append(Reason("page_size", problem.page_size, "a multiple of 256", SRC_FA2 + " L613, L736"))
        if problem.kv_dtype != problem.q_dtype:
            out.append(Reason("kv_dtype", problem.kv_dtype, f"equal to q_dtype {problem.q_dtype!r}", SRC_FA2 + " L395-399"))
        if problem.mask != "none":
            out.append(Reason("mask", problem.mask, "'none' (no custom mask)", SRC_FA2))
        if problem.pos_encoding == "ROPE_LLAMA":
            out.append(Reason("pos_encoding", problem.pos_encoding, "'NONE' or 'ALIBI' (RoPE only when appending to a cache)", SRC_FA2))
        if problem.pos_encoding == "ALIBI" and not problem.causal:
            out.append(Reason("causal", False, "True with ALiBi (FA2's bias is -slope*|distance|, FlashInfer's is signed)", SRC_FA2 + " L349-360"))
        return out

    def run(self, problem, state, batch) -> None:
        fa = self.loaded().module
        paged = problem.kv_storage == "paged"
        want_lse = batch.lse is not None
        scale = _host_scale(self.label, batch)
        result = fa.flash_attn_varlen_func(
            batch.q, batch.k, batch.v, batch.qo_indptr,
            _vendor.cu_seqlens(batch.kv_lens) if paged else batch.kv_indptr,
            batch.max_q_len, batch.max_kv_len,
            dropout_p=0.0,
            softmax_scale=scale,
            causal=problem.causal,
            window_size=_numerics.flash_window(problem.window_left, problem.causal),
            softcap=problem.logits_soft_cap,
            alibi_slopes=alibi_slopes(problem.num_qo_heads, batch.q.device) if problem.pos_encoding == "ALIBI" else None,
            return_attn_probs=want_lse,
            block_table=batch.block_table if paged else None,
        )
        _finish(batch, *_split(result, want_lse))


class DaoFA3(Provider):
    label = "flash_attn_interface"
    module = "flash_attn_interface"
    extra = "fa3"

    def limits(self, problem) -> list[Reason]:
        out = self.data_limits("fa3", problem)  # not in a CUDA graph: capability_db/backends/fa3.json
        if problem.head_dim_qk != problem.head_dim_vo:
            out.append(Reason("head_dim_vo", problem.head_dim_vo, f"equal to head_dim_qk {problem.head_dim_qk} (routed pairs)", SRC_FA3 + " L782-792"))
        return out  # K/V dtype = Q's holds for both fa3 providers: capability_db/backends/fa3.json

    def run(self, problem, state, batch) -> None:
        fai = self.loaded().module
        want_lse = batch.lse is not None
        common = dict(softmax_scale=_host_scale(self.label, batch), causal=problem.causal,
                      window_size=_numerics.flash_window(problem.window_left, problem.causal),
                      softcap=problem.logits_soft_cap)
        if problem.kv_storage == "paged":
            result = fai.flash_attn_with_kvcache(
                batch.q, batch.k, batch.v, cache_seqlens=batch.kv_lens, page_table=batch.block_table,
                cu_seqlens_q=batch.qo_indptr, max_seqlen_q=batch.max_q_len,
                return_softmax_lse=want_lse, **common)
        else:
            result = fai.flash_attn_varlen_func(
                batch.q, batch.k, batch.v, batch.qo_indptr, batch.kv_indptr, batch.max_q_len, batch.max_kv_len,
                return_attn_probs=want_lse, **common)
        _finish(batch, *_split(result, want_lse))
