"""Small pure-PyTorch building blocks of the reference backend (any device).

Every function works on one tile: a block of query rows of one request against a
chunk of its keys. Positions follow the project convention (dispatch/problem.py):
query row i of a request with q_len queries and kv_len keys sits at position
kv_len - q_len + i (bottom-right aligned); key j sits at position j.
"""
from __future__ import annotations

import torch

from backends import _numerics


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """FlashInfer's ALiBi slopes (backends/_numerics.py) as fp64 (num_heads,) on the CPU."""
    return torch.tensor(_numerics.alibi_slopes(num_heads), dtype=torch.float64)


def rope_llama(x: torch.Tensor, positions: torch.Tensor, theta: float, scale: float) -> torch.Tensor:
    """Rotate-half (first half / second half pairing) RoPE of x (n, H, D) at positions (n,).

    freq_i = theta**(-2i/D) / scale for i < D/2 (FlashInfer ROPE_LLAMA). Angles are
    formed in fp64 because positions times frequencies lose digits in fp32.
    """
    dim = x.shape[-1]
    if dim % 2:
        raise ValueError(f"head_dim_qk={dim}: ROPE_LLAMA needs an even head dimension")
    half = dim // 2
    idx = torch.arange(half, device=x.device, dtype=torch.float64)
    freqs = theta ** (-2.0 * idx / dim) / scale
    angles = positions.to(torch.float64)[:, None] * freqs[None, :]
    cos = angles.cos().to(x.dtype)[:, None, :]
    sin = angles.sin().to(x.dtype)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def position_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window_left: int
) -> torch.Tensor | None:
    """(rows, n) bool keep-mask from causality and the inclusive left window; None = keep all.

    window_left keeps keys in [q_pos - window_left, q_pos]; without causal only the
    lower bound applies (FlashInfer FA2 and its sink reference).
    """
    keep = None
    if causal:
        keep = k_pos[None, :] <= q_pos[:, None]
    if window_left >= 0:
        lower = k_pos[None, :] >= (q_pos[:, None] - window_left)
        keep = lower if keep is None else keep & lower
    return keep


def spec_bits_rows(spec_rows: torch.Tensor, q_len: int) -> torch.Tensor:
    """Decode xqa mask rows (rows, W16) of uint16 half-words into bool (rows, q_len).

    Each row holds little-endian uint32 words viewed as uint16 pairs, so bit j of
    the row is bit j % 16 of half-word j // 16. Bit j of row i: draft i sees draft j.
    """
    if spec_rows.dtype in (torch.uint16, torch.int16):
        words = spec_rows.view(torch.int16).to(torch.int32) & 0xFFFF
    else:
        raise TypeError(f"spec_mask dtype={spec_rows.dtype}: allowed torch.uint16 (or int16 bit pattern)")
    need = (q_len + 15) // 16
    if words.shape[-1] < need:
        raise ValueError(f"spec_mask width={words.shape[-1]} half-words: need >= {need} for q_len={q_len}")
    j = torch.arange(q_len, device=words.device)
    bits = (words[:, j // 16] >> (j % 16)[None, :]) & 1
    return bits.bool()


def spec_mask_tile(
    draft_rows: torch.Tensor, k_pos: torch.Tensor, kv_len: int, q_len: int
) -> torch.Tensor:
    """(rows, n) keep-mask of the xqa spec mask: prefix keys always visible, draft keys per bit.

    draft_rows is (rows, q_len) bool from ``spec_bits_rows``; the drafts are the last
    q_len keys (positions kv_len - q_len + j).
    """
    first_draft = kv_len - q_len
    j = k_pos - first_draft
    in_draft = j >= 0
    j_clamped = j.clamp(min=0, max=q_len - 1)
    draft_keep = draft_rows[:, j_clamped]
    return torch.where(in_draft[None, :], draft_keep, torch.ones_like(draft_keep))
