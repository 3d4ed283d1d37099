"""Spec models of the cuDNN function, the two wrappers (plan and run) and single prefill."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import torch

from ._normalize import bad, check_scale, host_ints, paged_nhd
from ._specs_entries import _query
from .problem import dtype_name
from ._spec_base import (OUT_DTYPES, Scale, _Spec, check_indptr_values, check_paged_values, need_heads, need_index,
                    need_int, need_kv_dtype, need_out, need_tensor, out_dtype_of)

Units = Any  # checked by hand so the message lists both spellings


def lens_shapes(b: int) -> list[tuple]:
    return [(b,), (b, 1, 1, 1)]


def offsets_shapes(b: int) -> list[tuple]:
    return [(b + 1,), (b + 1, 1, 1, 1)]


def token_offsets(name: str, t: torch.Tensor, mult: int) -> list[int]:
    """Device read: element offsets -> token offsets (each must be a multiple of ``mult``)."""
    vals = host_ints(t)
    for v in vals:
        if v % mult:
            raise bad(name, vals, f"element offsets, multiples of {mult} (= heads * head_dim); "
                      "pass batch_offsets_units='tokens' for token offsets")
    return [v // mult for v in vals]


class CudnnPrefillSpec(_Spec):
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
        _query("q", self.q)
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


__all__ = ["CudnnPrefillSpec", "lens_shapes", "offsets_shapes", "token_offsets"]
