"""The numeric conventions every adapter converts to, written once.

* LSE: our API returns fp32, base 2, packed token-major ``(total_q, Hq)``, ``-inf`` for a
  row with no visible key. Vendors return natural log, head-major ``(Hq, total_q)`` or
  padded ``(B, Hq, max_q)``, and FlashAttention marks empty rows ``+inf``.
* ALiBi slopes: FlashInfer's (``flashinfer.utils.get_alibi_slopes``, the ALiBi paper's).
* Windows: FlashInfer's ``window_left`` is inclusive (window_left + 1 keys, the query's own
  included; -1 = none). FlashInfer, trtllm-gen and xqa take it as is; the others below.

tests/oracle.py stays independent of this module on purpose (a second reading of the contract).
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2  # natural-log LSE * LOG2E = base-2 LSE


# -- LSE -------------------------------------------------------------------------------------
def natural_to_base2(lse):
    """A natural-log LSE (float or tensor) in base 2."""
    return lse * LOG2E


def base2_to_natural(lse):
    return lse * LN2


def token_rows(qo_indptr: torch.Tensor, total_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per packed token: its request and its row within the request (device ops, no sync)."""
    lengths = (qo_indptr[1:] - qo_indptr[:-1]).long()
    request = torch.repeat_interleave(torch.arange(lengths.numel(), device=qo_indptr.device), lengths,
                                      output_size=total_q)
    row = torch.arange(total_q, device=qo_indptr.device) - qo_indptr.long()[request]
    return request, row


def padded_to_packed(lse: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """(B, Hq, max_q) -> (total_q, Hq), ``rows`` from ``token_rows``."""
    request, row = rows
    return lse[request, :, row]


def packed_to_padded(lse: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor], batch_size: int,
                     max_q: int, fill: float = -math.inf) -> torch.Tensor:
    """(total_q, Hq) -> (B, Hq, max_q); rows past a request's length hold ``fill``."""
    request, row = rows
    out = lse.new_full((batch_size, lse.shape[1], max_q), fill)
    out[request, :, row] = lse
    return out


def write_lse_base2(dst: torch.Tensor, lse_nat: torch.Tensor,
                    rows: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> None:
    """A vendor's natural-log LSE -> ``dst`` (total_q, Hq) fp32 base 2, in place.

    ``lse_nat`` is head-major (Hq, total_q), or padded (B, Hq, max_q) with ``rows``.
    FlashAttention marks rows with no visible key ``+inf``; our contract says ``-inf``.
    """
    tokens = lse_nat.t() if lse_nat.dim() == 2 else padded_to_packed(lse_nat, rows)
    dst.copy_(tokens)
    dst.mul_(LOG2E)
    dst.masked_fill_(dst == math.inf, -math.inf)


# -- ALiBi -----------------------------------------------------------------------------------
def alibi_slopes(num_heads: int) -> list[float]:
    """Slopes 2^(-8(i+1)/n) for the largest power of two n <= heads, then the odd powers of
    2^(-4/n) for the remaining heads (FlashInfer's ``get_alibi_slopes``)."""
    n = 1 << (int(num_heads).bit_length() - 1)
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(num_heads - n)]
    return slopes


@functools.lru_cache(maxsize=64)
def alibi_tensor(num_heads: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The slopes as a (Hq,) tensor, made once per (heads, device, dtype): read-only, shared.
    Callers pass a device with its index (backends._device.device_key)."""
    return torch.tensor(alibi_slopes(num_heads), dtype=dtype, device=device)


# -- windows ---------------------------------------------------------------------------------
def flash_window(window_left: int, causal: bool) -> tuple[int, int]:
    """FlashAttention's ``window_size=(left, right)``, -1 = unbounded: right 0 with causal,
    unbounded without (a non-causal window keeps only the lower bound)."""
    if window_left < 0:
        return (-1, 0) if causal else (-1, -1)
    return window_left, (0 if causal else -1)


def torch_flash_window(window_left: int, causal: bool) -> tuple[Optional[int], Optional[int]]:
    """aten._flash_attention_forward's (window_size_left, window_size_right): None = no window."""
    if window_left < 0:
        return None, None
    return flash_window(window_left, causal)


def cudnn_left_bound(window_left: int) -> int:
    """cuDNN's ``diagonal_band_left_bound``: it drops keys <= pos - bound, so W + 1 keeps W + 1 keys."""
    return window_left + 1
