"""``single_prefill_with_kv_cache`` and ``single_prefill_with_kv_cache_return_lse``.

Seed: 002 (flashinfer.prefill module page) and 004 (the ``_return_lse`` signature and example).
"""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Any, Literal, Optional, Union, overload

import torch

from .. import nvfp4, ops, policy
from ..checks import (Layout, OUT_DTYPES, PosMode, Scale, Spec, bad, check_scale, fold_scale, layout_read,
                      need_finite, need_heads, need_kv_dtype, need_query, need_soft_cap, need_tensor, need_window,
                      out_dtype_of, uniform_indptr, unpack_bits)
from ..problem import AttentionBatch, AttentionProblem, dtype_name
from . import _base as B
from ._base import UNSET

ENTRY = "single_prefill_with_kv_cache"


# The types return_lse gives (typing.overload: no runtime effect; the signature is the seed's below)
@overload
def single_prefill_with_kv_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any,
                                 return_lse: Literal[True], **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def single_prefill_with_kv_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any,
                                 return_lse: Literal[False] = ..., **kwargs: Any) -> torch.Tensor: ...


def single_prefill_with_kv_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, custom_mask: Optional[torch.Tensor] = None,
    packed_custom_mask: Optional[torch.Tensor] = None, causal: bool = False, kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE", allow_fp16_qk_reduction: bool = UNSET, sm_scale: Optional[float] = None,
    window_left: int = -1, logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None, return_lse: bool = False, *, use_fp16_qk_reduction: bool = UNSET,
    scale_q: Optional[torch.Tensor] = None, scale_k: Optional[torch.Tensor] = None,
    scale_v: Optional[torch.Tensor] = None, o_dtype: Optional[torch.dtype] = None, backend: str = "auto",
    kv_cache_sf=None, k_scale: Union[float, torch.Tensor, None] = None,
    v_scale: Union[float, torch.Tensor, None] = None,
) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Prefill/append attention of one request over its whole KV.

    Parameters
    ----------
    q : (qo_len, num_qo_heads, head_dim_qk)
    k : (kv_len, num_kv_heads, head_dim_qk) for NHD, (num_kv_heads, kv_len, head_dim_qk) for HND
    v : like ``k`` with head_dim_vo
    custom_mask : bool (qo_len, kv_len), or its flattened (qo_len * kv_len,) form; True keeps
    packed_custom_mask : uint8 little-endian packbits of the flattened mask; wins over custom_mask
    causal : bottom-right aligned; ignored when a mask is given
    window_left : inclusive; -1 for none
    k_scale, v_scale : multiply the logits / the output (fp8 dequantization)

    Returns
    -------
    out (qo_len, num_qo_heads, head_dim_vo), or (out, lse) with lse (qo_len, num_qo_heads) fp32
    base 2 when ``return_lse``. ``allow_fp16_qk_reduction`` is a speed hint and never lowers
    precision here. Per-head fp8 ``scale_q/k/v`` are refused. NVFP4 K/V: uint8 ``k``/``v`` of
    head_dim // 2 bytes a row with ``kv_cache_sf=(k_sf, v_sf)``, their fp8 scale factors
    (dispatch/nvfp4.py); ``k_scale``/``v_scale`` are then the global scales.
    """
    if use_fp16_qk_reduction is not UNSET:  # a speed hint; given twice is an error
        B.one_of("allow_fp16_qk_reduction", allow_fp16_qk_reduction, "use_fp16_qk_reduction",
                 use_fp16_qk_reduction, False)
    if torch.compiler.is_compiling() and scale_q is None and scale_k is None and scale_v is None \
            and kv_cache_sf is None:
        (k1, k2), (v1, v2) = ops.split_scale(k_scale), ops.split_scale(v_scale)
        out, lse = ops.single_prefill(q, k, v, custom_mask, packed_custom_mask, causal, kv_layout, pos_encoding_mode,
                                      sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta, return_lse,
                                      backend, k1, k2, v1, v2, o_dtype)
        return (out, lse) if return_lse else out
    if packed_custom_mask is not None:
        custom_mask = None  # documented: "if provided, the custom_mask will be ignored"
    elif isinstance(custom_mask, torch.Tensor) and custom_mask.dim() == 1:
        custom_mask = _unflatten_mask(custom_mask, q, k, kv_layout)
    lane = DECLARATION.lane((q, k, v, scale_q, scale_k, scale_v, o_dtype, custom_mask, packed_custom_mask, causal,
                             kv_layout, pos_encoding_mode, sm_scale, window_left, logits_soft_cap, rope_scale,
                             rope_theta, return_lse, kv_cache_sf, k_scale, v_scale), policy.explicit_choice(backend))
    z = lane.sizes
    if kv_layout == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    out = torch.empty(z.qo_len, z.hq, z.dvo, dtype=z.out_dtype, device=q.device)
    lse = torch.empty(z.qo_len, z.hq, dtype=torch.float32, device=q.device) if return_lse else None
    batch = AttentionBatch(q=q, k=k, v=v, qo_indptr=z.qo_indptr, kv_lens=z.kv_lens, out=out, batch_size=1,
                           max_q_len=z.qo_len, max_kv_len=z.kv_len,
                           sm_scale=z.sm_scale if k_scale is None else fold_scale(z.sm_scale, k_scale),
                           out_scale=1.0 if v_scale is None else fold_scale(1.0, v_scale), kv_indptr=z.kv_indptr,
                           lse=lse, custom_mask=_flat_mask(custom_mask, packed_custom_mask, z),
                           mask_indptr=z.mask_indptr, extras=B.NO_EXTRAS)
    if kv_cache_sf is not None:  # NVFP4: the scale factors as logical NHD views, like k and v
        batch.k_sf, batch.v_sf = (sf.transpose(0, 1) if kv_layout == "HND" else sf for sf in kv_cache_sf)
    lane.launch(batch)
    return (out, lse) if return_lse else out


B.seed_signature(single_prefill_with_kv_cache, {"allow_fp16_qk_reduction": False,
                                                "use_fp16_qk_reduction": None})
ops.register_eager("single_prefill_with_kv_cache", single_prefill_with_kv_cache)
single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache, return_lse=True)


def _unflatten_mask(mask: torch.Tensor, q, k, kv_layout) -> torch.Tensor:
    """The flattened (qo_len * kv_len,) form -> (qo_len, kv_len); a wrong size is left for the
    spec to report with the expected shape."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 3 and k.dim() == 3):
        return mask
    kv_len = k.shape[1] if kv_layout == "HND" else k.shape[0]
    if mask.numel() != q.shape[0] * kv_len:
        return mask
    return mask.view(q.shape[0], kv_len)


_HND_ROWS = (1,)  # (num_kv_heads, kv_len, head_dim): kv_len varies


def _vary(args: dict) -> dict:
    kv_dim = _HND_ROWS if _hnd(args) else B.ROWS
    return {"k": kv_dim, "v": kv_dim, "kv_cache_sf": kv_dim, "custom_mask": B.ALL_DIMS,
            "packed_custom_mask": B.ALL_DIMS}


def _problem(spec, d, size: tuple) -> AttentionProblem:
    masked = spec.custom_mask is not None or spec.packed_custom_mask is not None
    return AttentionProblem(
        entry=ENTRY, phase="decode" if d.qo_len == 1 else "prefill", kv_storage="dense", kv_layout=spec.kv_layout,
        num_qo_heads=d.hq, num_kv_heads=d.hkv, head_dim_qk=d.dqk, head_dim_vo=d.dvo,
        q_dtype=dtype_name(spec.q.dtype), kv_dtype=dtype_name(d.k.dtype), out_dtype=dtype_name(d.out_dtype),
        causal=spec.causal, window_left=spec.window_left, mask="custom" if masked else "none",
        logits_soft_cap=float(spec.logits_soft_cap or 0.0), pos_encoding=spec.pos_encoding_mode,
        rope_scale=float(spec.rope_scale or 1.0), rope_theta=float(spec.rope_theta or 1e4),
        return_lse=spec.return_lse, device_type="cpu" if spec.q.device.type == "cpu" else "cuda", sizes=size)


def _size(args: dict) -> tuple:
    return 1, B.rows(args["q"]), B.rows(args["k"], 1 if _hnd(args) else 0)


def _hnd(args: dict) -> bool:
    layout = args["kv_layout"]  # any value: the spec names a bad one
    return type(layout) is str and layout == "HND"


def _sizes(args: dict, d) -> SimpleNamespace:
    """What a repeat of the call builds its batch from (the spec's derived sizes, the index tensors)."""
    device = args["q"].device
    kv_indptr = uniform_indptr(1, d.kv_len, device)
    masked = args["custom_mask"] is not None or args["packed_custom_mask"] is not None
    return SimpleNamespace(
        qo_len=d.qo_len, kv_len=d.kv_len, hq=d.hq, dvo=d.dvo, out_dtype=d.out_dtype,
        sm_scale=args["sm_scale"] if args["sm_scale"] is not None else 1.0 / math.sqrt(d.dqk),
        qo_indptr=uniform_indptr(1, d.qo_len, device), kv_indptr=kv_indptr, kv_lens=kv_indptr[1:],
        mask_indptr=uniform_indptr(1, d.qo_len * d.kv_len, device) if masked else None)


def _flat_mask(custom_mask, packed_custom_mask, z) -> Optional[torch.Tensor]:
    if custom_mask is not None:
        return custom_mask.reshape(-1)
    if packed_custom_mask is not None:
        n = z.qo_len * z.kv_len
        return unpack_bits(packed_custom_mask, [(n + 7) // 8], [n])
    return None


# -- the spec: what a call must satisfy (dispatch.checks: the three check groups) ---------------
class SinglePrefillSpec(Spec):
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
        need_query("q", self.q)
        need_tensor("k", self.k, ranks=(3,))
        need_tensor("v", self.v, ranks=(3,))
        k = self.k.transpose(0, 1) if self.kv_layout == "HND" else self.k
        v = self.v.transpose(0, 1) if self.kv_layout == "HND" else self.v
        out_dtype = out_dtype_of(self.q.dtype, self.o_dtype)
        unpack = 2 if nvfp4.packed(self.k) else 1  # NVFP4: head_dim // 2 bytes a row
        return SimpleNamespace(k=k, v=v, qo_len=self.q.shape[0], kv_len=k.shape[0], hq=self.q.shape[1],
                               hkv=k.shape[1], dqk=k.shape[2] * unpack, dvo=v.shape[2] * unpack, out_dtype=out_dtype)

    def static_checks(self, d):
        q, dev = self.q, self.q.device
        for name in ("scale_q", "scale_k", "scale_v"):
            if getattr(self, name) is not None:
                raise bad(name, getattr(self, name), "None (per-head fp8 scales are not supported; "
                          "pass the scalar k_scale / v_scale)")
        nvfp4.need_cache_pair(self.k, self.v, self.kv_cache_sf, "k", "v")
        for name, t in (("k", self.k), ("v", self.v)):
            need_tensor(name, t, device=dev)
            if not nvfp4.packed(t):
                need_kv_dtype(name, t, q.dtype)
            if t.stride(-1) != 1:
                raise bad(f"{name}.stride()", tuple(t.stride()), "a unit stride on the last (head_dim) dimension")
        if d.dqk != q.shape[2]:
            raise bad("k.shape", tuple(self.k.shape), f"head_dim {q.shape[2]} = q.shape[2]" + (
                f" ({q.shape[2] // 2} bytes a row: NVFP4 holds two values a byte)" if nvfp4.packed(self.k) else ""))
        if nvfp4.packed(self.k):
            self.nvfp4_static_checks()
        if self.v.dtype != self.k.dtype:
            raise bad("v.dtype", self.v.dtype, f"{dtype_name(self.k.dtype)}, the dtype of k")
        need_heads(d.hq, d.hkv, "q.shape[1] (num_qo_heads)", "num_kv_heads",
                   layout_read("k.shape", self.k.shape, self.kv_layout))
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
        if nvfp4.packed(self.k):  # kv_len varies per call: the scale factors' rows with it
            for i, (sf, name, t) in enumerate(zip(self.kv_cache_sf, ("k", "v"), (self.k, self.v))):
                nvfp4.need_sf_shape(f"kv_cache_sf[{i}]", sf, name, t)

    def nvfp4_static_checks(self):
        """A 16-bit query and fp8 scale factors beside uint8 K/V (their shapes: size_checks)."""
        nvfp4.need_query_dtype("q.dtype", self.q.dtype)
        for i, (sf, name, t) in enumerate(zip(nvfp4.sf_pair(self.kv_cache_sf), ("k", "v"), (self.k, self.v))):
            nvfp4.need_sf_static(f"kv_cache_sf[{i}]", sf, name, t)
        nvfp4.need_head_dim("v.shape[-1] * 2 (head_dim_vo)", self.v.shape[-1] * 2)

    def value_checks(self, d):
        check_scale("k_scale", self.k_scale, self.q.device, values=True)
        check_scale("v_scale", self.v_scale, self.q.device, values=True)


DECLARATION = B.Declaration(
    ENTRY, SinglePrefillSpec, ("q", "k", "v", "scale_q", "scale_k", "scale_v", "o_dtype", "custom_mask",
                               "packed_custom_mask", "causal", "kv_layout", "pos_encoding_mode", "sm_scale",
                               "window_left", "logits_soft_cap", "rope_scale", "rope_theta", "return_lse",
                               "kv_cache_sf", "k_scale", "v_scale"),
    problem=_problem, sizes=_sizes, size=_size, vary=_vary, per_call=("sm_scale", "k_scale", "v_scale"))
