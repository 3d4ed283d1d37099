"""``xqa_batch_decode_with_kv_cache`` (seed 003): paged decode and speculative decode.

out = bmm2_scale * softmax(bmm1_scale * q.k) v. ``o_scale`` cancels inside FlashInfer's XQA and
is NOT applied again. ``seq_lens`` (uint32 or int32) include the draft tokens.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from .. import ops, policy
from .._normalize import uniform_indptr
from ..problem import AttentionBatch, AttentionProblem, dtype_name
from ..specs import XqaDecodeSpec
from . import _base as B

ENTRY = "xqa_batch_decode_with_kv_cache"
_PER_CALL = ("max_seq_len", "bmm1_scale", "bmm2_scale", "o_scale")
_VARY = {"block_tables": B.ALL_DIMS, "seq_lens": B.ALL_DIMS, "mask": B.ALL_DIMS, "q_cu_seq_lens": B.ALL_DIMS}


def xqa_batch_decode_with_kv_cache(
    query: torch.Tensor, kv_cache, workspace_buffer: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, max_seq_len: int, bmm1_scale: Union[float, torch.Tensor] = 1.0,
    bmm2_scale: Union[float, torch.Tensor] = 1.0, window_left: int = -1, out: Optional[torch.Tensor] = None,
    sinks: Optional[torch.Tensor] = None, kv_layout: str = "NHD", enable_pdl: bool = None,
    q_len_per_req: Optional[int] = 1, o_scale: Optional[float] = 1.0, mask: Optional[torch.Tensor] = None,
    kv_cache_sf=None, *, q_cu_seq_lens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Paged decode (``q_len_per_req`` = 1) or speculative decode (> 1, with ``mask``).

    Parameters
    ----------
    query : (batch_size * q_len_per_req, num_qo_heads, head_dim), or (sum of drafts, ...)
        with ``q_cu_seq_lens``
    kv_cache : (pages, 2, page_size, num_kv_heads, head_dim) for NHD, (pages, 2, num_kv_heads,
        page_size, head_dim) for HND, or a (k_cache, v_cache) tuple of 4-D tensors
    block_tables : (batch_size, max_pages) int32
    seq_lens : (batch_size,) uint32 or int32 KV lengths including the draft tokens
    mask : uint16 (batch_size, q_len_per_req, 2 * ceil(q_len_per_req / 32)) little-endian bit
        words (bit j of row i: draft i sees draft j); the KV prefix is always visible
    sinks : (num_qo_heads,) fp32, or a list of floats

    Returns
    -------
    out (num_tokens, num_qo_heads, head_dim). The workspace is never written.
    """
    if torch.compiler.is_compiling() and kv_cache_sf is None:
        k_cache, v_cache = ops.split_kv(kv_cache)
        (b1, b1_t), (b2, b2_t) = ops.split_scale(bmm1_scale), ops.split_scale(bmm2_scale)
        res = ops.xqa_decode(query, k_cache, v_cache, workspace_buffer, block_tables, B.int32_lengths(seq_lens),
                             max_seq_len, b1, b1_t, b2, b2_t, window_left, B.sinks_tensor(sinks, query), kv_layout,
                             q_len_per_req, o_scale, mask, q_cu_seq_lens)
        return ops.fill(res, out)
    args = dict(query=query, kv_cache=kv_cache, workspace_buffer=workspace_buffer, block_tables=block_tables,
                seq_lens=B.int32_lengths(seq_lens),
                max_seq_len=max_seq_len, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, window_left=window_left,
                out=out, sinks=B.sinks_tensor(sinks, query), kv_layout=kv_layout, q_len_per_req=q_len_per_req,
                o_scale=o_scale, mask=mask, kv_cache_sf=kv_cache_sf, q_cu_seq_lens=q_cu_seq_lens)
    problem, batch = prepare(args)
    B.remember(xqa_batch_decode_with_kv_cache, B.execute(problem, batch, policy.explicit_choice()))
    return batch.out


def _problem(spec, d) -> AttentionProblem:
    spec_decode = spec.q_len_per_req > 1
    return AttentionProblem(
        entry=ENTRY, phase="spec_decode" if spec_decode else "decode", kv_storage="paged", kv_layout=spec.kv_layout,
        num_qo_heads=d.hq, num_kv_heads=d.hkv, head_dim_qk=d.dqk, head_dim_vo=d.dvo,
        q_dtype=dtype_name(spec.query.dtype), kv_dtype=dtype_name(d.k.dtype), out_dtype=dtype_name(d.out_dtype),
        page_size=d.page_size, causal=not spec_decode, window_left=spec.window_left,
        mask="spec_bits" if spec_decode else "none", has_sinks=spec.sinks is not None,
        q_len_per_req=spec.q_len_per_req if spec_decode and spec.q_cu_seq_lens is None else 0,
        device_type="cpu" if spec.query.device.type == "cpu" else "cuda")


def prepare(args: dict) -> tuple[AttentionProblem, AttentionBatch]:
    q = args["query"]
    key = lambda: B.call_key(ENTRY, args, _VARY, _PER_CALL)  # noqa: E731 (built only when needed)
    problem, spec, d = B.checked_repeat(ENTRY, XqaDecodeSpec, args, key, q, _problem,
                                        lambda a: B.paged_views(a["kv_cache"], a["kv_layout"]))
    qlen = args["q_len_per_req"]
    qo = args["q_cu_seq_lens"] if args["q_cu_seq_lens"] is not None else uniform_indptr(d.batch, qlen, q.device)
    batch = AttentionBatch(
        q=q, k=d.k, v=d.v, qo_indptr=qo, kv_lens=args["seq_lens"],
        out=B.new_out(args["out"], d.total_q, d.hq, d.dvo, d.out_dtype, q.device), batch_size=d.batch,
        max_q_len=qlen, max_kv_len=args["max_seq_len"], sm_scale=args["bmm1_scale"], out_scale=args["bmm2_scale"],
        block_table=args["block_tables"], sinks=args["sinks"], spec_mask=args["mask"] if qlen > 1 else None)
    return problem, batch


ops.register_eager('xqa_batch_decode_with_kv_cache', xqa_batch_decode_with_kv_cache)
