"""The per-entry spec models (see ``dispatch.specs`` for the three check groups)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import torch

from ._normalize import bad, check_scale, paged_nhd, split_kv
from ._spec_base import (OUT_DTYPES, Q_DTYPES, Layout, Scale, _Spec, check_indptr_values, check_paged_values,
                    need_finite, need_heads, need_index, need_int, need_kv_dtype, need_out, need_sinks,
                    need_tensor, need_window, out_dtype_of)


def _paged_kv(kv_cache, layout, allow_squeezed, name="kv_cache") -> SimpleNamespace:
    k, v, squeezed = split_kv(kv_cache, name, allow_squeezed)
    kn, vn = paged_nhd(k, layout, squeezed), paged_nhd(v, layout, squeezed)
    if kn.shape[:3] != vn.shape[:3]:
        raise bad(name, kv_cache, "K and V caches with the same (pages, page_size, num_kv_heads)")
    if k.dtype != v.dtype or k.device != v.device:
        raise bad(name, kv_cache, "K and V caches of one dtype on one device")
    pages, page_size, hkv, _ = kn.shape
    return SimpleNamespace(k=kn, v=vn, pages=pages, page_size=page_size, hkv=hkv, dqk=kn.shape[3],
                           dvo=vn.shape[3], kv_dtype=k.dtype, squeezed=squeezed)


def _query(name, q, dtypes=Q_DTYPES):
    need_tensor(name, q, ranks=(3,), dtypes=dtypes)
    if q.stride(-1) != 1:
        raise bad(f"{name}.stride()", tuple(q.stride()), "a unit stride on the last (head_dim) dimension")


def _kv_static(d, q, name="kv_cache"):
    if d.k.device != q.device:
        raise bad(f"{name}.device", d.k.device, f"{q.device}, the device of the query (all tensors on one device)")
    need_kv_dtype(name, d.k, q.dtype)
    if d.k.stride(-1) != 1 or d.v.stride(-1) != 1:
        raise bad(f"{name}.stride()", tuple(d.k.stride()), "a unit stride on the last (head_dim) dimension")
    if d.dqk != q.shape[2]:
        raise bad(f"{name} head_dim", d.dqk, f"{q.shape[2]} = query.shape[2]")
    need_heads(q.shape[1], d.hkv, "query.shape[1] (num_qo_heads)", "num_kv_heads")


class TrtllmContextSpec(_Spec):
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
        _query("query", self.query)
        d = _paged_kv(self.kv_cache, self.kv_layout, allow_squeezed=False)
        d.hq, d.total_q = self.query.shape[1], self.query.shape[0]
        if isinstance(self.out_dtype, str) and self.out_dtype == "nvfp4":
            raise bad("out_dtype", "nvfp4", "float16, bfloat16, float32 or an fp8 dtype (NVFP4 output is not supported)")
        d.out_dtype = out_dtype_of(self.query.dtype, self.out_dtype if self.out_dtype is not None else
                                   (self.out.dtype if self.out is not None else None))
        return d

    def static_checks(self, d):
        q, dev = self.query, self.query.device
        _kv_static(d, q)
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


class XqaDecodeSpec(_Spec):
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
        _query("query", self.query, dtypes=(torch.float16, torch.bfloat16, torch.float32))
        d = _paged_kv(self.kv_cache, self.kv_layout, allow_squeezed=False)
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
        _kv_static(d, q)
        if self.kv_cache_sf is not None:
            raise bad("kv_cache_sf", self.kv_cache_sf, "None (NVFP4 KV is not supported)")
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


__all__ = ["TrtllmContextSpec", "XqaDecodeSpec"]
