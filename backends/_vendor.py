"""Helpers shared by the vendor adapters (fa2, fa3, trtllm-gen, xqa).

Everything here translates *our* AttentionBatch convention (dispatch/problem.py)
into what a vendor function expects and back. No vendor package is imported at
module import time: ``load`` imports lazily and caches the outcome.

Caches here (name: key -> bound):
* ``_loaded``: module name -> one entry per vendor module (configuration only: unbounded);
* ``has_param``: (vendor function, parameter name) -> lru_cache(maxsize=256);
* ``_workspaces``: (tag, device with its index) -> one buffer per tag and GPU (configuration
  only: unbounded; a larger request replaces the buffer).
"""
from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from backends._device import device_key, made_to_keep
from backends.base import Backend, BackendRejected, Reason, import_reason

VENDOR_ERRORS = (RuntimeError, ValueError, NotImplementedError, AssertionError, KeyError, TypeError)


# -- imports and versions --------------------------------------------------------------------
@dataclass(frozen=True)
class Loaded:
    """One provider module: the module, or the Reason it cannot be used."""

    module: Any
    reason: Optional[Reason]

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def version(self) -> Optional[str]:
        return getattr(self.module, "__version__", None) if self.module is not None else None


_loaded: dict[str, Loaded] = {}


def load(module: str, extra: str) -> Loaded:
    """Import ``module`` once; a failure becomes the "not installed"/"import failed" Reason."""
    hit = _loaded.get(module)
    if hit is None:
        try:
            hit = Loaded(importlib.import_module(module), None)
        except Exception as exc:  # ImportError, or a CUDA-less build failing at import
            hit = Loaded(None, import_reason(extra, exc))
        _loaded[module] = hit
    return hit


def forget_imports() -> None:
    """Tests swap fake vendor modules in and out of sys.modules."""
    _loaded.clear()
    has_param.cache_clear()


@functools.lru_cache(maxsize=256)
def has_param(fn: Callable, name: str) -> bool:
    """Whether a vendor function accepts ``name`` (its signature changed across releases)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# -- scales ----------------------------------------------------------------------------------
def is_unit(scale) -> bool:
    """True only for the Python float 1.0: a tensor is never assumed to hold 1."""
    return not isinstance(scale, torch.Tensor) and float(scale) == 1.0


def host_float(scale) -> float:
    """A float for vendors that take the scale on the host (reads a device tensor: syncs)."""
    return float(scale.reshape(-1)[0].item()) if isinstance(scale, torch.Tensor) else float(scale)


def device_scalar(scale, device) -> Any:
    """A float stays a float; a tensor becomes a 0-dim fp32 tensor on ``device``."""
    if isinstance(scale, torch.Tensor):
        return scale.reshape(()).to(device=device, dtype=torch.float32)
    return float(scale)


def apply_out_scale(out: torch.Tensor, out_scale) -> None:
    """out *= out_scale in place (skipped for the float 1.0; a tensor is read on the device)."""
    if not is_unit(out_scale):
        out.mul_(out_scale.reshape(()) if isinstance(out_scale, torch.Tensor) else float(out_scale))


def refuse_causal_overhang(backend: str, causal: bool, q_len: int, kv_len: int, source: str) -> None:
    """BackendRejected for a causal request with more queries than keys, before anything is launched.

    Bottom-right alignment leaves its first q_len - kv_len rows with no key (0 and LSE -inf, the
    contract); FlashInfer's single-request kernel refuses the shape instead ("When mask_mode is set
    to MaskMode::kCausal, kv_len must be greater than or equal to qo_len", prefill.cuh; H200,
    flashinfer 0.7.2, FlashInfer's own GPU tests), so the router hands it over."""
    if causal and q_len > kv_len:
        raise BackendRejected(backend, [Reason("qo_len", q_len, f"at most kv_len={kv_len} with causal=True",
                                               source)])


def refuse_negative_scale(backend: str, scale, vendor: str) -> None:
    """BackendRejected for a float sm_scale < 0, before anything is launched.

    softmax(s * q.k) with s < 0 is well defined, but the vendors' online softmax folds
    s * log2(e) into exp2 and keeps the row max of the *unscaled* scores (FlashAttention
    2/3 ``softmax.h``, FlashInfer, and by all signs cuDNN/TRT-LLM): with s < 0 that max is
    the minimum and a masked -inf turns into +inf (NaN). Not verified on hardware, so the
    router hands these calls to native-triton / reference, which handle any sign. A device
    tensor scale is not read (that would synchronize): its sign is the caller's business.
    """
    if not isinstance(scale, torch.Tensor) and float(scale) < 0:
        raise rejected(backend, "sm_scale", float(scale), f"> 0 on {vendor}",
                       "backends/_vendor.py refuse_negative_scale (native-triton serves it)")


# -- paged KV ------------------------------------------------------------------------------
def kv_page_counts(kv_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    return (kv_lens.to(torch.int64) + page_size - 1) // page_size


def paged_csr(block_table: torch.Tensor, kv_lens: torch.Tensor, page_size: int):
    """block_table (B, max_pages) + kv_lens -> FlashInfer's (kv_indptr, kv_indices, last_page_len).

    Only the first ceil(kv_len/P) entries of a row are live; the tail may hold anything.
    """
    pages = kv_page_counts(kv_lens, page_size)
    indptr = torch.zeros(pages.numel() + 1, dtype=torch.int32, device=kv_lens.device)
    indptr[1:] = torch.cumsum(pages, 0).to(torch.int32)
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    live = cols[None, :] < pages.to(block_table.device)[:, None]
    indices = block_table[live].to(torch.int32)  # row-major: request by request
    last = kv_lens.to(torch.int64) - (pages - 1).clamp(min=0) * page_size
    last = torch.where(pages > 0, last, torch.zeros_like(last)).to(torch.int32)
    return indptr, indices, last


def cu_seqlens(lens: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    out[1:] = torch.cumsum(lens.to(torch.int64), 0).to(torch.int32)
    return out


def physical_kv(problem, k: torch.Tensor, v: torch.Tensor):
    """Our logical NHD page views -> (k, v, layout) in the caller's physical layout, so a
    vendor that assumes its layout's strides reads the memory as it lies (never a copy)."""
    if problem.kv_layout == "HND":
        return k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), "HND"
    return k, v, "NHD"


# -- outputs -------------------------------------------------------------------------------
def writable(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A contiguous buffer a vendor may write: ``t`` itself when contiguous, else a twin."""
    if t is None or t.is_contiguous():
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def write_back(dst: Optional[torch.Tensor], src: Optional[torch.Tensor]) -> None:
    if dst is not None and src is not None and src.data_ptr() != dst.data_ptr():
        dst.copy_(src)


# -- workspaces ----------------------------------------------------------------------------
_workspaces: dict[tuple, torch.Tensor] = {}


def workspace(tag: str, device: torch.device, nbytes: int, zeroed: bool) -> torch.Tensor:
    """One uint8 buffer per (tag, GPU), allocated (and zeroed) once, reused by every call.
    The key holds the device index: a bare 'cuda' resolves to the current GPU."""
    key = (tag, device_key(device))
    buf = _workspaces.get(key)
    if buf is None or buf.numel() < nbytes:
        alloc = torch.zeros if zeroed else torch.empty
        buf = _workspaces[key] = made_to_keep(lambda: alloc(nbytes, dtype=torch.uint8, device=key[1]), key[1])
    return buf


# -- rejections ----------------------------------------------------------------------------
def rejected(backend: str, field: str, value: Any, allowed: str, source: str = "") -> BackendRejected:
    return BackendRejected(backend, [Reason(field, value, allowed, source)])


def vendor_refused(backend: str, provider: str, exc: BaseException) -> BackendRejected:
    """A vendor error raised while *planning* (before any launch) -> hand over to the next backend."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return rejected(backend, f"{provider} plan", text[:300], "a configuration the vendor accepts at plan time")


class FlashInferModuleBackend(Backend):
    """A backend served by one flashinfer submodule (``vendor_module``): availability and version."""

    packages = ("flashinfer",)
    vendor_module = "flashinfer"

    def _loaded(self):
        return load(self.vendor_module, "flashinfer")

    def available(self) -> Optional[Reason]:
        return self._loaded().reason

    def version(self) -> Optional[str]:
        top = load("flashinfer", "flashinfer")
        return top.version if top.ok else None

    def extra_checks(self, problem, device) -> list[Reason]:
        """The limits the data's flashinfer provider declares for the installed version (e.g. XQA's
        fp8 output, from 0.7.0); none while FlashInfer is not installed (``available`` says so)."""
        version = self.version()
        providers = [p for p in self.caps.providers if p.module == "flashinfer"]
        return providers[0].limits(problem.facts(), version) if version and providers else []
