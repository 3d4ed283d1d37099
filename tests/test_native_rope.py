"""native-triton's fused RoPE (ROPE_LLAMA rotated inside the attention kernel, no rotated copies),
checked against the fp64 oracle (tests/oracle.py) on fresh random inputs with NaN-poisoned outputs:
the backend run directly (paged NHD/HND, ragged; causal or not; GQA, MQA; decode and prefill tiles;
head dims whose half is not a power of two; interior tiles and split-KV), and the two prefill
wrappers with the backend forced, against the oracle and the reference backend.

CPU: Triton's interpreter (tests/conftest.py), so shapes stay small.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import pytest
import torch
import triton
import triton.language as tl

from backends.native.triton_backend import TileConfig, rope_frequencies
from backends.native.triton_kernels import _rope_cos_sin, _rope_cos_sin_tile
from dispatch.benchmark.native import BACKEND, DEVICE, Case, build, problem_of
from dispatch.problem import NAME_DTYPES, AttentionBatch
from test_native_triton import assert_agrees_with_oracle

pytestmark = pytest.mark.native_triton

ROPE = dict(pos="ROPE_LLAMA")
CASES = {
    "paged_nhd_causal_gqa2": Case(**ROPE),
    "paged_hnd_p3_noncausal_gqa4": Case(layout="HND", page_size=3, hq=8, hkv=2, causal=False, **ROPE),
    "ragged_causal_mqa_bf16": Case(storage="ragged", hq=4, hkv=1, dtype="bfloat16", **ROPE),
    "ragged_noncausal_q_gt_kv": Case(storage="ragged", causal=False, q_lens=(6, 2), kv_lens=(3, 9), **ROPE),
    "decode_gqa4_d96": Case(page_size=16, hq=8, hkv=2, dqk=96, dvo=96, phase="decode", q_lens=(1, 1, 1),
                            kv_lens=(40, 7, 23), **ROPE),
    "d40_half_not_pow2": Case(storage="ragged", dqk=40, dvo=32, **ROPE),
    "window_soft_cap_sinks": Case(window_left=4, soft_cap=3.0, sinks=True, q_lens=(2, 5), kv_lens=(11, 7), **ROPE),
}
SCALINGS = {"default": (1.0, 1e4), "llama3_like": (8.0, 5e5), "short_theta": (0.5, 100.0)}


def run_rope(c: Case, rope_scale: float, rope_theta: float, config: Optional[TileConfig] = None,
             num_splits: Optional[int] = None):
    kw, dense_k, dense_v = build(c)
    total_q = sum(c.q_lens)
    sm = 0.8 / math.sqrt(c.dqk)
    out = torch.full((total_q, c.hq, c.dvo), float("nan"), device=DEVICE, dtype=NAME_DTYPES[c.dtype])
    lse = torch.full((total_q, c.hq), float("nan"), device=DEVICE)
    sinks = torch.rand(c.hq, device=DEVICE) * 3 if c.sinks else None
    batch = AttentionBatch(out=out, lse=lse, sinks=sinks, sm_scale=sm, out_scale=1.1, **kw)
    problem = replace(problem_of(c), rope_scale=rope_scale, rope_theta=rope_theta)
    plan = BACKEND.plan(problem, batch, config=config, num_splits=num_splits)
    BACKEND.run(plan, batch)
    assert_agrees_with_oracle(c, kw, dense_k, dense_v, out, lse, sm_scale=sm, causal=c.causal,
                              window_left=c.window_left, soft_cap=c.soft_cap,
                              sinks=None if sinks is None else sinks.cpu(), out_scale=1.1,
                              pos_encoding="ROPE_LLAMA", rope_scale=rope_scale, rope_theta=rope_theta)
    return plan


@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("name", list(CASES))
def test_fused_rope_matches_fp64(name, scaling):
    plan = run_rope(CASES[name], *SCALINGS[scaling])
    assert plan.constexprs["ROPE"] and plan.rope_freq.shape == (2, plan.constexprs["BLOCK_HALF"])


@pytest.mark.parametrize("name", ["paged_nhd_causal_gqa2", "ragged_noncausal_q_gt_kv", "decode_gqa4_d96"])
def test_fused_rope_interior_tiles_and_split_kv(name):
    """16-key tiles reach the unmasked interior loop; three splits rotate keys in every split."""
    c = replace(CASES[name], q_lens=(3,) + CASES[name].q_lens[1:], kv_lens=(80,) + CASES[name].kv_lens[1:])
    hpp = c.hq // c.hkv if c.phase != "prefill" else 1
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=hpp, num_warps=4, num_stages=1)
    plan = run_rope(c, 2.0, 1e4, config=cfg, num_splits=3)
    assert plan.num_splits == 3


def test_frequency_table_is_exact_in_two_parts():
    """hi + lo reproduces theta^(-2i/D)/scale to ~1e-14 relative (fp32 alone: ~6e-8), zero padded."""
    problem = replace(problem_of(Case(dqk=40, **ROPE)), rope_scale=8.0, rope_theta=5e5)
    table = rope_frequencies(problem, 32)
    want = 5e5 ** (-2.0 * torch.arange(20, dtype=torch.float64) / 40) / 8.0
    got = table[0, :20].double() + table[1, :20].double()
    assert ((got - want).abs() / want).max().item() < 1e-13
    assert ((table[0, :20].double() - want).abs() / want).max().item() > 1e-10  # the low part matters
    assert torch.equal(table[:, 20:], torch.zeros(2, 12))


# -- through the prefill wrappers (backend forced), against the reference backend ---------------------
HQ, HKV, D = 4, 2, 32


def _wrapper_inputs(causal: bool):
    g = torch.Generator().manual_seed(11)
    q_lens, kv_lens, page = (3, 6), (9, 14), 4
    qo = torch.tensor([0, 3, 9], dtype=torch.int32)
    q = torch.randn(sum(q_lens), HQ, D, generator=g)
    pages = [math.ceil(n / page) for n in kv_lens]
    perm = torch.randperm(sum(pages) + 2, generator=g).to(torch.int32)[: sum(pages)]
    cache = torch.randn(sum(pages) + 2, 2, page, HKV, D, generator=g)
    kv_indptr = torch.tensor([0, pages[0], sum(pages)], dtype=torch.int32)
    last = torch.tensor([(n - 1) % page + 1 for n in kv_lens], dtype=torch.int32)
    k = torch.randn(sum(kv_lens), HKV, D, generator=g)
    v = torch.randn(sum(kv_lens), HKV, D, generator=g)
    kv_rows = torch.tensor([0, kv_lens[0], sum(kv_lens)], dtype=torch.int32)
    tensors = dict(q=q, qo=qo, cache=cache, perm=perm, kv_indptr=kv_indptr, last=last, k=k, v=v, kv_rows=kv_rows)
    return {**{name: t.to(DEVICE) for name, t in tensors.items()}, "page": page, "causal": causal}


def _run_wrapper(kind: str, backend: str, x: dict, **rope):
    import dispatch

    ws = torch.empty(16, dtype=torch.uint8, device=DEVICE)
    common = dict(causal=x["causal"], pos_encoding_mode="ROPE_LLAMA", q_data_type=torch.float32, **rope)
    if kind == "paged":
        w = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(x["qo"], x["kv_indptr"], x["perm"], x["last"], HQ, HKV, D, x["page"], **common)
        return w.run(x["q"], x["cache"], return_lse=True)
    w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
    w.plan(x["qo"], x["kv_rows"], HQ, HKV, D, **common)
    return w.run(x["q"], x["k"], x["v"], return_lse=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_prefill_wrappers_rope_on_native_match_the_reference(kind, causal):
    x = _wrapper_inputs(causal)
    rope = dict(rope_scale=4.0, rope_theta=5e5)
    out, lse = _run_wrapper(kind, "native", x, **rope)
    with_plain_rope = _run_wrapper(kind, "native", x)  # the defaults differ: the options must reach the kernel
    want, want_lse = _run_wrapper(kind, "reference", x, **rope)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out - want).abs().max().item() < 1e-4 and (lse - want_lse).abs().max().item() < 1e-4
    assert (with_plain_rope[0] - out).abs().max().item() > 1e-3


# -- the angle reduction (the compiled kernel takes cos/sin of the reduced angle on the SFU) ----------
@triton.jit
def _angles(Pos, Freq, Cos, Sin, N: tl.constexpr, H: tl.constexpr):
    p = tl.load(Pos + tl.arange(0, N)).to(tl.float32)
    f = tl.arange(0, H)
    c, s = _rope_cos_sin(p[:, None], tl.load(Freq + f)[None, :], tl.load(Freq + H + f)[None, :])
    out = tl.arange(0, N)[:, None] * H + f[None, :]
    tl.store(Cos + out, c)
    tl.store(Sin + out, s)


def test_rope_angles_reduced_to_a_turn_match_fp64_at_long_positions():
    """_rope_cos_sin at positions up to ~2^20 with LLaMA frequencies (fp32 hi + lo parts): the angle
    is reduced by whole turns in fp32 before cos/sin (the interpreter takes numpy's cos/sin of the
    reduced angle, the GPU cos.approx/sin.approx, 2^-20.5 on [-pi, pi]); against fp64 the result is
    within 2e-6, where plain fp32 angles (p * f rounded) are off by ~1e-1 at these positions."""
    problem = replace(problem_of(Case(dqk=64, **ROPE)), rope_scale=1.0, rope_theta=5e5)
    table = rope_frequencies(problem, 32)
    pos = torch.cat([torch.randint(0, 1 << 20, (30,)), torch.tensor([0, (1 << 20) - 1])]).to(torch.int32)
    c, s = (torch.full((32, 32), float("nan"), device=DEVICE) for _ in range(2))  # the kernel writes these
    _angles[(1,)](pos.to(DEVICE), table.to(DEVICE), c, s, N=32, H=32)
    c, s = c.cpu(), s.cpu()
    freq = table[0].double() + table[1].double()
    want = pos.double()[:, None] * freq[None, :]
    assert (c.double() - want.cos()).abs().max().item() < 2e-6
    assert (s.double() - want.sin()).abs().max().item() < 2e-6
    naive = (pos.float()[:, None] * table[0][None, :]).double()
    assert (naive.cos() - want.cos()).abs().max().item() > 1e-2  # the hi + lo parts are needed


@triton.jit
def _tile_angles(Start, Freq, Cos, Sin, N: tl.constexpr, H: tl.constexpr):
    f = tl.arange(0, H)
    c, s = _rope_cos_sin_tile(tl.load(Start + tl.program_id(0)), tl.load(Freq + f), tl.load(Freq + H + f), N)
    out = tl.program_id(0) * N * H + f[:, None] * N + tl.arange(0, N)[None, :]
    tl.store(Cos + out, c)
    tl.store(Sin + out, s)


@pytest.mark.parametrize("rope_scale", [1.0, 0.5])
def test_rope_tile_angles_match_fp64_at_long_positions(rope_scale):
    """_rope_cos_sin_tile (16-bit dots: the tile start's angle reduced once, each key adding j * f) at
    key tiles of 128 starting up to ~2^20, LLaMA frequencies up to 1 / rope_scale: within 3e-5 / rope_scale
    of fp64. The band is the fp32 rounding of angles up to pi + 127 * f, which grows with f: ~1e-5 at
    f = 1; at f = 2 the angles reach 257 rad (ulp 2^-15), 4.1e-5 measured on the H100 (cos.approx of the
    unreduced sum), far below a 16-bit dot's 2^-11 relative
    rounding. The keys of one tile each differ."""
    problem = replace(problem_of(Case(dqk=64, **ROPE)), rope_scale=rope_scale, rope_theta=5e5)
    table = rope_frequencies(problem, 32)
    starts = torch.cat([torch.randint(0, 1 << 20, (6,)), torch.tensor([0, (1 << 20) - 128])]).to(torch.int32)
    c, s = (torch.full((8, 32, 128), float("nan"), device=DEVICE) for _ in range(2))  # the kernel writes these
    _tile_angles[(8,)](starts.to(DEVICE), table.to(DEVICE), c, s, N=128, H=32)
    c, s = c.cpu(), s.cpu()
    freq = table[0].double() + table[1].double()
    want = (starts.double()[:, None, None] + torch.arange(128).double()[None, None, :]) * freq[None, :, None]
    band = 3e-5 / rope_scale
    assert (c.double() - want.cos()).abs().max().item() < band
    assert (s.double() - want.sin()).abs().max().item() < band
