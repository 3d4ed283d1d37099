"""NVFP4 KV caches at the entry points: FlashInfer 0.7.2's ``kv_cache_sf``, checked and viewed.

An NVFP4 cache (backends/native/nvfp4.py has the format) is K/V of dtype ``uint8`` whose last dim
is ``head_dim // 2`` (two fp4 values a byte), with ``kv_cache_sf``: their fp8 e4m3 scale factors
(``torch.float8_e4m3fn``, or its bytes as ``uint8``), one per 16 values, of the cache's shape with a
last dim of ``head_dim // 16`` and a unit innermost stride. FlashInfer 0.7.2 serves it on
``single_prefill_with_kv_cache`` (``kv_cache_sf=(k_sf, v_sf)``) and
``BatchPrefillWithPagedKVCacheWrapper.run`` (a ``(k_sf, v_sf)`` pair or one (pages, 2, ...) tensor,
in the cache's layout) and ``BatchPrefillWithRaggedKVCacheWrapper.run`` (a pair, or one
(tokens, 2, Hkv, D // 16) tensor), after ``plan(kv_data_type=torch.uint8)``, with a 16-bit query;
``k_scale`` / ``v_scale`` are the global scales (logits / output), as for fp8.
"""
from __future__ import annotations

from typing import Any

import torch

from backends.native.nvfp4 import SF_BLOCK, SF_DTYPES

from .checks import bad, need_tensor, paged_nhd, split_kv
from .problem import dtype_name

PACKED = torch.uint8  # the cache dtype of NVFP4 values
NVFP4_Q_DTYPES = (torch.float16, torch.bfloat16)
SF_TEXT = "float8_e4m3fn (or its bytes as uint8)"


def packed(t: Any) -> bool:
    """Whether a K/V tensor holds NVFP4 values (uint8 bytes of two fp4 each)."""
    return isinstance(t, torch.Tensor) and t.dtype == PACKED


def need_query_dtype(name: str, q_dtype: torch.dtype) -> None:
    if q_dtype not in NVFP4_Q_DTYPES:
        raise bad(name, q_dtype, "float16 or bfloat16 with an NVFP4 (uint8) K/V cache (FlashInfer 0.7.2's fa2)")


def need_head_dim(name: str, head_dim: int) -> None:
    """A head dim an NVFP4 row can hold: whole blocks of 16 values (one scale factor each)."""
    if head_dim % SF_BLOCK:
        raise bad(name, head_dim, f"a multiple of {SF_BLOCK} with an NVFP4 cache (one fp8 scale factor per "
                  f"{SF_BLOCK} values)")


def sf_pair(kv_cache_sf: Any, name: str = "kv_cache_sf") -> tuple[torch.Tensor, torch.Tensor]:
    """single_prefill_with_kv_cache's form: a (k_sf, v_sf) pair of tensors."""
    if (not isinstance(kv_cache_sf, (tuple, list)) or len(kv_cache_sf) != 2
            or not all(isinstance(t, torch.Tensor) for t in kv_cache_sf)):
        raise bad(name, kv_cache_sf, "a (k_sf, v_sf) tuple of two torch.Tensors (NVFP4 scale factors)", TypeError)
    return kv_cache_sf[0], kv_cache_sf[1]


def need_sf_static(name: str, sf: torch.Tensor, cache_name: str, cache: torch.Tensor) -> None:
    """dtype, rank, device and innermost stride of one scale-factor tensor (what a call key proves)."""
    need_tensor(name, sf, ranks=(cache.dim(),), dtypes=SF_DTYPES, device=cache.device)
    if sf.dim() and sf.stride(-1) != 1:
        raise bad(f"{name}.stride()", tuple(sf.stride()), "a unit stride on the last dim (innermost stride 1)")
    if cache.shape[-1] * 2 % SF_BLOCK:
        raise bad(f"{cache_name}.shape", tuple(cache.shape), f"a last dim of head_dim // 2 with head_dim a multiple "
                  f"of {SF_BLOCK} (NVFP4: two values a byte, one scale factor per {SF_BLOCK})")


def need_sf_shape(name: str, sf: torch.Tensor, cache_name: str, cache: torch.Tensor) -> None:
    """The scale factors of every row of ``cache``: its shape with a last dim of head_dim // 16."""
    want = (*cache.shape[:-1], cache.shape[-1] * 2 // SF_BLOCK)
    if tuple(sf.shape) != want:
        raise bad(f"{name}.shape", tuple(sf.shape), f"{want}: the shape of {cache_name} {tuple(cache.shape)} with "
                  f"the last dim head_dim // {SF_BLOCK}")


def need_cache_pair(k: torch.Tensor, v: torch.Tensor, kv_cache_sf: Any, k_name: str, v_name: str) -> None:
    """K and V both NVFP4, and the scale factors given: neither half alone, no stray scale factors."""
    if packed(k) != packed(v):
        raise bad(f"{v_name}.dtype", v.dtype, f"{dtype_name(k.dtype)}, the dtype of {k_name} (NVFP4 K and V "
                  "are both uint8)")
    if packed(k) and kv_cache_sf is None:
        raise bad("kv_cache_sf", None, f"the NVFP4 scale factors of the uint8 {k_name}/{v_name} (a (k_sf, v_sf) "
                  f"pair of {SF_TEXT} tensors)")
    if not packed(k) and kv_cache_sf is not None:
        raise bad("kv_cache_sf", kv_cache_sf, f"None with a {dtype_name(k.dtype)} cache (scale factors go with an "
                  "NVFP4 cache: uint8 K/V of head_dim // 2 bytes a row)")


def paged_sf_views(kv_cache_sf: Any, layout: str) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The paged wrapper's scale factors as logical NHD views (pages, P, Hkv, D // 16) and whether
    the page dim is squeezed (page size 1), read like the cache: a (k_sf, v_sf) pair or one
    (pages, 2, ...) tensor in the wrapper's layout."""
    k_sf, v_sf, squeezed = split_kv(kv_cache_sf, "kv_cache_sf", True)
    return paged_nhd(k_sf, layout, squeezed), paged_nhd(v_sf, layout, squeezed), squeezed


def need_paged_sf(kv_cache_sf: Any, d) -> None:
    """Every check of the paged wrapper's scale factors against the cache ``d`` (paged_kv_spec's)."""
    k_sf, v_sf, squeezed = paged_sf_views(kv_cache_sf, d.layout)
    if squeezed != d.squeezed:
        raise bad("kv_cache_sf", kv_cache_sf, "tensors of the rank of paged_kv_cache's (one scale-factor tensor "
                  "per cache tensor, its last dim head_dim // 16)")
    for half, sf, cache in (("k", k_sf, d.k), ("v", v_sf, d.v)):
        need_sf_static(f"kv_cache_sf ({half})", sf, f"paged_kv_cache ({half})", cache)
        need_sf_shape(f"kv_cache_sf ({half}, as (pages, page_size, heads, dim))", sf,
                      f"paged_kv_cache ({half}, as (pages, page_size, heads, dim))", cache)


def ragged_sf(kv_cache_sf: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The ragged wrapper's scale factors: a (k_sf, v_sf) pair, or one (tokens, 2, Hkv, D // 16)
    tensor whose dim 1 holds K's and V's (FlashInfer 0.7.2 unbinds it)."""
    if isinstance(kv_cache_sf, torch.Tensor):
        if kv_cache_sf.dim() != 4 or kv_cache_sf.shape[1] != 2:
            raise bad("kv_cache_sf", kv_cache_sf, "a (k_sf, v_sf) pair, or one (tokens, 2, num_kv_heads, "
                      "head_dim // 16) tensor (K's scale factors at [:, 0], V's at [:, 1])")
        k_sf, v_sf = kv_cache_sf.unbind(1)
        return k_sf, v_sf
    return sf_pair(kv_cache_sf)


def need_ragged_sf(kv_cache_sf: Any, k: torch.Tensor, v: torch.Tensor) -> None:
    """Every check of the ragged wrapper's scale factors against its K and V."""
    for half, sf, cache in zip(("k", "v"), ragged_sf(kv_cache_sf), (k, v)):
        need_sf_static(f"kv_cache_sf ({half})", sf, half, cache)
        need_sf_shape(f"kv_cache_sf ({half})", sf, half, cache)
