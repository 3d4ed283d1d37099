"""``xqa_batch_decode_with_kv_cache`` (seed 003): paged decode and speculative decode.

out = bmm2_scale * softmax(bmm1_scale * q.k) v. ``o_scale`` cancels inside FlashInfer's XQA and
is NOT applied again. ``seq_lens`` (uint32 or int32) include the draft tokens.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional, Union

import torch

from .. import nvfp4, ops, policy
from ..checks import (Layout, OUT_DTYPES, Scale, Spec, bad, check_indptr_values, check_paged_values, check_scale,
                      need_finite, need_heads, need_index, need_int, need_kv_static, need_out, need_query, need_sinks,
                      need_tensor, need_unit_head_stride, need_window, paged_kv_spec, uniform_indptr)
from ..problem import AttentionBatch, AttentionProblem, dtype_name
from . import _base as B

ENTRY = "xqa_batch_decode_with_kv_cache"


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
    seq_lens = B.int32_lengths(seq_lens)
    if sinks is not None:
        sinks = B.sinks_tensor(sinks, query)
    lane = DECLARATION.lane((query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale,
                             bmm2_scale, window_left, out, sinks, kv_layout, q_len_per_req, o_scale, mask, kv_cache_sf,
                             q_cu_seq_lens), policy.explicit_choice())
    k, v = B.paged_kv(kv_cache, kv_layout)
    z = lane.sizes
    batch = AttentionBatch(
        q=query, k=k, v=v, qo_indptr=q_cu_seq_lens if q_cu_seq_lens is not None else z.qo_indptr, kv_lens=seq_lens,
        out=out if out is not None else torch.empty(z.total_q, z.hq, z.dvo, dtype=z.out_dtype, device=query.device),
        batch_size=z.batch, max_q_len=q_len_per_req, max_kv_len=max_seq_len, sm_scale=bmm1_scale,
        out_scale=bmm2_scale, block_table=block_tables, sinks=sinks, spec_mask=mask if q_len_per_req > 1 else None,
        extras=B.NO_EXTRAS)
    if kv_cache_sf is not None:  # NVFP4: the scale factors' logical NHD views, like k and v
        batch.k_sf, batch.v_sf = nvfp4.paged_sf_views(kv_cache_sf, kv_layout)[:2]
    lane.launch(batch)
    return batch.out


def _problem(spec, d, size: tuple) -> AttentionProblem:
    spec_decode = spec.q_len_per_req > 1
    return AttentionProblem(
        entry=ENTRY, phase="spec_decode" if spec_decode else "decode", kv_storage="paged", kv_layout=spec.kv_layout,
        num_qo_heads=d.hq, num_kv_heads=d.hkv, head_dim_qk=d.dqk, head_dim_vo=d.dvo,
        q_dtype=dtype_name(spec.query.dtype), kv_dtype=dtype_name(d.k.dtype), out_dtype=dtype_name(d.out_dtype),
        page_size=d.page_size, causal=not spec_decode, window_left=spec.window_left,
        mask="spec_bits" if spec_decode else "none", has_sinks=spec.sinks is not None,
        q_len_per_req=spec.q_len_per_req if spec_decode and spec.q_cu_seq_lens is None else 0,
        device_type="cpu" if spec.query.device.type == "cpu" else "cuda", sizes=size,
        replay_kv=size[2] if size else 0)  # its kv size is its length bound: what a graph of it replays


def _sizes(args: dict, d) -> SimpleNamespace:
    """What a repeat of the call builds its batch from (the spec's derived sizes)."""
    qo_indptr = None if args["q_cu_seq_lens"] is not None else uniform_indptr(d.batch, args["q_len_per_req"],
                                                                              args["query"].device)
    return SimpleNamespace(total_q=d.total_q, hq=d.hq, dvo=d.dvo, out_dtype=d.out_dtype, batch=d.batch,
                           qo_indptr=qo_indptr)


ops.register_eager('xqa_batch_decode_with_kv_cache', xqa_batch_decode_with_kv_cache)


# -- the spec: what a call must satisfy (dispatch.checks: the three check groups) ---------------
class XqaDecodeSpec(Spec):
    """``xqa_batch_decode_with_kv_cache``: decode or spec-decode with a uint16 bit mask."""

    query: torch.Tensor
    kv_cache: Any
    workspace_buffer: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_seq_len: int
    bmm1_scale: Scale = 1.0
    bmm2_scale: Scale = 1.0
    window_left: int = -1
    out: Optional[torch.Tensor] = None
    sinks: Optional[torch.Tensor] = None
    kv_layout: Layout = "NHD"
    q_len_per_req: int = 1
    o_scale: float = 1.0
    mask: Optional[torch.Tensor] = None
    kv_cache_sf: Any = None
    q_cu_seq_lens: Optional[torch.Tensor] = None

    def derive(self):
        need_query("query", self.query, dtypes=(torch.float16, torch.bfloat16, torch.float32))
        d = paged_kv_spec(self.kv_cache, self.kv_layout, allow_squeezed=False)
        if nvfp4.packed(d.k):  # NVFP4: head_dim // 2 bytes a row
            d.dqk, d.dvo = d.dqk * 2, d.dvo * 2
        d.hq, d.total_q = self.query.shape[1], self.query.shape[0]
        d.out_dtype = self.out.dtype if self.out is not None else self.query.dtype
        d.batch = self._batch_size(d)
        d.words = 2 * -(-self.q_len_per_req // 32) if isinstance(self.q_len_per_req, int) else 0
        return d

    def _batch_size(self, d) -> int:
        """The batch size most arguments agree on (seq_lens, block_tables, the query rows or
        q_cu_seq_lens), so the one that disagrees is the one blamed."""
        counts = [t.shape[0] for t in (self.seq_lens, self.block_tables) if isinstance(t, torch.Tensor) and t.dim()]
        if isinstance(self.q_cu_seq_lens, torch.Tensor) and self.q_cu_seq_lens.dim():
            counts.append(self.q_cu_seq_lens.shape[0] - 1)
        elif isinstance(self.q_len_per_req, int) and self.q_len_per_req > 0 and not d.total_q % self.q_len_per_req:
            counts.append(d.total_q // self.q_len_per_req)
        return max(counts, key=counts.count) if counts else 0

    def static_checks(self, d):
        q, dev = self.query, self.query.device
        if nvfp4.packed(d.k):
            self.nvfp4_checks(d)
        else:
            need_kv_static(d, q)
            if self.kv_cache_sf is not None:
                raise bad("kv_cache_sf", self.kv_cache_sf, f"None with a {dtype_name(d.k.dtype)} cache (NVFP4 scale "
                          "factors go with a uint8 kv_cache of head_dim // 2 bytes a row)")
        need_int("q_len_per_req", self.q_len_per_req, 1)
        need_window(self.window_left)
        need_index("block_tables", self.block_tables, None, dev)
        need_tensor("block_tables", self.block_tables, ranks=(2,))
        need_index("seq_lens", self.seq_lens, None, dev)
        need_tensor("seq_lens", self.seq_lens, ranks=(1,))
        if d.out_dtype not in OUT_DTYPES:
            raise bad("out.dtype", d.out_dtype, "float16, bfloat16, float32 or an fp8 dtype")
        need_sinks(self.sinks, d.hq, dev)
        if self.q_len_per_req > 1 and self.mask is None:
            raise bad("mask", None, f"a uint16 spec-decode mask (required when q_len_per_req={self.q_len_per_req} > 1)")
        if self.mask is not None:
            need_tensor("mask", self.mask, ranks=(2,) if self.q_cu_seq_lens is not None else (3,),
                        dtypes=(torch.uint16,), device=dev)
        if self.q_cu_seq_lens is not None:
            need_index("q_cu_seq_lens", self.q_cu_seq_lens, None, dev)
            if self.q_len_per_req < 2:
                raise bad("q_len_per_req", self.q_len_per_req, ">= 2 (the longest draft) when q_cu_seq_lens is given")

    def nvfp4_checks(self, d):
        """An NVFP4 cache (FlashInfer 0.7.2: XQA's own kernels serve it on SM12x GPUs only; native-triton
        and the reference on any device): a 16-bit query, the cache's scale factors (dispatch/nvfp4.py)."""
        q = self.query
        nvfp4.need_query_dtype("query.dtype", q.dtype)
        if d.k.device != q.device:
            raise bad("kv_cache.device", d.k.device, f"{q.device}, the device of the query (all tensors on one device)")
        need_unit_head_stride(d)
        if d.dqk != q.shape[2]:
            raise bad("kv_cache head_dim", d.dqk, f"{q.shape[2]} = query.shape[2] ({q.shape[2] // 2} bytes a row: "
                      "NVFP4 holds two values a byte)")
        need_heads(q.shape[1], d.hkv, "query.shape[1] (num_qo_heads)", "num_kv_heads")
        if self.kv_cache_sf is None:
            raise bad("kv_cache_sf", None, f"the NVFP4 scale factors of the uint8 kv_cache ({nvfp4.SF_TEXT} tensors "
                      "like the cache's halves, last dim head_dim // 16)")
        nvfp4.need_paged_sf(self.kv_cache_sf, d)

    def size_checks(self, d):
        dev, b = self.query.device, d.batch
        need_int("max_seq_len", self.max_seq_len, 1)
        need_finite("o_scale", self.o_scale, positive=True)  # a per-call value: not in the cache key
        if b < 1:
            raise bad("seq_lens.shape", tuple(self.seq_lens.shape), "(batch_size,) with batch_size >= 1")
        if self.seq_lens.shape[0] != b:
            raise bad("seq_lens.shape", tuple(self.seq_lens.shape), f"({b},): one length per request "
                      f"(block_tables has {self.block_tables.shape[0]} rows, the query {d.total_q} rows)")
        if self.block_tables.shape[0] != b:
            raise bad("block_tables.shape", tuple(self.block_tables.shape), f"({b}, max_pages), one row per seq_lens entry")
        if self.q_cu_seq_lens is None and d.total_q != b * self.q_len_per_req:
            raise bad("query.shape", tuple(self.query.shape),
                      f"({b * self.q_len_per_req}, {d.hq}, {d.dqk}) = (batch_size * q_len_per_req, heads, head_dim)")
        if self.q_cu_seq_lens is not None:
            need_index("q_cu_seq_lens", self.q_cu_seq_lens, b + 1, dev)
        if self.mask is not None and self.q_len_per_req > 1:
            want = (d.total_q, d.words) if self.q_cu_seq_lens is not None else (b, self.q_len_per_req, d.words)
            if tuple(self.mask.shape) != want:
                raise bad("mask.shape", tuple(self.mask.shape), f"{want} (uint16 pairs of uint32 bit words per draft row)")
        check_scale("bmm1_scale", self.bmm1_scale, dev, values=False)
        check_scale("bmm2_scale", self.bmm2_scale, dev, values=False)
        need_out(self.out, (d.total_q, d.hq, d.dvo), d.out_dtype, dev)

    def value_checks(self, d):
        dev = self.query.device
        if self.q_cu_seq_lens is not None:
            qo = check_indptr_values("q_cu_seq_lens", self.q_cu_seq_lens, d.total_q, "query.shape[0]")
            longest = max((b - a for a, b in zip(qo[:-1], qo[1:])), default=0)
            if longest > self.q_len_per_req:
                raise bad("q_len_per_req", self.q_len_per_req, f">= the longest draft ({longest} from q_cu_seq_lens)")
        if self.seq_lens.numel() and int(self.seq_lens.max()) > self.max_seq_len:
            raise bad("max_seq_len", self.max_seq_len, f">= max(seq_lens) = {int(self.seq_lens.max())}")
        check_paged_values(self.block_tables, self.seq_lens, d.page_size, d.pages)
        check_scale("bmm1_scale", self.bmm1_scale, dev, values=True)
        check_scale("bmm2_scale", self.bmm2_scale, dev, values=True)


DECLARATION = B.Declaration(
    ENTRY, XqaDecodeSpec, ("query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_seq_len",
                           "bmm1_scale", "bmm2_scale", "window_left", "out", "sinks", "kv_layout", "q_len_per_req",
                           "o_scale", "mask", "kv_cache_sf", "q_cu_seq_lens"),
    problem=_problem, sizes=_sizes, unread=("workspace_buffer",),
    size=lambda a: (B.rows(a["block_tables"]), a["q_len_per_req"], a["max_seq_len"]),
    vary={"block_tables": B.ALL_DIMS, "seq_lens": B.ALL_DIMS, "mask": B.ALL_DIMS, "q_cu_seq_lens": B.ALL_DIMS,
          "sinks": B.FULL},
    per_call=("max_seq_len", "bmm1_scale", "bmm2_scale", "o_scale"))
