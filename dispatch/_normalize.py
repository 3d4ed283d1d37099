"""Shared helpers of the entry points: error text, KV-cache views, index conversions, LSE layout.

Everything here turns one of FlashInfer's calling conventions into the normalized one of
``dispatch.problem`` (logical NHD paged views, block tables, token indptrs, packed base-2 LSE)
without copying caller tensors. Functions that read device data say so in their docstring:
the entry points call them only at plan time, on CPU tensors, or on the first call per key.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from backends._device import kept_views

from backends._device import BoundedCache
from .policy import RAW_ENVIRON, getenv
from .problem import dtype_name

ENV_VALIDATE = "ATTN_DISPATCH_VALIDATE"
_ENV_VALIDATE_RAW = ENV_VALIDATE.encode()  # its key in os.environ._data (policy.RAW_ENVIRON)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
INDEX_DTYPES = (torch.int32,)


# -- error text -----------------------------------------------------------------------------
def show(value: Any) -> str:
    """A short, readable rendering of an argument value for error messages."""
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={tuple(value.shape)}, dtype={dtype_name(value.dtype)}, device={value.device})"
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
        return "(" + ", ".join(show(v) for v in value) + ")"
    return repr(value)


def bad(name: str, value: Any, allowed: str, exc: type = ValueError) -> Exception:
    """The one rejection format: ``name=value: allowed ...`` (raise the result)."""
    return exc(f"{name}={show(value)}: allowed {allowed}")


def dtypes_text(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(dtype_name(d) for d in dtypes)


def full_validation() -> bool:
    """ATTN_DISPATCH_VALIDATE=full: device-data checks on every call, not once per key
    ('' or 'first', the default: CPU tensors every call, device tensors on a key's first call)."""
    if RAW_ENVIRON is not None and _ENV_VALIDATE_RAW not in RAW_ENVIRON:  # unset: every call's case
        return False
    value = getenv(ENV_VALIDATE)
    if not value:  # empty: the default
        return False
    mode = value.strip().lower()
    if mode not in ("", "first", "full"):
        raise bad(ENV_VALIDATE, value, "'full' (check device data on every call), 'first' or unset")
    return mode == "full"


def parse_dtype(value: Any, name: str) -> torch.dtype:
    """A torch dtype or its FlashInfer string spelling ("float16", "torch.bfloat16")."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        found = getattr(torch, value.replace("torch.", ""), None)
        if isinstance(found, torch.dtype):
            return found
    raise bad(name, value, "a torch.dtype or its name, e.g. torch.float16 or 'bfloat16'", TypeError)


# -- KV caches --------------------------------------------------------------------------------
def split_kv(kv_cache: Any, name: str, allow_squeezed: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(k, v, squeezed) in the caller's layout. 5-D (pages, 2, ...) with dim 1 = K/V (size 1:
    K is V), or a (K, V) tuple of 4-D tensors; with ``allow_squeezed`` a 4-D single tensor or a
    tuple of 3-D tensors is page size 1 with the page dim squeezed (squeezed=True)."""
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2 or not all(isinstance(t, torch.Tensor) for t in kv_cache):
            raise bad(name, kv_cache, "a tensor or a (k_cache, v_cache) tuple of two tensors", TypeError)
        k, v = kv_cache
        ranks = (4, 3) if allow_squeezed else (4,)
        if k.dim() != v.dim() or k.dim() not in ranks:
            raise bad(name, kv_cache, f"a tuple of two tensors of rank {' or '.join(map(str, ranks))}")
        return k, v, k.dim() == 3
    if not isinstance(kv_cache, torch.Tensor):
        raise bad(name, kv_cache, "a tensor or a (k_cache, v_cache) tuple of two tensors", TypeError)
    ranks = (5, 4) if allow_squeezed else (5,)
    if kv_cache.dim() not in ranks or kv_cache.shape[1] not in (1, 2):
        raise bad(name, kv_cache, f"a {' or '.join(f'{r}-D' for r in ranks)} tensor (pages, 2, ...) "
                  "with K at [:, 0] and V at [:, 1] (dim 1 of size 1 or 2)")
    if kv_cache.shape[1] == 2:
        k, v = kv_cache.unbind(1)  # one call for both views (the hot path of every paged run)
    else:
        k = v = kv_cache.select(1, 0)
    return k, v, kv_cache.dim() == 4


def cache_halves(cache: torch.Tensor, layout: str) -> tuple:
    """The logical NHD (k, v) views of a 5-D (pages, 2, ...) cache in ``layout`` (kept_views)."""
    return kept_views(cache, layout, lambda c: tuple(paged_nhd(half, layout, False) for half in c.unbind(1)))


def paged_nhd(t: torch.Tensor, layout: str, squeezed: bool) -> torch.Tensor:
    """The logical NHD view (pages, P, Hkv, D) of one paged cache tensor (never a copy)."""
    if squeezed:
        return t.unsqueeze(1)  # (pages, Hkv, D) -> (pages, 1, Hkv, D) whatever the layout
    return t.permute(0, 2, 1, 3) if layout == "HND" else t


# -- indices ----------------------------------------------------------------------------------
def host_ints(t: torch.Tensor) -> list[int]:
    """Host copy of a small index tensor (synchronizes for CUDA tensors: plan time only)."""
    return [int(x) for x in t.reshape(-1).tolist()]


def block_table_from_pages(kv_indptr: list[int], kv_indices: torch.Tensor, device) -> torch.Tensor:
    """FlashInfer's (indptr, indices) page lists -> (B, max_pages) int32 block table."""
    counts = [b - a for a, b in zip(kv_indptr[:-1], kv_indptr[1:])]
    batch = len(counts)
    table = torch.zeros(batch, max(max(counts, default=0), 1), dtype=torch.int32)
    ids = kv_indices.reshape(-1)[: kv_indptr[-1]].to("cpu", torch.int32)
    for b, (start, count) in enumerate(zip(kv_indptr[:-1], counts)):
        table[b, :count] = ids[start - kv_indptr[0]: start - kv_indptr[0] + count]
    return table.to(device)


def unpack_bits(packed: torch.Tensor, seg_bytes: list[int], seg_bits: list[int]) -> torch.Tensor:
    """Little-endian packbits segments (one per request, each padded to whole bytes) -> flat
    bool mask of sum(seg_bits) entries. Runs at plan time."""
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = ((packed.reshape(-1).to(torch.uint8).unsqueeze(-1) >> shifts) & 1).bool().reshape(-1)
    parts, start = [], 0
    for nbytes, nbits in zip(seg_bytes, seg_bits):
        parts.append(bits[start * 8: start * 8 + nbits])
        start += nbytes
    return torch.cat(parts) if parts else bits[:0]


def cumsum0(lens: Sequence[int]) -> list[int]:
    out = [0]
    for n in lens:
        out.append(out[-1] + int(n))
    return out


# Keyed on per-call sizes, so bounded: a serving stream sees every length once.
_ARANGE_CACHE = BoundedCache(maxsize=256)


def uniform_indptr(batch: int, step: int, device) -> torch.Tensor:
    """arange(B+1)*step int32 on a device, cached (read-only by contract)."""
    key = (batch, step, torch.device(device))
    t = _ARANGE_CACHE.get(key)
    if t is None:
        t = torch.arange(batch + 1, dtype=torch.int32, device=device) * step
        _ARANGE_CACHE.put(key, t)
    return t


# -- scales -----------------------------------------------------------------------------------
def fold_scale(base, *factors):
    """Product of a float/0-dim tensor scale with optional float/tensor factors (None skipped).
    Floats stay floats (no allocation); any tensor makes a 0-dim/1-elem fp32 tensor."""
    out = base
    for f in factors:
        if f is None:
            continue
        if isinstance(out, torch.Tensor) or isinstance(f, torch.Tensor):
            out = out * f
        else:
            out = float(out) * float(f)
    return out


def check_scale(name: str, value, device, values: bool, nonzero: bool = False) -> None:
    """A scale is a finite number, or a 1-element float32 tensor on the inputs' device
    (``nonzero``: a divisor, so 0 is refused too; tensor values are read only with ``values``)."""
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype != torch.float32:
            raise bad(name, value, "a Python float or a 0-dim / 1-element float32 tensor")
        if value.device != device:
            raise bad(name, value, f"a tensor on {device}, the device of the inputs")
        if values:
            got = float(value.reshape(-1)[0])
            if not math.isfinite(got) or (nonzero and got == 0):
                raise bad(name, got, "a finite value" + (", not 0 (it divides the output)" if nonzero else ""))
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(name, value, "a Python float or a 0-dim / 1-element float32 tensor", TypeError)
    if not math.isfinite(value) or (nonzero and value == 0):
        raise bad(name, value, "a finite value" + (", not 0 (it divides the output)" if nonzero else ""))


# -- LSE ----------------------------------------------------------------------------------------
def scatter_padded_lse(packed: torch.Tensor, qo_indptr: torch.Tensor, padded: torch.Tensor) -> None:
    """Packed (total_q, Hq) -> padded (B, max_q, Hq) in place; rows past a request's length are
    -inf. No host synchronization: row -> (request, local index) is computed on the device."""
    batch, max_q, heads = padded.shape
    padded.fill_(float("-inf"))
    total = packed.shape[0]
    if total == 0:
        return
    rows = torch.arange(total, device=packed.device, dtype=torch.int64)
    indptr = qo_indptr.to(torch.int64)
    req = torch.searchsorted(indptr, rows, right=True) - 1
    dest = req * max_q + (rows - indptr[req])
    padded.view(batch * max_q, heads).index_copy_(0, dest, packed)
