"""FlashInfer-compatible prefill entry points (``flashinfer.prefill``), served by the router.

Signatures follow FlashInfer (see /work/shared/reference/flashinfer-calling-conventions.md
section 2). Validation: the full spec once per signature; per call only size checks, plus
device-data checks for CPU tensors (CUDA: first call per key, or ATTN_DISPATCH_VALIDATE=full).
"""
from __future__ import annotations

import functools
import math

import torch

from . import policy, router
from . import _entry as E
from ._normalize import fold_scale, scatter_padded_lse, unpack_bits, uniform_indptr
from .problem import AttentionBatch, AttentionProblem, dtype_name
from .specs import CudnnPrefillSpec, SinglePrefillSpec, TrtllmContextSpec
from .wrappers import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper  # noqa: F401


def _problem(entry, spec_q, d, **kw) -> AttentionProblem:
    return AttentionProblem(
        entry=entry, num_qo_heads=d.hq, num_kv_heads=d.hkv, head_dim_qk=d.dqk, head_dim_vo=d.dvo,
        q_dtype=dtype_name(spec_q.dtype), kv_dtype=dtype_name(d.k.dtype), out_dtype=dtype_name(d.out_dtype),
        device_type="cpu" if spec_q.device.type == "cpu" else "cuda", **kw)


# -- trtllm-gen context ---------------------------------------------------------------------------
def trtllm_batch_context_with_kv_cache(
    query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
    bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left=-1, out=None, out_dtype=None,
    o_sf_scale=None, o_sf_vec_size=None, kv_layout="HND", enable_pdl=None, sinks=None, kv_cache_sf=None,
    skip_softmax_threshold_scale_factor=None, uses_shared_paged_kv_idx=True, causal=True, lse=None,
    return_lse=False, multi_ctas_kv_counter_buffer=None, use_fp16_softmax=None, uses_spcompress=None,
):
    """Paged context attention. out = bmm2_scale * softmax(bmm1_scale * q.k) v; seq_lens include the
    new tokens; cum_seq_lens_kv is ignored (paged KV). A provided ``lse`` is filled even when
    return_lse=False; with return_lse=True the same object is returned. enable_pdl, the skip-softmax
    threshold and the fp16-softmax/spcompress hints do not change the result and are ignored."""
    problem, batch = _trtllm_prepare(dict(locals()))
    E.remember(trtllm_batch_context_with_kv_cache, router.execute(problem, batch, policy.explicit_choice()))
    return (batch.out, batch.lse) if return_lse else batch.out


_TRTLLM_SIZES = ("max_q_len", "max_kv_len", "batch_size", "bmm1_scale", "bmm2_scale")
_IGNORED = ("workspace_buffer", "cum_seq_lens_kv", "enable_pdl", "skip_softmax_threshold_scale_factor",
            "multi_ctas_kv_counter_buffer", "use_fp16_softmax", "uses_spcompress")


def _trtllm_prepare(a: dict):
    a["_decode"] = a["max_q_len"] == 1
    sig = E.signature("trtllm", {k: v for k, v in a.items() if k not in _IGNORED}, loose=("block_tables",),
                      full=("sinks",), sizes=_TRTLLM_SIZES)
    a.pop("_decode")
    q = a["query"]
    wants_lse = a["return_lse"] or a["lse"] is not None

    def build(spec, d):
        return _problem("trtllm_batch_context_with_kv_cache", q, d,
                        phase="decode" if spec.max_q_len == 1 else "prefill", kv_storage="paged",
                        kv_layout=spec.kv_layout, page_size=d.page_size, causal=spec.causal,
                        window_left=spec.window_left, has_sinks=spec.sinks is not None, return_lse=wants_lse)

    problem, spec, d = E.checked(TrtllmContextSpec, a, sig, q.device, build)
    batch = AttentionBatch(
        q=q, k=d.k, v=d.v, qo_indptr=a["cum_seq_lens_q"], kv_lens=a["seq_lens"],
        out=E.new_out(a["out"], d.total_q, d.hq, d.dvo, d.out_dtype, q.device), batch_size=a["batch_size"],
        max_q_len=a["max_q_len"], max_kv_len=a["max_kv_len"], sm_scale=a["bmm1_scale"],
        out_scale=a["bmm2_scale"], block_table=a["block_tables"],
        lse=E.new_lse(a["lse"], d.total_q, d.hq, q.device, wants_lse), sinks=a["sinks"])
    return problem, batch


# -- cuDNN ---------------------------------------------------------------------------------------
def cudnn_batch_prefill_with_kv_cache(
    q, k_cache, v_cache, scale, workspace_buffer, *, max_token_per_sequence, max_sequence_kv,
    actual_seq_lens_q=None, actual_seq_lens_kv=None, block_tables=None, causal, return_lse, q_scale=None,
    k_scale=None, v_scale=None, batch_offsets_q=None, batch_offsets_o=None, batch_offsets_k=None,
    batch_offsets_v=None, batch_offsets_stats=None, batch_offsets_units="elements", out=None, lse=None,
    is_cuda_graph_compatible=False, backend=None, o_data_type=None,
):
    """cuDNN's batch prefill: paged K/V read as (pages, Hkv, P, D) by index whatever the strides,
    or ragged 3-D K/V located by batch_offsets_k/v. Offsets are tensor elements by default
    (q: x Hq*Dqk, o: x Hq*Dvo, k: x Hkv*Dqk, v: x Hkv*Dvo) or tokens with
    batch_offsets_units="tokens". Always returns (out, lse or None); the LSE is fp32 BASE 2 of
    shape (B, max_token_per_sequence, Hq), rows past a request's length are -inf.
    batch_offsets_stats is accepted and ignored (the LSE layout is always padded)."""
    explicit = policy.explicit_choice(backend)
    problem, batch, padded = _cudnn_prepare(dict(locals()))
    E.remember(cudnn_batch_prefill_with_kv_cache, router.execute(problem, batch, explicit))
    if not return_lse:
        return batch.out, None
    scatter_padded_lse(batch.lse, batch.qo_indptr, padded)
    return batch.out, padded


_CUDNN_IGNORED = ("workspace_buffer", "batch_offsets_stats", "backend", "explicit")
_CUDNN_SIZES = ("max_token_per_sequence", "max_sequence_kv", "scale", "q_scale", "k_scale", "v_scale")


def _cudnn_prepare(a: dict):
    a["_decode"] = a["max_token_per_sequence"] == 1
    sig = E.signature("cudnn", {k: v for k, v in a.items() if k not in _CUDNN_IGNORED},
                      loose=("block_tables",), sizes=_CUDNN_SIZES)
    a.pop("_decode")
    q = a["q"]

    def build(spec, d):
        return _problem("cudnn_batch_prefill_with_kv_cache", q, d,
                        phase="decode" if spec.max_token_per_sequence == 1 else "prefill",
                        kv_storage="paged" if d.paged else "ragged", kv_layout="HND" if d.paged else "NHD",
                        page_size=d.page_size if d.paged else 0, causal=spec.causal,
                        return_lse=spec.return_lse, cuda_graph=spec.is_cuda_graph_compatible)

    problem, spec, d = E.checked(CudnnPrefillSpec, a, sig, q.device, build)
    qo_indptr, kv_indptr, kv_lens = _cudnn_indices(a, d)
    batch = AttentionBatch(
        q=q, k=d.k, v=d.v, qo_indptr=qo_indptr, kv_lens=kv_lens,
        out=E.new_out(a["out"], d.total_q, d.hq, d.dvo, d.out_dtype, q.device), batch_size=d.batch,
        max_q_len=a["max_token_per_sequence"], max_kv_len=a["max_sequence_kv"],
        sm_scale=fold_scale(a["scale"], a["q_scale"], a["k_scale"]), out_scale=fold_scale(1.0, a["v_scale"]),
        kv_indptr=kv_indptr, block_table=a["block_tables"],
        lse=E.new_lse(None, d.total_q, d.hq, q.device, a["return_lse"]),
        extras={"actual_seq_lens_q": a["actual_seq_lens_q"], "actual_seq_lens_kv": a["actual_seq_lens_kv"]})
    padded = None
    if a["return_lse"]:
        padded = a["lse"] if a["lse"] is not None else torch.empty(
            d.batch, a["max_token_per_sequence"], d.hq, dtype=torch.float32, device=q.device)
    return problem, batch, padded


def _cumsum0(lens: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    out[1:] = lens.reshape(-1).cumsum(0)
    return out


def _cudnn_indices(a: dict, d):
    """Token-unit qo_indptr / kv_indptr and (B,) kv_lens from cuDNN's offsets and lengths."""
    tokens = a["batch_offsets_units"] == "tokens"
    if a["batch_offsets_q"] is not None:
        off = a["batch_offsets_q"].reshape(-1)
        qo = off if tokens else (off // (d.hq * d.dqk)).to(torch.int32)
    elif a["actual_seq_lens_q"] is not None:
        qo = _cumsum0(a["actual_seq_lens_q"])
    else:
        qo = uniform_indptr(1, d.total_q, a["q"].device)
    kv_indptr = None
    if not d.paged:
        if a["batch_offsets_k"] is not None:
            off = a["batch_offsets_k"].reshape(-1)
            kv_indptr = off if tokens else (off // (d.hkv * d.dqk)).to(torch.int32)
        else:
            kv_indptr = _cumsum0(a["actual_seq_lens_kv"])
    if a["actual_seq_lens_kv"] is not None:
        kv_lens = a["actual_seq_lens_kv"].reshape(-1)
    else:
        kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
    return qo, kv_indptr, kv_lens


# -- single prefill ------------------------------------------------------------------------------
def single_prefill_with_kv_cache(
    q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None, packed_custom_mask=None,
    causal=False, kv_layout="NHD", pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None,
    window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None, backend="auto", return_lse=False,
    kv_cache_sf=None, k_scale=None, v_scale=None,
):
    """One request: q (qo_len, Hq, Dqk), k/v (kv_len, Hkv, D) NHD or (Hkv, kv_len, D) HND.
    Returns out, or (out, lse) with lse (qo_len, Hq) fp32 base 2. k_scale multiplies the logits,
    v_scale the output. Per-head fp8 scale_q/k/v and NVFP4 are not supported."""
    explicit = policy.explicit_choice(backend)
    problem, batch = _single_prepare(dict(locals()))
    E.remember(single_prefill_with_kv_cache, router.execute(problem, batch, explicit))
    return (batch.out, batch.lse) if return_lse else batch.out


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache, return_lse=True)

_SINGLE_SIZES = ("sm_scale", "k_scale", "v_scale")


def _single_prepare(a: dict):
    a["_decode"] = a["q"].shape[0] == 1 if isinstance(a["q"], torch.Tensor) and a["q"].dim() else None
    sig = E.signature("single", {k: v for k, v in a.items() if k not in ("backend", "explicit")},
                      loose=("k", "v", "custom_mask"), sizes=_SINGLE_SIZES)
    a.pop("_decode")
    q = a["q"]

    def build(spec, d):
        mask = "custom" if spec.custom_mask is not None or spec.packed_custom_mask is not None else "none"
        return _problem("single_prefill_with_kv_cache", q, d, phase="decode" if d.qo_len == 1 else "prefill",
                        kv_storage="dense", kv_layout=spec.kv_layout, causal=spec.causal,
                        window_left=spec.window_left, mask=mask, logits_soft_cap=float(spec.logits_soft_cap or 0.0),
                        pos_encoding=spec.pos_encoding_mode, rope_scale=float(spec.rope_scale or 1.0),
                        rope_theta=float(spec.rope_theta or 1e4), return_lse=spec.return_lse)

    problem, spec, d = E.checked(SinglePrefillSpec, a, sig, q.device, build)
    sm_scale = a["sm_scale"] if a["sm_scale"] is not None else 1.0 / math.sqrt(d.dqk)
    custom = _single_mask(a, d)
    batch = AttentionBatch(
        q=q, k=d.k, v=d.v, qo_indptr=uniform_indptr(1, d.qo_len, q.device),
        kv_lens=uniform_indptr(1, d.kv_len, q.device)[1:], out=E.new_out(None, d.qo_len, d.hq, d.dvo, d.out_dtype,
                                                                         q.device),
        batch_size=1, max_q_len=d.qo_len, max_kv_len=d.kv_len, sm_scale=fold_scale(sm_scale, a["k_scale"]),
        out_scale=fold_scale(1.0, a["v_scale"]), kv_indptr=uniform_indptr(1, d.kv_len, q.device),
        lse=E.new_lse(None, d.qo_len, d.hq, q.device, a["return_lse"]), custom_mask=custom,
        mask_indptr=uniform_indptr(1, d.qo_len * d.kv_len, q.device) if custom is not None else None)
    return problem, batch


def _single_mask(a: dict, d):
    if a["custom_mask"] is not None:
        return a["custom_mask"].reshape(-1)
    if a["packed_custom_mask"] is not None:
        n = d.qo_len * d.kv_len
        return unpack_bits(a["packed_custom_mask"], [(n + 7) // 8], [n])
    return None
