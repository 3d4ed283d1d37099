"""The packed LSE (total_q, Hq) copied into cuDNN's padded layout (B, max_q, Hq) by one kernel.

Why: the cuDNN entry returns its LSE padded per request, rows past a request's length -inf. cuDNN
writes that layout itself; every other backend writes the packed one, which PyTorch ops scattered
with a fill, an arange, a searchsorted, a gather and an index_copy: about ten launches. On the H200,
native-triton's prefill calls with LSE on the cuDNN entry took 232-443 us of host time that way and
119-208 us with this kernel, and 19-32 us less GPU time (``attn-dispatch bench``, before and
after). Here one launch does the fill and the copy: program (b, j) owns elements [j * BLOCK,
(j + 1) * BLOCK) of request b's padded rows and reads its own rows' start and count from
``qo_indptr`` on the device (no host synchronization).

Served where the kernel can: both tensors contiguous, fp32, on the current CUDA device (or the Triton
interpreter, for tests); ``write`` returns False otherwise and the caller scatters with PyTorch.
Inside CUDA-graph capture only an already compiled variant launches (a compile is not a capture
operation we rely on).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._launch import KernelLaunch, interpreting

BLOCK = 1024  # elements per program: 8 KB of LSE, one pass of 4 warps


@triton.jit
def _padded_rows(Packed, Indptr, Padded, row_elems, heads, BLOCK: tl.constexpr):
    """Padded[b] (max_q x heads, flat) = Packed rows [indptr[b], indptr[b+1]), then -inf."""
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    start = tl.load(Indptr + b).to(tl.int64)
    count = tl.load(Indptr + b + 1).to(tl.int64) - start
    inside = offs < row_elems
    kept = inside & (offs // heads < count)
    value = tl.load(Packed + start * heads + offs, mask=kept, other=float("-inf"))
    tl.store(Padded + b.to(tl.int64) * row_elems + offs, value, mask=inside)


_launches: dict[Optional[int], KernelLaunch] = {}  # per device index (None: the interpreter on the CPU)


def _launch_for(device: torch.device) -> KernelLaunch:
    index = device.index if device.type == "cuda" else None
    launch = _launches.get(index)
    if launch is None:
        direct = device.type == "cuda" and not interpreting()
        launch = _launches[index] = KernelLaunch(_padded_rows, (1, 1), (BLOCK,), dict(num_warps=4), device, direct)
    return launch


def write(packed: torch.Tensor, qo_indptr: torch.Tensor, padded: torch.Tensor) -> bool:
    """Fill ``padded`` (B, max_q, Hq) from ``packed`` (total_q, Hq) by request, in one launch; False
    (nothing written) where this kernel does not serve the tensors."""
    batch, max_q, heads = padded.shape
    device = packed.device
    if not (device.type == "cuda" or interpreting()) or padded.device != device or qo_indptr.device != device:
        return False
    if device.type == "cuda" and torch.cuda.current_device() != device.index:
        return False  # Triton launches on the current device: PyTorch's ops follow the tensors instead
    if packed.dtype != torch.float32 or padded.dtype != torch.float32 or qo_indptr.dtype not in (torch.int32,
                                                                                                 torch.int64):
        return False
    if not (packed.is_contiguous() and padded.is_contiguous() and qo_indptr.is_contiguous()):
        return False
    if batch == 0 or max_q == 0 or heads == 0:
        return True  # nothing to write
    launch = _launch_for(device)
    head, ints = (packed, qo_indptr, padded), (max_q * heads, heads)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing() and not launch.compiled(head, ints, ()):
        return False
    launch(head, ints, (), grid=(batch, triton.cdiv(max_q * heads, BLOCK), 1))
    return True
