"""Spec models of the wrappers' plan/run and of single_prefill_with_kv_cache."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import torch

from ._normalize import FP8_DTYPES, bad, check_scale, host_ints, parse_dtype
from ._specs_entries import _paged_kv, _query
from ._specs_more import lens_shapes
from .problem import dtype_name
from ._spec_base import (OUT_DTYPES, Q_DTYPES, Layout, PosMode, Scale, _Spec, check_indptr_values, need_finite,
                    need_heads, need_index, need_int, need_kv_dtype, need_out, need_sinks, need_soft_cap,
                    need_tensor, need_window, out_dtype_of)


class _PlanCommon(_Spec):
    """Plan arguments shared by both wrappers (checked once per plan, device reads allowed)."""

    qo_indptr: torch.Tensor
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: Optional[int] = None
    custom_mask: Optional[torch.Tensor] = None
    packed_custom_mask: Optional[torch.Tensor] = None
    causal: bool = False
    pos_encoding_mode: PosMode = "NONE"
    window_left: int = -1
    logits_soft_cap: Optional[float] = None
    sm_scale: Optional[float] = None
    rope_scale: Optional[float] = None
    rope_theta: Optional[float] = None
    q_data_type: Any = "float16"
    kv_data_type: Any = None
    o_data_type: Any = None
    seq_lens: Optional[torch.Tensor] = None
    seq_lens_q: Optional[torch.Tensor] = None
    max_token_per_sequence: Optional[int] = None
    max_sequence_kv: Optional[int] = None
    backend: str = "auto"

    def static_checks(self, d):  # shared by the paged and ragged plans
        q_lens = [b - a for a, b in zip(d.qo[:-1], d.qo[1:])]
        self.mask_checks(d, q_lens, d.kv_lens)

    def common(self) -> SimpleNamespace:
        for name in ("num_qo_heads", "num_kv_heads", "head_dim_qk"):
            need_int(name, getattr(self, name), 1)
        if self.head_dim_vo is not None:
            need_int("head_dim_vo", self.head_dim_vo, 1)
        need_heads(self.num_qo_heads, self.num_kv_heads)
        need_window(self.window_left)
        need_soft_cap(self.logits_soft_cap)
        need_finite("sm_scale", self.sm_scale)
        need_finite("rope_scale", self.rope_scale, positive=True)
        need_finite("rope_theta", self.rope_theta, positive=True)
        q_dtype = parse_dtype(self.q_data_type, "q_data_type")
        if q_dtype not in Q_DTYPES:
            raise bad("q_data_type", q_dtype, "float16, bfloat16, float32 or an fp8 dtype")
        kv_dtype = parse_dtype(self.kv_data_type, "kv_data_type") if self.kv_data_type is not None else q_dtype
        if kv_dtype != q_dtype and kv_dtype not in FP8_DTYPES:
            raise bad("kv_data_type", kv_dtype, f"{q_dtype} (q_data_type) or an fp8 dtype")
        out_dtype = out_dtype_of(q_dtype, self.o_data_type)
        if out_dtype not in OUT_DTYPES:
            raise bad("o_data_type", out_dtype, "float16, bfloat16, float32 or an fp8 dtype")
        need_index("qo_indptr", self.qo_indptr, None, None)
        need_tensor("qo_indptr", self.qo_indptr, ranks=(1,))
        if self.qo_indptr.numel() < 2:
            raise bad("qo_indptr", self.qo_indptr, "a (batch_size + 1,) prefix sum with batch_size >= 1")
        return SimpleNamespace(hq=self.num_qo_heads, hkv=self.num_kv_heads, dqk=self.head_dim_qk,
                               dvo=self.head_dim_vo or self.head_dim_qk, q_dtype=q_dtype, kv_dtype=kv_dtype,
                               out_dtype=out_dtype, batch=self.qo_indptr.numel() - 1, cudnn=self.backend == "cudnn")

    def qo_host(self, d) -> list[int]:
        """Token prefix sums of the queries (element units / (Hq*Dqk) for backend='cudnn')."""
        vals = check_indptr_values("qo_indptr", self.qo_indptr, None, "")
        if d.cudnn:
            mult = d.hq * d.dqk
            if any(v % mult for v in vals):
                raise bad("qo_indptr", vals, f"element offsets (multiples of num_qo_heads*head_dim_qk={mult}) "
                          "with backend='cudnn'")
            vals = [v // mult for v in vals]
        return vals

    def mask_checks(self, d, q_lens, kv_lens) -> None:
        sizes = [a * b for a, b in zip(q_lens, kv_lens)]
        if self.custom_mask is not None:
            need_tensor("custom_mask", self.custom_mask, ranks=(1,), dtypes=(torch.bool,))
            if self.custom_mask.numel() != sum(sizes):
                raise bad("custom_mask.shape", tuple(self.custom_mask.shape),
                          f"({sum(sizes)},) = sum over requests of q_len * kv_len")
        if self.packed_custom_mask is not None:
            need_tensor("packed_custom_mask", self.packed_custom_mask, ranks=(1,), dtypes=(torch.uint8,))
            nbytes = sum((n + 7) // 8 for n in sizes)
            if self.packed_custom_mask.numel() != nbytes:
                raise bad("packed_custom_mask.shape", tuple(self.packed_custom_mask.shape),
                          f"({nbytes},) = per-request packbits of q_len * kv_len bits")


class PagedPlanSpec(_PlanCommon):
    paged_kv_indptr: torch.Tensor
    paged_kv_indices: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    page_size: int
    block_tables: Optional[torch.Tensor] = None

    def derive(self):
        d = self.common()
        need_int("page_size", self.page_size, 1)
        d.qo = self.qo_host(d)
        if d.cudnn:
            return self._cudnn_lengths(d)
        for name in ("paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len"):
            need_index(name, getattr(self, name), None, None)
        need_index("paged_kv_indptr", self.paged_kv_indptr, d.batch + 1, None)
        need_index("paged_kv_last_page_len", self.paged_kv_last_page_len, d.batch, None)
        d.kv_indptr = check_indptr_values("paged_kv_indptr", self.paged_kv_indptr, None, "", start0=False)
        if d.kv_indptr[-1] - d.kv_indptr[0] > self.paged_kv_indices.numel():
            raise bad("paged_kv_indices.shape", tuple(self.paged_kv_indices.shape),
                      f"at least {d.kv_indptr[-1] - d.kv_indptr[0]} page ids (paged_kv_indptr[-1])")
        last = host_ints(self.paged_kv_last_page_len)
        counts = [b - a for a, b in zip(d.kv_indptr[:-1], d.kv_indptr[1:])]
        for b, (n, l) in enumerate(zip(counts, last)):
            if n and not 1 <= l <= self.page_size:
                raise bad(f"paged_kv_last_page_len[{b}]", l, f"in [1, page_size={self.page_size}]")
        d.kv_lens = [(n - 1) * self.page_size + l if n else 0 for n, l in zip(counts, last)]
        ids = self.paged_kv_indices.reshape(-1)[: d.kv_indptr[-1] - d.kv_indptr[0]]
        d.max_page_id = int(ids.max()) if ids.numel() else -1
        if ids.numel() and int(ids.min()) < 0:
            raise bad("paged_kv_indices", int(ids.min()), "page ids >= 0")
        return d

    def _cudnn_lengths(self, d):
        """backend='cudnn': lengths and pages come from seq_lens / seq_lens_q / block_tables."""
        for name in ("seq_lens", "seq_lens_q", "block_tables"):
            if getattr(self, name) is None:
                raise bad(name, None, "a tensor (required by plan with backend='cudnn')")
        need_index("seq_lens", self.seq_lens, d.batch, None, lens_shapes(d.batch))
        need_index("seq_lens_q", self.seq_lens_q, d.batch, None, lens_shapes(d.batch))
        need_index("block_tables", self.block_tables, None, None)
        need_tensor("block_tables", self.block_tables, ranks=(2,))
        q_lens = [b - a for a, b in zip(d.qo[:-1], d.qo[1:])]
        if host_ints(self.seq_lens_q) != q_lens:
            raise bad("seq_lens_q", host_ints(self.seq_lens_q), f"the lengths of qo_indptr: {q_lens}")
        d.kv_lens = host_ints(self.seq_lens)
        capacity = self.block_tables.shape[1] * self.page_size
        if any(not 0 <= n <= capacity for n in d.kv_lens):
            raise bad("seq_lens", d.kv_lens, f"lengths in [0, {capacity}] = block_tables.shape[1] * page_size")
        ids = self.block_tables.to("cpu", torch.int64)
        used = torch.arange(ids.shape[1]).unsqueeze(0) < ((torch.tensor(d.kv_lens) + self.page_size - 1)
                                                         // self.page_size).unsqueeze(1)
        d.max_page_id = int(ids[used].max()) if used.any() else -1
        if used.any() and int(ids[used].min()) < 0:
            raise bad("block_tables", int(ids[used].min()), "page ids >= 0")
        return d



class RaggedPlanSpec(_PlanCommon):
    kv_indptr: torch.Tensor
    v_indptr: Optional[torch.Tensor] = None
    o_indptr: Optional[torch.Tensor] = None

    def derive(self):
        d = self.common()
        d.qo = self.qo_host(d)
        need_index("kv_indptr", self.kv_indptr, d.batch + 1, None)
        kv = check_indptr_values("kv_indptr", self.kv_indptr, None, "", start0=not d.cudnn)
        if d.cudnn:
            kv = self._cudnn_units(d, kv)
        d.kv_indptr = kv
        d.kv_lens = [b - a for a, b in zip(kv[:-1], kv[1:])]
        return d

    def _cudnn_units(self, d, kv):
        mult = d.hkv * d.dqk
        if any(v % mult for v in kv):
            raise bad("kv_indptr", kv, f"element offsets (multiples of num_kv_heads*head_dim_qk={mult}) with backend='cudnn'")
        kv = [v // mult for v in kv]
        for name, t, m, ref in (("v_indptr", self.v_indptr, d.hkv * d.dvo, kv),
                                ("o_indptr", self.o_indptr, d.hq * d.dvo, d.qo)):
            if t is not None:
                vals = host_ints(t)
                if len(vals) != len(ref) or [v // m for v in vals] != ref or any(v % m for v in vals):
                    raise bad(name, vals, f"element offsets of the same rows as the q/kv indptrs ({ref} x {m})")
        return kv



class _RunCommon(_Spec):
    q: torch.Tensor
    planned: Any  # the wrapper's plan-time SimpleNamespace
    q_scale: Optional[Scale] = None
    k_scale: Optional[Scale] = None
    v_scale: Optional[Scale] = None
    out: Optional[torch.Tensor] = None
    lse: Optional[torch.Tensor] = None
    return_lse: bool = False
    sinks: Optional[torch.Tensor] = None
    kv_cache_sf: Any = None
    extra_args: tuple = ()

    def q_checks(self, d):
        p = self.planned
        _query("q", self.q)
        if self.q.dtype != p.q_dtype:
            raise bad("q.dtype", self.q.dtype, f"{p.q_dtype} (plan's q_data_type; plan(q_data_type=...) to change it)")
        if tuple(self.q.shape[1:]) != (p.hq, p.dqk):
            raise bad("q.shape", tuple(self.q.shape), f"(n, {p.hq}, {p.dqk}) = (tokens, num_qo_heads, head_dim_qk)")
        if self.extra_args:
            raise bad("*args", self.extra_args, "none (JIT-variant arguments are not supported)", TypeError)
        if self.kv_cache_sf is not None:
            raise bad("kv_cache_sf", self.kv_cache_sf, "None (NVFP4 KV is not supported)")
        need_sinks(self.sinks, p.hq, self.q.device)

    def io_checks(self, d):
        p, dev = self.planned, self.q.device
        if self.q.shape[0] != p.total_q:
            raise bad("q.shape", tuple(self.q.shape), f"({p.total_q}, {p.hq}, {p.dqk}): plan's qo_indptr[-1] tokens")
        for name in ("q_scale", "k_scale", "v_scale", "o_scale"):
            check_scale(name, getattr(self, name, None), dev, values=False, nonzero=name == "o_scale")
        need_out(self.out, (p.total_q, p.hq, p.dvo), p.out_dtype, dev)
        need_out(self.lse, (p.total_q, p.hq), torch.float32, dev, name="lse")

    def value_checks(self, d):
        for name in ("q_scale", "k_scale", "v_scale", "o_scale"):
            check_scale(name, getattr(self, name, None), self.q.device, values=True, nonzero=name == "o_scale")


class PagedRunSpec(_RunCommon):
    paged_kv_cache: Any
    window_left: Optional[int] = None

    def derive(self):
        p = self.planned
        if p.cudnn:  # cuDNN reads (pages, Hkv, P, D) whatever the wrapper's kv_layout
            return _paged_kv(self.paged_kv_cache, "HND", allow_squeezed=False, name="paged_kv_cache")
        return _paged_kv(self.paged_kv_cache, p.layout, allow_squeezed=True, name="paged_kv_cache")

    def static_checks(self, d):
        p = self.planned
        self.q_checks(d)
        if d.k.device != self.q.device:
            raise bad("paged_kv_cache.device", d.k.device, f"{self.q.device}, the device of q")
        if d.kv_dtype != p.kv_dtype:
            raise bad("paged_kv_cache.dtype", d.kv_dtype, f"{p.kv_dtype} (plan's kv_data_type)")
        got = (d.page_size, d.hkv, d.dqk, d.dvo)
        if got != (p.page_size, p.hkv, p.dqk, p.dvo):
            cache = self.paged_kv_cache
            shape = tuple(cache.shape) if isinstance(cache, torch.Tensor) else tuple(tuple(t.shape) for t in cache)
            raise bad("paged_kv_cache.shape", shape, f"(page_size, num_kv_heads, head_dim_qk, head_dim_vo) = "
                      f"{(p.page_size, p.hkv, p.dqk, p.dvo)} as planned, in the {p.layout} layout (got {got} "
                      f"from K/V of shape {tuple(d.k.shape)} as (pages, page_size, heads, dim))")
        if self.window_left is not None and self.window_left != p.window_left and p.backend != "trtllm-gen":
            raise bad("window_left", self.window_left, f"None or {p.window_left} (the planned value)")

    def size_checks(self, d):
        self.io_checks(d)
        if self.planned.max_page_id >= d.pages:
            name = "block_tables" if self.planned.cudnn else "paged_kv_indices"
            raise bad(f"{name} (planned)", self.planned.max_page_id, f"page ids < {d.pages}, the pages of "
                      f"paged_kv_cache (shape[0]={d.pages}): re-plan, or pass the whole cache")


class RaggedRunSpec(_RunCommon):
    k: torch.Tensor
    v: torch.Tensor
    o_scale: Optional[Scale] = None

    def derive(self):
        return SimpleNamespace()

    def static_checks(self, d):
        p = self.planned
        self.q_checks(d)
        for name, t, dim in (("k", self.k, p.dqk), ("v", self.v, p.dvo)):
            need_tensor(name, t, ranks=(3,), device=self.q.device)
            if t.dtype != p.kv_dtype:
                raise bad(f"{name}.dtype", t.dtype, f"{p.kv_dtype} (plan's kv_data_type)")
            if tuple(t.shape[1:]) != (p.hkv, dim) or t.stride(-1) != 1:
                raise bad(f"{name}.shape", tuple(t.shape), f"(n, {p.hkv}, {dim}) with a unit last stride")

    def size_checks(self, d):
        self.io_checks(d)
        for name, t in (("k", self.k), ("v", self.v)):
            if t.shape[0] < self.planned.total_kv:
                raise bad(f"{name}.shape", tuple(t.shape), f">= {self.planned.total_kv} rows (plan's kv_indptr[-1])")


class SinglePrefillSpec(_Spec):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale_q: Optional[torch.Tensor] = None
    scale_k: Optional[torch.Tensor] = None
    scale_v: Optional[torch.Tensor] = None
    o_dtype: Any = None
    custom_mask: Optional[torch.Tensor] = None
    packed_custom_mask: Optional[torch.Tensor] = None
    causal: bool = False
    kv_layout: Layout = "NHD"
    pos_encoding_mode: PosMode = "NONE"
    sm_scale: Optional[float] = None
    window_left: int = -1
    logits_soft_cap: Optional[float] = None
    rope_scale: Optional[float] = None
    rope_theta: Optional[float] = None
    backend: str = "auto"
    return_lse: bool = False
    kv_cache_sf: Any = None
    k_scale: Optional[Scale] = None
    v_scale: Optional[Scale] = None

    def derive(self):
        _query("q", self.q)
        need_tensor("k", self.k, ranks=(3,))
        need_tensor("v", self.v, ranks=(3,))
        k = self.k.transpose(0, 1) if self.kv_layout == "HND" else self.k
        v = self.v.transpose(0, 1) if self.kv_layout == "HND" else self.v
        out_dtype = out_dtype_of(self.q.dtype, self.o_dtype)
        return SimpleNamespace(k=k, v=v, qo_len=self.q.shape[0], kv_len=k.shape[0], hq=self.q.shape[1],
                               hkv=k.shape[1], dqk=k.shape[2], dvo=v.shape[2], out_dtype=out_dtype)

    def static_checks(self, d):
        q, dev = self.q, self.q.device
        for name in ("scale_q", "scale_k", "scale_v"):
            if getattr(self, name) is not None:
                raise bad(name, getattr(self, name), "None (per-head fp8 scales are not supported; "
                          "pass the scalar k_scale / v_scale)")
        if self.kv_cache_sf is not None:
            raise bad("kv_cache_sf", self.kv_cache_sf, "None (NVFP4 KV is not supported)")
        for name, t in (("k", self.k), ("v", self.v)):
            need_tensor(name, t, device=dev)
            need_kv_dtype(name, t, q.dtype)
            if t.stride(-1) != 1:
                raise bad(f"{name}.stride()", tuple(t.stride()), "a unit stride on the last (head_dim) dimension")
        if d.dqk != q.shape[2]:
            raise bad("k.shape", tuple(self.k.shape), f"head_dim {q.shape[2]} = q.shape[2]")
        if self.v.dtype != self.k.dtype:
            raise bad("v.dtype", self.v.dtype, f"{dtype_name(self.k.dtype)}, the dtype of k")
        need_heads(d.hq, d.hkv, "q.shape[1] (num_qo_heads)", "num_kv_heads")
        if d.out_dtype not in OUT_DTYPES:
            raise bad("o_dtype", d.out_dtype, "float16, bfloat16, float32 or an fp8 dtype")
        need_window(self.window_left)
        need_soft_cap(self.logits_soft_cap)
        need_finite("rope_scale", self.rope_scale, positive=True)
        need_finite("rope_theta", self.rope_theta, positive=True)

    def size_checks(self, d):
        # Per call: kv_len and sm_scale vary from call to call, so the cache key leaves them out.
        dev = self.q.device
        need_finite("sm_scale", self.sm_scale)
        if d.v.shape[:2] != d.k.shape[:2]:
            raise bad("v.shape", tuple(self.v.shape), f"the leading dims of k {tuple(self.k.shape)} "
                      f"(kv_len and num_kv_heads in the {self.kv_layout} layout)")
        if self.custom_mask is not None and self.packed_custom_mask is not None:
            raise bad("packed_custom_mask", self.packed_custom_mask, "None when custom_mask is given (pass one)")
        if self.custom_mask is not None:
            need_tensor("custom_mask", self.custom_mask, dtypes=(torch.bool,), device=dev)
            if tuple(self.custom_mask.shape) != (d.qo_len, d.kv_len):
                raise bad("custom_mask.shape", tuple(self.custom_mask.shape), f"({d.qo_len}, {d.kv_len}) = (qo_len, kv_len)")
        if self.packed_custom_mask is not None:
            need_tensor("packed_custom_mask", self.packed_custom_mask, ranks=(1,), dtypes=(torch.uint8,), device=dev)
            nbytes = (d.qo_len * d.kv_len + 7) // 8
            if self.packed_custom_mask.numel() != nbytes:
                raise bad("packed_custom_mask.shape", tuple(self.packed_custom_mask.shape), f"({nbytes},)")
        check_scale("k_scale", self.k_scale, dev, values=False)
        check_scale("v_scale", self.v_scale, dev, values=False)

    def value_checks(self, d):
        check_scale("k_scale", self.k_scale, self.q.device, values=True)
        check_scale("v_scale", self.v_scale, self.q.device, values=True)
