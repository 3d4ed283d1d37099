"""native-triton: attn-dispatch's own Triton kernels, the GPU fallback for every valid problem.

``plan`` does all host work once (tile shapes, split count, grids, constexprs, scratch buffers
sized from the batch's host-side upper bounds, RoPE frequencies); ``run`` gathers the call's
pointers and strides and launches through ``KernelLaunch`` (backends/native/_launch.py: the cached
compiled kernel, called directly), with no host synchronization and no allocation, so it can be
captured in a CUDA graph. Kernels: backends/native/triton_kernels.py. Measured performance and the
split-KV rule: docs/benchmarks.md (native-triton); the rule's reasons are at ``split_kv``.

Caches (name: key -> bound):
* ``_SM_COUNT``: CUDA device index (never a bare "cuda") -> SM count (one entry per GPU);
* ``NativeTritonBackend._available``: one entry; Triton's own kernel cache (per device,
  per constexpr specialization) is Triton's; each plan's ``KernelLaunch`` keeps at most
  ``MAX_VARIANTS`` compiled-kernel handles;
* no buffer outlives its plan: split-KV scratch, ALiBi slopes and RoPE frequencies are made in
  ``plan`` on the batch's device and held by the plan;
* ``TritonPlan.others``: ``plan_facts`` -> plan, at most ``MAX_OTHERS`` per plan: a batch whose
  sizes or GPU differ from its plan's is served by the plan of its own facts, made once (the entry
  points keep one plan per call key, ``plan_reusable``, and its lanes differ in exact sizes).
Every launch runs under the tensors' GPU (Triton launches on the *current* device).
Any sm_scale sign is served: the kernel moves a negative scale's sign into q.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch

from backends._device import device_key, made_to_keep, on_device, on_device_launch
from backends._numerics import alibi_slopes
from backends.base import Backend, DeviceDesc, Reason, import_reason
from backends.native._launch import KernelLaunch, interpreting
from capability_db.vocabulary import AttentionBatch, AttentionProblem


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
    # The plain-path kernel (PLAIN_PREFILL: paged prefill's large tiles) and its variants:
    kernel: str = "general"  # "plain": triton_plain._attn_fwd_plain, for problems plain_reasons accepts
    kv_tma: bool = False  # plain kernel, ragged/dense K/V: tiles read by TMA descriptors
    persistent: bool = False  # plain kernel: about one wave of programs, longest query blocks first
    # True: split decode tiles (block_m <= MAX_FUSED_MERGE_ROWS, splits <= MAX_FUSED_MERGE_SPLITS) merge in
    # the last split program (one launch). Off by default: on the H100 it was no faster than the merge
    # kernel's second launch (see MAX_FUSED_MERGE_SPLITS); kept, tested, for the tool's comparison rows.
    fused_merge: bool = False


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
    split_count: Optional[torch.Tensor] = None  # fused merge: (row blocks,) int32 zeros, left at zero by each launch
    alibi: Optional[torch.Tensor] = None  # (Hq,) fp32 slopes
    rope_freq: Optional[torch.Tensor] = None  # (2, BLOCK_HALF) fp32: frequency hi and lo parts
    attention: Optional[KernelLaunch] = None
    merge: Optional[KernelLaunch] = None
    pointer_attention: Optional[KernelLaunch] = None  # kv_tma plans: calls whose K/V a TMA cannot read
    fixed_ints: tuple = ()  # the kernel's integer arguments the plan fixes (see _attention_ints)
    facts: tuple = ()  # plan_facts of the batch it was made for: a batch with other facts gets its own plan
    overrides: tuple = (None, None, False)  # plan()'s (num_splits, config, fixup), for the plans of other facts
    others: Optional[dict] = None  # plan_facts -> the plan of those facts (run / launcher, at most MAX_OTHERS)


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
                if not torch.cuda.is_available() and not interpreting():
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
        if device.kind == "cpu" and not interpreting():
            reasons.append(Reason("device_kind", "cpu", "cuda, or cpu with TRITON_INTERPRET=1 (Triton's interpreter)",
                                  "backends/native/triton_backend.py"))
        return reasons

    # -- plan ----------------------------------------------------------------
    def plan(self, problem: AttentionProblem, batch: AttentionBatch, *, num_splits: Optional[int] = None,
             config: Optional[TileConfig] = None, fixup: bool = False) -> TritonPlan:
        """Host-side choices only. ``num_splits``/``config`` override the heuristics (tests, tuning).
        ``fixup``: the plan of a vendor decode's fix-up (see fixup_refusal): a launch after the vendor's
        that recomputes only the row blocks whose logits it cannot bound (the kernel's FIXUP)."""
        plan = self._plan(problem, batch, num_splits, config, fixup)
        plan.facts, plan.overrides = plan_facts(batch, fixup), (num_splits, config, fixup)
        return plan

    def plans_before_run(self, problem: AttentionProblem) -> bool:
        return True  # plan_facts: sizes and the device

    def plan_reusable(self, problem: AttentionProblem) -> bool:
        # A plan reads from the batch only its plan_facts (sizes, device) and records them; run and
        # launcher serve a batch of other facts with the plan of its own facts (plan_for), so the
        # entry points keep one plan per call key and its lanes take the launcher on repeats.
        return True

    def plan_for(self, plan: TritonPlan, batch: AttentionBatch) -> TritonPlan:
        """The plan serving ``batch``: ``plan`` when the batch's facts are its own, else the plan of
        those facts (made once and kept by ``plan``: a call key's lanes share one kept plan)."""
        facts = plan_facts(batch, plan.overrides[2])
        if facts == plan.facts:
            return plan
        others = plan.others if plan.others is not None else {}
        found = others.get(facts)
        if found is None:
            found = _derived(plan, others, batch, facts)
            if found is None:
                num_splits, config, fixup = plan.overrides
                found = self.plan(plan.problem, batch, num_splits=num_splits, config=config, fixup=fixup)
            if len(others) >= MAX_OTHERS:
                others.pop(next(iter(others)))
            others[facts] = found
            plan.others = others
        return found

    def _plan(self, problem: AttentionProblem, batch: AttentionBatch, num_splits: Optional[int],
              config: Optional[TileConfig], fixup: bool = False) -> TritonPlan:
        _check_batch(problem, batch)
        device = batch.q.device
        cfg = config or fit_shared_memory(problem, choose_config(problem, batch.max_q_len, device), device)
        group, hpp = problem.gqa_group, cfg.heads_per_program
        if group % hpp:
            raise ValueError(f"config.heads_per_program={hpp} must divide the GQA group {group}")
        _check_plain_config(problem, cfg, num_splits)
        m_blocks = max(1, math.ceil(max(batch.max_q_len, 1) * hpp / cfg.block_m))
        if fixup:
            refusal = fixup_refusal(problem) or (cfg.kernel != "general" and f"the {cfg.kernel} kernel")
            if refusal:
                raise ValueError(f"native-triton cannot fix up this problem: {refusal}")
            if config is None:
                cfg = replace(cfg, **FIXUP_TILE)
        if cfg.kernel == "plain" and config is None and not num_splits:
            cfg, m_blocks = split_when_underfilled(problem, batch, cfg, m_blocks, device)
        if cfg.kernel == "plain":
            return _plain_plan(problem, batch, cfg, m_blocks, device)
        if fixup:  # one split over any length (a fix-up is rare; a captured one follows any length)
            splits, chunk = 1, FIXUP_CHUNK
        elif num_splits:
            span = split_span(problem, batch, cfg)
            splits, chunk = splits_of_chunk(span, chunk_keys(span, num_splits, cfg.block_n))
        else:
            splits, chunk = choose_splits(problem, batch, cfg, m_blocks, device)
        grid = (m_blocks, batch.batch_size * problem.num_kv_heads * (group // hpp), splits)
        plan = TritonPlan(problem, cfg, grid, splits, chunk, batch.total_q,
                          _constexprs(problem, cfg, splits, fixup), device_key(device))
        plan.part_o, plan.part_lse, plan.split_count, plan.alibi, plan.rope_freq = made_to_keep(
            lambda: _plan_buffers(plan, batch.total_q), device)
        _plan_launches(plan, device)
        return plan

    # -- run -----------------------------------------------------------------
    def run(self, plan: TritonPlan, batch: AttentionBatch) -> None:
        plan = self.plan_for(plan, batch)  # other sizes or another GPU: the plan of the batch's facts
        if plan.device.type == "cuda" and torch.cuda.current_device() == plan.device.index:
            _launch(plan, batch)  # already current: skip on_device's switch (~1 us)
        else:
            with on_device(plan.device):  # Triton launches on the current device (CPU: a null context)
                _launch(plan, batch)

    # -- follow (a captured graph's plan, re-planned in place: Backend.follow_refusal) ------------
    def follow_refusal(self, plan: TritonPlan, batch: AttentionBatch) -> Optional[str]:
        """The captured launches read lengths and indices from the batch's tensors; their grid,
        split count and keys per split are fixed. They do a batch of the same size and query rows
        whose query blocks fit the grid and, on the split kernel, whose keys fit the splits."""
        facts = plan_facts(batch)
        if (facts[0], facts[3], facts[4]) != (plan.facts[0], plan.facts[3], plan.facts[4]):
            return (f"native-triton: batch size, query rows, device {facts[0]}, {facts[3]}, {facts[4]}; "
                    f"the captured plan's {plan.facts[0]}, {plan.facts[3]}, {plan.facts[4]}")
        cfg = plan.config
        blocks = max(1, math.ceil(max(batch.max_q_len, 1) * cfg.heads_per_program / cfg.block_m))
        room = plan.fixed_ints[0][0] if cfg.kernel == "plain" else plan.grid[0]
        if blocks > room:
            return f"native-triton: {batch.max_q_len} queries per request need {blocks} query blocks, the graph has {room}"
        keys, span = plan.num_splits * plan.kv_chunk, split_span(plan.problem, batch, cfg)
        if cfg.kernel != "plain" and span > keys:
            return (f"native-triton: {span} keys per program (split_span), the captured splits cover {keys} "
                    "(plan the capture with the longest lengths, or pass plan(max_sequence_kv=...))")
        return None

    def follow(self, plan: TritonPlan, batch: AttentionBatch) -> None:
        plan.facts = plan_facts(batch, plan.overrides[2])  # the captured launches serve these facts now

    def launcher(self, plan: TritonPlan, batch: AttentionBatch) -> Optional[Callable[[AttentionBatch], None]]:
        """Exact repeats of ``batch`` (Backend.launcher): what run checks and derives per call (capacity,
        device, scale kinds, strides, the split-buffer and merge arguments, the specialization key) is
        fixed now; a call reads the tensors' addresses and calls the compiled kernels (one or two launches)."""
        plan = self.plan_for(plan, batch)
        if _readable_indices(batch) is not batch:
            return None  # an index tensor needs a copy per call: run makes it
        return on_device_launch(plan.device, _launcher(plan, batch))


# ---------------------------------------------------------------------------
# planning helpers
# ---------------------------------------------------------------------------
MAX_OTHERS = 8  # plans of other facts kept by one plan (the lanes of one call key)
# The fix-up's launch mostly returns after its bound: short key tiles without a pipeline hold fewer
# registers and no shared-memory stages (H200, tools/fixup_cost.py, two runs: up to 2.4 us less per call
# than the decode tile, on 4 of 6 and 7 of 8 problems).
FIXUP_TILE = dict(num_stages=1, block_n=32)
FIXUP_CHUNK = 1 << 30  # a fix-up plan's one split: every key of any request (int32 with a window's offset)


def _derived(plan: TritonPlan, others: dict, batch: AttentionBatch, facts: tuple) -> Optional[TritonPlan]:
    """The plan of ``batch`` made from a plan of the same call key whose tile and query blocks it shares
    (same query rows per request, same GPU: an engine's decode steps), or None. Only the schedule
    depends on the batch there (grid, split count, keys per split, scratch): the compiled launches,
    whose grid is given per call, and the problem's buffers are shared, so a new batch costs the
    split rule and its scratch, not a plan."""
    if facts[1] != plan.facts[1] or facts[4] != plan.facts[4]:
        return None
    num_splits, config, fixup = plan.overrides
    cfg, problem = plan.config, plan.problem
    if cfg.kernel != "general" or cfg.fused_merge or (config is None and _plain_candidate(problem)):
        return None  # the plain kernel's, or a choice between kernels that reads the batch (split_when_underfilled)
    m_blocks = plan.grid[0]
    if fixup:
        splits, chunk = 1, FIXUP_CHUNK
    elif num_splits:
        span = split_span(problem, batch, cfg)
        splits, chunk = splits_of_chunk(span, chunk_keys(span, num_splits, cfg.block_n))
    else:
        splits, chunk = choose_splits(problem, batch, cfg, m_blocks, batch.q.device)
    model = next((p for p in (plan, *others.values()) if (p.num_splits > 1) == (splits > 1)
                  and p.facts[1] == facts[1] and p.facts[4] == facts[4] and p.config == cfg), None)
    if model is None:
        return None  # the other kernel variant (split or not): a plan of its own
    derived = replace(model, grid=(m_blocks, batch.batch_size * problem.num_kv_heads * (problem.gqa_group //
                                                                                       cfg.heads_per_program), splits),
                      num_splits=splits, kv_chunk=chunk, total_q_capacity=batch.total_q, facts=facts, others=None)
    if splits > 1:
        derived.part_o, derived.part_lse = made_to_keep(lambda: _split_buffers(derived, batch.total_q), plan.device)
    derived.fixed_ints = ((problem.window_left, chunk, problem.num_kv_heads), _part_strides(derived))
    return derived


def _split_buffers(plan: TritonPlan, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split kernel's partial outputs and LSEs for ``rows`` query rows (a plan keeps them)."""
    problem, splits = plan.problem, plan.num_splits
    return (torch.empty((splits, rows, problem.num_qo_heads, problem.head_dim_vo), dtype=torch.float32,
                        device=plan.device),
            torch.empty((splits, rows, problem.num_qo_heads), dtype=torch.float32, device=plan.device))


def _plan_buffers(plan: TritonPlan, rows: int) -> tuple:
    """A general-kernel plan's buffers (part_o, part_lse, split_count, alibi, rope_freq; None where the
    plan has no use for one), which it keeps."""
    problem, device = plan.problem, plan.device
    part_o, part_lse = _split_buffers(plan, rows) if plan.num_splits > 1 else (None, None)
    split_count = (torch.zeros(plan.grid[0] * plan.grid[1], dtype=torch.int32, device=device)
                   if plan.constexprs["MERGE_BLOCK_S"] else None)
    alibi = (torch.tensor(alibi_slopes(problem.num_qo_heads), dtype=torch.float32, device=device)
             if problem.pos_encoding == "ALIBI" else None)
    rope_freq = (rope_frequencies(problem, plan.constexprs["BLOCK_HALF"]).to(device)
                 if problem.pos_encoding == "ROPE_LLAMA" else None)
    return part_o, part_lse, split_count, alibi, rope_freq


def fixup_refusal(problem: AttentionProblem) -> str:
    """Why a fix-up plan cannot serve ``problem`` ('' when it can). The kernel bounds each row's logit at
    the row's own position, which every decode row sees (causal or one query, any window); RoPE would
    rotate q and K before the dot, a mask could hide that key."""
    if problem.phase != "decode":
        return f"phase {problem.phase!r} (the fix-up serves 'decode')"
    if problem.mask != "none" or problem.pos_encoding != "NONE":
        return f"mask {problem.mask!r}, pos_encoding {problem.pos_encoding!r} (the fix-up serves 'none', 'NONE')"
    if problem.kv_nvfp4:
        return "kv_dtype 'uint8' (NVFP4: the fix-up's bound reads K as stored)"
    return ""


def plan_facts(batch: AttentionBatch, fixup: bool = False) -> tuple:
    """Everything of a batch that ``plan`` reads besides the problem (grid, splits, scratch sizes,
    tile shape and the device of the buffers): equal facts, equal plan. A fix-up plan's one split
    covers any length (FIXUP_CHUNK), so its facts leave the longest length out: a decode batch of a
    size seen before (an engine's steps) finds its fix-up plan made."""
    kv = None if fixup else batch.max_kv_len
    return (batch.batch_size, batch.max_q_len, kv, batch.total_q, device_key(batch.q.device))


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
    v_table = batch.v_block_table
    if not problem.uses_shared_paged_kv_idx and (v_table is None or v_table.shape != batch.block_table.shape):
        raise ValueError(f"v_block_table={None if v_table is None else tuple(v_table.shape)}: uses_shared_paged_kv_idx"
                         f"=False needs V's page ids of block_table's shape {tuple(batch.block_table.shape)}")


# The one-line switch to the plain-path kernel for prefill: None keeps the general kernel.
# choose_config applies it to the large prefill tiles (M >= 128) of the KV storages named, for a problem
# plain_reasons accepts (kv_tma: ragged only). Measured on the H100 (tools/native_h100.py --variants,
# causal 8 x 2048, bf16, 32/8 heads, d128): paged, plain with 4 stages 276 TFLOP/s eager / 285 in a CUDA
# graph against the general kernel's 260 / 266; ragged, plain 314 / 321 against 316 / 333, and neither
# TMA descriptors nor the persistent schedule gained (Triton 3.6 on sm_90): the general kernel keeps it.
PLAIN_PREFILL: Optional[dict] = dict(kernel="plain", num_stages=4)
PLAIN_PREFILL_STORAGE = ("paged",)
# RoPE on the plain kernel (its K halves rotated per tile) with 3 stages: paged RoPE 248 TFLOP/s eager /
# 259 graph against the general kernel's 228 / 242 (4 stages: 242 / 253; H100, same shape).
PLAIN_PREFILL_ROPE_STAGES = 3


def _plain_candidate(problem: AttentionProblem) -> bool:
    """Whether choose_config may give ``problem`` the plain kernel (at large query tiles)."""
    return bool(PLAIN_PREFILL and problem.phase == "prefill" and problem.kv_storage in PLAIN_PREFILL_STORAGE
                and not plain_reasons(problem))


def choose_config(problem: AttentionProblem, max_q_len: int, device: torch.device) -> TileConfig:
    """Tile shapes by phase and head dim (measured on the H100; the reasons are beside each tile)."""
    cfg = _general_config(problem, max_q_len)
    if cfg.block_m >= 128 and _plain_candidate(problem):
        plain = dict(PLAIN_PREFILL)
        if problem.pos_encoding == "ROPE_LLAMA":
            plain["num_stages"] = PLAIN_PREFILL_ROPE_STAGES
        plain["kv_tma"] = plain.get("kv_tma", False) and problem.kv_storage != "paged"
        cfg = replace(cfg, **plain)
    return cfg


def _general_config(problem: AttentionProblem, max_q_len: int) -> TileConfig:
    group = problem.gqa_group
    dmax = max(_pow2(problem.head_dim_qk), _pow2(problem.head_dim_vo))
    rows = max(max_q_len, 1) * group
    if dmax > 256:
        return _wide_head_config(problem, rows)
    if rows <= 64 or problem.phase != "prefill":
        # Decode-like: pack the whole group (and all drafts) into the M dimension.
        # Long key tiles keep more bytes in flight per program (H100: N128 2.86 TB/s vs N64 2.33).
        block_m = min(max(16, _pow2(rows)), 64)
        # fp8 K/V keep this tile: N64 with 5 stages (the paged prefetch depth) measured slower on the H100
        # (64 x 4096 in a CUDA graph: 0.412 ms vs 0.251 for N128 s3; N128 s5 0.325, N32 s5 0.446).
        block_n = 128 if dmax <= 128 else 64
        return TileConfig(block_m, block_n, group, num_warps=4, num_stages=3)
    if dmax <= 128 and problem.mask == "custom":
        return _custom_mask_config(group)
    if dmax <= 128:  # H100 d128 causal 8x2048: M256/8 warps, 4 heads of a group per tile: 301 TFLOP/s
        if max_q_len >= 1024:  # (M256 one head 282, M128 one head 268)
            hpp = max(d for d in (1, 2, 4) if group % d == 0)
            # RoPE's K halves reach the MMA through registers: their loads need the deeper prefetch.
            stages = _paged_stages(problem, 3) if problem.pos_encoding == "ROPE_LLAMA" else 3
            return TileConfig(256, 64, hpp, num_warps=8, num_stages=stages)
        return TileConfig(128, 64, 1, num_warps=4, num_stages=3)
    return TileConfig(64, 32, 1, num_warps=4, num_stages=2)


def _wide_head_config(problem: AttentionProblem, rows: int) -> TileConfig:
    """Tiles of head dims above 256 (up to 512, padded to 512 with masks): the fp32 accumulator of M x 512
    outputs is what limits them. Picked by compiling for sm_90a without a GPU (Triton 3.9, cuobjdump
    -res-usage of the cubin; 512/512, tests/test_native_wide.py's shapes): prefill M32 N32, 8 warps,
    2 stages: 145-215 registers, no spills, 82-98 KB shared (M64 N32 spilled 416 B at 8 warps, 2.2 KB at
    4), fp8 q and K/V too. Decode-like (the group's rows in M): M16/M32 N32, 8 warps, 3 stages on paged
    K/V (one tile of prefetch, as ragged at 2): 164-192 registers, no spills, 65-100 KB. RoPE (the K
    halves rotated in registers) takes M16: at M32 it spilled 8-16 B (bf16) and 328 B (fp8 K/V) in
    prefill, 352 B in a decode of 32 heads per group. fp32 inputs (q, K in fp32 for the ieee dots): M16
    N16 (M32 N32 spilled 12 KB). Not yet timed on a GPU (tools/native_h100.py --wide)."""
    if problem.q_dtype == "float32":
        return TileConfig(16, 16, problem.gqa_group if problem.phase != "prefill" or rows <= 16 else 1,
                          num_warps=8, num_stages=2)
    block_m = 16 if problem.pos_encoding == "ROPE_LLAMA" else 32
    if rows <= block_m or problem.phase != "prefill":  # paged K/V at 3 stages prefetch one tile, as ragged at 2
        return TileConfig(min(max(16, _pow2(rows)), block_m), 32, problem.gqa_group, num_warps=8,
                          num_stages=3 if problem.kv_storage == "paged" else 2)
    return TileConfig(block_m, 32, 1, num_warps=8, num_stages=2)


def _custom_mask_config(group: int) -> TileConfig:
    """Prefill tiles under a custom bool mask. Its rows start at any byte, so each mask element is a byte
    load with its own 64-bit address, and the tile's mask is held a key tile ahead (the prefetch in
    _attn_fwd). The tiles are those whose mask addresses fit the registers (sm_90a, Triton 3.6, ptxas)
    and measured fastest on the H100 (8 x 2048 non-causal, 32/8 heads):
    per token, broadcast to a KV group's 4 heads, M128 with 8 warps, no spills: 183 TFLOP/s (M256 spills
    280 B: 150; M256 N32: 172); with one head per row M64 N32, the only spill-free tile there (8 x 512:
    108 TFLOP/s; M128 N64 spilled 4 KB: 12)."""
    hpp = max(d for d in (1, 2, 4) if group % d == 0)
    if hpp == 1:
        return TileConfig(64, 32, 1, num_warps=4, num_stages=3)
    return TileConfig(128, 64, hpp, num_warps=8, num_stages=3)


def _paged_stages(problem: AttentionProblem, stages: int) -> int:
    """num_stages that gives paged K/V the prefetch depth ``stages`` gives contiguous K/V. Triton's
    pipeliner (3.6, AssignLatencies) gives each load (stages - 1) // (indirection + 1) iterations of
    lead; paged K/V addresses come from the page-table load (indirection 1), so at 3 stages they are
    fetched one tile ahead and waited for at the top of the next iteration (sm_90 TTGIR: one K buffer,
    ``async_wait {num = 0}``) where ragged K/V get two or three buffers. Two more stages restore that."""
    return stages + 2 if problem.kv_storage == "paged" else stages


def _kv_buffers(problem: AttentionProblem, cfg: TileConfig) -> int:
    """K/V tiles a program stages in shared memory: the tiles loaded ahead (see _paged_stages) plus
    the one in use (sm_90 compiles of the d128 tiles match within 3%)."""
    ahead = (cfg.num_stages - 1) // (2 if problem.kv_storage == "paged" else 1)
    return max(1, ahead) + 1


def _smem_bytes(problem: AttentionProblem, cfg: TileConfig, buffers: Optional[int] = None) -> int:
    """Estimated shared memory of a program: ``buffers`` K/V tiles (default _kv_buffers) plus the q tile,
    staged in q's dtype at worst (fp32 inputs need twice the bytes of bf16; fp8 K/V are counted at
    2 bytes: V is converted to fp16 through shared memory)."""
    elem = 4 if problem.q_dtype == "float32" else 2
    dqk, dvo = max(16, _pow2(problem.head_dim_qk)), max(16, _pow2(problem.head_dim_vo))
    buffers = _kv_buffers(problem, cfg) if buffers is None else buffers
    return (buffers * cfg.block_n * (dqk + dvo) + cfg.block_m * dqk) * elem


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


def programs_per_sm(problem: AttentionProblem, cfg: TileConfig, device: torch.device) -> int:
    """Programs of this tile an SM holds at once, as the split rule counts them: bound by warps (64 per
    SM) and shared memory at one K/V tile per stage. That overcounts paged staging (_kv_buffers) and
    misses registers (the d128 decode tiles compile to ~240 registers: 2 programs per SM where this
    says 1), but split_kv's factor 2 was measured with it: kept, so no split count moved."""
    smem = _smem_bytes(problem, cfg, buffers=cfg.num_stages)
    return max(1, min(64 // cfg.num_warps, int(_smem_limit(device) / 0.9 // smem)))


# The plain kernel has no KV split: a grid of fewer programs than this share of the SMs (few requests x KV
# heads x query blocks) leaves the rest idle however long the keys. There the general kernel, which splits
# the keys, serves instead, where each split reads at least as many keys as its tile has query rows (a
# shorter split writes more partial output, in fp32, than it reads K/V). H200, the 18 problems of
# tools/grids/native-underfilled.json timed both ways (``attn-dispatch bench``, with and without the move):
# 17 move, 15 of them 1.2-22x faster, 2 unchanged; cudnn 2 x 331 x 120436, h4/1 d128 causal, 24 programs on
# 132 SMs, 5.55 -> 0.59 ms; trtllm 4 x 1483 x 1483, 8 splits of 192 keys for tiles of 256 rows, 0.051 ->
# 0.057 ms split: kept plain. A captured CUDA graph of a moved plan follows longer keys only within its
# splits, as every general-kernel plan (NativeTritonBackend.follow_refusal).
UNDERFILLED_SHARE = 0.5


def split_when_underfilled(problem: AttentionProblem, batch: AttentionBatch, cfg: TileConfig, m_blocks: int,
                           device: torch.device) -> tuple[TileConfig, int]:
    """(config, query blocks): the plain ``cfg`` unless its grid fills less than ``UNDERFILLED_SHARE`` of
    the SMs and the general kernel would split the keys into splits of at least its query rows per
    tile; then the general kernel's."""
    programs = batch.batch_size * problem.num_kv_heads * (problem.gqa_group // cfg.heads_per_program) * m_blocks
    if device.type != "cuda" or programs >= UNDERFILLED_SHARE * _sm_count(device):
        return cfg, m_blocks
    general = fit_shared_memory(problem, _general_config(problem, batch.max_q_len), device)
    blocks = max(1, math.ceil(max(batch.max_q_len, 1) * general.heads_per_program / general.block_m))
    splits, chunk = choose_splits(problem, batch, general, blocks, device)
    return (general, blocks) if splits > 1 and chunk >= general.block_m else (cfg, m_blocks)


def choose_splits(problem: AttentionProblem, batch: AttentionBatch, cfg: TileConfig, m_blocks: int,
                  device: torch.device) -> tuple[int, int]:
    """(splits, keys per split) for this device: ``split_kv`` with the SM count and occupancy read
    here. The interpreter runs programs one after another: splitting there only costs time."""
    span = split_span(problem, batch, cfg)
    if device.type != "cuda":
        return 1, max(cfg.block_n, chunk_keys(span, 1, cfg.block_n))
    return split_kv(batch.batch_size, problem.num_kv_heads, span, _sm_count(device),
                    head_groups=problem.gqa_group // cfg.heads_per_program, m_blocks=m_blocks,
                    per_sm=programs_per_sm(problem, cfg, device), block_n=cfg.block_n)


def split_span(problem: AttentionProblem, batch: AttentionBatch, cfg: TileConfig) -> int:
    """Keys one program's splits must cover: the longest request's, or under a window, from the tile
    of the program's first visible key on (the kernel counts its splits from there): at most
    window_left + the query rows + a tile. Windowed decode then splits the window, not the sequence
    (H200, random problems: xqa 2 x 1 x 107164, window 1591: native-triton 42.8 us against XQA's 10.9)."""
    if problem.window_left < 0:
        return batch.max_kv_len
    return max(1, min(batch.max_kv_len, problem.window_left + batch.max_q_len + cfg.block_n - 1))


MAX_SPLITS = 64  # the merge reduces up to this many partials per row in one tile
# The fused merge (TileConfig.fused_merge: the last split program merges, one launch): decode tiles only, at
# most 4 splits. H100, in a CUDA graph: 16 and 32 splits
# (1 x 4096, 1 x 32768) 0.018 vs 0.016 and 0.064 vs 0.058 ms against the merge kernel, the merge then on the
# call's critical path in one program per row block where the merge kernel spreads it; 2 splits (1 x 512,
# 8 x 512) 0.95-1.00x, one launch fewer but no measurable gain eager either (0.83-1.08x). So not the default.
MAX_FUSED_MERGE_ROWS = 16
MAX_FUSED_MERGE_SPLITS = 4
# At least this many key tiles per split: fewer is mostly pipeline prologue (H100: b1 x 32k, 64 splits lost
# 8%). 2, not 4: the H100 decode grid (tools/native_h100.py) found twice the splits of 4's rule best at
# short keys (b1/b4/b16 x 512: 2 splits, 1.08-1.45x; b1 x 4096: 16 splits, 1.27x); longer keys are unchanged.
MIN_TILES_PER_SPLIT = 2
# ... but keys of at most this many tiles split one tile per split: the H100 grids found 4 splits best at
# 512 keys (N128) for batch 1 and 4, where two tiles per split (2 splits) reached 0.80x / 0.87x of it
# (0.84x / 0.90x on an earlier grid). At batch 16 the two-wave cap keeps 2 (1 was best there, 0.92x).
SHORT_SPLIT_TILES = 4


def split_kv(batch_size: int, kv_heads: int, kv_len: int, sms: int, *, head_groups: int = 1, m_blocks: int = 1,
             per_sm: int = 1, block_n: int = 128) -> tuple[int, int]:
    """Flash-decoding split of the keys, (splits, keys per split), a pure function of the launch.

    Without splitting there are ``programs = batch x kv heads x head groups x query blocks``; the
    GPU holds ``slots = SMs x programs per SM`` at once. Rule (measured on the H100; docs/benchmarks.md,
    native-triton): the largest split count with programs x splits <= 2 x slots (two waves: one wave leaves
    each SM a single program and no latency hiding, a third, mostly empty wave costs more than it
    hides), at most one split per ``MIN_TILES_PER_SPLIT`` key tiles (one per tile up to
    ``SHORT_SPLIT_TILES`` tiles of keys) and at most ``MAX_SPLITS``. The keys per split are then
    rounded up to whole tiles, which can lower the count (33 -> 32 at 128k).
    """
    programs = max(1, batch_size * kv_heads * head_groups * m_blocks)
    slots = max(1, sms * per_sm)
    tiles_per_split = 1 if kv_len <= SHORT_SPLIT_TILES * block_n else MIN_TILES_PER_SPLIT
    useful = max(1, min(MAX_SPLITS, kv_len // (tiles_per_split * block_n)))
    wanted = max(1, min(2 * slots // programs, useful))
    return splits_of_chunk(kv_len, chunk_keys(kv_len, wanted, block_n))


def chunk_keys(kv_len: int, splits: int, block_n: int) -> int:
    """Keys per split for ``splits`` splits, in whole tiles."""
    return max(block_n, math.ceil(max(kv_len, 1) / splits / block_n) * block_n)


def splits_of_chunk(kv_len: int, chunk: int) -> tuple[int, int]:
    return max(1, math.ceil(max(kv_len, 1) / chunk)), chunk


# ---------------------------------------------------------------------------
# the plain-path kernel (backends/native/triton_plain.py)
# ---------------------------------------------------------------------------
def plain_reasons(problem: AttentionProblem) -> list[str]:
    """Why the plain-path kernel cannot serve ``problem`` (empty: it can): it has no feature code."""
    checks = [
        (problem.q_dtype in ("float16", "bfloat16"), f"q_dtype {problem.q_dtype} (float16, bfloat16)"),
        (problem.kv_dtype == problem.q_dtype, f"kv_dtype {problem.kv_dtype} (q's, {problem.q_dtype})"),
        (problem.head_dim_qk == problem.head_dim_vo in (64, 128),
         f"head dims {problem.head_dim_qk}/{problem.head_dim_vo} (equal, 64 or 128)"),
        (problem.mask == "none", f"mask {problem.mask} (none)"),
        (problem.window_left < 0, f"window_left {problem.window_left} (-1)"),
        (problem.logits_soft_cap <= 0, f"logits_soft_cap {problem.logits_soft_cap} (0)"),
        (problem.pos_encoding in ("NONE", "ROPE_LLAMA"), f"pos_encoding {problem.pos_encoding} (NONE, ROPE_LLAMA)"),
        (not problem.has_sinks, "has_sinks True (False)"),
        (problem.uses_shared_paged_kv_idx, "uses_shared_paged_kv_idx False (True: one page table for K and V)"),
    ]
    return [why for ok, why in checks if not ok]


def _check_plain_config(problem: AttentionProblem, cfg: TileConfig, num_splits: Optional[int]) -> None:
    """An explicit plain-kernel config the problem cannot take is an error (named), never a silent swap."""
    if cfg.kernel == "general":
        if cfg.kv_tma or cfg.persistent:
            raise ValueError("config.kv_tma / config.persistent need config.kernel='plain'")
        return
    if cfg.kernel != "plain":
        raise ValueError(f"config.kernel={cfg.kernel!r}; allowed: 'general', 'plain'")
    reasons = plain_reasons(problem)
    if cfg.kv_tma and problem.kv_storage == "paged":
        reasons.append("kv_tma with paged K/V (ragged or dense only: Hopper's TMA has no row gather)")
    if num_splits not in (None, 1):
        reasons.append(f"num_splits {num_splits} (1)")
    if reasons:
        raise ValueError("config.kernel='plain' cannot serve this problem: " + "; ".join(reasons))


def _plain_plan(problem: AttentionProblem, batch: AttentionBatch, cfg: TileConfig, m_blocks: int,
                device: torch.device) -> TritonPlan:
    """A plan on the plain-path kernel: one split; a grid of (query blocks, requests x head groups), or
    with ``persistent`` about one wave of programs (the SMs times the programs one holds)."""
    from . import triton_plain

    bh = batch.batch_size * problem.num_kv_heads * (problem.gqa_group // cfg.heads_per_program)
    grid = (m_blocks, bh, 1)
    if cfg.persistent:  # the interpreter: 3 programs, so that each takes several tiles (as on a GPU)
        wave = _sm_count(device) * programs_per_sm(problem, cfg, device) if device.type == "cuda" else 3
        grid = (max(1, min(m_blocks * bh, wave)), 1, 1)
    chunk = max(cfg.block_n, chunk_keys(batch.max_kv_len, 1, cfg.block_n))
    plan = TritonPlan(problem, cfg, grid, 1, chunk, batch.total_q, _plain_constexprs(problem, cfg),
                      device_key(device))
    direct = device.type == "cuda" and not interpreting()
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    kernel = triton_plain._attn_fwd_plain
    _check_parameter_order(kernel, plan.constexprs)
    plan.attention = KernelLaunch(kernel, grid, tuple(plan.constexprs.values()), options, device, direct)
    if cfg.kv_tma:
        _set_tma_allocator(device)
        pointer = tuple({**plan.constexprs, "KV_TMA": False}.values())
        plan.pointer_attention = KernelLaunch(kernel, grid, pointer, options, device, direct)
    plan.fixed_ints = ((m_blocks, batch.batch_size, problem.num_kv_heads), (0,) * 5)
    if problem.pos_encoding == "ROPE_LLAMA":
        plan.rope_freq = made_to_keep(lambda: rope_frequencies(problem, problem.head_dim_qk // 2).to(device), device)
    return plan


def _plain_constexprs(problem: AttentionProblem, cfg: TileConfig) -> dict:
    """triton_plain._attn_fwd_plain's plan-fixed constexprs, in its parameter order."""
    return dict(
        GROUP=problem.gqa_group, HPP=cfg.heads_per_program, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        HEAD_D=problem.head_dim_qk, PAGED=problem.kv_storage == "paged", PAGE_SIZE=max(problem.page_size, 1),
        CAUSAL=problem.causal, DOT_F32=interpreting(),  # the interpreter's bf16 dot is wrong (Triton 3.9)
        KV_TMA=cfg.kv_tma, PERSISTENT=cfg.persistent, ROPE=problem.pos_encoding == "ROPE_LLAMA",
    )


def _tma_ready(plan: TritonPlan, batch: AttentionBatch) -> bool:
    """Whether this call's K and V can be read through the (rows, kv heads x head dim) descriptors: a
    16-byte aligned base and row stride, heads packed in a row, the head dim contiguous."""
    d = plan.problem.head_dim_qk
    for x in (batch.k, batch.v):
        stride = x.stride()
        if stride[-1] != 1 or stride[-2] != d or (x.data_ptr() | stride[0] * x.element_size()) & 15:
            return False
    return True


_TMA_ALLOCATOR: list = []


def _set_tma_allocator(device: torch.device) -> None:
    """Device-side tensor descriptors need global scratch per launch, which Triton asks of the allocator
    set by ``triton.set_allocator`` (none by default: the launch would raise). Ours takes it from
    torch's caching allocator on the launch's stream (graph-capture safe). Set once per process."""
    if _TMA_ALLOCATOR or device.type != "cuda":
        return
    import triton

    def scratch(size: int, alignment: int, stream: Optional[int]) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8, device="cuda")

    triton.set_allocator(scratch)
    _TMA_ALLOCATOR.append(scratch)


def _constexprs(problem: AttentionProblem, cfg: TileConfig, splits: int, fixup: bool = False) -> dict:
    """The attention kernel's plan-fixed constexprs, in its parameter order (see _plan_launches)."""
    mask_mode = {"none": 0, "custom": 1, "spec_bits": 2}[problem.mask]
    # Dots in fp16 whenever q or K/V are fp8 (fp8 -> fp16 is exact and one instruction per pair). The
    # interpreter's bf16 dot is wrong (Triton 3.9): there only bf16 dots run in fp32 instead.
    # NVFP4 K/V too: their values (e2m1 x e4m3, at most 6 significant bits in [2^-10, 2688]) are exact in fp16.
    f16_dots = problem.q_dtype != "float32" and (problem.q_dtype.startswith("float8") or problem.kv_fp8
                                                 or problem.kv_nvfp4)
    return dict(
        GROUP=problem.gqa_group, HPP=cfg.heads_per_program, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        HEAD_DQK=problem.head_dim_qk, HEAD_DV=problem.head_dim_vo,
        BLOCK_DQK=max(16, _pow2(problem.head_dim_qk)), BLOCK_DV=max(16, _pow2(problem.head_dim_vo)),
        BLOCK_HALF=max(16, _pow2(problem.head_dim_qk // 2)),  # a dot needs K >= 16
        PAGED=problem.kv_storage == "paged", PAGE_SIZE=max(problem.page_size, 1),
        # A custom or xqa bit mask replaces causality (FlashInfer: mask_mode CUSTOM ignores causal).
        CAUSAL=problem.causal and mask_mode == 0, HAS_WINDOW=problem.window_left >= 0,
        SOFT_CAP=problem.logits_soft_cap > 0, HAS_SINKS=problem.has_sinks, MASK_MODE=mask_mode,
        HAS_ALIBI=problem.pos_encoding == "ALIBI", ROPE=problem.pos_encoding == "ROPE_LLAMA", SPLIT=splits > 1,
        DOT_F32=problem.q_dtype == "float32" or (interpreting() and problem.q_dtype == "bfloat16" and not f16_dots),
        F16_DOTS=f16_dots, MERGE_BLOCK_S=_fused_merge_splits(cfg, splits), FIXUP=fixup, NVFP4=problem.kv_nvfp4,
        V_TABLE=not problem.uses_shared_paged_kv_idx,
    )


def _fused_merge_splits(cfg: TileConfig, splits: int) -> int:
    """The fused merge's tile of partials (a power of two >= splits), or 0: no split, more splits than
    MAX_FUSED_MERGE_SPLITS, a prefill tile, or a config that asks for the merge kernel."""
    if not 2 <= splits <= MAX_FUSED_MERGE_SPLITS or not cfg.fused_merge or cfg.block_m > MAX_FUSED_MERGE_ROWS:
        return 0
    # one tile for every split count: the count changes with the batch every step, and a tile per
    # count would compile a kernel variant on the request path
    return MAX_FUSED_MERGE_SPLITS


def rope_frequencies(problem: AttentionProblem, block_half: int) -> torch.Tensor:
    """(2, block_half) fp32: theta^(-2i/D) / scale for i < D/2 formed in fp64, as an fp32 high part and
    the fp32 rest (zero padded); the kernel forms angles from both (as the reference does in fp64)."""
    half = problem.head_dim_qk // 2
    i = torch.arange(half, dtype=torch.float64)
    freq = problem.rope_theta ** (-2.0 * i / problem.head_dim_qk) / problem.rope_scale
    table = torch.zeros((2, block_half), dtype=torch.float32)
    table[0, :half] = freq.to(torch.float32)
    table[1, :half] = (freq - table[0, :half].double()).to(torch.float32)
    return table


def _plan_launches(plan: TritonPlan, device: torch.device) -> None:
    from . import triton_kernels as tk

    p, cfg = plan.problem, plan.config
    _check_parameter_order(tk._attn_fwd, plan.constexprs)
    direct = device.type == "cuda" and not interpreting()
    plan.attention = KernelLaunch(tk._attn_fwd, plan.grid, tuple(plan.constexprs.values()),
                                  dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages), device, direct)
    if plan.num_splits > 1 and not plan.constexprs["MERGE_BLOCK_S"]:
        # one tile of MAX_SPLITS partials, masked, whatever the split count: the count changes with the
        # batch every step, and a tile per count would compile a merge variant on the request path
        merge_consts = (p.head_dim_vo, plan.constexprs["BLOCK_DV"], MAX_SPLITS, p.has_sinks)
        plan.merge = KernelLaunch(tk._merge_splits, (plan.total_q_capacity, p.num_qo_heads), merge_consts,
                                  dict(num_warps=4), device, direct)
    plan.fixed_ints = ((p.window_left, plan.kv_chunk, p.num_kv_heads), _part_strides(plan))


def _part_strides(plan: TritonPlan) -> tuple:
    """The split buffers' strides the kernels take: part_o's first three, part_lse's first two."""
    if plan.num_splits > 1:
        return (*plan.part_o.stride()[:3], *plan.part_lse.stride()[:2])
    return (0,) * 5


_CHECKED_ORDER: set = set()


def _check_parameter_order(kernel, constexprs: dict) -> None:
    """The launch passes constexprs by position: their names must be the kernel's parameters just
    before the per-call ones (WRITE_LSE, SCALE_PTR, OUT_SCALE_PTR). Checked once per process."""
    if id(kernel) in _CHECKED_ORDER:
        return
    import inspect

    names = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)
    expected = [*constexprs, "WRITE_LSE", "SCALE_PTR", "OUT_SCALE_PTR"]
    if names[-len(expected):] != expected:
        raise RuntimeError(f"_attn_fwd's trailing parameters {names[-len(expected):]} != {expected}")
    _CHECKED_ORDER.add(id(kernel))


# ---------------------------------------------------------------------------
# launch helpers (no allocation, no host synchronization)
# ---------------------------------------------------------------------------
def _kv_strides(x: torch.Tensor, paged: bool) -> tuple[int, int, int, int]:
    """(page, token, head, dim) strides of a logical NHD view; page stride 0 if not paged."""
    if paged:
        return x.stride()
    return (0, *x.stride())


# Index tensors the kernel reads at unit stride (no stride argument): a strided one (every other
# length, a column of a wider tensor) would be read wrong, so it goes over as a row-major copy.
_UNIT_STRIDE_INDICES = ("qo_indptr", "kv_lens", "kv_indptr", "mask_indptr")


def _readable_indices(batch: AttentionBatch) -> AttentionBatch:
    """``batch``, or a copy with row-major copies of the index tensors the kernel cannot read as
    they are: the unit-stride ones, and a page table whose rows are not unit-stride (its row
    stride is an argument, so a table sliced from a wider one goes as it is)."""
    fixed = {name: t.contiguous() for name in _UNIT_STRIDE_INDICES
             if (t := getattr(batch, name)) is not None and not t.is_contiguous()}
    table, v_table = batch.block_table, batch.v_block_table
    if table is not None and table.dim() == 2 and table.shape[1] > 1 and table.stride(1) != 1:
        fixed["block_table"] = table.contiguous()
    if v_table is not None and (v_table.stride(1) != 1 and v_table.shape[1] > 1
                                or v_table.stride(0) != fixed.get("block_table", table).stride(0)):
        # the kernel reads V's ids with K's row stride: both go as row-major copies of one shape
        fixed.update(block_table=table.contiguous(), v_block_table=v_table.contiguous())
    return replace(batch, **fixed) if fixed else batch


def _launch(plan: TritonPlan, batch: AttentionBatch) -> None:
    batch = _readable_indices(batch)
    head, ints, flags = _attention_args(plan, batch)
    if plan.pointer_attention is not None and not _tma_ready(plan, batch):
        plan.pointer_attention(head, ints, flags, plan.grid)
    else:
        plan.attention(head, ints, flags, plan.grid)  # the plan's grid: launches are shared (_derived)
    if plan.merge is not None:
        plan.merge(*_merge_args(plan, batch))


def _attention_args(plan: TritonPlan, batch: AttentionBatch) -> tuple[tuple, tuple, tuple]:
    """(head, ints, flags) of the attention kernel for this call (see KernelLaunch)."""
    p = plan.problem
    sm_scale, out_scale = batch.sm_scale, batch.out_scale
    scale_ptr = isinstance(sm_scale, torch.Tensor)
    out_scale_ptr = isinstance(out_scale, torch.Tensor)
    sm_scale = sm_scale if scale_ptr else float(sm_scale)
    out_scale = out_scale if out_scale_ptr else float(out_scale)
    spec = custom = k_sf = v_sf = None
    if p.mask == "spec_bits":
        spec = batch.spec_mask.view(torch.int16)
    elif p.mask == "custom":
        custom = batch.custom_mask.view(torch.uint8)
    if p.kv_nvfp4:  # the kernel assembles the fp8 scale factors from their bytes
        if batch.k_sf is None or batch.v_sf is None:
            raise ValueError("k_sf/v_sf=None: NVFP4 K/V (kv_dtype 'uint8') need their fp8 scale factors")
        k_sf, v_sf = batch.k_sf.view(torch.uint8), batch.v_sf.view(torch.uint8)
    head = (batch.q, batch.k, batch.v, batch.out, batch.lse, plan.part_o, plan.part_lse, plan.split_count,
            batch.qo_indptr, batch.kv_lens, batch.kv_indptr, batch.block_table, batch.v_block_table, batch.sinks,
            custom, batch.mask_indptr, spec, plan.alibi, plan.rope_freq, k_sf, v_sf, sm_scale, out_scale,
            float(p.logits_soft_cap))
    return head, _attention_ints(plan, batch, spec), (batch.lse is not None, scale_ptr, out_scale_ptr)


def _merge_args(plan: TritonPlan, batch: AttentionBatch) -> tuple[tuple, tuple, tuple, tuple]:
    """(head, ints, flags, grid) of the split merge for this call."""
    lse, out_scale = batch.lse, batch.out_scale
    out_scale_ptr = isinstance(out_scale, torch.Tensor)
    lse_strides = lse.stride() if lse is not None else (0, 0)
    head = (plan.part_o, plan.part_lse, batch.out, lse, batch.sinks, out_scale if out_scale_ptr else float(out_scale))
    ints = (plan.num_splits, *plan.fixed_ints[1], *batch.out.stride(), *lse_strides)
    return head, ints, (lse is not None, out_scale_ptr), (batch.total_q, plan.problem.num_qo_heads, 1)


# The batch fields the attention kernel's head takes per call, by position (None: plan-held or a float).
_ATTENTION_FIELDS = ("q", "k", "v", "out", "lse", None, None, None, "qo_indptr", "kv_lens", "kv_indptr",
                     "block_table", "v_block_table", "sinks", "custom_mask", "mask_indptr", "spec_mask", None, None,
                     "k_sf", "v_sf", "sm_scale", "out_scale", None)
_MERGE_FIELDS = (None, None, "out", "lse", "sinks", "out_scale")


def _repeat(launch: KernelLaunch, fields: tuple, head: tuple, ints: tuple, flags: tuple, grid=None):
    """(launch of the call's tensors, the getter of those tensors from a batch) for ``launch`` repeated
    with this head's fixed parts (see KernelLaunch.repeat)."""
    slots = tuple(i for i, (name, x) in enumerate(zip(fields, head))
                  if name is not None and isinstance(x, torch.Tensor))
    get = operator.attrgetter(*(fields[i] for i in slots))
    if len(slots) == 1:
        one = get
        get = lambda batch: (one(batch),)  # noqa: E731 - attrgetter of one name returns the bare value
    return launch.repeat(head, ints, flags, slots, grid), get


def _launcher(plan: TritonPlan, batch: AttentionBatch) -> Callable[[AttentionBatch], None]:
    """run's launches for exact repeats of ``batch``: everything but the tensors' addresses fixed now."""
    if plan.pointer_attention is not None:
        return _tma_launcher(plan, batch)
    attention, get = _repeat(plan.attention, _ATTENTION_FIELDS, *_attention_args(plan, batch), plan.grid)
    if plan.merge is None:
        def launch(b: AttentionBatch) -> None:
            attention(get(b))

        return launch
    m_head, m_ints, m_flags, m_grid = _merge_args(plan, batch)
    merge, get_m = _repeat(plan.merge, _MERGE_FIELDS, m_head, m_ints, m_flags, m_grid)

    def launch_and_merge(b: AttentionBatch) -> None:
        attention(get(b))
        merge(get_m(b))

    return launch_and_merge


def _tma_launcher(plan: TritonPlan, batch: AttentionBatch) -> Callable[[AttentionBatch], None]:
    """Exact repeats of a kv_tma plan: the strides are fixed, so only K's and V's addresses decide per
    call between the TMA kernel and its pointer twin (a descriptor needs a 16-byte aligned base)."""
    args = _attention_args(plan, batch)
    tma, get = _repeat(plan.attention, _ATTENTION_FIELDS, *args, plan.grid)
    pointer, _ = _repeat(plan.pointer_attention, _ATTENTION_FIELDS, *args, plan.grid)
    if not _tma_ready(plan, batch):
        tma = pointer

    def launch(b: AttentionBatch) -> None:
        (pointer if (b.k.data_ptr() | b.v.data_ptr()) & 15 else tma)(get(b))

    return launch


def _attention_ints(plan: TritonPlan, batch: AttentionBatch, spec: Optional[torch.Tensor]) -> tuple:
    """The attention kernel's integer arguments, in its parameter order: the plan's leading three,
    the strides of this call's tensors, the plan's split-buffer strides, the NVFP4 scale factors'
    (page, token, head) strides (their last is 1: the entry points check it)."""
    paged = plan.problem.kv_storage == "paged"
    spec_strides = (0, 0, 0)  # (request, row, ragged?) in int16 elements
    if spec is not None:
        spec_strides = (spec.stride(0), spec.stride(1), 0) if spec.dim() == 3 else (0, spec.stride(0), 1)
    lead, part_strides = plan.fixed_ints
    return (*lead, *batch.q.stride(), *_kv_strides(batch.k, paged), *_kv_strides(batch.v, paged),
            *batch.out.stride(), *(batch.lse.stride() if batch.lse is not None else (0, 0)),
            batch.block_table.stride(0) if paged else 0, *spec_strides, *part_strides, *_sf_strides(batch, paged))


def _sf_strides(batch: AttentionBatch, paged: bool) -> tuple:
    if batch.k_sf is None or batch.v_sf is None:
        return (0,) * 6
    return (*_kv_strides(batch.k_sf, paged)[:3], *_kv_strides(batch.v_sf, paged)[:3])
