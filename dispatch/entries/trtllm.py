"""``trtllm_batch_context_with_kv_cache`` (seed 001): paged context attention, TensorRT-LLM style.

out = bmm2_scale * softmax(bmm1_scale * q.k) v; ``seq_lens`` (uint32 or int32) are the total KV
lengths including the new tokens; ``cum_seq_lens_kv`` is ignored for paged KV (FlashInfer's
own tests pass page counts there).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional, Union

import torch

from .. import ops, policy
from ..checks import (Layout, OUT_DTYPES, Scale, Spec, bad, check_indptr_values, check_paged_values, check_scale,
                      need_index, need_int, need_kv_static, need_out, need_query, need_sinks, need_tensor, need_window,
                      out_dtype_of, paged_kv_spec)
from ..problem import AttentionBatch, AttentionProblem, dtype_name
from . import _base as B
from ._base import UNSET

ENTRY = "trtllm_batch_context_with_kv_cache"
_PER_CALL = ("max_q_len", "max_kv_len", "batch_size", "bmm1_scale", "bmm2_scale")
_VARY = {"block_tables": B.ALL_DIMS, "seq_lens": B.ALL_DIMS, "cum_seq_lens_q": B.ALL_DIMS, "sinks": B.FULL}


def trtllm_batch_context_with_kv_cache(
    query: torch.Tensor, kv_cache, workspace_buffer: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, max_q_len: int, max_kv_len: int, bmm1_scale: Union[float, torch.Tensor],
    bmm2_scale: Union[float, torch.Tensor], batch_size: int, cum_seq_lens_q: torch.Tensor,
    cum_seq_lens_kv: torch.Tensor, window_left: int = -1, out: Optional[torch.Tensor] = None, out_dtype=None,
    o_sf_scale: Optional[float] = None, o_sf_vec_size: Optional[int] = None, kv_layout: str = "HND",
    enable_pdl: Optional[bool] = None, sinks=None, kv_block_scales=UNSET,
    skip_softmax_threshold_scale_factor: Optional[float] = None, uses_shared_paged_kv_idx: bool = True, *,
    kv_cache_sf=UNSET, causal: bool = True, lse: Optional[torch.Tensor] = None, return_lse: bool = False,
    multi_ctas_kv_counter_buffer=None, use_fp16_softmax: Optional[bool] = None,
    uses_spcompress: Optional[bool] = None,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Paged context (prefill) attention.

    Parameters
    ----------
    query : (num_tokens, num_qo_heads, head_dim)
    kv_cache : (pages, 2, num_kv_heads, page_size, head_dim) for HND, (pages, 2, page_size,
        num_kv_heads, head_dim) for NHD, or a (k_cache, v_cache) tuple of 4-D tensors
    block_tables : (batch_size, max_pages_per_seq) int32
    seq_lens : (batch_size,) uint32 or int32, KV length per request including the new tokens
    cum_seq_lens_q : (batch_size + 1,) int32 token prefix sums of the queries
    sinks : (num_qo_heads,) fp32 tensor, or a list of floats / of one such tensor
    lse : (num_tokens, num_qo_heads) fp32 base 2, filled whenever given

    Returns
    -------
    out (num_tokens, num_qo_heads, head_dim), or (out, lse) with ``return_lse``. enable_pdl,
    the skip-softmax threshold and the fp16-softmax/spcompress hints never change the result
    and are ignored. NVFP4 (``kv_block_scales``/``kv_cache_sf``, ``o_sf_*``) is refused.
    """
    block_scales = B.one_of("kv_block_scales", kv_block_scales, "kv_cache_sf", kv_cache_sf, None)
    if torch.compiler.is_compiling() and block_scales is None and o_sf_scale is None and o_sf_vec_size is None:
        return _compiled(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
                         bmm2_scale, batch_size, cum_seq_lens_q, window_left, out, out_dtype, kv_layout, sinks,
                         causal, lse, return_lse)
    seq_lens = B.int32_lengths(seq_lens)
    if sinks is not None:
        sinks = B.sinks_tensor(sinks, query)
    explicit = policy.explicit_choice()
    hot = _hot_key(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
                   bmm2_scale, batch_size, cum_seq_lens_q, window_left, out, out_dtype, o_sf_scale, o_sf_vec_size,
                   kv_layout, sinks, block_scales, uses_shared_paged_kv_idx, causal, lse, return_lse, explicit)
    lane = B.HOT_LANES.get(hot) if hot is not None else None
    if lane is None:
        lane = _lane(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
                     bmm2_scale, batch_size, cum_seq_lens_q, window_left, out, out_dtype, o_sf_scale, o_sf_vec_size,
                     kv_layout, sinks, block_scales, uses_shared_paged_kv_idx, causal, lse, return_lse, explicit, hot)
    k, v = B.paged_kv(kv_cache, kv_layout)
    z = lane.sizes
    device = query.device
    if out is None:
        out = torch.empty(z.total_q, z.hq, z.dvo, dtype=z.out_dtype, device=device)
    if lse is None and return_lse:
        lse = torch.empty(z.total_q, z.hq, dtype=torch.float32, device=device)
    # positional: AttentionBatch's field order (keywords cost ~0.5 us a call on this path)
    batch = AttentionBatch(query, k, v, cum_seq_lens_q, seq_lens, out, batch_size, max_q_len, max_kv_len, bmm1_scale,
                           bmm2_scale, None, block_tables, lse, sinks, None, None, None, B.NO_EXTRAS)
    B.remember(trtllm_batch_context_with_kv_cache, lane.launch(batch))
    return (out, lse) if return_lse else out


def _hot_key(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
             bmm2_scale, batch_size, cum_seq_lens_q, window_left, out, out_dtype, o_sf_scale, o_sf_vec_size, kv_layout,
             sinks, block_scales, uses_shared, causal, lse, return_lse, explicit) -> Optional[tuple]:
    """The short key of a default-option call (float scales, a 5-D cache or a (k, v) pair; no out,
    lse, sinks or NVFP4), or None: each value it holds is of a fixed type, so it maps to one full key."""
    if not (out is None and out_dtype is None and o_sf_scale is None and o_sf_vec_size is None and sinks is None
            and block_scales is None and lse is None and type(return_lse) is bool and type(causal) is bool
            and type(window_left) is int and type(kv_layout) is str and type(uses_shared) is bool
            and type(bmm1_scale) is float and type(bmm2_scale) is float and type(max_q_len) is int
            and type(max_kv_len) is int and type(batch_size) is int and type(query) is _T
            and type(workspace_buffer) is _T and type(block_tables) is _T and type(seq_lens) is _T
            and type(cum_seq_lens_q) is _T and B.lanes_open(query)):
        return None
    if type(kv_cache) is _T:
        kv = (kv_cache,)
    elif type(kv_cache) is tuple and len(kv_cache) == 2 and type(kv_cache[0]) is _T and type(kv_cache[1]) is _T:
        kv = kv_cache
    else:
        return None
    key = [ENTRY, explicit, policy.strict_mode(), max_q_len, max_kv_len, bmm1_scale, bmm2_scale, batch_size,
           window_left, kv_layout, uses_shared, causal, return_lse, len(kv)]
    for t in (query, block_tables, seq_lens, cum_seq_lens_q) + kv:  # the workspace: its type only (unread)
        key += (t.dtype, t.device, t.shape, t.stride())
    return tuple(key)


_T = torch.Tensor


def _lane(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
          batch_size, cum_seq_lens_q, window_left, out, out_dtype, o_sf_scale, o_sf_vec_size, kv_layout, sinks,
          block_scales, uses_shared, causal, lse, return_lse, explicit, hot) -> B.Lane:
    """The call's lane by its full key (checked once per call key); kept under ``hot`` too."""
    key = B.lane_key(ENTRY, (query, workspace_buffer, block_tables, seq_lens, cum_seq_lens_q) + B.kv_parts(kv_cache),
                     (max_q_len, max_kv_len, bmm1_scale, bmm2_scale, batch_size, window_left, out, out_dtype,
                      o_sf_scale, o_sf_vec_size, kv_layout, sinks, block_scales, uses_shared, causal, lse, return_lse),
                     explicit)
    lane = B.lane(key, TrtllmContextSpec, lambda: dict(
        query=query, kv_cache=kv_cache, workspace_buffer=workspace_buffer, block_tables=block_tables,
        seq_lens=seq_lens, max_q_len=max_q_len, max_kv_len=max_kv_len, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale,
        batch_size=batch_size, cum_seq_lens_q=cum_seq_lens_q, window_left=window_left, out=out, out_dtype=out_dtype,
        o_sf_scale=o_sf_scale, o_sf_vec_size=o_sf_vec_size, kv_layout=kv_layout, sinks=sinks,
        kv_cache_sf=block_scales, uses_shared_paged_kv_idx=uses_shared, causal=causal, lse=lse,
        return_lse=return_lse), _call_key, _problem, _sizes, explicit)
    if hot is not None and key is not None:
        B.HOT_LANES.put(hot, lane)
    return lane


def _compiled(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
              bmm2_scale, batch_size, cum_seq_lens_q, window_left, out, out_dtype, kv_layout, sinks, causal, lse,
              return_lse):
    """Under torch.compile: the op call (validation runs inside it), then the caller's buffers."""
    k_cache, v_cache = ops.split_kv(kv_cache)
    (b1, b1_t), (b2, b2_t) = ops.split_scale(bmm1_scale), ops.split_scale(bmm2_scale)
    wants_lse = return_lse or lse is not None
    res, res_lse = ops.trtllm_context(
        query, k_cache, v_cache, workspace_buffer, block_tables, B.int32_lengths(seq_lens), max_q_len, max_kv_len, b1,
        b1_t, b2, b2_t, batch_size, cum_seq_lens_q, window_left, out.dtype if out is not None and out_dtype is None
        else out_dtype, kv_layout, B.sinks_tensor(sinks, query), causal, wants_lse)
    res = ops.fill(res, out)
    res_lse = ops.fill(res_lse, lse) if wants_lse else None
    return (res, res_lse) if return_lse else res


B.seed_signature(trtllm_batch_context_with_kv_cache, {"kv_block_scales": None, "kv_cache_sf": None})


def _problem(spec, d, args: dict) -> AttentionProblem:
    return AttentionProblem(
        entry=ENTRY, phase="decode" if spec.max_q_len == 1 else "prefill", kv_storage="paged",
        kv_layout=spec.kv_layout, num_qo_heads=d.hq, num_kv_heads=d.hkv, head_dim_qk=d.dqk, head_dim_vo=d.dvo,
        q_dtype=dtype_name(spec.query.dtype), kv_dtype=dtype_name(d.k.dtype), out_dtype=dtype_name(d.out_dtype),
        page_size=d.page_size, causal=spec.causal, window_left=spec.window_left, has_sinks=spec.sinks is not None,
        return_lse=spec.return_lse or spec.lse is not None,
        device_type="cpu" if spec.query.device.type == "cpu" else "cuda", sizes=_size(args) or ())


def _size(args: dict):
    return B.size_key(args["batch_size"], args["max_q_len"], args["max_kv_len"])


def _call_key(args: dict) -> tuple:
    # max_q_len == 1 makes it a decode problem: a fact of the key, not only a per-call size.
    return B.call_key(ENTRY, args, _VARY, _PER_CALL) + (args["max_q_len"] == 1, _size(args))


def _sizes(args: dict, d) -> SimpleNamespace:
    return SimpleNamespace(total_q=d.total_q, hq=d.hq, dvo=d.dvo, out_dtype=d.out_dtype)


ops.register_eager('trtllm_batch_context_with_kv_cache', trtllm_batch_context_with_kv_cache)


# -- the spec: what a call must satisfy (dispatch.checks: the three check groups) ---------------
class TrtllmContextSpec(Spec):
    """``trtllm_batch_context_with_kv_cache``: paged 5-D/tuple cache, seq_lens incl. new tokens."""

    query: torch.Tensor
    kv_cache: Any
    workspace_buffer: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_q_len: int
    max_kv_len: int
    bmm1_scale: Scale
    bmm2_scale: Scale
    batch_size: int
    cum_seq_lens_q: torch.Tensor
    cum_seq_lens_kv: Any = None  # ignored for paged KV (FlashInfer tests pass page counts)
    window_left: int = -1
    out: Optional[torch.Tensor] = None
    out_dtype: Any = None
    o_sf_scale: Optional[float] = None
    o_sf_vec_size: Optional[int] = None
    kv_layout: Layout = "HND"
    sinks: Optional[torch.Tensor] = None
    kv_cache_sf: Any = None
    uses_shared_paged_kv_idx: bool = True
    causal: bool = True
    lse: Optional[torch.Tensor] = None
    return_lse: bool = False

    def derive(self):
        need_query("query", self.query)
        d = paged_kv_spec(self.kv_cache, self.kv_layout, allow_squeezed=False)
        d.hq, d.total_q = self.query.shape[1], self.query.shape[0]
        if isinstance(self.out_dtype, str) and self.out_dtype == "nvfp4":
            raise bad("out_dtype", "nvfp4", "float16, bfloat16, float32 or an fp8 dtype (NVFP4 output is not supported)")
        d.out_dtype = out_dtype_of(self.query.dtype, self.out_dtype if self.out_dtype is not None else
                                   (self.out.dtype if self.out is not None else None))
        return d

    def static_checks(self, d):
        q, dev = self.query, self.query.device
        need_kv_static(d, q)
        if not self.uses_shared_paged_kv_idx:
            raise bad("uses_shared_paged_kv_idx", False, "True (separate K/V page tables are not supported)")
        for name in ("kv_cache_sf", "o_sf_scale", "o_sf_vec_size"):
            if getattr(self, name) is not None:
                raise bad(name, getattr(self, name), "None (NVFP4 KV/output is not supported)")
        if d.out_dtype not in OUT_DTYPES:  # blame the argument the dtype came from
            raise bad("out_dtype" if self.out_dtype is not None else "out.dtype", d.out_dtype,
                      "float16, bfloat16, float32 or an fp8 dtype")
        need_window(self.window_left)
        need_index("block_tables", self.block_tables, None, dev)
        need_tensor("block_tables", self.block_tables, ranks=(2,))
        need_index("seq_lens", self.seq_lens, None, dev)
        need_tensor("seq_lens", self.seq_lens, ranks=(1,))
        need_index("cum_seq_lens_q", self.cum_seq_lens_q, None, dev)
        need_sinks(self.sinks, d.hq, dev)

    def size_checks(self, d):
        dev, b = self.query.device, self.batch_size
        need_int("batch_size", b, 1)
        need_int("max_q_len", self.max_q_len, 1)
        need_int("max_kv_len", self.max_kv_len, 1)
        if self.block_tables.shape[0] != b:
            raise bad("block_tables.shape", tuple(self.block_tables.shape), f"({b}, max_pages) for batch_size={b}")
        need_index("seq_lens", self.seq_lens, b, dev)
        need_index("cum_seq_lens_q", self.cum_seq_lens_q, b + 1, dev)
        check_scale("bmm1_scale", self.bmm1_scale, dev, values=False)
        check_scale("bmm2_scale", self.bmm2_scale, dev, values=False)
        need_out(self.out, (d.total_q, d.hq, d.dvo), d.out_dtype, dev)
        need_out(self.lse, (d.total_q, d.hq), torch.float32, dev, name="lse")

    def value_checks(self, d):
        dev = self.query.device
        qo = check_indptr_values("cum_seq_lens_q", self.cum_seq_lens_q, d.total_q, "query.shape[0]")
        longest = max((b - a for a, b in zip(qo[:-1], qo[1:])), default=0)
        if longest > self.max_q_len:
            raise bad("max_q_len", self.max_q_len, f">= the longest query ({longest} tokens from cum_seq_lens_q)")
        if self.seq_lens.numel() and int(self.seq_lens.max()) > self.max_kv_len:
            raise bad("max_kv_len", self.max_kv_len, f">= max(seq_lens) = {int(self.seq_lens.max())}")
        check_paged_values(self.block_tables, self.seq_lens, d.page_size, d.pages)
        check_scale("bmm1_scale", self.bmm1_scale, dev, values=True)
        check_scale("bmm2_scale", self.bmm2_scale, dev, values=True)
