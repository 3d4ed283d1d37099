"""NVFP4 KV caches as FlashInfer 0.7 stores them, and their dequantization in PyTorch.

Format (flashinfer/prefill.py ``kv_cache_sf``; include/flashinfer/page.cuh, the append kernel's
``nvfp4_append_quantize_block``):

* values: fp4 e2m1, two per ``uint8`` along the head dim, element ``2i`` in the low nibble and
  ``2i + 1`` in the high one, so a row of ``D`` values is ``D // 2`` bytes;
* scale factors: one fp8 e4m3 per ``SF_BLOCK`` = 16 consecutive values of a row (``D // 16`` per
  row), in a linear (row-major) layout with the values' leading dims; stored as
  ``torch.float8_e4m3fn`` or as its raw bytes in ``uint8`` (FlashInfer's tests pass the latter);
* a global scale per tensor, FlashInfer's ``k_scale`` / ``v_scale``: ``k_scale`` multiplies the
  logits, ``v_scale`` the output, as for fp8 caches.

A value is ``e2m1 * sf`` (times the global scale). Both factors are exact in fp32 and their
product has at most 6 significant bits, within [2^-10, 2688]: exact in fp16 and bf16 too.

``quantize`` makes such a cache from real values as FlashInfer's append kernel does (the random
inputs of the probe, the autotune and the benchmark scenarios are made with it; the tests check
it against a quantizer of their own).
"""
from __future__ import annotations

import torch

SF_BLOCK = 16  # values per fp8 scale factor
# e2m1 code -> value: codes 0-7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SF_DTYPES = (torch.float8_e4m3fn, torch.uint8)


def scale_factors(sf: torch.Tensor) -> torch.Tensor:
    """The fp8 e4m3 scale factors as float32 (a uint8 tensor holds their bytes)."""
    if sf.dtype == torch.uint8:
        sf = sf.view(torch.float8_e4m3fn)
    return sf.to(torch.float32)


def dequantize(packed: torch.Tensor, sf: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(..., D // 2) uint8 values and (..., D // 16) scale factors -> (..., D) in ``dtype``
    (the global scale not applied). Any device; no host synchronization."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    low, high = (packed & 0xF).long(), (packed >> 4).long()
    values = torch.stack((table[low], table[high]), dim=-1).flatten(-2)  # (..., D)
    blocks = values.unflatten(-1, (-1, SF_BLOCK)) * scale_factors(sf).unsqueeze(-1)
    return blocks.flatten(-2).to(dtype)


# e2m1 rounding of FlashInfer's append kernel (nvfp4_append_quantize_e2m1): |x| above (or at, where
# inclusive) each threshold moves one code up; ties at 0.25, 1.25, 2.5, 5 round down, at 0.75, 1.75, 3.5 up
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def quantize(x: torch.Tensor, global_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Real values (..., D), D a multiple of 16 -> (uint8 (..., D // 2), float8_e4m3fn (..., D // 16)):
    per block of 16, sf = fp8(amax / (6 * global_scale)), values rounded to e2m1 after dividing by
    sf * global_scale (FlashInfer include/flashinfer/page.cuh nvfp4_append_quantize_block)."""
    blocks = x.float().unflatten(-1, (-1, SF_BLOCK))
    amax = blocks.abs().amax(-1, keepdim=True)
    sf = (amax / (6.0 * global_scale)).to(torch.float8_e4m3fn)
    denom = sf.float() * global_scale
    scaled = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, torch.ones_like(denom)), 0.0).flatten(-2)
    mag = scaled.abs()
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for threshold, inclusive in _E2M1_STEPS:  # increasing: the code is the count of thresholds passed
        code += (mag >= threshold if inclusive else mag > threshold).to(torch.uint8)
    code |= torch.signbit(scaled).to(torch.uint8) << 3
    return code[..., 0::2] | (code[..., 1::2] << 4), sf.squeeze(-1)
