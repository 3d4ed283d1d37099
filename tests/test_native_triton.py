"""native-triton backend, run directly (no router) against a float64 dense oracle.

On a machine without a GPU these run through Triton's interpreter (tests/conftest.py
sets TRITON_INTERPRET=1), so shapes are small. Each scenario draws fresh random
inputs, poisons out/lse with NaN and checks every element was written. The scenario
description, builder, oracle and ``run_case`` live in dispatch/benchmark/native.py (shared
with tools/native_h100.py); on a GPU host this file runs as is (DEVICE is cuda there).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pytest
import torch

from backends.base import DeviceDesc
from backends.native import triton_backend as tb
from backends.native.triton_backend import TileConfig, split_kv
from capability_db import CPU_DEVICE, resolve_device
from dispatch.benchmark.native import BACKEND, BANDS, DEVICE, Case, build, expected, problem_of, rel_err, run_case
from dispatch.problem import AttentionBatch, NAME_DTYPES

# ---------------------------------------------------------------------------
# scenarios
# ---------------------------------------------------------------------------
DECODE = dict(phase="decode", q_lens=(1, 1, 1), kv_lens=(17, 30, 5), causal=True)
LONG_DECODE = dict(phase="decode", q_lens=(1, 1, 1), kv_lens=(70, 33, 5), causal=True)
SCENARIOS = {
    "paged_nhd_causal_fp16": Case(),
    "paged_hnd_page5_bf16": Case(layout="HND", page_size=5, dtype="bfloat16"),
    "paged_page1_decode_gqa4": Case(page_size=1, hq=8, hkv=2, **DECODE),
    "paged_page16_decode_mqa": Case(page_size=16, hq=4, hkv=1, dtype="bfloat16", **DECODE),
    "ragged_noncausal_q_gt_kv": Case(storage="ragged", q_lens=(6, 4), kv_lens=(3, 9), causal=False),
    "ragged_causal_fully_masked_rows": Case(storage="ragged", q_lens=(6, 2), kv_lens=(3, 7)),
    "dense_fp32_d96": Case(storage="dense", q_lens=(7,), kv_lens=(11,), dtype="float32", dqk=96, dvo=96),
    "paged_d192_dv128_bf16": Case(dtype="bfloat16", dqk=192, dvo=128, page_size=8),
    "ragged_d256_bf16": Case(storage="ragged", dtype="bfloat16", dqk=256, dvo=256, q_lens=(2, 3), kv_lens=(5, 9)),
    "ragged_d40_odd_size": Case(storage="ragged", dqk=40, dvo=40),
    "gqa3_non_pow2_group": Case(hq=6, hkv=2),
    "window_causal": Case(window_left=3, q_lens=(4, 6), kv_lens=(20, 15)),
    "window_noncausal": Case(storage="ragged", causal=False, window_left=2),
    "soft_cap": Case(soft_cap=2.0, dtype="bfloat16"),
    "sinks_fully_masked_rows": Case(storage="ragged", sinks=True, q_lens=(5, 3), kv_lens=(2, 8)),
    "fp8_e4m3_decode_hnd": Case(layout="HND", kv_dtype="float8_e4m3fn", dtype="bfloat16", **DECODE),
    "fp8_e5m2_prefill": Case(kv_dtype="float8_e5m2", dtype="float16"),
    "fp8_q_and_kv_bf16_out": Case(dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn", out_dtype="bfloat16"),
    "custom_mask_ragged": Case(storage="ragged", mask="custom", causal=False, q_lens=(4, 3), kv_lens=(6, 5)),
    # Prefill tiles of _custom_mask_config: per-token mask loads broadcast to 4 heads (M128), one head (M64 N32).
    "custom_mask_prefill_gqa4": Case(mask="custom", causal=False, hq=8, hkv=2, page_size=5, q_lens=(40, 9),
                                     kv_lens=(70, 30)),
    "custom_mask_prefill_mha": Case(storage="ragged", mask="custom", causal=False, hq=2, hkv=2, q_lens=(70, 9),
                                    kv_lens=(75, 30)),
    "spec_decode_bits_window": Case(phase="spec_decode", mask="spec_bits", causal=False, q_lens=(3, 3),
                                    kv_lens=(12, 7), hq=8, hkv=2, q_len_per_req=3, window_left=8),
    "spec_decode_ragged_bits_varlen": Case(phase="spec_decode", mask="spec_bits", causal=False, q_lens=(3, 1, 2),
                                           kv_lens=(12, 7, 9), q_len_per_req=3, spec_ragged=True,
                                           dtype="bfloat16"),
    "alibi_soft_cap": Case(pos="ALIBI", soft_cap=5.0, hq=4, hkv=4),
    "rope_ragged": Case(storage="ragged", pos="ROPE_LLAMA"),
    "rope_paged_hnd_fp8": Case(layout="HND", page_size=3, pos="ROPE_LLAMA", kv_dtype="float8_e4m3fn",
                               dtype="bfloat16"),
    "tensor_scales_strided_q_out": Case(tensor_scales=True, strided_q=True, dtype="bfloat16"),
    "no_lse": Case(lse=False, causal=False),
    # NVFP4 K/V (uint8 values, fp8 scale factors per 16; FlashInfer 0.7.2's kv_cache_sf): the oracle reads
    # the dequantized cache, so the band is q's
    "nvfp4_paged_hnd_decode_bf16": Case(layout="HND", kv_dtype="uint8", dtype="bfloat16", **DECODE),
    "nvfp4_paged_d192_dv128_window": Case(kv_dtype="uint8", dqk=192, dvo=128, page_size=8, window_left=6,
                                          q_lens=(4, 6), kv_lens=(20, 15)),
    "nvfp4_ragged_rope_noncausal": Case(storage="ragged", kv_dtype="uint8", pos="ROPE_LLAMA", causal=False),
    # head dim 48: a scale block straddles the RoPE halves (the kernel's per-value path)
    "nvfp4_paged_rope_d48": Case(kv_dtype="uint8", pos="ROPE_LLAMA", dqk=48, dvo=48, page_size=5),
    "nvfp4_dense_gqa_bf16": Case(storage="dense", kv_dtype="uint8", dtype="bfloat16", hq=8, hkv=2, q_lens=(7,),
                                 kv_lens=(37,)),
    # fp8 e4m3 outputs (FlashInfer's o_dtype / o_data_type / xqa's out / trtllm's out_dtype): each element
    # within one e4m3 spacing of the oracle's rounding
    "fp8_out_paged_prefill_bf16": Case(dtype="bfloat16", out_dtype="float8_e4m3fn"),
    "fp8_out_fp8_q_kv_hnd": Case(layout="HND", dtype="float8_e4m3fn", kv_dtype="float8_e4m3fn",
                                 out_dtype="float8_e4m3fn", sinks=True),
    "fp8_out_decode_fp8_kv": Case(kv_dtype="float8_e4m3fn", dtype="bfloat16", out_dtype="float8_e4m3fn", **DECODE),
}


def band_of(c: Case) -> float:
    """METHOD.md's relative-error band for the case's dtypes (fp8 K/V or output: the fp8 band)."""
    fp8 = (c.kv_dtype or c.dtype).startswith("float8") or c.out_dtype.startswith("float8")
    return BANDS["fp8"] if fp8 else BANDS[c.dtype]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_matches_fp64(name):
    _, err, lse_err = run_case(SCENARIOS[name])
    assert err < band_of(SCENARIOS[name]) and lse_err < band_of(SCENARIOS[name])


@pytest.mark.parametrize("name,case", [
    ("decode_sinks_lse", Case(sinks=True, page_size=16, hq=8, hkv=2, **LONG_DECODE)),
    ("prefill_causal_window", Case(window_left=5, q_lens=(4, 6), kv_lens=(40, 25))),
    # the splits share the window, counted from each request's first visible tile; the second request
    # is shorter than the window (its first visible key is key 0)
    ("decode_window_long", Case(phase="decode", window_left=37, page_size=16, hq=8, hkv=2, q_lens=(1, 1),
                                kv_lens=(301, 20), causal=True)),
    ("prefill_noncausal_window_long", Case(storage="ragged", causal=False, window_left=21, q_lens=(3, 5),
                                           kv_lens=(190, 64))),
    ("spec_decode", Case(phase="spec_decode", mask="spec_bits", causal=False, q_lens=(2, 2), kv_lens=(60, 9),
                         q_len_per_req=2, tensor_scales=True)),
    # fp8 out: the splits' partials stay fp32; only the merge's store rounds to e4m3
    ("decode_fp8_kv_fp8_out", Case(kv_dtype="float8_e4m3fn", dtype="bfloat16", out_dtype="float8_e4m3fn", sinks=True,
                                   page_size=16, hq=8, hkv=2, **LONG_DECODE)),
])
@pytest.mark.parametrize("fused_merge", [True, False])
def test_split_kv_merge_matches_fp64(name, case, fused_merge):
    """Both merges: the last split program's (one launch) and the merge kernel's."""
    hpp = case.hq // case.hkv if case.phase != "prefill" else 1
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=hpp, num_warps=4, num_stages=1,
                     fused_merge=fused_merge)
    plan, _, _ = run_case(case, num_splits=3, config=cfg)
    assert plan.num_splits > 1 and plan.grid[2] == plan.num_splits, "the split-KV path was not exercised"
    assert (plan.merge is None) == fused_merge and (plan.split_count is not None) == fused_merge
    if fused_merge:
        assert not plan.split_count.any(), "the arrival counters were not left at zero"


def test_windowed_splits_cover_the_window_not_the_sequence():
    """Under a window, the keys split are those from the first visible tile on (split_span): a decode
    call of 4000 keys with a window of 100 splits about 100 + a tile of keys, still matching fp64."""
    case = Case(phase="decode", window_left=100, page_size=16, hq=8, hkv=2, q_lens=(1, 1), kv_lens=(4000, 2500),
                causal=True)
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=4, num_warps=4, num_stages=1)
    plan, err, lse_err = run_case(case, num_splits=4, config=cfg)
    assert plan.num_splits == 4 and plan.num_splits * plan.kv_chunk < 200
    assert err < band_of(case) and lse_err < band_of(case)


def test_a_captured_windowed_split_follows_longer_requests():
    """A graph captured with split keys serves a later batch whose windows fit its splits (split_span),
    however long its requests; without a window the keys themselves must fit."""
    def plan_and_batch(window_left: int, kv_lens: tuple):
        c = Case(phase="decode", window_left=window_left, page_size=16, hq=8, hkv=2, q_lens=(1, 1), kv_lens=kv_lens,
                 causal=True)
        kw, _, _ = build(c)
        batch = AttentionBatch(out=torch.empty((2, c.hq, c.dvo), device=DEVICE, dtype=torch.float16), **kw)
        return problem_of(c), batch
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=4, num_warps=4, num_stages=1)
    problem, batch = plan_and_batch(60, (200, 90))
    plan = BACKEND.plan(problem, batch, num_splits=3, config=cfg)
    assert BACKEND.follow_refusal(plan, plan_and_batch(60, (900, 400))[1]) is None
    problem, batch = plan_and_batch(-1, (200, 90))
    plan = BACKEND.plan(problem, batch, num_splits=3, config=cfg)
    assert "the captured splits cover" in BACKEND.follow_refusal(plan, plan_and_batch(-1, (900, 400))[1])


def test_the_merge_kernel_serves_what_the_fused_merge_does_not():
    """The fused merge, when asked for, serves decode tiles (<= 16 rows) with at most 4 splits; prefill
    tiles, more splits and the default config use the merge kernel."""
    cfg = TileConfig(block_m=32, block_n=16, heads_per_program=1, num_warps=4, num_stages=1, fused_merge=True)
    plan, _, _ = run_case(Case(q_lens=(20, 6), kv_lens=(40, 25)), num_splits=2, config=cfg)
    assert plan.merge is not None and plan.split_count is None
    decode = Case(page_size=16, hq=8, hkv=2, **LONG_DECODE)
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=4, num_warps=4, num_stages=1, fused_merge=True)
    plan, _, _ = run_case(decode, num_splits=5, config=cfg)
    assert plan.num_splits == 5 and plan.merge is not None and plan.split_count is None
    plan, _, _ = run_case(decode, num_splits=3, config=replace(cfg, fused_merge=False))  # the default
    assert plan.merge is not None and plan.split_count is None


def test_custom_mask_prefill_tiles():
    """The custom-mask scenarios above reach the tiles _custom_mask_config chooses for them."""
    tiles = {}
    for name in ("custom_mask_prefill_gqa4", "custom_mask_prefill_mha"):
        c = SCENARIOS[name]
        tiles[name] = tb.choose_config(problem_of(c), max(c.q_lens), torch.device("cpu"))
    assert (tiles["custom_mask_prefill_gqa4"].block_m, tiles["custom_mask_prefill_gqa4"].heads_per_program) == (128, 4)
    assert (tiles["custom_mask_prefill_mha"].block_m, tiles["custom_mask_prefill_mha"].block_n) == (64, 32)


def test_partial_group_packing_and_small_tiles():
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=2, num_warps=4, num_stages=1)
    plan, _, _ = run_case(Case(hq=8, hkv=2, q_lens=(9, 3), kv_lens=(33, 20)), config=cfg)
    assert plan.grid[1] == 2 * 2 * 2  # batch x kv heads x (group / heads_per_program)


# ---------------------------------------------------------------------------
# capability data, availability, errors, CUDA graphs
# ---------------------------------------------------------------------------
def test_available_here():
    assert BACKEND.available() is None


def test_check_accepts_every_scenario_on_this_device_and_h100():
    h100 = resolve_device("h100")
    here = CPU_DEVICE if DEVICE == "cpu" else h100
    for name, case in SCENARIOS.items():
        p = replace(problem_of(case), device_type="cuda")
        assert BACKEND.check(p, h100) == [], name
        assert BACKEND.check(replace(p, device_type=DEVICE), here) == [], name


def test_check_rejects_with_field_value_and_allowed():
    p = problem_of(Case(dqk=520, dvo=520))  # 512 is served (tests/test_native_wide.py)
    reasons = BACKEND.check(p, resolve_device("h100"))
    assert [r.field for r in reasons] == ["head_dim_qk", "head_dim_vo"]
    assert reasons[0].value == 520 and "512" in reasons[0].allowed
    fp8 = problem_of(Case(kv_dtype="float8_e4m3fn", dtype="bfloat16"))
    assert [r.field for r in BACKEND.check(fp8, resolve_device("a100"))] == ["sm"]
    mixed = problem_of(Case(dtype="float16", kv_dtype="bfloat16"))
    assert [r.field for r in BACKEND.check(mixed, resolve_device("h100"))] == ["kv_dtype"]


def test_cpu_only_under_the_interpreter(monkeypatch):
    p = problem_of(Case())
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reasons = BACKEND.check(p, DeviceDesc(name="cpu", kind="cpu"))
    assert [r.field for r in reasons] == ["device_kind"] and "TRITON_INTERPRET" in reasons[0].allowed
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert BACKEND.check(p, DeviceDesc(name="cpu", kind="cpu")) == []


def test_plan_names_missing_arguments():
    c = Case()
    kw, _, _ = build(c)
    kw.pop("block_table")
    out = torch.empty((sum(c.q_lens), c.hq, c.dvo), device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match="block_table"):
        BACKEND.plan(problem_of(c), AttentionBatch(out=out, **kw))


def test_run_serves_a_larger_batch_with_the_plan_of_its_own_sizes():
    """The entry points keep one plan per call key (plan_reusable) and its lanes differ in exact
    sizes: a batch larger than planned is served by a plan of its own facts, made once and kept by
    the first plan (whose buffers are never written past their size), and matches the oracle."""
    c = Case(q_lens=(2, 2), kv_lens=(5, 6))
    kw, _, _ = build(c)
    out = torch.empty((4, c.hq, c.dvo), device=DEVICE, dtype=torch.float16)
    plan = BACKEND.plan(problem_of(c), AttentionBatch(out=out, lse=torch.empty(4, c.hq, device=DEVICE), **kw))
    assert BACKEND.plan_reusable(plan.problem)
    big = replace(c, q_lens=(3, 3), kv_lens=(9, 6))
    for _ in range(2):
        kw2, dense_k, dense_v = build(big)
        out2 = torch.full((6, c.hq, c.dvo), float("nan"), device=DEVICE, dtype=torch.float16)
        lse2 = torch.full((6, c.hq), float("nan"), device=DEVICE)
        batch = AttentionBatch(out=out2, lse=lse2, sm_scale=0.3, **kw2)
        BACKEND.run(plan, batch)
        assert_agrees_with_oracle(big, kw2, dense_k, dense_v, out2, lse2, sm_scale=0.3, causal=big.causal)
    assert plan.total_q_capacity == 4 and list(plan.others) == [tb.plan_facts(batch)]
    assert plan.others[tb.plan_facts(batch)].total_q_capacity == 6


def test_a_decode_batch_of_other_sizes_shares_the_plans_launches():
    """Decode steps (one query row a request; a new batch size and new lengths each step) are served by
    plans derived from the kept one: its compiled launches (the grid given per call), a schedule and
    scratch of their own; a split count of the other kernel variant (one split) gets a plan of its
    own. Each matches the oracle."""
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=2, num_warps=4, num_stages=1)
    c = Case(phase="decode", page_size=4, hq=4, hkv=2, q_lens=(1, 1), kv_lens=(40, 23), causal=True)
    kw, _, _ = build(c)
    out = torch.empty((2, c.hq, c.dvo), device=DEVICE, dtype=torch.float16)
    plan = BACKEND.plan(problem_of(c), AttentionBatch(out=out, lse=None, **kw), num_splits=3, config=cfg)
    assert plan.num_splits == 3
    for q_lens, kv_lens, derived in (((1, 1, 1), (70, 5, 33), True), ((1,), (9,), False), ((1, 1), (50, 61), True)):
        step = replace(c, q_lens=q_lens, kv_lens=kv_lens)
        kw2, dense_k, dense_v = build(step)
        out2 = torch.full((len(q_lens), c.hq, c.dvo), float("nan"), device=DEVICE, dtype=torch.float16)
        lse2 = torch.full((len(q_lens), c.hq), float("nan"), device=DEVICE)
        batch = AttentionBatch(out=out2, lse=lse2, sm_scale=0.3, **kw2)
        BACKEND.run(plan, batch)
        assert_agrees_with_oracle(step, kw2, dense_k, dense_v, out2, lse2, sm_scale=0.3, causal=True)
        served = plan.others[tb.plan_facts(batch)]
        assert (served.attention is plan.attention) == derived and served.grid[1] == len(q_lens) * 2
        assert served.num_splits * served.kv_chunk >= max(kv_lens)


def test_a_plan_of_other_query_rows_lends_no_launches():
    """A batch of other query rows gets a plan of its own tile; a later batch of the first plan's query rows
    whose split count differs from it is not derived from that plan of other rows (its tile would not fit
    the grid): it gets its own, as a fresh plan would (plans only, nothing launched)."""
    c = Case(storage="ragged", q_lens=(1, 1), kv_lens=(400, 230))
    kw, _, _ = build(c)
    plan = BACKEND.plan(problem_of(c), AttentionBatch(out=torch.empty((2, c.hq, c.dvo), device=DEVICE), lse=None,
                                                      **kw), num_splits=3)

    def batch_of(q_lens, kv_lens):
        kw2, _, _ = build(replace(c, q_lens=q_lens, kv_lens=kv_lens))
        return AttentionBatch(out=torch.empty((sum(q_lens), c.hq, c.dvo), device=DEVICE), lse=None, **kw2)
    long = BACKEND.plan_for(plan, batch_of((40, 40), (41, 45)))
    short = batch_of((1, 1, 1), (9, 5, 7))
    served = BACKEND.plan_for(plan, short)
    assert plan.num_splits > 1 and long.num_splits == served.num_splits == 1 and long.config != plan.config
    assert served.attention is not long.attention and served.config == plan.config
    assert served.grid == BACKEND.plan(plan.problem, short, num_splits=3).grid


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run this file on the GPU host)")
def test_cuda_graph_replay_equals_eager():
    c = Case(sinks=True, page_size=16, hq=8, hkv=2, tensor_scales=True, **LONG_DECODE)
    kw, _, _ = build(c)
    out = torch.empty((3, c.hq, c.dvo), device=DEVICE, dtype=torch.float16)
    lse = torch.empty((3, c.hq), device=DEVICE)
    batch = AttentionBatch(out=out, lse=lse, sinks=torch.rand(c.hq, device=DEVICE), sm_scale=torch.tensor(0.1,
                           device=DEVICE), **kw)
    plan = BACKEND.plan(problem_of(c), batch, num_splits=2)
    BACKEND.run(plan, batch)
    eager, eager_lse = out.clone(), lse.clone()
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        BACKEND.run(plan, batch)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused merge's cross-program ordering needs a GPU")
def test_fused_merge_equals_the_merge_kernel_under_back_to_back_launches():
    """The last split program merges after an acq_rel counter (triton_kernels._merge_if_last). On a GPU,
    4 splits per row block and launches queued back to back (eager and graph replays) must each give
    the first launch's output bit for bit (the merge's order is fixed, not the arrival order's) and
    agree with the merge kernel: a program that merged before every partial was visible, or a counter
    left non-zero, would show as a different output."""
    c = Case(dtype="bfloat16", hq=32, hkv=8, dqk=128, dvo=128, page_size=16, phase="decode",
             q_lens=(1,) * 4, kv_lens=(16384, 9000, 16384, 300), causal=True)
    kw, _, _ = build(c)
    outs = {}
    for fused in (False, True):
        cfg = TileConfig(16, 128, 4, num_warps=4, num_stages=3, fused_merge=fused)
        batch = AttentionBatch(out=torch.full((4, c.hq, c.dvo), float("nan"), device=DEVICE, dtype=torch.bfloat16),
                               lse=torch.empty((4, c.hq), device=DEVICE), sm_scale=0.088, **kw)
        plan = BACKEND.plan(problem_of(c), batch, config=cfg, num_splits=4)
        assert plan.num_splits == 4 and (plan.merge is None) == fused
        BACKEND.run(plan, batch)
        outs[fused] = (batch, plan)
    (kernel, _), (ref, plan) = outs[False], outs[True]
    assert rel_err(ref.out, kernel.out) < 4e-3 and rel_err(ref.lse, kernel.lse) < 1e-6  # bf16 rounding apart
    many = [replace(ref, out=torch.full_like(ref.out, float("nan")), lse=torch.empty_like(ref.lse))
            for _ in range(30)]
    for b in many:  # queued without a synchronization between them
        BACKEND.run(plan, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for b in many[:5]:
            BACKEND.run(plan, b)
    for b in many[:5]:
        b.out.fill_(float("nan"))
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    for b in many:
        assert torch.equal(b.out, ref.out) and torch.equal(b.lse, ref.lse)
    assert not plan.split_count.any()


SMALL_TILE_CASES = {  # long enough that 16-key tiles hit the unmasked interior loop
    "causal_interior": Case(q_lens=(5, 20), kv_lens=(50, 37)),
    "window_interior": Case(q_lens=(5, 20), kv_lens=(70, 37), window_left=33, page_size=5),
    "noncausal_ragged_interior": Case(storage="ragged", causal=False, q_lens=(3, 18), kv_lens=(49, 64)),
    "alibi_cap_sinks_interior": Case(q_lens=(17,), kv_lens=(66,), pos="ALIBI", soft_cap=3.0, sinks=True,
                                     dtype="bfloat16"),
    "d96_hnd_interior": Case(layout="HND", dqk=96, dvo=96, q_lens=(4, 1), kv_lens=(40, 61)),
}


@pytest.mark.parametrize("name", list(SMALL_TILE_CASES))
def test_small_tiles_interior_matches_fp64(name):
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=1, num_warps=4, num_stages=1)
    plan, err, lse_err = run_case(SMALL_TILE_CASES[name], config=cfg)
    assert plan.config.block_n == 16 and err < band_of(SMALL_TILE_CASES[name]) and lse_err < band_of(
        SMALL_TILE_CASES[name])


def test_split_count_fills_two_waves_on_an_h100():
    """split_kv on 132 SMs, one d128 decode program per SM (the choices measured best on the H100)."""
    h100 = dict(sms=132, per_sm=1, block_n=128)
    assert split_kv(64, 8, 4096, **h100) == (1, 4096)  # 512 programs: already ~4 waves
    assert split_kv(32, 8, 4096, **h100) == (1, 4096)  # 256 programs <= 2 waves
    assert split_kv(16, 8, 4096, **h100) == (2, 2048)  # 128 programs x 2
    assert split_kv(4, 8, 65536, **h100) == (8, 8192)  # measured best: 8 splits 2.85 TB/s (4: 2.57, 16: 2.62)
    assert split_kv(1, 8, 131072, **h100) == (32, 4096)  # 33 wanted, whole tiles make it 32 (measured best)
    assert split_kv(1, 8, 32768, **h100) == (32, 1024)  # measured: 32 1.94 TB/s, 16 1.89, 64 1.78
    assert split_kv(1, 8, 2048, **h100) == (8, 256)  # short keys: at least 2 tiles of 128 per split
    assert split_kv(1, 8, 512, **h100) == (4, 128)  # up to 4 tiles of keys: one tile per split
    assert split_kv(4, 8, 512, **h100) == (4, 128)  # (measured best at batch 1 and 4)
    assert split_kv(16, 8, 512, **h100) == (2, 256)  # 128 programs: two waves allow 2
    assert split_kv(1, 8, 640, **h100) == (2, 384)  # 5 tiles: two tiles per split again
    assert split_kv(1, 8, 4096, **h100) == (16, 256)
    assert split_kv(1, 8, 511, **h100) == (2, 256)  # 3 wanted, whole tiles make it 2
    assert split_kv(1, 1, 10 ** 6, **h100) == (64, 15744)  # never more than the merge's 64 partials
    # Query blocks and head groups are programs too (spec decode, partial GQA packing).
    assert split_kv(4, 8, 65536, m_blocks=2, head_groups=2, **h100) == (2, 32768)
    # Two resident programs per SM double the slots (smaller tiles).
    assert split_kv(4, 8, 65536, sms=132, per_sm=2, block_n=64) == (16, 4096)


H100_SMEM_OPTIN = 232448  # bytes of shared memory one H100 program may opt into


@pytest.mark.parametrize("kv_dtype,storage,want", [("float8_e4m3fn", "paged", (128, 3)), ("float8_e4m3fn", "ragged",
                                                   (128, 3)), ("bfloat16", "paged", (128, 3))])
def test_decode_tile_is_n128_s3_for_fp8_and_bf16(monkeypatch, kv_dtype, storage, want):
    """d128 decode on an H100: fp8 and bf16 K/V, paged or ragged, take N128 with 3 stages (the fastest
    measured: paged fp8 N64 s5 was 1.6x slower in a graph), and fit in
    shared memory as chosen; the split rule's occupancy input stays one program per SM for all three
    (its factor 2 was measured with that count)."""
    monkeypatch.setattr(tb, "_smem_limit", lambda device: 0.9 * H100_SMEM_OPTIN)
    c = Case(storage=storage, page_size=16, hq=32, hkv=8, dqk=128, dvo=128, dtype="bfloat16", kv_dtype=kv_dtype,
             phase="decode")
    cuda = torch.device("cuda", 0)
    cfg = tb.fit_shared_memory(problem_of(c), tb.choose_config(problem_of(c), 1, cuda), cuda)
    assert (cfg.block_n, cfg.num_stages) == want
    assert tb._kv_buffers(problem_of(c), cfg) == 3 - (storage == "paged")
    assert tb.programs_per_sm(problem_of(c), cfg, cuda) == 1


@pytest.mark.parametrize("pos,storage,stages", [("ROPE_LLAMA", "paged", 3), ("ROPE_LLAMA", "ragged", 3),
                                                ("NONE", "paged", 4)])
def test_paged_rope_prefill_gets_the_ragged_prefetch_depth(monkeypatch, pos, storage, stages):
    """d128 causal prefill of 2048 tokens: ragged RoPE takes the general kernel's K/V buffers at 3
    stages (sm_90: 2 per K half, 3 for V) in 164 KB; paged K/V take the plain kernel (PLAIN_PREFILL),
    with 3 stages for RoPE and 4 without, 2 K/V buffers."""
    monkeypatch.setattr(tb, "_smem_limit", lambda device: 0.9 * H100_SMEM_OPTIN)
    c = Case(storage=storage, page_size=16, hq=32, hkv=8, dqk=128, dvo=128, dtype="bfloat16", pos=pos)
    cuda = torch.device("cuda", 0)
    cfg = tb.fit_shared_memory(problem_of(c), tb.choose_config(problem_of(c), 2048, cuda), cuda)
    assert (cfg.block_m, cfg.block_n, cfg.heads_per_program, cfg.num_stages) == (256, 64, 4, stages)
    assert cfg.kernel == ("plain" if storage == "paged" else "general")
    assert tb._kv_buffers(problem_of(c), cfg) == (2 if storage == "paged" else 3)
    assert tb._smem_bytes(problem_of(c), cfg) <= 0.9 * H100_SMEM_OPTIN

# ---------------------------------------------------------------------------
# negative (and zero) softmax scales, against the independent oracle tests/oracle.py
# ---------------------------------------------------------------------------
def run_scaled(c: Case, sm_scale, config: Optional[TileConfig] = None, num_splits: Optional[int] = None):
    """One run with a given sm_scale (float or tensor), compared with oracle.batch_attention_fp64."""
    kw, dense_k, dense_v = build(c)
    total_q = sum(c.q_lens)
    out = torch.full((total_q, c.hq, c.dvo), float("nan"), device=DEVICE, dtype=NAME_DTYPES[c.dtype])
    lse = torch.full((total_q, c.hq), float("nan"), device=DEVICE)
    sinks = torch.rand(c.hq, device=DEVICE) * 5 if c.sinks else None
    batch = AttentionBatch(out=out, lse=lse, sinks=sinks, sm_scale=sm_scale, out_scale=0.8, **kw)
    plan = BACKEND.plan(problem_of(c), batch, config=config, num_splits=num_splits)
    BACKEND.run(plan, batch)
    errors = assert_agrees_with_oracle(c, kw, dense_k, dense_v, out, lse, sm_scale=sm_scale, causal=c.causal,
                                       window_left=c.window_left, soft_cap=c.soft_cap,
                                       sinks=None if sinks is None else sinks.cpu(), out_scale=0.8)
    return plan, *errors


def assert_agrees_with_oracle(c: Case, kw: dict, dense_k, dense_v, out, lse, **oracle_kwargs) -> tuple:
    """out/lse of one run against oracle.batch_attention_fp64 (request-major q from ``kw``): all
    written, within the dtype's band, LSE -inf exactly on the fully masked rows. Returns the two
    relative errors (out, finite LSE)."""
    import oracle

    starts = [0, *torch.tensor(c.q_lens).cumsum(0).tolist()]
    qs = [kw["q"][a:b].cpu() for a, b in zip(starts[:-1], starts[1:])]
    ref_out, ref_lse = oracle.batch_attention_fp64(qs, [k.cpu() for k in dense_k], [v.cpu() for v in dense_v],
                                                   **oracle_kwargs)
    assert not out.isnan().any() and not lse.isnan().any(), "NaN (or unwritten) output"
    band = band_of(c)
    out_err = rel_err(out.cpu(), ref_out)
    assert out_err < band
    assert torch.equal(lse.cpu().isinf(), ref_lse.isinf())
    fin = ~ref_lse.isinf()
    lse_err = rel_err(lse.cpu()[fin], ref_lse[fin])
    assert lse_err < band
    return out_err, lse_err


NEGATIVE_SCALE_CASES = {
    "causal": Case(q_lens=(3, 5), kv_lens=(9, 13)),
    "causal_window": Case(window_left=3, q_lens=(4, 6), kv_lens=(20, 15)),
    "noncausal_window_ragged": Case(storage="ragged", causal=False, window_left=2, q_lens=(3, 4), kv_lens=(8, 6)),
    "causal_soft_cap": Case(soft_cap=2.0, dtype="bfloat16"),
    "window_soft_cap_sinks": Case(window_left=4, soft_cap=3.0, sinks=True, q_lens=(2, 5), kv_lens=(11, 7)),
    "fully_masked_rows": Case(storage="ragged", q_lens=(6, 2), kv_lens=(3, 7)),
    "decode_gqa4": Case(page_size=1, hq=8, hkv=2, **DECODE),
}


@pytest.mark.parametrize("scale", [-0.3, -2.0])
@pytest.mark.parametrize("name", list(NEGATIVE_SCALE_CASES))
def test_negative_scale_matches_oracle(name, scale):
    _, err, lse_err = run_scaled(NEGATIVE_SCALE_CASES[name], scale)
    assert err < band_of(NEGATIVE_SCALE_CASES[name]) and lse_err < band_of(NEGATIVE_SCALE_CASES[name])


@pytest.mark.parametrize("name", ["causal_window", "window_soft_cap_sinks"])
def test_negative_scale_interior_tiles_and_split_kv(name):
    """Small tiles exercise the unmasked interior path (row max of raw scores times the scale);
    splits exercise the merge (two: under a window the splits share its keys, split_span)."""
    c = replace(NEGATIVE_SCALE_CASES[name], q_lens=(3, 9), kv_lens=(70, 41))
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=1, num_warps=4, num_stages=1)
    plan, err, _ = run_scaled(c, -0.4, config=cfg, num_splits=3)
    assert plan.num_splits == 2 and err < band_of(c)


def test_negative_tensor_scale_is_read_on_the_device():
    plan, err, _ = run_scaled(NEGATIVE_SCALE_CASES["causal_window"], torch.tensor(-0.5, device=DEVICE))
    assert plan.constexprs["CAUSAL"] and err < band_of(NEGATIVE_SCALE_CASES["causal_window"])


def test_zero_scale_is_a_uniform_softmax():
    """sm_scale 0: every visible key weighs the same ((-inf) * 0 must not become NaN)."""
    _, err, lse_err = run_scaled(NEGATIVE_SCALE_CASES["causal_window"], 0.0)
    assert err < band_of(NEGATIVE_SCALE_CASES["causal_window"]) and lse_err < band_of(
        NEGATIVE_SCALE_CASES["causal_window"])


@pytest.mark.parametrize("num_splits", [1, 3])  # 1, not None: on a GPU the split rule splits 40 keys too
@pytest.mark.parametrize("causal", [True, False])
def test_sinks_lse_is_the_whole_denominators(num_splits, causal):
    """With sinks the LSE includes the sink's term (dispatch/benchmark/oracle.py, as FlashInfer's sink
    kernels, trtllm-gen and cuDNN return it), once, through the split-KV merge too; rows with no key
    (causal, 6 queries over 4 keys) give out 0 and LSE sink / ln 2 (run_case checks both against the
    oracle); without the sink's term the LSE would be off by far more than the band."""
    c = Case(sinks=True, q_lens=(6, 3), kv_lens=(4, 40), causal=causal, dtype="float32")
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=1, num_warps=4, num_stages=1)
    plan, err, lerr = run_case(c, num_splits=num_splits, config=cfg)
    assert err < BANDS["float32"] and lerr < BANDS["float32"]
    assert plan.num_splits == num_splits, "the split-KV merge was (not) exercised"


@pytest.mark.parametrize("q_scale", [2.0 ** 20, 2.0 ** -30])
def test_fp8_kv_with_bf16_queries_beyond_fp16_range(q_scale):
    """fp8 K/V run their dots in fp16 (fp8 -> fp16 is exact, one instruction per pair): bf16 queries
    far outside fp16's range (2^20 overflows it, 2^-30 underflows it) are moved in by a power of two
    that the softmax scale takes back, so the result still matches fp64."""
    c = Case(kv_dtype="float8_e4m3fn", dtype="bfloat16", hq=8, hkv=2, **LONG_DECODE)
    kw, dense_k, dense_v = build(c)
    kw["q"] = kw["q"] * q_scale  # a power of two: exact in bf16
    total_q = sum(c.q_lens)
    out = torch.full((total_q, c.hq, c.dvo), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    lse = torch.full((total_q, c.hq), float("nan"), device=DEVICE)
    sm = 0.5 / q_scale
    batch = AttentionBatch(out=out, lse=lse, sm_scale=sm, out_scale=1.0, **kw)
    plan = BACKEND.plan(problem_of(c), batch)
    assert plan.constexprs["F16_DOTS"] and not plan.constexprs["DOT_F32"]
    BACKEND.run(plan, batch)
    assert_agrees_with_oracle(c, kw, dense_k, dense_v, out, lse, sm_scale=sm, causal=True)


# ---------------------------------------------------------------------------
# the fix-up after a vendor decode (FIXUP: backends/xqa.py)
# ---------------------------------------------------------------------------
FIXUP_CASES = {
    "fp16": Case(phase="decode", q_lens=(1, 1, 1), kv_lens=(37, 20, 5), hq=8, hkv=2, lse=False),
    "bf16_window_sinks": Case(phase="decode", q_lens=(1, 1, 1), kv_lens=(37, 20, 5), hq=8, hkv=2, lse=False,
                              dtype="bfloat16", window_left=9, sinks=True, page_size=16),
    "fp8_kv_hnd_tensor_scales": Case(phase="decode", q_lens=(1, 1, 1), kv_lens=(37, 20, 5), hq=4, hkv=1,
                                     lse=False, dtype="bfloat16", kv_dtype="float8_e4m3fn", layout="HND",
                                     tensor_scales=True),
}
VENDOR_WROTE = 5.0  # what the fix-up must leave alone where it can bound the logits


def _fixup_run(c: Case, scale_request: dict):
    """The fix-up over an out already holding VENDOR_WROTE, after q of each request r scaled by
    scale_request[r]: (plan, out, the fp64 oracle's out)."""
    kw, dense_k, dense_v = build(c)
    for r, factor in scale_request.items():
        kw["q"][r] = kw["q"][r].float() * factor
    scale_of = (lambda x: torch.tensor(x, device=DEVICE)) if c.tensor_scales else (lambda x: x)
    sm, osc = 0.9 / c.dqk ** 0.5, 1.3
    out = torch.full((len(c.q_lens), c.hq, c.dvo), VENDOR_WROTE, device=DEVICE, dtype=NAME_DTYPES[c.dtype])
    sinks = torch.rand(c.hq, device=DEVICE) * 5 if c.sinks else None
    batch = AttentionBatch(out=out, lse=None, sinks=sinks, sm_scale=scale_of(sm), out_scale=scale_of(osc), **kw)
    plan = BACKEND.plan(problem_of(c), batch, fixup=True)
    BACKEND.run(plan, batch)
    ref, _ = expected(c, kw["q"], dense_k, dense_v, sm, osc, sinks, {})
    return plan, out, ref


@pytest.mark.parametrize("name", list(FIXUP_CASES))
def test_fixup_recomputes_only_the_requests_it_cannot_bound(name):
    """Request 1's q is scaled until |scale| * sum |q||k| at its last key passes FIXUP_LOGIT (1e4): its
    rows are recomputed (the fp64 oracle's answer); requests 0 and 2 keep what the vendor wrote."""
    c = FIXUP_CASES[name]
    plan, out, ref = _fixup_run(c, {1: 3000.0})
    assert plan.num_splits == 1 and plan.constexprs["FIXUP"] and plan.merge is None
    assert (out[0] == VENDOR_WROTE).all() and (out[2] == VENDOR_WROTE).all(), "a bounded row was rewritten"
    err = rel_err(out[1:2], ref[1:2])
    assert err < band_of(c), f"recomputed rows off by {err:.2e}"


def test_fixup_recomputes_rows_whose_bound_is_not_a_number():
    """A NaN or inf in q leaves no bound: those rows are recomputed (what the oracle gives, NaN here)."""
    c = FIXUP_CASES["fp16"]
    _, out, _ = _fixup_run(c, {0: float("nan"), 2: float("inf")})
    assert not (out[0] == VENDOR_WROTE).any() and not (out[2] == VENDOR_WROTE).any()
    assert (out[1] == VENDOR_WROTE).all()


def test_fixup_covers_any_length_and_refuses_what_it_cannot_bound():
    """One split over every key (a captured fix-up follows any longer request); prefill, masks and RoPE
    are refused before any launch, naming what the fix-up serves."""
    c = FIXUP_CASES["fp16"]
    kw, _, _ = build(c)
    batch = AttentionBatch(out=torch.empty(3, c.hq, c.dvo, device=DEVICE, dtype=torch.float16), lse=None, **kw)
    plan = BACKEND.plan(problem_of(c), batch, fixup=True)
    longer = replace(batch, max_kv_len=1 << 20)
    assert BACKEND.follow_refusal(plan, longer) is None and plan.kv_chunk >= 1 << 20
    for other, named in ((replace(c, phase="prefill", q_lens=(2, 1, 1)), "phase"),
                         (replace(c, pos="ROPE_LLAMA"), "pos_encoding")):
        with pytest.raises(ValueError, match=named):
            BACKEND.plan(problem_of(other), batch, fixup=True)


def test_a_fixup_plan_serves_its_batch_size_at_any_length():
    """A decode step's new lengths with a batch size seen before take the fix-up plan made (no plan per
    step); a new batch size gets its own; an attention plan still plans per longest length."""
    c = FIXUP_CASES["fp16"]
    kw, _, _ = build(c)
    batch = AttentionBatch(out=torch.empty(3, c.hq, c.dvo, device=DEVICE, dtype=torch.float16), lse=None, **kw)
    plan = BACKEND.plan(problem_of(c), batch, fixup=True)
    assert BACKEND.plan_for(plan, replace(batch, max_kv_len=batch.max_kv_len + 100)) is plan
    assert plan.others is None
    kw2, _, _ = build(replace(c, q_lens=(1, 1), kv_lens=(37, 20)))
    fewer = AttentionBatch(out=torch.empty(2, c.hq, c.dvo, device=DEVICE, dtype=torch.float16), lse=None, **kw2)
    assert BACKEND.plan_for(plan, fewer) is not plan and plan.others[tb.plan_facts(fewer, True)].grid[1] < plan.grid[1]
    attention = BACKEND.plan(problem_of(c), batch)
    assert BACKEND.plan_for(attention, replace(batch, max_kv_len=batch.max_kv_len + 100)) is not attention
