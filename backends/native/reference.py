"""PyTorch reference backend: every feature, any device, bounded memory, slow.

Computes attention exactly as dispatch/problem.py defines it, request by request,
in fp32 (fp64 when q is fp64):

* query rows are taken in blocks of at most ``Q_CHUNK`` rows and keys in chunks of
  at most ``KV_CHUNK`` keys, with an online softmax (running max / running sum)
  across key chunks, so no (q_len x kv_len) score matrix is ever formed;
* GQA: q head h reads kv head h // (Hq/Hkv) through a batched matmul over kv
  heads, never a repeated copy of K/V.

Memory bound (besides the caller's tensors): one tile of scores and its
temporaries, about ``4 * Hq * rows * keys`` elements with rows <= Q_CHUNK and
keys <= KV_CHUNK (rows shrinks so Hq * rows * keys <= MAX_TILE_ELEMS), plus the
fp32 copies of one query block and one key/value chunk, plus the per-block
accumulator (Hq, rows, Dvo). With the defaults that is at most ~4 x 64 MiB.

Semantics not fixed by the problem docstring, chosen to match FlashInfer:

* ALiBi: bias = slope_h * (kv_idx - qo_idx) added after sm_scale and before the
  soft cap, with qo_idx the query's row index *within its request* (FlashInfer
  FA2 prefill.cuh passes the raw row index to ``LogitsTransform``; decode passes
  0; include/flashinfer/attention/variants.cuh ``ALIBIAttention``), slopes as
  ``flashinfer.utils.get_alibi_slopes``. Without a soft cap the softmax equals the
  bottom-right form slope*(k_pos - q_pos) and only the LSE moves, by slope*(kv_len -
  q_len); with a soft cap the bias enters before the cap, so the raw row index changes
  the capped logits and the output too wherever kv_len != q_len.
* custom mask and xqa spec mask replace ``causal`` (FlashInfer: mask mode CUSTOM
  overrides CAUSAL); window_left still applies on top of them.
* sinks enter the softmax's denominator (not the numerator) and so the LSE, which is the
  log of that whole denominator, as FlashInfer's sink variants, trtllm-gen's softmax stats and
  cuDNN's Stats compute it (dispatch/benchmark/oracle.py cites them); a fully masked row gives 0
  and LSE -inf, or with a sink LSE = sink / ln 2.

NVFP4 K/V (``kv_dtype`` "uint8", FlashInfer 0.7.2's ``kv_cache_sf``): each key chunk's packed values
and fp8 scale factors are read like any K/V rows and dequantized there (backends/native/nvfp4.py).

Not CUDA-graph capturable: lengths are read on the host (``cuda_graph: never``).
Any sm_scale sign (and 0) is served: scores are scaled before masking and the row max.

Caches: none (the plan's fp64 ALiBi slopes live on the CPU and move per call).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from backends import _numerics
from backends.base import Backend, DeviceDesc, Reason
from backends.native import _torch_ops as ops
from backends.native import nvfp4

if TYPE_CHECKING:  # pragma: no cover
    from capability_db.vocabulary import AttentionProblem

# Tile sizes (module constants so tests can shrink them to exercise chunking).
Q_CHUNK = 256
KV_CHUNK = 1024
MAX_TILE_ELEMS = 1 << 24  # Hq * rows * keys per score tile (64 MiB in fp32)


@dataclass(frozen=True)
class ReferencePlan:
    """Everything run() needs besides the batch: the problem and the ALiBi slopes."""

    problem: "AttentionProblem"
    alibi: Optional[torch.Tensor]  # (Hq,) fp64 on CPU, moved per call


@dataclass
class _Request:
    """Host-side lengths and offsets of one request."""

    index: int
    q_start: int
    q_len: int
    kv_len: int
    kv_start: int  # ragged/dense: first key row in k/v; paged: unused


class ReferenceBackend(Backend):
    name = "reference"

    def extra_checks(self, problem, device: DeviceDesc) -> list[Reason]:
        reasons = []
        if problem.num_kv_heads <= 0 or problem.num_qo_heads % problem.num_kv_heads:
            reasons.append(Reason("num_qo_heads", problem.num_qo_heads,
                                  f"a multiple of num_kv_heads={problem.num_kv_heads}",
                                  "backends/native/reference.py (GQA grouping)"))
        return reasons

    def plan_reusable(self, problem) -> bool:
        return True  # the problem and its ALiBi slopes

    def plans_before_run(self, problem) -> bool:
        return True

    def plan(self, problem, batch) -> ReferencePlan:
        alibi = ops.alibi_slopes(problem.num_qo_heads) if problem.pos_encoding == "ALIBI" else None
        return ReferencePlan(problem=problem, alibi=alibi)

    def run(self, plan: ReferencePlan, batch) -> None:
        problem = plan.problem
        _validate(problem, batch)
        ctx = _Context(problem, batch, plan.alibi)
        for req in _requests(problem, batch):
            if req.q_len == 0:
                continue
            rows_per_block = _rows_per_block(problem.num_qo_heads)
            for r0 in range(0, req.q_len, rows_per_block):
                r1 = min(req.q_len, r0 + rows_per_block)
                _attend_block(ctx, req, r0, r1)


def _validate(problem, batch) -> None:
    """Argument errors that would otherwise surface as obscure indexing failures."""
    if problem.kv_storage == "paged" and batch.block_table is None:
        raise ValueError("block_table=None: a paged problem needs a (B, max_pages) int32 block_table")
    if not problem.uses_shared_paged_kv_idx and batch.v_block_table is None:
        raise ValueError("v_block_table=None: uses_shared_paged_kv_idx=False needs V's (B, max_pages) page ids")
    if problem.kv_storage != "paged" and batch.kv_indptr is None:
        raise ValueError(f"kv_indptr=None: a {problem.kv_storage} problem needs a (B+1,) kv_indptr")
    if problem.mask == "custom" and (batch.custom_mask is None or batch.mask_indptr is None):
        raise ValueError("custom_mask/mask_indptr=None: mask='custom' needs both (flat bool mask + (B+1,) offsets)")
    if problem.mask == "custom" and batch.custom_mask.dtype != torch.bool:
        raise TypeError(f"custom_mask dtype={batch.custom_mask.dtype}: allowed torch.bool (unpacked, True = keep)")
    if problem.mask == "spec_bits" and batch.spec_mask is None:
        raise ValueError("spec_mask=None: mask='spec_bits' needs the xqa uint16 bit-row mask")
    if problem.has_sinks and batch.sinks is None:
        raise ValueError("sinks=None: has_sinks=True needs a (num_qo_heads,) fp32 tensor")
    if problem.kv_nvfp4 and (batch.k_sf is None or batch.v_sf is None):
        raise ValueError("k_sf/v_sf=None: NVFP4 K/V (kv_dtype 'uint8') need their fp8 scale factors")
    if batch.out.shape[1:] != (problem.num_qo_heads, problem.head_dim_vo):
        raise ValueError(f"out shape={tuple(batch.out.shape)}: allowed (total_q, {problem.num_qo_heads}, "
                         f"{problem.head_dim_vo})")


def _requests(problem, batch) -> list[_Request]:
    """Per-request lengths, read on the host (the reason this backend is not graph-safe)."""
    qo = batch.qo_indptr.tolist()
    kv_lens = batch.kv_lens.tolist()
    kv_ptr = batch.kv_indptr.tolist() if batch.kv_indptr is not None else None
    reqs = []
    for b in range(batch.batch_size):
        kv_start = kv_ptr[b] if kv_ptr is not None and problem.kv_storage != "paged" else 0
        reqs.append(_Request(b, int(qo[b]), int(qo[b + 1] - qo[b]), int(kv_lens[b]), int(kv_start)))
    return reqs


def _rows_per_block(num_heads: int) -> int:
    return max(1, min(Q_CHUNK, MAX_TILE_ELEMS // max(1, num_heads * KV_CHUNK)))


def _scalar(value, dtype, device):
    """A float, or a 0-dim / 1-element tensor read on the device (no host sync)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"scale tensor shape={tuple(value.shape)}: allowed a 0-dim or 1-element tensor")
        return value.reshape(()).to(device=device, dtype=dtype)
    return float(value)


class _Context:
    """Per-call constants shared by every tile of the call."""

    def __init__(self, problem, batch, alibi: Optional[torch.Tensor]):
        self.problem, self.batch = problem, batch
        self.device = batch.q.device
        self.dtype = torch.float64 if batch.q.dtype == torch.float64 else torch.float32
        self.group = problem.num_qo_heads // problem.num_kv_heads
        self.sm_scale = _scalar(batch.sm_scale, self.dtype, self.device)
        self.out_scale = _scalar(batch.out_scale, self.dtype, self.device)
        self.alibi = alibi.to(self.device, self.dtype)[:, None, None] if alibi is not None else None
        self.sinks = (batch.sinks.to(self.device, self.dtype).reshape(-1)[:, None]
                      if problem.has_sinks else None)

    def keys_values(self, req: _Request, k0: int, k1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K (n, Hkv, Dqk) and V (n, Hkv, Dvo) of keys [k0, k1) of a request, in compute dtype."""
        batch = self.batch
        if self.problem.kv_storage == "paged":
            page_size = batch.k.shape[1]
            idx = torch.arange(k0, k1, device=batch.block_table.device)
            pages = batch.block_table[req.index, idx // page_size].to(device=batch.k.device, dtype=torch.long)
            slots = (idx % page_size).to(batch.k.device)
            v_pages = pages
            if not self.problem.uses_shared_paged_kv_idx:  # V's pages have ids of their own
                v_pages = batch.v_block_table[req.index, idx // page_size].to(device=batch.k.device, dtype=torch.long)

            def rows(cache: torch.Tensor, side: str = "k") -> torch.Tensor:
                return _gather_rows(cache, pages if side == "k" else v_pages, slots)
        else:
            def rows(cache: torch.Tensor, side: str = "k") -> torch.Tensor:
                return cache[req.kv_start + k0: req.kv_start + k1]
        if self.problem.kv_nvfp4:  # packed fp4 rows and their scale factors, read alike
            return (nvfp4.dequantize(rows(batch.k), rows(batch.k_sf), self.dtype),
                    nvfp4.dequantize(rows(batch.v, "v"), rows(batch.v_sf, "v"), self.dtype))
        return rows(batch.k).to(self.dtype), rows(batch.v, "v").to(self.dtype)


def _gather_rows(cache: torch.Tensor, pages: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache[pages, slots] (n, H, D); fp8 goes through a uint8 view because advanced
    indexing kernels do not cover the float8 dtypes on every device/torch build."""
    if cache.dtype.itemsize == 1 and cache.dtype.is_floating_point:
        return cache.view(torch.uint8)[pages, slots].view(cache.dtype)
    return cache[pages, slots]


def _attend_block(ctx: _Context, req: _Request, r0: int, r1: int) -> None:
    """Rows [r0, r1) of one request against all its keys, chunked; writes out and lse."""
    problem, batch = ctx.problem, ctx.batch
    rows = r1 - r0
    hq, hkv = problem.num_qo_heads, problem.num_kv_heads
    q = batch.q[req.q_start + r0: req.q_start + r1].to(ctx.dtype)  # (rows, Hq, Dqk)
    q_idx = torch.arange(r0, r1, device=ctx.device)
    q_pos = q_idx + (req.kv_len - req.q_len)
    if problem.pos_encoding == "ROPE_LLAMA":
        q = ops.rope_llama(q, q_pos, problem.rope_theta, problem.rope_scale)
    # (rows, Hq, D) -> (Hkv, G*rows, D): head h = kvh * G + g, so scores view as (Hq, rows, n).
    q = q.permute(1, 0, 2).reshape(hkv, ctx.group * rows, -1) * ctx.sm_scale
    draft_rows = _draft_rows(ctx, req, r0, r1) if problem.mask == "spec_bits" else None

    m = torch.full((hq, rows), -math.inf, device=ctx.device, dtype=ctx.dtype)
    l = torch.zeros((hq, rows), device=ctx.device, dtype=ctx.dtype)
    acc = torch.zeros((hq, rows, problem.head_dim_vo), device=ctx.device, dtype=ctx.dtype)
    for k0 in range(0, req.kv_len, KV_CHUNK):
        k1 = min(req.kv_len, k0 + KV_CHUNK)
        k, v = ctx.keys_values(req, k0, k1)
        k_pos = torch.arange(k0, k1, device=ctx.device)
        if problem.pos_encoding == "ROPE_LLAMA":
            k = ops.rope_llama(k, k_pos, problem.rope_theta, problem.rope_scale)
        s = torch.matmul(q, k.permute(1, 2, 0)).view(hq, rows, k1 - k0)
        s = _transform_logits(ctx, s, q_idx, k_pos)
        keep = _keep_mask(ctx, req, q_idx, q_pos, k_pos, draft_rows)
        if keep is not None:
            s = s.masked_fill(~keep[None], -math.inf)
        m, l, acc = _online_update(ctx, m, l, acc, s, v)
    _finish(ctx, req, r0, r1, m, l, acc)


def _transform_logits(ctx: _Context, s: torch.Tensor, q_idx: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """ALiBi bias (FlashInfer: slope * (kv_idx - raw qo_idx)), then the soft cap."""
    if ctx.alibi is not None:
        s = s + ctx.alibi * (k_pos[None, :] - q_idx[:, None]).to(ctx.dtype)[None]
    cap = ctx.problem.logits_soft_cap
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    return s


def _keep_mask(ctx, req, q_idx, q_pos, k_pos, draft_rows) -> Optional[torch.Tensor]:
    """(rows, n) bool, True = keep; None when every key of the tile is visible."""
    problem = ctx.problem
    causal = problem.causal and problem.mask == "none"
    keep = ops.position_mask(q_pos, k_pos, causal, problem.window_left)
    extra = None
    if problem.mask == "custom":
        start = int(ctx.batch.mask_indptr[req.index])  # host read, like every length here
        flat = ctx.batch.custom_mask[start: start + req.q_len * req.kv_len].to(ctx.device)
        extra = flat.reshape(req.q_len, req.kv_len)[q_idx][:, k_pos]
    elif problem.mask == "spec_bits":
        extra = ops.spec_mask_tile(draft_rows, k_pos, req.kv_len, req.q_len)
    if extra is not None:
        keep = extra if keep is None else keep & extra
    return keep


def _draft_rows(ctx: _Context, req: _Request, r0: int, r1: int) -> torch.Tensor:
    """Decoded xqa mask rows [r0, r1) of a request: (rows, q_len) bool."""
    spec = ctx.batch.spec_mask
    if spec.dim() == 3:  # (B, q_len, W16)
        rows = spec[req.index, r0:r1]
    else:  # ragged (total_q, W16)
        rows = spec[req.q_start + r0: req.q_start + r1]
    return ops.spec_bits_rows(rows.to(ctx.device), req.q_len)


def _online_update(ctx, m, l, acc, s, v):
    """Fold one key chunk into the running max m, sum l and numerator acc (natural log)."""
    hq, rows, n = s.shape
    m_new = torch.maximum(m, s.amax(dim=-1))
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # all -inf so far
    p = torch.exp(s - m_safe[..., None])
    alpha = torch.exp(m - m_safe)
    l = l * alpha + p.sum(dim=-1)
    pv = torch.matmul(p.view(ctx.problem.num_kv_heads, ctx.group * rows, n), v.permute(1, 0, 2))
    acc = acc * alpha[..., None] + pv.view(hq, rows, -1)
    return m_new, l, acc


def _finish(ctx: _Context, req: _Request, r0: int, r1: int, m, l, acc) -> None:
    """Normalize (sinks join the denominator), scale, and write out/lse rows in place."""
    batch = ctx.batch
    empty = l == 0  # fully masked rows: out 0, lse -inf (the sink's alone with a sink)
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    if ctx.sinks is not None:
        top = torch.maximum(m_safe, ctx.sinks.expand_as(m_safe))
        num_scale = torch.exp(m_safe - top)
        denom = l * num_scale + torch.exp(ctx.sinks - top)
        out = acc * (num_scale / denom)[..., None]
        m_safe, l, empty = top, denom, torch.zeros_like(empty)  # the LSE is the whole denominator's
    else:
        out = acc / torch.where(empty, torch.ones_like(l), l)[..., None]
    out = out * ctx.out_scale
    rows = slice(req.q_start + r0, req.q_start + r1)
    batch.out[rows].copy_(_stored(out.permute(1, 0, 2), batch.out.dtype))
    if batch.lse is not None:
        lse = torch.where(empty, torch.full_like(m, -math.inf), (m_safe + torch.log(torch.where(
            empty, torch.ones_like(l), l))) / _numerics.LN2)
        batch.lse[rows].copy_(lse.t().to(batch.lse.dtype))


def _stored(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values in the output's dtype. An fp8 output saturates at its largest finite value, as FlashInfer
    0.7.2's kernels store it (their conversion is satfinite: backends/native/triton_kernels.py
    _e4m3_grid cites them); the clamp keeps that whatever a torch release's own overflow rule. NaN
    stays NaN."""
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        largest = torch.finfo(dtype).max
        values = values.clamp(-largest, largest)
    return values.to(dtype)
