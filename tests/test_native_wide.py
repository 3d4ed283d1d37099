"""native-triton at head dims above 256: up to 512 for head_dim_qk and head_dim_vo, any
pair of multiples of 8 (FlashInfer's 192/128, 448/256, 512/512 among them), on every path the backend
serves (paged/ragged/dense prefill, decode, spec decode; causal, window, soft cap, sinks, ALiBi, RoPE,
custom and xqa masks, fp8 K/V, fp32, split-KV with both merges), each against the fp64 oracle.

On a CPU these run under Triton's interpreter at tiny lengths (tests/conftest.py); on a GPU host as is.
The tiles (triton_backend._wide_head_config) were picked by compiling for sm_90a without a GPU; the IR of
every scenario here is built for sm_90 by tests/test_native_ir.py, which also compiles the bf16 512/512
tiles to a cubin and checks their shared memory and spills. GPU sizes: tools/native_h100.py --wide.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from backends.native import triton_backend as tb
from backends.native.triton_backend import TileConfig
from capability_db import resolve_device
from dispatch.benchmark.native import BACKEND, BANDS, Case, problem_of, run_case

pytestmark = pytest.mark.native_triton

DECODE = dict(phase="decode", q_lens=(1, 1, 1), kv_lens=(70, 33, 5), causal=True)
WIDE_SCENARIOS = {
    # 40 rows of one head: the prefill tile (M32, one head per row), interior and diagonal key tiles
    "ragged_d512_prefill_tile_bf16": Case(storage="ragged", dtype="bfloat16", dqk=512, dvo=512, hq=2, hkv=2,
                                          q_lens=(40, 9), kv_lens=(75, 20)),
    "paged_hnd_d448_dv256_bf16": Case(layout="HND", page_size=5, dtype="bfloat16", dqk=448, dvo=256),
    "paged_d192_dv128_decode_fp8": Case(page_size=16, dqk=192, dvo=128, kv_dtype="float8_e4m3fn",
                                        dtype="bfloat16", hq=8, hkv=2, **DECODE),
    "dense_d384_window_soft_cap_sinks": Case(storage="dense", dqk=384, dvo=384, q_lens=(6,), kv_lens=(40,),
                                             window_left=9, soft_cap=3.0, sinks=True),
    "ragged_d320_rope": Case(storage="ragged", dqk=320, dvo=320, pos="ROPE_LLAMA", dtype="bfloat16"),
    # 20 rows of one head: RoPE's prefill tile (M16), fp8 K/V rotated in registers
    "paged_d384_rope_prefill_tile_fp8": Case(page_size=4, dqk=384, dvo=384, pos="ROPE_LLAMA", kv_dtype="float8_e4m3fn",
                                             dtype="bfloat16", hq=2, hkv=2, q_lens=(20, 5), kv_lens=(30, 9)),
    "paged_d512_decode_fp8_e5m2_gqa4": Case(page_size=16, dqk=512, dvo=512, kv_dtype="float8_e5m2", hq=8, hkv=2,
                                            **DECODE),
    "paged_d512_decode_rope_gqa4": Case(page_size=8, dqk=512, dvo=512, pos="ROPE_LLAMA", hq=8, hkv=2, **DECODE),
    "spec_decode_d512_bits_window": Case(phase="spec_decode", mask="spec_bits", causal=False, q_lens=(3, 3),
                                         kv_lens=(12, 7), hq=8, hkv=2, q_len_per_req=3, window_left=8, dqk=512,
                                         dvo=512, dtype="bfloat16"),
    "custom_mask_d384_dv512": Case(storage="ragged", mask="custom", causal=False, dqk=384, dvo=512, q_lens=(4, 3),
                                   kv_lens=(6, 5)),
    "alibi_soft_cap_d512": Case(pos="ALIBI", soft_cap=5.0, hq=4, hkv=4, dqk=512, dvo=512),
    "dense_fp32_d512_dv256": Case(storage="dense", dtype="float32", dqk=512, dvo=256, q_lens=(7,), kv_lens=(11,)),
}


def band_of(c: Case) -> float:
    return BANDS["fp8"] if (c.kv_dtype or c.dtype).startswith("float8") else BANDS[c.dtype]


@pytest.mark.parametrize("name", list(WIDE_SCENARIOS))
def test_wide_head_scenario_matches_fp64(name):
    c = WIDE_SCENARIOS[name]
    plan, err, lse_err = run_case(c)
    assert err < band_of(c) and lse_err < band_of(c)
    assert plan.constexprs["BLOCK_DQK"] >= c.dqk and plan.constexprs["BLOCK_DV"] >= c.dvo


@pytest.mark.parametrize("fused_merge", [True, False])
def test_wide_head_split_kv_matches_fp64(fused_merge):
    """Split-KV at 512/512 with the default decode tile (N32: 70 keys are 3 splits), both merges."""
    c = Case(page_size=16, dqk=512, dvo=512, hq=8, hkv=2, sinks=True, dtype="bfloat16", **DECODE)
    cfg = replace(tb.choose_config(problem_of(c), 1, torch.device("cpu")), fused_merge=fused_merge)
    plan, err, lse_err = run_case(c, num_splits=3, config=cfg)
    assert plan.num_splits == 3 and (plan.merge is None) == fused_merge
    assert err < BANDS["bfloat16"] and lse_err < BANDS["bfloat16"]


def _config(dqk: int, dvo: int, max_q_len: int, **case) -> TileConfig:
    c = Case(dqk=dqk, dvo=dvo, **case)
    return tb.choose_config(replace(problem_of(c), device_type="cuda"), max_q_len, torch.device("cuda"))


def test_wide_head_tiles():
    """Above 256 (after padding): M32 N32 8 warps 2 stages for prefill, the group's rows in M16/M32 N32 with
    3 stages for paged decode, M16 with RoPE, M16 N16 for fp32; 256 and below keep the H100-tuned tiles."""
    assert _config(512, 512, 2048, dtype="bfloat16") == TileConfig(32, 32, 1, 8, 2)
    assert _config(320, 320, 2048, storage="ragged") == TileConfig(32, 32, 1, 8, 2)
    assert _config(448, 256, 1, hq=8, hkv=2, phase="decode") == TileConfig(16, 32, 4, 8, 3)
    assert _config(512, 512, 4, hq=64, hkv=8, phase="decode") == TileConfig(32, 32, 8, 8, 3)
    assert _config(512, 512, 2048, dtype="float32") == TileConfig(16, 16, 1, 8, 2)
    # RoPE rotates K's halves in registers: M16 (M32 spilled)
    assert _config(384, 384, 2048, pos="ROPE_LLAMA") == TileConfig(16, 32, 1, 8, 2)
    assert _config(512, 512, 1, hq=64, hkv=2, phase="decode", pos="ROPE_LLAMA") == TileConfig(16, 32, 32, 8, 3)
    # unchanged at 256 and below (the H100-tuned tiles)
    assert _config(256, 256, 2048) == TileConfig(64, 32, 1, 4, 2)
    assert _config(192, 128, 2048) == TileConfig(64, 32, 1, 4, 2)
    assert _config(256, 256, 1, hq=8, hkv=2, phase="decode") == TileConfig(16, 64, 4, 4, 3)


@pytest.mark.parametrize("storage", ["paged", "ragged"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
@pytest.mark.parametrize("phase,q_len", [("prefill", 2048), ("decode", 1)])
def test_wide_head_tiles_fit_an_h100_as_chosen(monkeypatch, storage, dtype, phase, q_len):
    """fit_shared_memory (227 KB per block on sm_90, 90% used) keeps the wide tiles as chosen: the sizes
    the sm_90a compiles were checked at are the ones a GPU plans."""
    monkeypatch.setattr(tb, "_smem_limit", lambda device: 0.9 * 232448)
    c = Case(storage=storage, dtype=dtype, dqk=512, dvo=512, hq=8, hkv=2, phase=phase)
    problem = replace(problem_of(c), device_type="cuda")
    cfg = tb.choose_config(problem, q_len, torch.device("cuda"))
    assert tb.fit_shared_memory(problem, cfg, torch.device("cuda")) == cfg


@pytest.mark.parametrize("dqk,dvo", [(192, 128), (256, 256), (320, 320), (384, 384), (448, 256), (512, 512),
                                     (512, 128), (128, 512)])
def test_capability_accepts_head_dims_up_to_512(dqk, dvo):
    for case in (Case(dqk=dqk, dvo=dvo), Case(dqk=dqk, dvo=dvo, phase="decode", **{k: v for k, v in DECODE.items()
                                                                                   if k != "phase"})):
        p = replace(problem_of(case), device_type="cuda")
        assert BACKEND.check(p, resolve_device("h100")) == [], (dqk, dvo)


def test_capability_refuses_above_512_naming_the_limit():
    p = replace(problem_of(Case(dqk=520, dvo=576)), device_type="cuda")
    reasons = BACKEND.check(p, resolve_device("h100"))
    assert [(r.field, r.value) for r in reasons] == [("head_dim_qk", 520), ("head_dim_vo", 576)]
    assert all("512" in r.allowed for r in reasons)
