"""NVFP4 KV caches for the tests: a quantizer in FlashInfer's format and an fp64 dequantizer, both
written here from FlashInfer's definition (include/flashinfer/page.cuh nvfp4_append_quantize_block,
tests/test_helpers/utils_fp4.py), independent of the package's own dequantizer.

Format: fp4 e2m1 values two per uint8 along the head dim (element 2i in the low nibble), one fp8
e4m3 scale factor per 16 values (linear layout, the values' leading dims), a global scale per
tensor (FlashInfer's k_scale / v_scale): value = e2m1 * sf * global_scale.
"""
from __future__ import annotations

import torch

BLOCK = 16
E2M1_MAX = 6.0


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e2m1 value as FlashInfer's append kernel does (its thresholds: ties at
    0.25, 1.25, 2.5 and 5 go down, at 0.75, 1.75 and 3.5 up); the sign in bit 3."""
    mag = x.abs()
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for threshold, value, inclusive in ((0.25, 1, False), (0.75, 2, True), (1.25, 3, False), (1.75, 4, True),
                                        (2.5, 5, False), (3.5, 6, True), (5.0, 7, False)):
        above = mag >= threshold if inclusive else mag > threshold
        code = torch.where(above, torch.full_like(code, value), code)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def quantize(x: torch.Tensor, global_scale: float = 1.0, sf_bytes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., D) real -> (packed uint8 (..., D // 2), scale factors (..., D // 16)): fp8 e4m3
    (float8_e4m3fn, or its bytes as uint8 with ``sf_bytes``, as FlashInfer's tests pass them)."""
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    amax = blocks.abs().amax(-1, keepdim=True)
    sf = (amax / (E2M1_MAX * global_scale)).to(torch.float8_e4m3fn)
    sf_value = sf.float()
    ok = (amax > 0) & (sf_value > 0)
    inv = torch.where(ok, 1.0 / torch.where(ok, sf_value * global_scale, torch.ones_like(sf_value)),
                      torch.zeros_like(sf_value))
    codes = _e2m1_codes((blocks * inv).flatten(-2))
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    sf = sf.squeeze(-1)
    return packed, (sf.view(torch.uint8) if sf_bytes else sf)


def _e2m1_fp64(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes -> values: exponent field e (2 bits), mantissa m (1 bit): m/2 when e == 0, else
    (1 + m/2) * 2^(e-1)."""
    c = codes.to(torch.int64)
    e, m = (c >> 1) & 3, (c & 1).double()
    mag = torch.where(e == 0, m * 0.5, (1 + m * 0.5) * torch.pow(2.0, (e - 1).double()))
    return torch.where((c & 8) != 0, -mag, mag)


def _e4m3_fp64(sf: torch.Tensor) -> torch.Tensor:
    """fp8 e4m3 bytes -> values: exponent field e (4 bits, bias 7), mantissa m (3 bits)."""
    b = (sf.view(torch.uint8) if sf.dtype != torch.uint8 else sf).to(torch.int64)
    e, m = (b >> 3) & 15, (b & 7).double()
    mag = torch.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * torch.pow(2.0, (e - 7).double()))
    return torch.where((b & 0x80) != 0, -mag, mag)


def dequantize_fp64(packed: torch.Tensor, sf: torch.Tensor, global_scale: float = 1.0) -> torch.Tensor:
    """(..., D // 2) uint8 and (..., D // 16) scale factors -> (..., D) float64 on the CPU."""
    packed, sf = packed.cpu(), sf.cpu()
    values = torch.stack((_e2m1_fp64(packed & 0xF), _e2m1_fp64(packed >> 4)), dim=-1).flatten(-2)
    blocks = values.unflatten(-1, (-1, BLOCK)) * _e4m3_fp64(sf).unsqueeze(-1)
    return blocks.flatten(-2) * global_scale
