"""native-triton: attn-dispatch's own Triton kernels, the GPU fallback for every valid problem.

``plan`` does all host work once (tile shapes, split count, grids, scratch buffers
sized from the batch's host-side upper bounds); ``run`` only launches, with no
host synchronization and no allocation, so it can be captured in a CUDA graph.
Kernels: backends/native/triton_kernels.py. Performance notes: tools/NOTES-native.md.

Caches (name: key -> bound):
* ``_SM_COUNT``: CUDA device index (never a bare "cuda") -> SM count (one entry per GPU);
* ``NativeTritonBackend._available``: one entry; Triton's own kernel cache (per device,
  per constexpr specialization) is Triton's;
* no buffer outlives its plan: split-KV scratch, ALiBi slopes and RoPE copies are made in
  ``plan`` on the batch's device and held by the plan (the caller's plan cache keys on the
  device; a run on another GPU than its plan is refused).
Every launch runs under the tensors' GPU (Triton launches on the *current* device).
Any sm_scale sign is served: the kernel moves a negative scale's sign into q.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch

from backends._device import device_key, on_device
from backends._numerics import alibi_slopes
from backends.base import Backend, DeviceDesc, Reason, import_reason
from capability_db.vocabulary import AttentionBatch, AttentionProblem


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclass(frozen=True)
class TileConfig:
    """Launch shape of the attention kernel (chosen in plan, overridable for benchmarks)."""

    block_m: int
    block_n: int
    heads_per_program: int  # HPP: query heads of one KV group packed into the M dimension
    num_warps: int
    num_stages: int


@dataclass
class TritonPlan:
    problem: AttentionProblem
    config: TileConfig
    grid: tuple[int, int, int]
    num_splits: int
    kv_chunk: int
    total_q_capacity: int
    constexprs: dict[str, Any]
    device: Optional[torch.device] = None  # where the scratch buffers live (with its index)
    part_o: Optional[torch.Tensor] = None  # (splits, total_q, Hq, Dvo) fp32
    part_lse: Optional[torch.Tensor] = None  # (splits, total_q, Hq) fp32
    alibi: Optional[torch.Tensor] = None  # (Hq,) fp32 slopes
    rope_q: Optional[torch.Tensor] = None  # rotated copies (RoPE problems only)
    rope_k: Optional[torch.Tensor] = None
    rope_grids: tuple = ()
    extra: dict = field(default_factory=dict)


class NativeTritonBackend(Backend):
    name = "native-triton"
    packages = ("triton",)
    _available: Optional[tuple[Optional[Reason]]] = None

    # -- availability --------------------------------------------------------
    def available(self) -> Optional[Reason]:
        if self._available is None:
            try:
                __import__("triton")  # importable is all we ask here
            except Exception as exc:  # noqa: BLE001 - any import failure is a reason
                NativeTritonBackend._available = (import_reason("triton", exc),)
            else:
                reason = None
                if not torch.cuda.is_available() and not _interpreting():
                    reason = Reason("device", "no CUDA device", "a CUDA GPU, or TRITON_INTERPRET=1 (CPU, slow)")
                NativeTritonBackend._available = (reason,)
        return self._available[0]

    def version(self) -> Optional[str]:
        try:
            import triton
        except Exception:  # noqa: BLE001
            return None
        return triton.__version__

    def extra_checks(self, problem: AttentionProblem, device: DeviceDesc) -> list[Reason]:
        reasons = []
        if device.kind == "cpu" and not _interpreting():
            reasons.append(Reason("device_kind", "cpu", "cuda, or cpu with TRITON_INTERPRET=1 (Triton's interpreter)",
                                  "backends/native/triton_backend.py"))
        return reasons

    # -- plan ----------------------------------------------------------------
    def plan(self, problem: AttentionProblem, batch: AttentionBatch, *, num_splits: Optional[int] = None,
             config: Optional[TileConfig] = None) -> TritonPlan:
        """Host-side choices only. ``num_splits``/``config`` override the heuristics (tests, tuning)."""
        _check_batch(problem, batch)
        device = batch.q.device
        cfg = config or fit_shared_memory(problem, choose_config(problem, batch.max_q_len, device), device)
        group, hpp = problem.gqa_group, cfg.heads_per_program
        if group % hpp:
            raise ValueError(f"config.heads_per_program={hpp} must divide the GQA group {group}")
        m_blocks = max(1, math.ceil(max(batch.max_q_len, 1) * hpp / cfg.block_m))
        programs = m_blocks * batch.batch_size * problem.num_kv_heads * (group // hpp)
        splits = num_splits or choose_splits(programs, batch.max_kv_len, problem, cfg, device)
        chunk = max(cfg.block_n, math.ceil(max(batch.max_kv_len, 1) / splits / cfg.block_n) * cfg.block_n)
        splits = max(1, math.ceil(max(batch.max_kv_len, 1) / chunk))
        plan = TritonPlan(problem, cfg, (m_blocks, batch.batch_size * problem.num_kv_heads * (group // hpp), splits),
                          splits, chunk, batch.total_q, _constexprs(problem, batch, cfg, splits), device_key(device))
        if splits > 1:
            plan.part_o = torch.empty((splits, batch.total_q, problem.num_qo_heads, problem.head_dim_vo),
                                      dtype=torch.float32, device=device)
            plan.part_lse = torch.empty((splits, batch.total_q, problem.num_qo_heads), dtype=torch.float32,
                                        device=device)
        if problem.pos_encoding == "ALIBI":
            plan.alibi = torch.tensor(alibi_slopes(problem.num_qo_heads), dtype=torch.float32, device=device)
        if problem.pos_encoding == "ROPE_LLAMA":
            _plan_rope(plan, problem, batch)
        return plan

    # -- run -----------------------------------------------------------------
    def run(self, plan: TritonPlan, batch: AttentionBatch) -> None:
        if batch.total_q > plan.total_q_capacity:
            raise ValueError(f"q has {batch.total_q} rows but the plan was made for at most "
                             f"{plan.total_q_capacity}; plan again for this batch")
        if plan.device is not None and device_key(batch.q.device) != plan.device:
            raise ValueError(f"q is on {batch.q.device} but the plan's buffers are on {plan.device}; "
                             "plan again on this device")
        with on_device(batch.q.device):
            self._launch(plan, batch)

    def _launch(self, plan: TritonPlan, batch: AttentionBatch) -> None:
        from . import triton_kernels as tk

        q, k = batch.q, batch.k
        if plan.rope_q is not None:
            _launch_rope(plan, batch)
            q, k = plan.rope_q[: batch.total_q], plan.rope_k
        _launch_attention(tk, plan, batch, q, k)
        if plan.num_splits > 1:
            _launch_merge(tk, plan, batch)


# ---------------------------------------------------------------------------
# planning helpers
# ---------------------------------------------------------------------------
def _check_batch(problem: AttentionProblem, batch: AttentionBatch) -> None:
    """The few things data cannot say; ValueError names the argument before any launch."""
    if problem.kv_storage == "paged" and (batch.block_table is None or batch.k.dim() != 4):
        raise ValueError("paged KV needs block_table and 4-D k/v views (pages, page_size, Hkv, D); "
                         f"got block_table={batch.block_table is not None}, k.dim()={batch.k.dim()}")
    if problem.kv_storage != "paged" and (batch.kv_indptr is None or batch.k.dim() != 3):
        raise ValueError(f"{problem.kv_storage} KV needs kv_indptr and 3-D k/v (tokens, Hkv, D); "
                         f"got kv_indptr={batch.kv_indptr is not None}, k.dim()={batch.k.dim()}")
    if problem.mask == "custom" and (batch.custom_mask is None or batch.mask_indptr is None):
        raise ValueError("mask='custom' needs custom_mask and mask_indptr; got None")
    if problem.mask == "spec_bits" and batch.spec_mask is None:
        raise ValueError("mask='spec_bits' needs spec_mask (uint16 bit rows); got None")
    if problem.has_sinks and batch.sinks is None:
        raise ValueError("has_sinks=True needs sinks (Hq,) float32; got None")


def choose_config(problem: AttentionProblem, max_q_len: int, device: torch.device) -> TileConfig:
    """Tile shapes by phase and head dim (measured on H100: tools/NOTES-native.md)."""
    group = problem.gqa_group
    dmax = max(_pow2(problem.head_dim_qk), _pow2(problem.head_dim_vo))
    rows = max(max_q_len, 1) * group
    if rows <= 64 or problem.phase != "prefill":
        # Decode-like: pack the whole group (and all drafts) into the M dimension.
        # Long key tiles keep more bytes in flight per program (H100: N128 2.86 TB/s vs N64 2.33).
        block_m = min(max(16, _pow2(rows)), 64)
        block_n = 128 if dmax <= 128 else 64
        return TileConfig(block_m, block_n, group, num_warps=4, num_stages=3)
    if dmax <= 128:  # H100 d128 causal 8x2048: M256/8 warps, 4 heads of a group per tile: 301 TFLOP/s
        if max_q_len >= 1024:  # (M256 one head 282, M128 one head 268: tools/NOTES-native.md)
            hpp = max(d for d in (1, 2, 4) if group % d == 0)
            return TileConfig(256, 64, hpp, num_warps=8, num_stages=3)
        return TileConfig(128, 64, 1, num_warps=4, num_stages=3)
    return TileConfig(64, 32, 1, num_warps=4, num_stages=2)


def _smem_bytes(problem: AttentionProblem, cfg: TileConfig) -> int:
    """Estimated shared memory of a program: pipelined K/V tiles plus the q tile, staged in
    q's dtype at worst (fp32 inputs need twice the bytes of bf16)."""
    elem = 4 if problem.q_dtype == "float32" else 2
    dqk, dvo = max(16, _pow2(problem.head_dim_qk)), max(16, _pow2(problem.head_dim_vo))
    return (cfg.num_stages * cfg.block_n * (dqk + dvo) + cfg.block_m * dqk) * elem


def _smem_limit(device: torch.device) -> float:
    index = device_key(device).index
    return 0.9 * torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def fit_shared_memory(problem: AttentionProblem, cfg: TileConfig, device: torch.device) -> TileConfig:
    """Shrink stages, then key tiles, then query tiles until a program fits shared memory."""
    if device.type != "cuda":
        return cfg
    limit = _smem_limit(device)
    while _smem_bytes(problem, cfg) > limit:
        if cfg.num_stages > 2:
            cfg = replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.block_n > 16:
            cfg = replace(cfg, block_n=cfg.block_n // 2)
        elif cfg.block_m > 16:
            cfg = replace(cfg, block_m=cfg.block_m // 2)
        else:
            break
    return cfg


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter runs programs one after another: splitting only costs time
    index = device_key(device).index
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def choose_splits(programs: int, max_kv_len: int, problem: AttentionProblem, cfg: TileConfig,
                  device: torch.device) -> int:
    """Flash-decoding split count: about two waves of resident programs (slots = SMs x
    programs per SM, shared-memory bound), at least 4 key tiles per split."""
    if device.type != "cuda":
        return 1  # the interpreter runs programs one after another: splitting only costs time
    per_sm = max(1, min(64 // cfg.num_warps, int(_smem_limit(device) / 0.9 // _smem_bytes(problem, cfg))))
    return best_splits(programs, _sm_count(device) * per_sm, max(1, min(64, max_kv_len // (4 * cfg.block_n))))


def best_splits(programs: int, slots: int, max_useful: int) -> int:
    """The largest split with programs x splits <= 2 waves. H100 sweep (tools/NOTES-native.md):
    4 requests x 64k keys, 32 programs: 8 splits 2.85 TB/s, 9 2.66, 4 2.57, 16 2.62, 32 2.77;
    a third, mostly empty wave costs more than the extra latency hiding gains."""
    return max(1, min(2 * slots // max(programs, 1), max_useful))


def _constexprs(problem: AttentionProblem, batch: AttentionBatch, cfg: TileConfig, splits: int) -> dict:
    mask_mode = {"none": 0, "custom": 1, "spec_bits": 2}[problem.mask]
    return dict(
        GROUP=problem.gqa_group, HPP=cfg.heads_per_program, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        HEAD_DQK=problem.head_dim_qk, HEAD_DV=problem.head_dim_vo,
        BLOCK_DQK=max(16, _pow2(problem.head_dim_qk)), BLOCK_DV=max(16, _pow2(problem.head_dim_vo)),
        PAGED=problem.kv_storage == "paged", PAGE_SIZE=max(problem.page_size, 1),
        # A custom or xqa bit mask replaces causality (FlashInfer: mask_mode CUSTOM ignores causal).
        CAUSAL=problem.causal and mask_mode == 0, HAS_WINDOW=problem.window_left >= 0,
        SOFT_CAP=problem.logits_soft_cap > 0, HAS_SINKS=problem.has_sinks, MASK_MODE=mask_mode,
        HAS_ALIBI=problem.pos_encoding == "ALIBI", WRITE_LSE=batch.lse is not None, SPLIT=splits > 1,
        DOT_F32=_interpreting() or problem.q_dtype == "float32", Q_FP8=problem.q_dtype.startswith("float8"),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _plan_rope(plan: TritonPlan, problem: AttentionProblem, batch: AttentionBatch) -> None:
    """Scratch copies of q and k rotated by a separate pass (k keeps its logical shape;
    fp8 k is rotated into q's dtype since rotation is linear in the folded scale)."""
    dtype = torch.bfloat16 if problem.q_dtype.startswith("float8") else batch.q.dtype
    plan.rope_q = torch.empty((batch.total_q, problem.num_qo_heads, problem.head_dim_qk),
                              dtype=dtype, device=batch.q.device)
    shape = tuple(batch.k.shape)
    if problem.kv_storage == "paged" and "pages_used" in batch.extras:
        # A wrapper plans on its first run, with the caller's whole page pool: the copy needs only
        # the pages the plan's block table reaches, not the pool.
        shape = (min(shape[0], batch.extras["pages_used"]),) + shape[1:]
    plan.rope_k = torch.empty(shape, dtype=dtype, device=batch.k.device)
    block_t = 16
    plan.rope_grids = (
        (batch.batch_size, max(1, math.ceil(batch.max_q_len / block_t)), problem.num_qo_heads),
        (batch.batch_size, max(1, math.ceil(batch.max_kv_len / block_t)), problem.num_kv_heads),
    )


# ---------------------------------------------------------------------------
# launch helpers (no allocation, no host synchronization)
# ---------------------------------------------------------------------------
def _kv_strides(x: torch.Tensor, paged: bool) -> tuple[int, int, int, int]:
    """(page, token, head, dim) strides of a logical NHD view; page stride 0 if not paged."""
    if paged:
        return x.stride(0), x.stride(1), x.stride(2), x.stride(3)
    return 0, x.stride(0), x.stride(1), x.stride(2)


def _scale_arg(value) -> tuple[Any, bool]:
    if isinstance(value, torch.Tensor):
        return value, True
    return float(value), False


def _launch_attention(tk, plan: TritonPlan, batch: AttentionBatch, q: torch.Tensor, k: torch.Tensor) -> None:
    p = plan.problem
    paged = p.kv_storage == "paged"
    sm_scale, scale_ptr = _scale_arg(batch.sm_scale)
    out_scale, out_scale_ptr = _scale_arg(batch.out_scale)
    lse = batch.lse if batch.lse is not None else batch.out  # unused pointer when WRITE_LSE is off
    part_o = plan.part_o if plan.part_o is not None else batch.out
    part_lse = plan.part_lse if plan.part_lse is not None else batch.out
    spec = batch.spec_mask.view(torch.int16) if p.mask == "spec_bits" else None
    spec_strides = (0, 0, 0)  # (request, row, ragged?) in int16 elements
    if spec is not None:
        spec_strides = (spec.stride(0), spec.stride(1), 0) if spec.dim() == 3 else (0, spec.stride(0), 1)
    custom = batch.custom_mask.view(torch.uint8) if p.mask == "custom" else None
    tk._attn_fwd[plan.grid](
        q, k, batch.v, batch.out, lse, part_o, part_lse,
        batch.qo_indptr, batch.kv_lens, batch.kv_indptr, batch.block_table, batch.sinks,
        custom, batch.mask_indptr, spec, plan.alibi,
        sm_scale, out_scale, p.window_left, float(p.logits_soft_cap), plan.kv_chunk, p.num_kv_heads,
        *q.stride(), *_kv_strides(k, paged), *_kv_strides(batch.v, paged), *batch.out.stride(),
        *(lse.stride()[:2]), batch.block_table.stride(0) if paged else 0,
        *spec_strides,
        *(part_o.stride()[:3] if plan.part_o is not None else (0, 0, 0)),
        *(part_lse.stride()[:2] if plan.part_lse is not None else (0, 0)),
        SCALE_PTR=scale_ptr, OUT_SCALE_PTR=out_scale_ptr, **plan.constexprs,
    )


def _launch_merge(tk, plan: TritonPlan, batch: AttentionBatch) -> None:
    p = plan.problem
    out_scale, out_scale_ptr = _scale_arg(batch.out_scale)
    lse = batch.lse if batch.lse is not None else batch.out
    tk._merge_splits[(batch.total_q, p.num_qo_heads)](
        plan.part_o, plan.part_lse, batch.out, lse, batch.sinks, out_scale, plan.num_splits,
        *plan.part_o.stride()[:3], *plan.part_lse.stride()[:2], *batch.out.stride(), *(lse.stride()[:2]),
        HEAD_DV=p.head_dim_vo, BLOCK_DV=plan.constexprs["BLOCK_DV"], BLOCK_S=max(2, _pow2(plan.num_splits)),
        HAS_SINKS=p.has_sinks, WRITE_LSE=batch.lse is not None, OUT_SCALE_PTR=out_scale_ptr, num_warps=4,
    )


def _launch_rope(plan: TritonPlan, batch: AttentionBatch) -> None:
    from . import triton_kernels as tk

    p = plan.problem
    paged = p.kv_storage == "paged"
    common = dict(log2_theta=math.log2(p.rope_theta), rcp_scale=1.0 / p.rope_scale)
    consts = dict(HEAD_D=p.head_dim_qk, HALF_BLOCK=max(8, _pow2(p.head_dim_qk // 2)), BLOCK_T=16,
                  PAGE_SIZE=max(p.page_size, 1))
    q_grid, k_grid = plan.rope_grids
    rq = plan.rope_q[: batch.total_q]
    tk._rope_rows[q_grid](batch.q, rq, batch.qo_indptr, batch.kv_lens, batch.kv_indptr, batch.block_table,
                          **common, stride_xp=0, stride_xt=batch.q.stride(0), stride_xh=batch.q.stride(1),
                          stride_xd=batch.q.stride(2), stride_yp=0, stride_yt=rq.stride(0), stride_yh=rq.stride(1),
                          stride_yd=rq.stride(2), stride_bt=0, IS_Q=True, PAGED=False, **consts)
    xs, ys = _kv_strides(batch.k, paged), _kv_strides(plan.rope_k, paged)
    tk._rope_rows[k_grid](batch.k, plan.rope_k, batch.qo_indptr, batch.kv_lens, batch.kv_indptr, batch.block_table,
                          **common, stride_xp=xs[0], stride_xt=xs[1], stride_xh=xs[2], stride_xd=xs[3],
                          stride_yp=ys[0], stride_yt=ys[1], stride_yh=ys[2], stride_yd=ys[3],
                          stride_bt=batch.block_table.stride(0) if paged else 0, IS_Q=False, PAGED=paged, **consts)
