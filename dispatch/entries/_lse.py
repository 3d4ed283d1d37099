"""FlashInfer's LSE options (``lse_base``, ``lse_layout``, from flashinfer 0.7.1): the one place the
entries convert the LSE every backend writes (fp32 base 2, ``(tokens, num_qo_heads)``, the seeds'
definition) into the base and layout a call asks for.

``lse_base="ln"`` is the natural log (``torch.logsumexp``'s convention): base 2 times ln 2.
``lse_layout="HN"`` is the contiguous transpose ``(num_qo_heads, tokens)``; a caller's ``lse``
buffer is then that shape, and the backend writes a fresh ``(tokens, num_qo_heads)`` one first, as
FlashInfer 0.7.2 stages it (flashinfer/prefill.py ``_stage_lse`` / ``_finish_lse``).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..checks import bad, need_out

LN2 = math.log(2.0)
LSE_BASES = ("log2", "ln")
LSE_LAYOUTS = ("NH", "HN")
_BASES_TEXT = "'log2' (base 2, the default) or 'ln' (natural log)"
_LAYOUTS_TEXT = "'NH' ((tokens, num_qo_heads), the default) or 'HN' (its contiguous transpose)"


def need_lse_base(lse_base) -> None:
    if not isinstance(lse_base, str) or lse_base not in LSE_BASES:
        raise bad("lse_base", lse_base, _BASES_TEXT)


def need_lse_options(lse_base, lse_layout) -> None:
    need_lse_base(lse_base)
    if not isinstance(lse_layout, str) or lse_layout not in LSE_LAYOUTS:
        raise bad("lse_layout", lse_layout, _LAYOUTS_TEXT)


def stage(lse: Optional[torch.Tensor], lse_layout: str, rows: int, heads: int,
          device) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(the buffer the backend writes, the caller's destination in the asked layout). ``NH``: the
    caller's buffer itself (its checks are the entry's). ``HN``: a caller's buffer is checked here,
    before anything runs, and the backend gets a fresh one (``None``: the entry allocates it)."""
    if lse_layout == "NH" or lse is None:
        return lse, None
    need_out(lse, (heads, rows), torch.float32, device, name="lse",
             shape_text=f"(num_qo_heads={heads}, tokens={rows}) with lse_layout='HN'")
    if not lse.is_contiguous():
        raise bad("lse.stride()", tuple(lse.stride()), f"contiguous strides {(rows, 1)} with lse_layout='HN'")
    return None, lse


def finish(lse: torch.Tensor, lse_base: str, lse_layout: str = "NH",
           dest: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The base-2 LSE a backend wrote, in the asked base and layout: in place for ``NH``; one
    transposing copy (scaled for ``ln``) into ``dest`` (or a new contiguous tensor) for ``HN``.
    Any other shape (the cuDNN entry's padded (B, max_q, Hq)) takes the base only, in place."""
    if lse_layout == "NH":
        if lse_base == "ln":
            lse.mul_(LN2)  # -inf (padded rows, empty requests) stays -inf
        return lse
    src = lse.t()
    if dest is None:
        dest = torch.empty(src.shape, dtype=lse.dtype, device=lse.device)
    if lse_base == "ln":
        torch.mul(src, LN2, out=dest)
    else:
        dest.copy_(src)
    return dest


def traced(lse: torch.Tensor, lse_base: str, lse_layout: str = "NH") -> torch.Tensor:
    """``finish`` without writes, for a torch.compile graph (the op's fresh LSE, then the caller's
    buffer filled from it)."""
    if lse_layout == "HN":
        lse = lse.t().contiguous()
    return lse * LN2 if lse_base == "ln" else lse
