"""native-triton's performance targets on the GPU in one command: fused RoPE, fp8 KV, launch cost (run() and the
launcher) and split-KV rule, checked against float64 and timed (H100, torch 2.11, Triton 3.6; under
4 minutes with compilation; the decode grid only with --grid, about 2 more minutes).

1. agreement: fresh random inputs per scenario (fused RoPE on paged/ragged prefill, causal or not,
   GQA, long positions in decode; fp8 KV; plain, split and feature paths), out/lse poisoned with NaN,
   run three times (the first launch goes through Triton's ``kernel[grid]``, the second through the
   cached compiled kernel, the third through ``NativeTritonBackend.launcher``), each compared with
   the float64 oracle (dispatch/benchmark/oracle.py);
2. host time per eager launch: back-to-back calls of a tiny decode (GPU work far below the host's),
   the launcher, run() (cached compiled kernel) and Triton's own ``kernel[grid]`` path;
3. timing with CUDA events (dispatch/timing.py: median, warm-up excluded), K/V rotated over
   copies together larger than 3 x the 50 MB L2: one call at a time (launch included) and replayed
   in a CUDA graph: RoPE decode 64 x 4096 and causal prefill 8 x 2048 against the same workload
   without RoPE, fp8 KV decode against bf16 (bytes read), the feature paths (window, soft cap, sinks,
   xqa's spec mask, a custom mask) against the plain path per key read, short decodes with the fused
   split merge against the merge kernel, a device copy for the bandwidth ceiling; the targets (each
   path within 10-15% of the plain path, see ``summary``) are checked in the summary ("(info)" rows
   compare variants);
4. with --grid: the decode grid (batch 1..256 x keys 512..128k) at the rule's split count and at
   half and twice it, so the rule's distance to the best of the three is measured;
5. with --variants (Hopper prefill at vendor speed): the plain-path prefill kernel (paged gather,
   ragged TMA, persistent, tiles) and fp8 decode tiles/splits beside the defaults (VARIANT_ROWS), each
   first checked against float64 at a smaller shape with the same plan overrides (rows "variant: ..."
   of the agreement table); a variant that fails is timed but marked WRONG and kept out of the
   targets (about 1 more minute).

6. with --wide (head dims above 256): only the wide-head scenarios (WIDE_AGREEMENT: 192/128,
   256, 320, 384, 448/256, 512/512 on every path: paged/ragged prefill, decode with splits, fp8 KV, spec
   decode, RoPE, window + soft cap + sinks) against float64, and their timing rows (WIDE_ROWS); writes
   native-h100-wide.json/.md (about 2 minutes with compilation).

    python -m tools.native_h100 --out "$OUT"        # writes native-h100.json and native-h100.md
    python -m tools.native_h100 --variants --out "$OUT"
    python -m tools.native_h100 --wide --out "$OUT"
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from backends.native.triton_backend import NativeTritonBackend, TileConfig, choose_config, fit_shared_memory
from dispatch.benchmark.oracle import batch_attention_fp64
from dispatch.benchmark.native import Case, build, problem_of, rel_err
from dispatch.problem import NAME_DTYPES, AttentionBatch
from dispatch.timing import time_ms

BACKEND = NativeTritonBackend()
HQ, HKV, D, PAGE = 32, 8, 128, 16
L2_BYTES = 50 << 20
BIG = dict(hq=HQ, hkv=HKV, dqk=D, dvo=D, page_size=PAGE, dtype="bfloat16")
DEC = dict(phase="decode", causal=True)
ROPE = dict(pos="ROPE_LLAMA")
DEADLINE_S = 300  # timing stops here so the whole run stays under 6 minutes (--grid: 430)
VARIANTS_EXTRA_S = 70  # --variants: 14 more checks and timed rows (~8 s each with compilation); < 5 minutes


# -- agreement ---------------------------------------------------------------------------------------
AGREEMENT = {  # name: (case, rope_scale, rope_theta)
    "rope_paged_causal_gqa4": (Case(q_lens=(300, 37), kv_lens=(1500, 900), **BIG, **ROPE), 8.0, 5e5),
    "rope_paged_hnd_noncausal": (Case(layout="HND", causal=False, q_lens=(64, 5), kv_lens=(700, 80), **BIG, **ROPE),
                                 1.0, 1e4),
    "rope_ragged_causal_gqa4": (Case(storage="ragged", q_lens=(256, 77), kv_lens=(256, 1000), **BIG, **ROPE), 1.0, 1e4),
    "rope_ragged_noncausal_d64": (Case(storage="ragged", causal=False, hq=16, hkv=4, dtype="float16",
                                       q_lens=(100, 3), kv_lens=(50, 400), **ROPE), 2.0, 1e4),
    "rope_decode_long_positions": (Case(q_lens=(1,) * 2, kv_lens=(100_000, 3000), **BIG, **DEC, **ROPE), 8.0, 5e5),
    "rope_fp8_kv_decode": (Case(kv_dtype="float8_e4m3fn", q_lens=(1,) * 3, kv_lens=(4000, 17, 900), **BIG, **DEC,
                                **ROPE), 1.0, 1e4),
    # Candidate tiles: paged fp8 decode at N64 / 5 stages (interior tiles, splits), RoPE prefill at M256 / 5 stages.
    "fp8_kv_decode_split": (Case(kv_dtype="float8_e4m3fn", q_lens=(1,) * 4, kv_lens=(20000, 4096, 33, 700), **BIG,
                                 **DEC), 1.0, 1e4),
    "rope_paged_prefill_m256": (Case(q_lens=(1100, 40), kv_lens=(1500, 900), **BIG, **ROPE), 2.0, 5e5),
    "decode_b4_64k_split": (Case(q_lens=(1,) * 4, kv_lens=(65536, 40000, 777, 9), **BIG, **DEC), 1.0, 1e4),
    "decode_b1_131k_split": (Case(q_lens=(1,), kv_lens=(131072,), **BIG, **DEC), 1.0, 1e4),
    "prefill_causal_paged": (Case(q_lens=(512, 129), kv_lens=(2048, 129), **BIG), 1.0, 1e4),
    "window_cap_sinks_decode": (Case(q_lens=(1,) * 3, kv_lens=(5000, 900, 64), window_left=511, soft_cap=30.0,
                                     sinks=True, **BIG, **DEC), 1.0, 1e4),
    "spec_decode_q4_tensor_scales": (Case(phase="spec_decode", mask="spec_bits", causal=False, q_lens=(4,) * 3,
                                          kv_lens=(3000, 40, 777), q_len_per_req=4, tensor_scales=True, **BIG),
                                     1.0, 1e4),
}


# Head dims above 256 (the tiles of triton_backend._wide_head_config), at GPU sizes: 16/4 heads.
WIDE = dict(hq=16, hkv=4, page_size=PAGE, dtype="bfloat16")
WIDE_AGREEMENT = {
    "wide_paged_prefill_causal_d512": (Case(q_lens=(300, 37), kv_lens=(700, 37), dqk=512, dvo=512, **WIDE), 1.0, 1e4),
    "wide_ragged_prefill_noncausal_d448_dv256": (Case(storage="ragged", causal=False, q_lens=(200, 64),
                                                      kv_lens=(300, 900), dqk=448, dvo=256, **WIDE), 1.0, 1e4),
    "wide_ragged_prefill_rope_d384": (Case(storage="ragged", q_lens=(256, 77), kv_lens=(256, 1000), dqk=384, dvo=384,
                                           **WIDE, **ROPE), 1.0, 1e4),
    "wide_paged_prefill_window_cap_sinks_d320": (Case(q_lens=(129, 40), kv_lens=(1000, 40), window_left=127,
                                                      soft_cap=30.0, sinks=True, dqk=320, dvo=320, **WIDE), 1.0, 1e4),
    "wide_paged_prefill_d192_dv128": (Case(q_lens=(300, 37), kv_lens=(700, 37), dqk=192, dvo=128, **WIDE), 1.0, 1e4),
    "wide_decode_split_d512": (Case(q_lens=(1,) * 4, kv_lens=(20000, 4096, 33, 700), dqk=512, dvo=512, **WIDE, **DEC),
                               1.0, 1e4),
    "wide_decode_fp8_d512": (Case(kv_dtype="float8_e4m3fn", q_lens=(1,) * 3, kv_lens=(4000, 17, 900), dqk=512,
                                  dvo=512, **WIDE, **DEC), 1.0, 1e4),
    "wide_decode_rope_long_positions_d512": (Case(q_lens=(1,) * 2, kv_lens=(100_000, 3000), dqk=512, dvo=512,
                                                  **WIDE, **DEC, **ROPE), 8.0, 5e5),
    "wide_decode_d256": (Case(q_lens=(1,) * 3, kv_lens=(5000, 900, 64), dqk=256, dvo=256, **WIDE, **DEC), 1.0, 1e4),
    "wide_spec_decode_q4_d512": (Case(phase="spec_decode", mask="spec_bits", causal=False, q_lens=(4,) * 3,
                                      kv_lens=(3000, 40, 777), q_len_per_req=4, dqk=512, dvo=512, **WIDE), 1.0, 1e4),
    "wide_prefill_fp16_d512_ragged": (Case(storage="ragged", q_lens=(100, 3), kv_lens=(100, 400), dqk=512, dvo=512,
                                           **{**WIDE, "dtype": "float16"}), 1.0, 1e4),
}


def _spec_mask(c: Case):
    from dispatch.benchmark.native import spec_bits

    qn = c.q_len_per_req
    bits = (torch.rand(len(c.q_lens), qn, qn, device="cuda") > 0.5) | torch.eye(qn, dtype=torch.bool, device="cuda")
    return bits, spec_bits(bits)


def _oracle_masks(c: Case, bits):
    """Per-request (q_len, kv_len) keep masks for the xqa bit mask (drafts are the last keys)."""
    if bits is None:
        return None
    masks = []
    for b, (ql, kl) in enumerate(zip(c.q_lens, c.kv_lens)):
        keep = torch.ones(ql, kl, dtype=torch.bool)
        keep[:, kl - ql:] = bits[b, :ql, :ql].cpu()
        masks.append(keep)
    return masks


def check(name: str, c: Case, rope_scale: float, rope_theta: float, plan_kw: dict | None = None) -> dict:
    kw, dense_k, dense_v = build(c)
    bits = None
    if c.mask == "spec_bits":
        bits, kw["spec_mask"] = _spec_mask(c)
    total_q, sm = sum(c.q_lens), 0.9 / math.sqrt(c.dqk)
    out = torch.empty((total_q, c.hq, c.dvo), device="cuda", dtype=NAME_DTYPES[c.dtype])
    lse = torch.empty((total_q, c.hq), device="cuda")
    sinks = torch.rand(c.hq, device="cuda") * 5 if c.sinks else None
    scale = (lambda x: torch.tensor(x, device="cuda")) if c.tensor_scales else (lambda x: x)
    batch = AttentionBatch(out=out, lse=lse, sinks=sinks, sm_scale=scale(sm), out_scale=scale(1.3), **kw)
    problem = replace(problem_of(c), device_type="cuda", rope_scale=rope_scale, rope_theta=rope_theta)
    plan = BACKEND.plan(problem, batch, **(plan_kw or {}))
    starts = [0, *torch.tensor(c.q_lens).cumsum(0).tolist()]
    ref_out, ref_lse = batch_attention_fp64(
        [kw["q"][a:b].cpu() for a, b in zip(starts[:-1], starts[1:])], [k.cpu() for k in dense_k],
        [v.cpu() for v in dense_v], _oracle_masks(c, bits), sm_scale=sm, causal=c.causal and c.mask == "none",
        window_left=c.window_left, soft_cap=c.soft_cap, sinks=None if sinks is None else sinks.cpu(), out_scale=1.3,
        pos_encoding=c.pos, rope_scale=rope_scale, rope_theta=rope_theta)
    errors = []
    launch = None
    for _ in range(3):  # Triton's path, the cached compiled kernel, the launcher
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        if launch is None:
            BACKEND.run(plan, batch)
        else:
            launch(batch)
        torch.cuda.synchronize()
        if len(errors) == 1:
            launch = BACKEND.launcher(plan, batch)
        fin = ~ref_lse.isinf()
        errors.append((rel_err(out.cpu(), ref_out), rel_err(lse.cpu()[fin], ref_lse[fin]),
                       bool(torch.equal(lse.cpu().isinf(), ref_lse.isinf())), bool(out.isnan().any())))
    band = 6e-2 if (c.kv_dtype or "").startswith("float8") else 1e-2
    ok = all(e[0] < band and e[1] < band and e[2] and not e[3] for e in errors)
    return {"scenario": name, "ok": ok, "out_err": [e[0] for e in errors], "lse_err": [e[1] for e in errors],
            "splits": plan.num_splits, "direct_variants": len(plan.attention._variants), "tile": _tile_name(plan)}


def _tile_name(plan) -> str:
    cfg = plan.config
    extra = "".join(f" {k}" for k in ("kv_tma", "persistent") if getattr(cfg, k)) + " plain" * (cfg.kernel == "plain")
    return f"M{cfg.block_m} N{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}{extra}"


# -- host time per launch ----------------------------------------------------------------------------
def host_us_per_launch(path: str, calls: int = 3000) -> dict:
    """path: "launcher" (NativeTritonBackend.launcher), "run" (run(), the cached compiled kernel) or
    "triton" (run() through Triton's kernel[grid])."""
    c = Case(q_lens=(1,), kv_lens=(64,), **BIG, **DEC)
    kw = _timing_inputs(c)
    batch = AttentionBatch(out=torch.empty((1, HQ, D), device="cuda", dtype=torch.bfloat16),
                           lse=torch.empty((1, HQ), device="cuda"), sm_scale=0.088, **kw)
    plan = BACKEND.plan(replace(problem_of(c), device_type="cuda"), batch)
    plan.attention.direct = path != "triton"
    BACKEND.run(plan, batch)
    launch = BACKEND.launcher(plan, batch) if path == "launcher" else None
    call = (lambda: launch(batch)) if launch is not None else (lambda: BACKEND.run(plan, batch))
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter() - t0) * 1e6 / calls)
        torch.cuda.synchronize()
    names = {"launcher": "launcher(plan, batch)", "run": "run() (cached compiled kernel)",
             "triton": "run() through Triton kernel[grid]"}
    return {"path": names[path], "us_per_launch": sorted(runs)[2], "launches_per_call": 1 + (plan.merge is not None)}


# -- timing ------------------------------------------------------------------------------------------
def _timing_inputs(c: Case) -> dict:
    """Random inputs of a Case without lab_native's float64 copies (sizes here reach gigabytes):
    a paged cache with shuffled pages, or ragged rows."""
    dt = NAME_DTYPES[c.kv_dtype or c.dtype]
    lens = torch.tensor(c.kv_lens, dtype=torch.int32, device="cuda")
    qo = torch.tensor([0, *torch.tensor(c.q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(c.q_lens), c.hq, c.dqk, device="cuda", dtype=NAME_DTYPES[c.dtype])
    kw = dict(q=q, qo_indptr=qo, kv_lens=lens, batch_size=len(c.q_lens), max_q_len=max(c.q_lens),
              max_kv_len=max(c.kv_lens))
    if c.storage == "paged":
        per = max(math.ceil(n / c.page_size) for n in c.kv_lens)
        pages = per * len(c.kv_lens)
        kw["block_table"] = torch.randperm(pages, device="cuda").to(torch.int32).view(len(c.kv_lens), per)
        shape = (pages, c.page_size, c.hkv)
    else:
        kw["kv_indptr"] = torch.tensor([0, *torch.tensor(c.kv_lens).cumsum(0).tolist()], dtype=torch.int32,
                                       device="cuda")
        shape = (sum(c.kv_lens), c.hkv)
    kw["k"] = torch.randn((*shape, c.dqk), device="cuda").to(dt)
    kw["v"] = torch.randn((*shape, c.dvo), device="cuda").to(dt)  # V has its own head dim
    if c.mask == "custom":  # FlashInfer's flattened bool mask, about 60% of the pairs kept
        sizes = torch.tensor([ql * kl for ql, kl in zip(c.q_lens, c.kv_lens)])
        kw["custom_mask"] = torch.rand(int(sizes.sum()), device="cuda") > 0.4
        kw["mask_indptr"] = torch.tensor([0, *sizes.cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    if c.mask == "spec_bits":
        kw["spec_mask"] = _spec_mask(c)[1]
    return kw


def _batches(c: Case) -> list:
    """The batch, and copies with their own K/V (together > 3 x L2) sharing its plan's shapes."""
    kw = _timing_inputs(c)
    total_q = sum(c.q_lens)
    sinks = torch.randn(c.hq, device="cuda") if c.sinks else None
    base = AttentionBatch(out=torch.empty((total_q, c.hq, c.dvo), device="cuda", dtype=torch.bfloat16),
                          lse=torch.empty((total_q, c.hq), device="cuda"), sm_scale=1 / math.sqrt(c.dqk), sinks=sinks,
                          **kw)
    kv_bytes = (kw["k"].numel() + kw["v"].numel()) * kw["k"].element_size()
    n = min(16, max(1, math.ceil(3 * L2_BYTES / kv_bytes)))
    return [base] + [replace(base, k=kw["k"].clone(), v=kw["v"].clone()) for _ in range(n - 1)]


def time_case(c: Case, num_splits=None, config=None, fused_merge=False) -> dict:
    """``fused_merge``: the default tile with the split merge in the attention launch (TileConfig.fused_merge)."""
    problem = replace(problem_of(c), device_type="cuda")
    batches = _batches(c)
    if fused_merge:
        chosen = choose_config(problem, max(c.q_lens), batches[0].q.device)
        config = replace(fit_shared_memory(problem, chosen, batches[0].q.device), fused_merge=True)
    plan = BACKEND.plan(problem, batches[0], num_splits=num_splits, config=config)
    turn = [0]

    def one_call():
        BACKEND.run(plan, batches[turn[0] % len(batches)])
        turn[0] += 1

    eager = time_ms(one_call, reps=40, warmup=5)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for b in batches:
            BACKEND.run(plan, b)
    replay = time_ms(graph.replay, reps=20, warmup=2) / len(batches)
    return {"eager_ms": eager, "graph_ms": replay, "splits": plan.num_splits, "copies": len(batches),
            "tile": _tile_name(plan)}


def kv_tb_s(c: Case, ms: float) -> float:
    """Bytes of K and V read (a window reads its last window_left + 1 keys) per second."""
    elem = 1 if (c.kv_dtype or "").startswith("float8") else 2
    keys = sum(min(n, c.window_left + 1) if c.window_left >= 0 else n for n in c.kv_lens)
    return keys * c.hkv * (c.dqk + c.dvo) * elem / (ms * 1e-3) / 1e12


def causal_tflop_s(c: Case, ms: float) -> float:
    flops = sum(2.0 * c.hq * (c.dqk + c.dvo) * (q * k - q * (q - 1) / 2) for q, k in zip(c.q_lens, c.kv_lens))
    return flops / (ms * 1e-3) / 1e12


def dense_tflop_s(c: Case, ms: float) -> float:
    """Every (query, key) pair visited: a custom mask's kernel reads every key, as a non-causal one."""
    return sum(2.0 * c.hq * (c.dqk + c.dvo) * q * k for q, k in zip(c.q_lens, c.kv_lens)) / (ms * 1e-3) / 1e12


RATES = {"kv": (kv_tb_s, "TB/s"), "flops": (causal_tflop_s, "TFLOP/s"), "dense": (dense_tflop_s, "TFLOP/s")}


def copy_ceiling_tb_s() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), reps=20, warmup=3)
    return 2 * x.numel() / (ms * 1e-3) / 1e12


DECODE_GRID = [(b, n) for b in (1, 4, 16, 64, 256) for n in (512, 4096, 32768, 131072)
               if 2 * b * n * HKV * D * 2 <= (8 << 30)]
DEC64 = Case(q_lens=(1,) * 64, kv_lens=(4096,) * 64, **BIG, **DEC)
FP8 = replace(DEC64, kv_dtype="float8_e4m3fn")
PRE8 = Case(q_lens=(2048,) * 8, kv_lens=(2048,) * 8, **BIG)
# The feature paths (target: within 15% of the plain path per key read): window, soft cap, sinks at 64 x 4096;
# xqa's speculative bit mask (4 drafts per request) against the same queries unmasked; a custom mask on
# prefill against the non-causal plain prefill (a custom mask visits every key).
SPEC4 = Case(phase="spec_decode", mask="spec_bits", causal=False, q_lens=(4,) * 64, kv_lens=(4096,) * 64,
             q_len_per_req=4, **BIG)
Q4 = replace(SPEC4, phase="prefill", mask="none", q_len_per_req=0)
PRE8_FULL = replace(PRE8, causal=False)
PRE8_512 = Case(q_lens=(512,) * 8, kv_lens=(512,) * 8, causal=False, **BIG)
# Short decodes, where the split merge's second launch is a large part of the call: the merge kernel (the
# default) against the merge fused into the attention launch (TileConfig.fused_merge; r10-r12 ran the fused
# merge as the default row and the merge kernel as "merge kernel").
SHORT_DECODES = [(b, n) for b, n in ((1, 512), (1, 4096), (8, 512), (1, 32768))]


def _tile(m: int, n: int, hpp: int, warps: int, stages: int) -> dict:
    return {"config": TileConfig(m, n, hpp, num_warps=warps, num_stages=stages)}


# name, case, metric (RATES), plan overrides (time_case's keywords).
FEATURE_ROWS = [
    ("decode b64 x 4096", DEC64, "kv", {}),
    ("decode b64 x 4096 RoPE", replace(DEC64, **ROPE), "kv", {}),
    ("decode b64 x 4096 fp8 KV", FP8, "kv", {}),
    ("decode b64 x 4096 fp8 KV, 2 splits", FP8, "kv", {"num_splits": 2}),
    ("decode b64 x 1024", replace(DEC64, kv_lens=(1024,) * 64), "kv", {}),
    ("decode b64 x 4096 window 1023", replace(DEC64, window_left=1023), "kv", {}),
    ("decode b64 x 4096 soft cap", replace(DEC64, soft_cap=30.0), "kv", {}),
    ("decode b64 x 4096 sinks", replace(DEC64, sinks=True), "kv", {}),
    ("decode b64 x 4096 window 1023 + soft cap + sinks", replace(DEC64, window_left=1023, soft_cap=30.0, sinks=True),
     "kv", {}),
    ("decode b64 x 4096 q4, spec mask", SPEC4, "kv", {}),
    ("decode b64 x 4096 q4", Q4, "kv", {}),
    ("prefill 8 x 2048 custom mask", replace(PRE8, causal=False, mask="custom"), "dense", {}),
    ("prefill 8 x 2048 non-causal", PRE8_FULL, "dense", {}),
    ("prefill 8 x 2048 custom mask, M256", replace(PRE8, causal=False, mask="custom"), "dense",
     _tile(256, 64, 4, 8, 3)),
    ("prefill 8 x 2048 custom mask, M256 N32", replace(PRE8, causal=False, mask="custom"), "dense",
     _tile(256, 32, 4, 8, 3)),
    ("prefill 8 x 512 custom mask", replace(PRE8_512, mask="custom"), "dense", {}),
    ("prefill 8 x 512 non-causal", PRE8_512, "dense", {}),
    ("prefill 8 x 512 custom mask, one head per row", replace(PRE8_512, mask="custom"), "dense",
     _tile(64, 32, 1, 4, 3)),
    *[row for b, n in SHORT_DECODES for row in (
        (f"decode b{b} x {n}", Case(q_lens=(1,) * b, kv_lens=(n,) * b, **BIG, **DEC), "kv", {}),
        (f"decode b{b} x {n}, fused merge", Case(q_lens=(1,) * b, kv_lens=(n,) * b, **BIG, **DEC), "kv",
         {"fused_merge": True}))],
    ("prefill causal 8 x 2048", PRE8, "flops", {}),
    ("prefill causal 8 x 2048 RoPE", replace(PRE8, **ROPE), "flops", {}),
    ("prefill causal 8 x 2048 ragged", replace(PRE8, storage="ragged"), "flops", {}),
    ("prefill causal 8 x 2048 ragged RoPE", replace(PRE8, storage="ragged", **ROPE), "flops", {}),
]


# --wide: head dims above 256 beside d128 and d256 at the same shapes (16/4 heads, bf16, pages of 16).
WIDE_DEC = Case(q_lens=(1,) * 64, kv_lens=(4096,) * 64, **WIDE, **DEC)
WIDE_PRE = Case(q_lens=(2048,) * 4, kv_lens=(2048,) * 4, **WIDE)
WIDE_ROWS = [
    *[(f"decode b64 x 4096 d{dqk}/{dvo}", replace(WIDE_DEC, dqk=dqk, dvo=dvo), "kv", {})
      for dqk, dvo in ((128, 128), (256, 256), (192, 128), (448, 256), (512, 512))],
    ("decode b64 x 4096 d512 fp8 KV", replace(WIDE_DEC, dqk=512, dvo=512, kv_dtype="float8_e4m3fn"), "kv", {}),
    *[(f"prefill causal 4 x 2048 d{dqk}/{dvo}", replace(WIDE_PRE, dqk=dqk, dvo=dvo), "flops", {})
      for dqk, dvo in ((128, 128), (256, 256), (192, 128), (384, 384), (448, 256), (512, 512))],
    ("prefill causal 4 x 2048 d512, M64 N32 w8", replace(WIDE_PRE, dqk=512, dvo=512), "flops", _tile(64, 32, 1, 8, 2)),
]


# Candidates (--variants): the plain-path prefill kernel (backends/native/triton_plain.py) and fp8
# decode tiles and splits, each checked against float64 at a smaller shape with the same plan overrides
# first (VARIANT_CHECKS); a variant that disagrees is timed but marked wrong and kept out of the targets.
PLAIN = dict(kernel="plain")
RAG8 = replace(PRE8, storage="ragged")


def _plain(m: int = 256, n: int = 64, warps: int = 8, stages: int = 3, **kw) -> dict:
    return {"config": TileConfig(m, n, 4, num_warps=warps, num_stages=stages, **PLAIN, **kw)}


PRE8_ROPE, RAG8_ROPE = replace(PRE8, **ROPE), replace(RAG8, **ROPE)
# RoPE on the plain kernel at several stage counts and tiles (the plain kernel's own tiles are its defaults).
VARIANT_ROWS = [
    ("prefill causal 8 x 2048 RoPE, plain s4", PRE8_ROPE, "flops", _plain(stages=4)),
    ("prefill causal 8 x 2048 RoPE, plain s3", PRE8_ROPE, "flops", _plain(stages=3)),
    ("prefill causal 8 x 2048 RoPE, plain M128 N64 s4", PRE8_ROPE, "flops", _plain(128, 64, stages=4)),
    ("prefill causal 8 x 2048 ragged RoPE, plain s3", RAG8_ROPE, "flops", _plain(stages=3)),
    ("prefill causal 8 x 2048 ragged RoPE, plain s4", RAG8_ROPE, "flops", _plain(stages=4)),
]
_CHECK_PRE = Case(q_lens=(600, 40), kv_lens=(800, 600), **BIG)  # 10 query blocks of M256: interior + diagonal
_CHECK_FP8 = Case(kv_dtype="float8_e4m3fn", q_lens=(1,) * 4, kv_lens=(20000, 4096, 33, 700), **BIG, **DEC)


def _check_case(c: Case) -> Case:
    """The variant's agreement shape: its storage and dtypes at a size the fp64 oracle runs quickly."""
    return replace(_CHECK_FP8 if c.phase == "decode" else _CHECK_PRE, storage=c.storage, pos=c.pos)


def variant_checks() -> list:
    """Every variant against float64 before it is timed (three calls each, as the scenarios); one that
    fails to plan or compile is a failed check with its error, and the run goes on."""
    rows = []
    for name, c, _, plan_kw in VARIANT_ROWS:
        try:
            rows.append(check(f"variant: {name}", _check_case(c), 1.0, 1e4, plan_kw))
        except Exception as exc:  # noqa: BLE001
            rows.append({"scenario": f"variant: {name}", "ok": False, "out_err": [], "lse_err": [], "splits": 0,
                         "tile": "", "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
    return rows


def decode_grid_rows(start: float) -> list:
    rows = []
    for b, n in DECODE_GRID:
        if time.time() - start > DEADLINE_S + 130:
            rows.append({"case": f"decode b{b} x {n}", "skipped": "deadline"})
            continue
        c = Case(q_lens=(1,) * b, kv_lens=(n,) * b, **BIG, **DEC)
        rule = time_case(c)
        tried = {rule["splits"]: rule}
        for s in {max(1, rule["splits"] // 2), min(64, rule["splits"] * 2)} - set(tried):
            tried[s] = time_case(c, num_splits=s)
        best = min(tried.values(), key=lambda r: r["graph_ms"])
        rows.append({"case": f"decode b{b} x {n}", "rule_splits": rule["splits"], "rule": rule,
                     "eager_tb_s": kv_tb_s(c, rule["eager_ms"]), "graph_tb_s": kv_tb_s(c, rule["graph_ms"]),
                     "best_splits": best["splits"], "rule_vs_best": best["graph_ms"] / rule["graph_ms"],
                     "tried": {s: r["graph_ms"] for s, r in sorted(tried.items())}})
    return rows


# The defaults the variants are compared with: with --variants they run first, then the variants, then the
# other feature rows (measured in earlier rounds), so a deadline cuts what is already known.
BASELINES = ("decode b64 x 4096", "decode b64 x 4096 fp8 KV", "decode b64 x 4096 fp8 KV, N128 s3",
             "prefill causal 8 x 2048", "prefill causal 8 x 2048 ragged", "prefill causal 8 x 2048 RoPE",
             "prefill causal 8 x 2048 ragged RoPE")


def _row_order(variants: bool, wide: bool = False) -> list:
    if wide:
        return WIDE_ROWS
    if not variants:
        return FEATURE_ROWS
    first = [r for r in FEATURE_ROWS if r[0] in BASELINES]
    return first + VARIANT_ROWS + [r for r in FEATURE_ROWS if r[0] not in BASELINES]


def feature_rows(start: float, variants: bool = False, wrong: frozenset = frozenset(), wide: bool = False) -> list:
    """The feature rows, then with ``variants`` the candidates (a name in ``wrong`` failed its check);
    with ``wide`` only the wide-head rows."""
    rows = []
    deadline = DEADLINE_S + VARIANTS_EXTRA_S * variants
    for name, c, metric, plan_kw in _row_order(variants, wide):
        if time.time() - start > deadline:
            rows.append({"case": name, "skipped": "deadline"})
            continue
        try:  # an explicit tile may not fit (or compile): the row says so, the run goes on
            r = time_case(c, **plan_kw)
        except Exception as exc:  # noqa: BLE001
            rows.append({"case": name, "skipped": f"{type(exc).__name__}: {str(exc)[:120]}"})
            continue
        rate, unit = RATES[metric]
        rows.append({"case": name, **r, "unit": unit,
                     "eager_rate": rate(c, r["eager_ms"]), "graph_rate": rate(c, r["graph_ms"]),
                     "wrong": f"variant: {name}" in wrong})
    return rows


# -- report ------------------------------------------------------------------------------------------
def environment() -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "sm": f"{props.major}{props.minor}",
            "sms": props.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "date": datetime.datetime.now(datetime.timezone.utc).isoformat()}


def _row(res: dict, case: str) -> dict:
    return next((r for r in res["features"] if r["case"] == case and "skipped" not in r and not r.get("wrong")), {})


def summary(res: dict) -> list:
    """native-triton's targets against this run: (target, measured eager / graph, met on eager)."""
    rows = []

    def ratio(name: str, case: str, base: str, goal: float):
        a, b = _row(res, case), _row(res, base)
        if a and b:
            e, g = a["eager_rate"] / b["eager_rate"], a["graph_rate"] / b["graph_rate"]
            rows.append({"target": f"{name} >= {goal:.2f}", "eager": e, "graph": g, "met": e >= goal})

    ratio("RoPE decode 64x4096 / plain (TB/s)", "decode b64 x 4096 RoPE", "decode b64 x 4096", 0.85)
    ratio("RoPE prefill 8x2048 / plain (TFLOP/s)", "prefill causal 8 x 2048 RoPE", "prefill causal 8 x 2048", 0.85)
    ratio("ragged RoPE prefill 8x2048 / paged plain", "prefill causal 8 x 2048 ragged RoPE", "prefill causal 8 x 2048",
          0.85)
    ratio("(info) RoPE prefill 8x2048, s3 / plain", "prefill causal 8 x 2048 RoPE, s3", "prefill causal 8 x 2048", 0.85)
    ratio("(info) RoPE prefill 8x2048 / plain s5", "prefill causal 8 x 2048 RoPE", "prefill causal 8 x 2048, s5", 0.85)
    ratio("(info) ragged RoPE / ragged plain", "prefill causal 8 x 2048 ragged RoPE", "prefill causal 8 x 2048 ragged",
          0.85)
    for tile in ("", ", 2 splits"):
        ratio(f"fp8 KV decode{tile} / bf16 (bytes read per s)", f"decode b64 x 4096 fp8 KV{tile}", "decode b64 x 4096",
              0.90)
    ratio("(info) fp8 KV decode / bf16 N64 s5", "decode b64 x 4096 fp8 KV", "decode b64 x 4096, N64 s5", 0.90)
    # per key read: a window of 1024 keys against the plain path over 1024 keys (the same work per call)
    for feature in ("window 1023", "window 1023 + soft cap + sinks"):
        ratio(f"{feature} decode 64x4096 / plain 64x1024 (per key read)", f"decode b64 x 4096 {feature}",
              "decode b64 x 1024", 0.85)
    for feature in ("soft cap", "sinks"):
        ratio(f"{feature} decode 64x4096 / plain (per key read)", f"decode b64 x 4096 {feature}", "decode b64 x 4096",
              0.85)
    ratio("spec mask decode 64x4096 q4 / unmasked q4", "decode b64 x 4096 q4, spec mask", "decode b64 x 4096 q4", 0.85)
    for shape in ("8 x 2048", "8 x 512"):
        ratio(f"custom mask prefill {shape} / non-causal plain", f"prefill {shape} custom mask",
              f"prefill {shape} non-causal", 0.85)
    for tile in ("one head per row",):
        ratio(f"(info) custom mask prefill 8 x 512, {tile} / non-causal", f"prefill 8 x 512 custom mask, {tile}",
              "prefill 8 x 512 non-causal", 0.85)
    for tile in ("M256", "M256 N32"):  # the default is M128 x 4 heads (r13)
        ratio(f"(info) custom mask prefill 8 x 2048, {tile} / non-causal", f"prefill 8 x 2048 custom mask, {tile}",
              "prefill 8 x 2048 non-causal", 0.85)
    for b, n in SHORT_DECODES:
        ratio(f"(info) decode b{b} x {n}, fused merge / merge kernel", f"decode b{b} x {n}, fused merge",
              f"decode b{b} x {n}", 1.0)
    for name, c, metric, _ in VARIANT_ROWS:
        if metric == "kv":
            ratio(f"{name[len('decode b64 x 4096 '):]} / bf16 (bytes read per s)", name, "decode b64 x 4096", 0.90)
    for name, c, metric, _ in VARIANT_ROWS:
        if metric == "flops" and c.pos == "ROPE_LLAMA":
            ratio(f"(variant) {name} / paged plain", name, "prefill causal 8 x 2048", 0.85)
    for name in ["prefill causal 8 x 2048", "prefill causal 8 x 2048 ragged"] + [
            n for n, _, metric, _ in VARIANT_ROWS if metric == "flops"]:
        r = _row(res, name)
        if r:
            rows.append({"target": f"{name} >= 370 TFLOP/s", "eager": r["eager_rate"], "graph": r["graph_rate"],
                         "met": r["eager_rate"] >= 370})
    launcher = next((h for h in res["host"] if h["path"].startswith("launcher")), None)
    if launcher:
        us = launcher["us_per_launch"]
        rows.append({"target": "launcher us per eager launch <= 20", "eager": us, "graph": None, "met": us <= 20})
    return rows


def markdown(res: dict) -> str:
    env = res["environment"]
    lines = [f"# native-triton on {env['gpu']} (sm_{env['sm']}, {env['sms']} SMs)", "",
             f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, {env['date']}; "
             f"device copy ceiling {res['copy_tb_s']:.2f} TB/s; {res['seconds']:.0f} s", "",
             "## Targets (met: on eager timing)", "", "| target | eager | graph | met |", "|---|---|---|---|"]
    for t in res["summary"]:
        graph = "" if t["graph"] is None else f"{t['graph']:.3f}"
        lines.append(f"| {t['target']} | {t['eager']:.3f} | {graph} | {t['met']} |")
    lines += ["", "## Agreement vs float64 (calls: Triton's path / the cached compiled kernel / the launcher)", "",
              "| scenario | ok | out rel err | lse rel err | splits | tile |", "|---|---|---|---|---|---|"]
    for a in res["agreement"]:
        lines.append(f"| {a['scenario']} | {a['ok']} | {' / '.join(f'{e:.2e}' for e in a['out_err'])} | "
                     f"{' / '.join(f'{e:.2e}' for e in a['lse_err'])} | {a['splits']} | "
                     f"{a.get('error') or a.get('tile', '')} |")
    lines += ["", "## Host time per eager launch (tiny decode, back-to-back)", "", "| path | us per launch |",
              "|---|---|"] + [f"| {h['path']} | {h['us_per_launch']:.1f} |" for h in res["host"]]
    lines += ["", "## RoPE, fp8 KV and the plain path (bf16 q, 32/8 heads, d128, pages of 16)", "",
              "| case | tile | eager ms | graph ms | eager | graph | unit | splits |", "|---|---|---|---|---|---|---|---|"]
    for r in res["features"]:
        if "skipped" in r:
            lines.append(f"| {r['case']} | skipped ({r['skipped']}) |||||||")
            continue
        lines.append(f"| {r['case']}{' (WRONG: failed its fp64 check)' * bool(r.get('wrong'))} | {r['tile']} | {r['eager_ms']:.3f} | {r['graph_ms']:.3f} | {r['eager_rate']:.2f}"
                     f" | {r['graph_rate']:.2f} | {r['unit']} | {r['splits']} |")
    if not res["decode_grid"]:
        return "\n".join(lines) + "\n"
    lines += ["", "## Decode grid (bf16, 32/8 heads, d128, pages of 16): the split rule vs half and twice it", "",
              "| case | rule splits | eager ms | graph ms | eager TB/s | graph TB/s | best of tried | rule / best |",
              "|---|---|---|---|---|---|---|---|"]
    for r in res["decode_grid"]:
        if "skipped" in r:
            lines.append(f"| {r['case']} | skipped ({r['skipped']}) |||||||")
            continue
        lines.append(f"| {r['case']} | {r['rule_splits']} | {r['rule']['eager_ms']:.3f} | {r['rule']['graph_ms']:.3f}"
                     f" | {r['eager_tb_s']:.2f} | {r['graph_tb_s']:.2f} | {r['best_splits']} | {r['rule_vs_best']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for the JSON and Markdown")
    parser.add_argument("--grid", action="store_true", help="also the decode split grid (about 2 more minutes)")
    parser.add_argument("--variants", action="store_true",
                        help="also the candidate kernels and tiles, each checked against float64 first")
    parser.add_argument("--wide", action="store_true",
                        help="only head dims above 256: their fp64 checks and timing rows")
    args = parser.parse_args()
    if args.wide:
        return wide_main(Path(args.out))
    start = time.time()
    torch.manual_seed(0)
    res = {"environment": environment(),
           "command": "python -m tools.native_h100" + " --grid" * args.grid + " --variants" * args.variants}
    res["agreement"] = [check(name, *spec) for name, spec in AGREEMENT.items()]
    res["agreement"] += variant_checks() if args.variants else []
    wrong = frozenset(a["scenario"] for a in res["agreement"] if not a["ok"])
    res["host"] = [host_us_per_launch(path) for path in ("launcher", "run", "triton")]
    res["copy_tb_s"] = copy_ceiling_tb_s()
    res["features"] = feature_rows(start, args.variants, wrong)
    res["decode_grid"] = decode_grid_rows(start) if args.grid else []
    res["summary"] = summary(res)
    res["seconds"] = time.time() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "native-h100.json").write_text(json.dumps(res, indent=1, default=str))
    text = markdown(res)
    (out / "native-h100.md").write_text(text)
    print(text)
    return 0 if all(a["ok"] for a in res["agreement"] if not a["scenario"].startswith("variant: ")) else 1


def _checked(name: str, spec: tuple) -> dict:
    """check(), a failure to plan, compile or launch being a failed row with its error (the run goes on)."""
    try:
        return check(name, *spec)
    except Exception as exc:  # noqa: BLE001
        return {"scenario": name, "ok": False, "out_err": [], "lse_err": [], "splits": 0, "tile": "",
                "error": f"{type(exc).__name__}: {str(exc)[:160]}"}


def wide_main(out: Path) -> int:
    """--wide: WIDE_AGREEMENT against float64, then WIDE_ROWS timed; native-h100-wide.json/.md."""
    start = time.time()
    torch.manual_seed(0)
    res = {"environment": environment(), "command": "python -m tools.native_h100 --wide", "summary": [],
           "host": [], "copy_tb_s": copy_ceiling_tb_s(), "decode_grid": []}
    res["agreement"] = [_checked(name, spec) for name, spec in WIDE_AGREEMENT.items()]
    res["features"] = feature_rows(start, wide=True)
    res["seconds"] = time.time() - start
    out.mkdir(parents=True, exist_ok=True)
    (out / "native-h100-wide.json").write_text(json.dumps(res, indent=1, default=str))
    text = markdown(res).replace("native-triton on", "native-triton, head dims above 256, on", 1).replace(
        "RoPE, fp8 KV and the plain path (bf16 q, 32/8 heads, d128, pages of 16)",
        "Head dims above 256 beside d128/d256 (bf16 q, 16/4 heads, pages of 16)", 1)
    (out / "native-h100-wide.md").write_text(text)
    print(text)
    return 0 if all(a["ok"] for a in res["agreement"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
