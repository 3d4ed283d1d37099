"""``cudnn_batch_prefill_with_kv_cache`` (seed 000): cuDNN's batch prefill, paged or ragged KV.

Paged K/V are read as (pages, Hkv, P, D) by index whatever their strides (cuDNN ignores any
layout name); ragged 3-D K/V are located by ``batch_offsets_k/v``. Offsets are tensor elements
by default (q: x Hq*Dqk, o: x Hq*Dvo, k: x Hkv*Dqk, v: x Hkv*Dvo) or tokens with
``batch_offsets_units="tokens"``; absent offsets are derived from the lengths (packed rows).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal, Optional, Union, overload

import torch

from backends import kept_views

from .. import ops, policy
from ..checks import (OUT_DTYPES, Scale, Spec, Units, bad, check_indptr_values, check_paged_values, check_scale,
                      fold_scale, host_ints, lens_shapes, need_heads, need_index, need_int, need_kv_dtype, need_out,
                      need_query, need_tensor, offsets_shapes, out_dtype_of, paged_nhd, scatter_padded_lse,
                      token_offsets, uniform_indptr)
from ..problem import AttentionBatch, AttentionProblem, dtype_name
from . import _base as B
from . import _lse
from ._base import UNSET

ENTRY = "cudnn_batch_prefill_with_kv_cache"
_INDEX_ARGS = ("actual_seq_lens_q", "actual_seq_lens_kv", "block_tables", "batch_offsets_q", "batch_offsets_o",
               "batch_offsets_k", "batch_offsets_v")


# The types return_lse gives (typing.overload: no runtime effect; the signature is the seed's below)
@overload
def cudnn_batch_prefill_with_kv_cache(q: torch.Tensor, *args: Any,
                                      return_lse: Literal[True], **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def cudnn_batch_prefill_with_kv_cache(q: torch.Tensor, *args: Any,
                                      return_lse: Literal[False] = ..., **kwargs: Any) -> tuple[torch.Tensor, None]: ...


def cudnn_batch_prefill_with_kv_cache(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: Union[float, torch.Tensor],
    workspace_buffer: torch.Tensor, *, max_token_per_sequence: int, max_sequence_kv: int,
    actual_seq_lens_q: Optional[torch.Tensor] = UNSET, actual_seq_lens_kv: Optional[torch.Tensor] = UNSET,
    block_tables: Optional[torch.Tensor] = None,
    causal: bool, return_lse: bool, batch_offsets_q: Optional[torch.Tensor] = None,
    batch_offsets_o: Optional[torch.Tensor] = None, batch_offsets_k: Optional[torch.Tensor] = None,
    batch_offsets_v: Optional[torch.Tensor] = None, batch_offsets_stats: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None, is_cuda_graph_compatible: bool = False,
    backend: Optional[str] = None, q_scale=None, k_scale=None, v_scale=None, batch_offsets_units: str = "elements",
    o_data_type=None, lse_base: str = "log2",
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Batch prefill with cuDNN's calling convention.

    Parameters
    ----------
    q : (total_q, num_qo_heads, head_dim_qk)
    k_cache, v_cache : paged (pages, num_kv_heads, page_size, head_dim) with ``block_tables``
        (batch, max_pages) int32, or ragged (total_kv, num_kv_heads, head_dim)
    actual_seq_lens_q, actual_seq_lens_kv : (batch,) or (batch, 1, 1, 1) int32, on the CPU or
        on q's device. The seed shows them required; as in FlashInfer 0.7 they may be left out
        where the batch offsets imply them (the lengths are then the offsets' spans); paged K/V
        needs actual_seq_lens_kv
    batch_offsets_q/o/k/v : optional (batch + 1,) offsets (elements by default)
    backend : None (the router picks), one of our backend names, or FlashInfer's ``"cubin"``
        (cuDNN's own prebuilt kernels there): our cuDNN backend, as an explicit choice
    lse_base : "log2" (default, the seeds' base 2) or "ln" (natural log)

    Returns
    -------
    (out, lse or None): out (total_q, num_qo_heads, head_dim_vo); lse fp32 base 2 (or as
    ``lse_base`` asks) of shape (batch, max_token_per_sequence, num_qo_heads), rows past a
    request's length -inf. ``batch_offsets_stats`` is accepted and ignored (the LSE layout is
    always padded).
    """
    if actual_seq_lens_q is UNSET:
        actual_seq_lens_q = None
    if actual_seq_lens_kv is UNSET:
        actual_seq_lens_kv = None
    if lse_base != "log2":
        _lse.need_lse_base(lse_base)
    if backend == "cubin":  # FlashInfer's selector of cuDNN's prebuilt kernels: cuDNN's kernels, our cuDNN backend
        backend = "cudnn"
    if torch.compiler.is_compiling() and actual_seq_lens_q is not None and actual_seq_lens_kv is not None and not any(
            isinstance(s, torch.Tensor) or s is not None for s in (q_scale, k_scale, v_scale)):
        scale_f, scale_t = ops.split_scale(scale)
        res, res_lse = ops.cudnn_prefill(
            q, k_cache, v_cache, scale_f, scale_t, workspace_buffer, max_token_per_sequence, max_sequence_kv,
            actual_seq_lens_q, actual_seq_lens_kv, block_tables, causal, return_lse, batch_offsets_q, batch_offsets_o,
            batch_offsets_k, batch_offsets_v, is_cuda_graph_compatible, backend, batch_offsets_units, o_data_type)
        if return_lse and lse_base != "log2":
            res_lse = _lse.traced(res_lse, lse_base)
        return ops.fill(res, out), (ops.fill(res_lse, lse) if return_lse else None)
    explicit = policy.explicit_choice(backend)
    if isinstance(q, torch.Tensor) and not q.is_cpu:  # lengths may come on the CPU (the seed's example)
        actual_seq_lens_q, actual_seq_lens_kv = _on_device(actual_seq_lens_q, q), _on_device(actual_seq_lens_kv, q)
    lane = DECLARATION.lane((q, k_cache, v_cache, scale, workspace_buffer, max_token_per_sequence, max_sequence_kv,
                             actual_seq_lens_q, actual_seq_lens_kv, block_tables, causal, return_lse, q_scale,
                             k_scale, v_scale, batch_offsets_q, batch_offsets_o, batch_offsets_k, batch_offsets_v,
                             batch_offsets_units, out, lse, is_cuda_graph_compatible, o_data_type), explicit)
    z = lane.sizes
    padded = None  # the padded LSE: cuDNN writes it in place, as FlashInfer's graph does; others' is scattered
    if return_lse:
        padded = lse if lse is not None else torch.empty(z.batch, max_token_per_sequence, z.hq, dtype=torch.float32,
                                                         device=q.device)
    packed = _packed_view(z, padded)
    batch = _batch(z, q, k_cache, v_cache, fold_scale(scale, q_scale, k_scale), fold_scale(1.0, v_scale),
                   max_token_per_sequence, max_sequence_kv, actual_seq_lens_q, actual_seq_lens_kv, block_tables,
                   return_lse, batch_offsets_q, batch_offsets_o, batch_offsets_k, batch_offsets_units == "tokens", out,
                   padded, packed)
    ran = lane.launch(batch)
    if not return_lse:
        return batch.out, None
    if not B.is_dry() and ran.backend != "cudnn" and packed is None:
        scatter_padded_lse(batch.lse, batch.qo_indptr, padded)
    if lse_base != "log2" and not B.is_dry():
        _lse.finish(padded, lse_base)  # every backend's LSE is base 2 here: the asked base, in place
    return batch.out, padded


def _packed_view(z, padded: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The padded LSE as the packed (total_q, Hq) one, where they are the same memory: a decode-shaped
    call (one row per request), its (B, 1, Hq) buffer contiguous. Every backend then writes it in place
    and nothing is scattered: the scatter's ten small launches made native-triton's decode calls with
    LSE cost 200-350 us of host time on the H200 against 75-160 without (random problems of
    ``attn-dispatch bench``, seed 738408487)."""
    if padded is None or not _one_row_each(z) or not padded.is_contiguous():
        return None
    return padded.view(z.batch, z.hq)


def _batch(z, q, k_cache, v_cache, sm_scale, out_scale, max_q, max_kv, seq_q, seq_kv, block_tables, return_lse,
           offsets_q, offsets_o, offsets_k, tokens: bool, out, padded_lse=None, packed_lse=None) -> AttentionBatch:
    """The batch of a checked call: logical NHD pages, token-unit indices, the caller's cuDNN
    buffers in extras, out and the packed LSE allocated when not given (``packed_lse``: the padded
    one's view, ``_packed_view``)."""
    if z.paged:  # the logical NHD pages (as the spec's), kept per cache object
        k, v = kept_views(k_cache, "nhd", _nhd_pages)[0], kept_views(v_cache, "nhd", _nhd_pages)[0]
    else:
        k, v = k_cache, v_cache
    qo_indptr, kv_indptr, kv_lens = _indices(q, z, tokens, seq_q, seq_kv, offsets_q, offsets_k)
    out = out if out is not None else torch.empty(z.total_q, z.hq, z.dvo, dtype=z.out_dtype, device=q.device)
    given = _cudnn_buffers(z, tokens, seq_q, q, offsets_q, out, offsets_o, k_cache, v_cache, padded_lse)
    kind = AttentionBatch if qo_indptr is not None else _DividedOnRead
    batch = kind(q=q, k=k, v=v, qo_indptr=qo_indptr, kv_lens=kv_lens, out=out, batch_size=z.batch, max_q_len=max_q,
                 max_kv_len=max_kv, sm_scale=sm_scale, out_scale=out_scale, kv_indptr=kv_indptr,
                 block_table=block_tables, lse=B.new_lse(packed_lse, z.total_q, z.hq, q.device, return_lse),
                 extras=given)
    if qo_indptr is None:
        batch.__dict__["_qo_offsets"] = (offsets_q, z.hq * z.dqk)
    return batch


class _DividedOnRead(AttentionBatch):
    """The batch of a call that gave Q's offsets in elements: its token ``qo_indptr`` is divided
    out of them when a backend first reads it. cuDNN binds the caller's offsets themselves, so a
    call it serves launches no division, as FlashInfer's launches none. On tiny decode calls that
    kernel made ours 1.17-1.28x FlashInfer's GPU time (H200, random problems of ``attn-dispatch
    bench``); without it 0.92-1.00x (H200, 8 cuDNN decode and sinks problems). Any other backend
    pays the one division."""

    @property  # type: ignore[override]
    def qo_indptr(self) -> torch.Tensor:
        indptr = self.__dict__.get("_qo_indptr")
        if indptr is None:
            offsets, row = self.__dict__["_qo_offsets"]
            indptr = self.__dict__["_qo_indptr"] = _token_offsets(offsets, row, False)
        return indptr

    @qo_indptr.setter
    def qo_indptr(self, value: Optional[torch.Tensor]) -> None:
        self.__dict__["_qo_indptr"] = value


def _nhd_pages(pool: torch.Tensor) -> tuple:
    return (pool.permute(0, 2, 1, 3),)


def _on_device(lengths, q):
    """The seed documents the lengths on the CPU when not capturing a CUDA graph: the kernels
    read them on q's device, so they move there (the caller's tensor is not modified)."""
    if isinstance(lengths, torch.Tensor) and isinstance(q, torch.Tensor) and lengths.is_cpu and not q.is_cpu:
        return lengths.to(q.device)
    return lengths


def _problem(spec, d, size: tuple) -> AttentionProblem:
    return AttentionProblem(
        entry=ENTRY, phase="decode" if spec.max_token_per_sequence == 1 else "prefill",
        kv_storage="paged" if d.paged else "ragged", kv_layout="HND" if d.paged else "NHD",
        num_qo_heads=d.hq, num_kv_heads=d.hkv, head_dim_qk=d.dqk, head_dim_vo=d.dvo,
        q_dtype=dtype_name(spec.q.dtype), kv_dtype=dtype_name(d.k.dtype), out_dtype=dtype_name(d.out_dtype),
        page_size=d.page_size if d.paged else 0, causal=spec.causal, return_lse=spec.return_lse,
        cuda_graph=spec.is_cuda_graph_compatible, device_type="cpu" if spec.q.device.type == "cpu" else "cuda",
        sizes=size,
        replay_kv=size[2] if size else 0)  # its kv size is its length bound: what a graph of it replays


def _sizes(args: dict, d) -> SimpleNamespace:
    """What a repeat builds its batch from; for a decode-shaped call (``_one_row_each``) also the
    cached uniform offsets it binds: the token indptr and Q's and O's element offsets."""
    z = SimpleNamespace(total_q=d.total_q, hq=d.hq, dqk=d.dqk, hkv=d.hkv, dvo=d.dvo, out_dtype=d.out_dtype,
                        batch=d.batch, paged=d.paged, max_q=args["max_token_per_sequence"], one_row_each=None)
    if _one_row_each(z):
        device = args["q"].device
        z.one_row_each = (uniform_indptr(z.batch, 1, device), uniform_indptr(z.batch, z.hq * z.dqk, device),
                          uniform_indptr(z.batch, z.hq * z.dvo, device))
    return z


def _cudnn_buffers(z: SimpleNamespace, tokens: bool, seq_q, q, offsets_q, out, offsets_o, k_cache, v_cache,
                   padded_lse=None):
    """The caller's buffers already in cuDNN's convention (int32 query lengths; element offsets
    that match packed Q / O rows; the paged pools as declared; the padded (B, max_q, Hq) LSE that
    cuDNN's Stats fill in place), for the cuDNN backend to use as they are (batch.extras; it binds
    their pointers, whatever their shape: no view is made here)."""
    given = {} if padded_lse is None else {"lse_padded": padded_lse}
    if seq_q is not None and seq_q.dtype is torch.int32:
        given["seq_q"] = seq_q
    row_q, row_o = z.hq * z.dqk, z.hq * z.dvo
    if offsets_q is None and z.one_row_each is not None:  # the cached element offsets of row b: no kernel per call
        offsets_q, offsets_o = z.one_row_each[1:]
        tokens = False
    if not tokens:
        if offsets_q is not None and offsets_q.dtype is torch.int32 and q.stride(0) == row_q:
            given["off_q"] = offsets_q
        if offsets_o is not None and offsets_o.dtype is torch.int32 and out.stride(0) == row_o:
            given["off_o"] = offsets_o
    if z.paged:  # the caller's pools are the (pages, Hkv, P, D) views cuDNN reads: no view back per call
        given["pool_k"], given["pool_v"] = k_cache, v_cache
    return {"cudnn": given} if given else B.NO_EXTRAS


def _one_row_each(z) -> bool:
    """A decode-shaped call (one query row per request): the checks hold every length to 1 (q has
    one row per token), so request b's query is row b, the packed prefix sums are a constant, and
    FlashInfer's own call declares Q the same way (flashinfer 0.5.3 flashinfer/cudnn/prefill.py:
    without batch_offsets_q, Q's batch stride is one token row)."""
    return z.max_q == 1 and z.total_q == z.batch


def _cumsum0(lens: torch.Tensor) -> torch.Tensor:
    """(B+1,) int32 prefix sums of (B,) lengths, on the device: two launches (a zero fill and the
    scan written after it; ``pad`` would be three: its fill, its copy and the scan), no sync."""
    flat = lens.reshape(-1)
    sums = torch.zeros(flat.shape[0] + 1, dtype=torch.int32, device=flat.device)
    torch.cumsum(flat, 0, dtype=torch.int32, out=sums[1:])
    return sums


def _token_offsets(offsets: torch.Tensor, units_per_token: int, tokens: bool) -> torch.Tensor:
    flat = offsets.reshape(-1)
    if tokens:
        return flat
    flat = torch.floor_divide(flat, units_per_token)  # not ``//``: Tensor.__floordiv__ is a Python wrapper
    return flat if flat.dtype is torch.int32 else flat.to(torch.int32)


def _indices(q, d, tokens: bool, seq_q, seq_kv, offsets_q, offsets_k):
    """Token-unit qo_indptr / kv_indptr and (B,) kv_lens; absent offsets are the packed prefix
    sums of the lengths (what FlashInfer computes for packed inputs). qo_indptr is None where Q's
    offsets came in elements: the batch divides them on first read (``_DividedOnRead``)."""
    if offsets_q is not None:  # in elements: divided when a backend reads it (_DividedOnRead)
        qo = _token_offsets(offsets_q, d.hq * d.dqk, tokens) if tokens else None
    elif d.one_row_each is not None:
        qo = d.one_row_each[0]  # cached: no kernel per call
    elif seq_q is not None:
        qo = _cumsum0(seq_q)
    else:
        qo = uniform_indptr(1, d.total_q, q.device)
    kv_indptr = None
    if not d.paged:
        kv_indptr = _token_offsets(offsets_k, d.hkv * d.dqk, tokens) if offsets_k is not None else _cumsum0(seq_kv)
    kv_lens = seq_kv.reshape(-1) if seq_kv is not None else (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
    return qo, kv_indptr, kv_lens


B.seed_signature(cudnn_batch_prefill_with_kv_cache, {"actual_seq_lens_q": B.REQUIRED_SHOWN,
                                                     "actual_seq_lens_kv": B.REQUIRED_SHOWN})
ops.register_eager('cudnn_batch_prefill_with_kv_cache', cudnn_batch_prefill_with_kv_cache)


# -- the spec: what a call must satisfy (dispatch.checks: the three check groups) ---------------
class CudnnPrefillSpec(Spec):
    """``cudnn_batch_prefill_with_kv_cache``: paged (block_tables) or ragged (3-D K/V) KV."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    scale: Scale
    workspace_buffer: torch.Tensor
    max_token_per_sequence: int
    max_sequence_kv: int
    actual_seq_lens_q: Optional[torch.Tensor] = None
    actual_seq_lens_kv: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None
    causal: bool
    return_lse: bool
    q_scale: Optional[Scale] = None
    k_scale: Optional[Scale] = None
    v_scale: Optional[Scale] = None
    batch_offsets_q: Optional[torch.Tensor] = None
    batch_offsets_o: Optional[torch.Tensor] = None
    batch_offsets_k: Optional[torch.Tensor] = None
    batch_offsets_v: Optional[torch.Tensor] = None
    batch_offsets_units: Units = "elements"
    out: Optional[torch.Tensor] = None
    lse: Optional[torch.Tensor] = None
    is_cuda_graph_compatible: bool = False
    o_data_type: Any = None

    def derive(self):
        need_query("q", self.q)
        d = SimpleNamespace(paged=self.block_tables is not None, hq=self.q.shape[1], total_q=self.q.shape[0])
        rank = 4 if d.paged else 3
        need_tensor("k_cache", self.k_cache, ranks=(rank,))
        need_tensor("v_cache", self.v_cache, ranks=(rank,))
        if d.paged:  # (pages, Hkv, P, D) by index, whatever the strides: a permuted view
            d.k, d.v = paged_nhd(self.k_cache, "HND", False), paged_nhd(self.v_cache, "HND", False)
            d.pages, d.page_size = d.k.shape[0], d.k.shape[1]
        else:
            d.k, d.v = self.k_cache, self.v_cache
        d.hkv, d.dqk, d.dvo = d.k.shape[-2], d.k.shape[-1], d.v.shape[-1]
        d.out_dtype = out_dtype_of(self.q.dtype, self.o_data_type if self.o_data_type is not None else
                                   (self.out.dtype if self.out is not None else None))
        d.batch = self._batch_size()
        d.tokens = self.batch_offsets_units == "tokens"
        return d

    def _batch_size(self) -> int:
        """The batch size most arguments agree on, so a wrong one is the one blamed."""
        counts = [t.shape[0] for t in (self.block_tables, self.actual_seq_lens_kv, self.actual_seq_lens_q)
                  if isinstance(t, torch.Tensor) and t.dim()]
        counts += [t.shape[0] - 1 for t in (self.batch_offsets_q, self.batch_offsets_k)
                   if isinstance(t, torch.Tensor) and t.dim()]
        return max(counts, key=counts.count) if counts else 1

    def static_checks(self, d):
        q, dev = self.q, self.q.device
        if self.batch_offsets_units not in ("elements", "tokens"):
            raise bad("batch_offsets_units", self.batch_offsets_units, "'elements' or 'tokens'")
        for name, t in (("k_cache", self.k_cache), ("v_cache", self.v_cache)):
            need_tensor(name, t, device=dev)
            need_kv_dtype(name, t, q.dtype)
            if t.stride(-1) != 1:
                raise bad(f"{name}.stride()", tuple(t.stride()), "a unit stride on the last (head_dim) dimension")
        if d.dqk != q.shape[2]:
            raise bad("k_cache head_dim", d.dqk, f"{q.shape[2]} = q.shape[2]")
        if self.k_cache.dtype != self.v_cache.dtype:
            raise bad("v_cache.dtype", self.v_cache.dtype, f"{dtype_name(self.k_cache.dtype)}, the dtype of k_cache")
        need_heads(d.hq, d.hkv, "q.shape[1] (num_qo_heads)", "num_kv_heads")
        if d.out_dtype not in OUT_DTYPES:  # blame the argument the dtype came from
            raise bad("o_data_type" if self.o_data_type is not None else "out.dtype", d.out_dtype,
                      "float16, bfloat16, float32 or an fp8 dtype")
        for name in ("actual_seq_lens_q", "actual_seq_lens_kv", "block_tables", "batch_offsets_q",
                     "batch_offsets_o", "batch_offsets_k", "batch_offsets_v"):
            if getattr(self, name) is not None:
                need_index(name, getattr(self, name), None, dev)
        if d.paged and self.actual_seq_lens_kv is None:
            raise bad("actual_seq_lens_kv", None, "a (B,1,1,1) int32 tensor (required with block_tables)")
        if not d.paged and self.batch_offsets_k is None and self.actual_seq_lens_kv is None:
            raise bad("batch_offsets_k", None, "a (B+1,) offsets tensor or actual_seq_lens_kv (ragged K/V)")

    def size_checks(self, d):
        dev, b = self.q.device, d.batch
        if d.v.shape[:-1] != d.k.shape[:-1]:  # pages / KV rows vary per call: checked here
            raise bad("v_cache.shape", tuple(self.v_cache.shape), f"the leading dims of k_cache {tuple(self.k_cache.shape)}")
        need_int("max_token_per_sequence", self.max_token_per_sequence, 1)
        need_int("max_sequence_kv", self.max_sequence_kv, 1)
        for name in ("actual_seq_lens_q", "actual_seq_lens_kv"):
            if getattr(self, name) is not None:
                need_index(name, getattr(self, name), b, dev, lens_shapes(b))
        for name in ("batch_offsets_q", "batch_offsets_o", "batch_offsets_k", "batch_offsets_v"):
            if getattr(self, name) is not None:
                need_index(name, getattr(self, name), b + 1, dev, offsets_shapes(b))
        # Absent batch offsets mean packed rows: derived from actual_seq_lens_q (the seed marks
        # them optional); without lengths either, one request must own every row.
        if b > 1 and self.batch_offsets_q is None and self.actual_seq_lens_q is None:
            raise bad("actual_seq_lens_q", None, f"a (B,) int32 tensor or batch_offsets_q when B={b} > 1")
        if d.paged:
            need_tensor("block_tables", self.block_tables, ranks=(2,))
            if self.block_tables.shape[0] != b:
                raise bad("block_tables.shape", tuple(self.block_tables.shape), f"({b}, max_pages)")
        for name in ("scale", "q_scale", "k_scale", "v_scale"):
            check_scale(name, getattr(self, name), dev, values=False)
        need_out(self.out, (d.total_q, d.hq, d.dvo), d.out_dtype, dev)
        need_out(self.lse, (b, self.max_token_per_sequence, d.hq), torch.float32, dev,
                 name="lse", shape_text=f"(B={b}, max_token_per_sequence={self.max_token_per_sequence}, "
                 f"num_qo_heads={d.hq})")

    def value_checks(self, d):
        d.qo = self._qo_tokens(d)
        q_lens = [y - x for x, y in zip(d.qo[:-1], d.qo[1:])]
        if self.actual_seq_lens_q is not None and host_ints(self.actual_seq_lens_q) != q_lens:
            raise bad("actual_seq_lens_q", host_ints(self.actual_seq_lens_q), f"the lengths of batch_offsets_q: {q_lens}")
        if max(q_lens, default=0) > self.max_token_per_sequence:
            raise bad("max_token_per_sequence", self.max_token_per_sequence, f">= the longest query ({max(q_lens)})")
        kv_lens = host_ints(self.actual_seq_lens_kv) if self.actual_seq_lens_kv is not None else None
        if d.paged:
            check_paged_values(self.block_tables, self.actual_seq_lens_kv.reshape(-1), d.page_size, d.pages,
                               lens_name="actual_seq_lens_kv")
        else:
            kv_lens = self._ragged_kv_values(d, kv_lens)
        if max(kv_lens, default=0) > self.max_sequence_kv:
            raise bad("max_sequence_kv", self.max_sequence_kv, f">= the longest KV sequence ({max(kv_lens)})")
        for name in ("scale", "q_scale", "k_scale", "v_scale"):
            check_scale(name, getattr(self, name), self.q.device, values=True)

    def _qo_tokens(self, d) -> list[int]:
        mult_q, mult_o = (1, 1) if d.tokens else (d.hq * d.dqk, d.hq * d.dvo)
        if self.batch_offsets_q is None:
            lens = host_ints(self.actual_seq_lens_q) if self.actual_seq_lens_q is not None else [d.total_q]
            if min(lens, default=0) < 0:
                raise bad("actual_seq_lens_q", lens, "lengths >= 0")
            qo = [0]
            for n in lens:  # packed rows: the prefix sums of the lengths
                qo.append(qo[-1] + n)
        else:
            qo = token_offsets("batch_offsets_q", self.batch_offsets_q, mult_q)
        check_indptr_values("batch_offsets_q (tokens)", torch.tensor(qo), d.total_q, "q.shape[0]")
        if self.batch_offsets_o is not None and token_offsets("batch_offsets_o", self.batch_offsets_o, mult_o) != qo:
            raise bad("batch_offsets_o", host_ints(self.batch_offsets_o),
                      f"the same token rows as batch_offsets_q ({qo} tokens x {mult_o})")
        return qo

    def _ragged_kv_values(self, d, kv_lens):
        mult_k, mult_v = (1, 1) if d.tokens else (d.hkv * d.dqk, d.hkv * d.dvo)
        if kv_lens is not None and min(kv_lens, default=0) < 0:
            raise bad("actual_seq_lens_kv", kv_lens, "lengths >= 0")
        if self.batch_offsets_k is None:
            kv = [0]
            for n in kv_lens:
                kv.append(kv[-1] + n)
        else:
            kv = token_offsets("batch_offsets_k", self.batch_offsets_k, mult_k)
            check_indptr_values("batch_offsets_k (tokens)", torch.tensor(kv), None, "", start0=False)
        if self.batch_offsets_v is not None and token_offsets("batch_offsets_v", self.batch_offsets_v, mult_v) != kv:
            raise bad("batch_offsets_v", host_ints(self.batch_offsets_v), "the same token rows as batch_offsets_k")
        if kv[-1] > self.k_cache.shape[0]:
            if self.batch_offsets_k is None:  # rows packed by the lengths: the lengths are too long
                raise bad("actual_seq_lens_kv", kv_lens, f"lengths summing to <= k_cache.shape[0]={self.k_cache.shape[0]} "
                          f"(the K/V rows; they sum to {kv[-1]})")
            raise bad("batch_offsets_k", kv, f"token offsets <= k_cache.shape[0]={self.k_cache.shape[0]}")
        spans = [y - x for x, y in zip(kv[:-1], kv[1:])]
        if kv_lens is not None and any(n > s for n, s in zip(kv_lens, spans)):
            raise bad("actual_seq_lens_kv", kv_lens, f"lengths <= the spans of batch_offsets_k: {spans}")
        return kv_lens if kv_lens is not None else spans


def _batch_rows(args: dict) -> Any:
    """The batch size of a call's size class: its lengths' rows, or its offsets' rows less one
    where the lengths are left out (None while neither is a tensor: the checks name it)."""
    for name in ("actual_seq_lens_kv", "actual_seq_lens_q"):
        if args[name] is not None:
            return B.rows(args[name])
    for name in ("batch_offsets_q", "batch_offsets_k"):
        n = B.rows(args[name])
        if n is not None:
            return n - 1
    return 1


DECLARATION = B.Declaration(
    ENTRY, CudnnPrefillSpec, ("q", "k_cache", "v_cache", "scale", "workspace_buffer", "max_token_per_sequence",
                              "max_sequence_kv", "actual_seq_lens_q", "actual_seq_lens_kv", "block_tables", "causal",
                              "return_lse", "q_scale", "k_scale", "v_scale", "batch_offsets_q", "batch_offsets_o",
                              "batch_offsets_k", "batch_offsets_v", "batch_offsets_units", "out", "lse",
                              "is_cuda_graph_compatible", "o_data_type"),
    problem=_problem, sizes=_sizes, unread=("workspace_buffer",),
    size=lambda a: (_batch_rows(a), a["max_token_per_sequence"], a["max_sequence_kv"]),
    vary={**{name: B.ALL_DIMS for name in _INDEX_ARGS}, "lse": B.ALL_DIMS},
    per_call=("max_token_per_sequence", "max_sequence_kv", "scale", "q_scale", "k_scale", "v_scale"),
    facts=lambda a: (a["max_token_per_sequence"] == 1,))
