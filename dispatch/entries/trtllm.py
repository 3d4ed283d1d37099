"""``trtllm_batch_context_with_kv_cache`` (seed 001): paged context attention, TensorRT-LLM style.

out = bmm2_scale * softmax(bmm1_scale * q.k) v; ``seq_lens`` (uint32 or int32) are the total KV
lengths including the new tokens; ``cum_seq_lens_kv`` is ignored for paged KV (FlashInfer's
own tests pass page counts there).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal, Optional, Union, overload

import torch

from .. import ops, policy
from ..checks import (Layout, OUT_DTYPES, Scale, Spec, bad, check_indptr_values, check_paged_values, check_scale,
                      need_index, need_int, need_kv_static, need_out, need_query, need_sinks, need_tensor, need_window,
                      out_dtype_of, paged_kv_spec)
from ..problem import AttentionBatch, AttentionProblem, dtype_name
from . import _base as B
from ._base import UNSET

ENTRY = "trtllm_batch_context_with_kv_cache"


# The types return_lse gives (typing.overload: no runtime effect; the signature is the seed's below)
@overload
def trtllm_batch_context_with_kv_cache(query: torch.Tensor, *args: Any,
                                       return_lse: Literal[True], **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def trtllm_batch_context_with_kv_cache(query: torch.Tensor, *args: Any,
                                       return_lse: Literal[False] = ..., **kwargs: Any) -> torch.Tensor: ...


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
    uses_spcompress: Optional[bool] = None, backend: Optional[str] = "auto",
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Paged context (prefill) attention.

    Parameters
    ----------
    query : (num_tokens, num_qo_heads, head_dim)
    kv_cache : (pages, 2, num_kv_heads, page_size, head_dim) for HND, (pages, 2, page_size,
        num_kv_heads, head_dim) for NHD, or a (k_cache, v_cache) tuple of 4-D tensors
    block_tables : (batch_size, max_pages_per_seq) int32; with ``uses_shared_paged_kv_idx=False``
        (batch_size, 2, max_pages_per_seq): K's page ids (dim 1 index 0) and V's (index 1), each an
        index into its own cache's pages (TensorRT-LLM's form: one pool holding K and V pages,
        passed as ``(pool, pool)``)
    seq_lens : (batch_size,) uint32 or int32, KV length per request including the new tokens
    cum_seq_lens_q : (batch_size + 1,) int32 token prefix sums of the queries
    sinks : (num_qo_heads,) fp32 tensor, or a list of floats / of one such tensor
    lse : (num_tokens, num_qo_heads) fp32 base 2, filled whenever given
    backend : "auto" (the router picks; FlashInfer's default is its "trtllm-gen" kernels) or a
        backend name: "trtllm-gen" or any of ours, an explicit choice (honoured or refused with
        the fact that fails); FlashInfer's "cake" has no adapter here and is refused

    Returns
    -------
    out (num_tokens, num_qo_heads, head_dim), or (out, lse) with ``return_lse``. enable_pdl,
    the skip-softmax threshold and the fp16-softmax/spcompress hints never change the result
    and are ignored. NVFP4 (``kv_block_scales``/``kv_cache_sf``, ``o_sf_*``) is refused.
    """
    block_scales = None if kv_block_scales is UNSET and kv_cache_sf is UNSET else B.one_of(
        "kv_block_scales", kv_block_scales, "kv_cache_sf", kv_cache_sf, None)
    if (torch.compiler.is_compiling() and block_scales is None and o_sf_scale is None and o_sf_vec_size is None
            and (backend is None or backend == "auto") and uses_shared_paged_kv_idx is True):
        return _compiled(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale,
                         bmm2_scale, batch_size, cum_seq_lens_q, window_left, out, out_dtype, kv_layout, sinks,
                         causal, lse, return_lse)
    explicit = policy.explicit_choice(backend)  # unknown names fail here, with the options
    seq_lens = B.int32_lengths(seq_lens)
    if sinks is not None:
        sinks = B.sinks_tensor(sinks, query)
    lane = DECLARATION.lane((query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len,
                             bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q, window_left, out, out_dtype,
                             o_sf_scale, o_sf_vec_size, kv_layout, sinks, block_scales, uses_shared_paged_kv_idx,
                             causal, lse, return_lse), explicit)
    k, v = B.paged_kv(kv_cache, kv_layout)
    z = lane.sizes
    device = query.device
    if out is None:
        out = torch.empty(z.total_q, z.hq, z.dvo, dtype=z.out_dtype, device=device)
    if lse is None and return_lse:
        lse = torch.empty(z.total_q, z.hq, dtype=torch.float32, device=device)
    k_table, v_table = (block_tables, None) if uses_shared_paged_kv_idx else block_tables.unbind(1)  # views
    lane.launch(AttentionBatch(q=query, k=k, v=v, qo_indptr=cum_seq_lens_q, kv_lens=seq_lens, out=out,
                               batch_size=batch_size, max_q_len=max_q_len, max_kv_len=max_kv_len, sm_scale=bmm1_scale,
                               out_scale=bmm2_scale, block_table=k_table, v_block_table=v_table, lse=lse, sinks=sinks,
                               extras=B.NO_EXTRAS))
    return (out, lse) if return_lse else out


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


def _problem(spec, d, size: tuple) -> AttentionProblem:
    return AttentionProblem(
        entry=ENTRY, phase="decode" if spec.max_q_len == 1 else "prefill", kv_storage="paged",
        kv_layout=spec.kv_layout, num_qo_heads=d.hq, num_kv_heads=d.hkv, head_dim_qk=d.dqk, head_dim_vo=d.dvo,
        q_dtype=dtype_name(spec.query.dtype), kv_dtype=dtype_name(d.k.dtype), out_dtype=dtype_name(d.out_dtype),
        page_size=d.page_size, causal=spec.causal, window_left=spec.window_left, has_sinks=spec.sinks is not None,
        uses_shared_paged_kv_idx=spec.uses_shared_paged_kv_idx,
        return_lse=spec.return_lse or spec.lse is not None,
        device_type="cpu" if spec.query.device.type == "cpu" else "cuda", sizes=size,
        replay_kv=size[2] if size else 0)  # its kv size is its length bound: what a graph of it replays


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
        for name in ("kv_cache_sf", "o_sf_scale", "o_sf_vec_size"):
            if getattr(self, name) is not None:
                raise bad(name, getattr(self, name), "None (NVFP4 KV/output: FlashInfer 0.7.2 serves them through "
                          "trtllm-gen on Blackwell, sm_100+, which attn-dispatch does not forward; NVFP4 KV is served "
                          "on single_prefill_with_kv_cache, both prefill wrappers and xqa_batch_decode_with_kv_cache)")
        if d.out_dtype not in OUT_DTYPES:  # blame the argument the dtype came from
            raise bad("out_dtype" if self.out_dtype is not None else "out.dtype", d.out_dtype,
                      "float16, bfloat16, float32 or an fp8 dtype")
        need_window(self.window_left)
        need_index("block_tables", self.block_tables, None, dev)
        self._check_table_rank()
        need_index("seq_lens", self.seq_lens, None, dev)
        need_tensor("seq_lens", self.seq_lens, ranks=(1,))
        need_index("cum_seq_lens_q", self.cum_seq_lens_q, None, dev)
        need_sinks(self.sinks, d.hq, dev)

    def _check_table_rank(self):
        """FlashInfer's rule: (batch, pages) for page ids K and V share, (batch, 2, pages) for their own."""
        t, shared = self.block_tables, self.uses_shared_paged_kv_idx
        if not isinstance(shared, bool):
            raise bad("uses_shared_paged_kv_idx", shared, "True or False", TypeError)
        need_tensor("block_tables", t)
        form = ("(batch_size, max_pages) with uses_shared_paged_kv_idx=True" if shared else
                "(batch_size, 2, max_pages) with uses_shared_paged_kv_idx=False (dim 1: K's page ids, then V's)")
        if t.dim() != (2 if shared else 3):
            raise bad("block_tables", t, f"a {2 if shared else 3}-D tensor {form}")
        if not shared and t.shape[1] != 2:
            raise bad("block_tables.shape", tuple(t.shape), form)

    def size_checks(self, d):
        dev, b = self.query.device, self.batch_size
        need_int("batch_size", b, 1)
        need_int("max_q_len", self.max_q_len, 1)
        need_int("max_kv_len", self.max_kv_len, 1)
        if self.block_tables.shape[0] != b:
            raise bad("block_tables.shape", tuple(self.block_tables.shape),
                      (f"({b}, max_pages)" if self.uses_shared_paged_kv_idx else f"({b}, 2, max_pages)")
                      + f" for batch_size={b}")
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
        if self.uses_shared_paged_kv_idx:
            check_paged_values(self.block_tables, self.seq_lens, d.page_size, d.pages)
        else:  # each id indexes its own cache's pages
            for side, name in ((0, "block_tables[:, 0]"), (1, "block_tables[:, 1]")):
                check_paged_values(self.block_tables[:, side], self.seq_lens, d.page_size, d.pages, table_name=name)
        check_scale("bmm1_scale", self.bmm1_scale, dev, values=True)
        check_scale("bmm2_scale", self.bmm2_scale, dev, values=True)


DECLARATION = B.Declaration(
    ENTRY, TrtllmContextSpec, ("query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_q_len",
                               "max_kv_len", "bmm1_scale", "bmm2_scale", "batch_size", "cum_seq_lens_q", "window_left",
                               "out", "out_dtype", "o_sf_scale", "o_sf_vec_size", "kv_layout", "sinks", "kv_cache_sf",
                               "uses_shared_paged_kv_idx", "causal", "lse", "return_lse"),
    problem=_problem, sizes=_sizes, unread=("workspace_buffer",),
    size=lambda a: (a["batch_size"], a["max_q_len"], a["max_kv_len"]),
    vary={"block_tables": B.ALL_DIMS, "seq_lens": B.ALL_DIMS, "cum_seq_lens_q": B.ALL_DIMS, "sinks": B.FULL},
    per_call=("max_q_len", "max_kv_len", "batch_size", "bmm1_scale", "bmm2_scale"),
    facts=lambda a: (a["max_q_len"] == 1,))  # a decode problem: a fact of the key, not only a per-call size
