"""native-triton backend, run directly (no router) against a float64 dense oracle.

On a machine without a GPU these run through Triton's interpreter (tests/conftest.py
sets TRITON_INTERPRET=1), so shapes are small. Each scenario draws fresh random
inputs, poisons out/lse with NaN and checks every element was written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import pytest
import torch

from backends.base import DeviceDesc
from backends._numerics import alibi_slopes
from backends.native.triton_backend import NativeTritonBackend, TileConfig, best_splits
from capability_db import CPU_DEVICE, resolve_device
from dispatch.problem import AttentionBatch, AttentionProblem, NAME_DTYPES

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BANDS = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2, "fp8": 6e-2}
BACKEND = NativeTritonBackend()


@dataclass(frozen=True)
class Case:
    """A named scenario: everything needed to build the problem and the tensors."""

    storage: str = "paged"
    layout: str = "NHD"
    page_size: int = 4
    q_lens: tuple = (3, 5)
    kv_lens: tuple = (9, 13)
    hq: int = 4
    hkv: int = 2
    dqk: int = 64
    dvo: int = 64
    dtype: str = "float16"
    kv_dtype: str = ""  # "" = same as dtype
    out_dtype: str = ""  # "" = same as dtype
    causal: bool = True
    window_left: int = -1
    soft_cap: float = 0.0
    sinks: bool = False
    mask: str = "none"
    pos: str = "NONE"
    lse: bool = True
    tensor_scales: bool = False
    strided_q: bool = False
    phase: str = "prefill"
    q_len_per_req: int = 0
    spec_ragged: bool = False  # xqa mask as (total_q, W) instead of (B, Q, W)


def problem_of(c: Case) -> AttentionProblem:
    return AttentionProblem(
        entry="test", phase=c.phase, kv_storage=c.storage, kv_layout=c.layout, num_qo_heads=c.hq,
        num_kv_heads=c.hkv, head_dim_qk=c.dqk, head_dim_vo=c.dvo, q_dtype=c.dtype,
        kv_dtype=c.kv_dtype or c.dtype, out_dtype=c.out_dtype or c.dtype, page_size=c.page_size if c.storage == "paged" else 0,
        causal=c.causal, window_left=c.window_left, mask=c.mask, logits_soft_cap=c.soft_cap,
        pos_encoding=c.pos, has_sinks=c.sinks, return_lse=c.lse, q_len_per_req=c.q_len_per_req,
        device_type=DEVICE)


def _rand(shape, dtype, scale=1.0):
    x = torch.randn(shape, device=DEVICE, dtype=torch.float32) * scale
    return x.to(NAME_DTYPES[dtype])


def build(c: Case):
    """(problem, batch, dense float64 per-request K/V for the oracle, extras)."""
    kv_dtype = c.kv_dtype or c.dtype
    total_q, total_kv = sum(c.q_lens), sum(c.kv_lens)
    qo_indptr = torch.tensor([0, *torch.tensor(c.q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    kv_lens = torch.tensor(c.kv_lens, dtype=torch.int32, device=DEVICE)
    if c.strided_q:  # q as a column slice of a wider packed buffer
        q = _rand((total_q, c.hq + 2 * c.hkv, c.dqk + 16), c.dtype)[:, : c.hq, : c.dqk]
    else:
        q = _rand((total_q, c.hq, c.dqk), c.dtype)
    batch = dict(q=q, qo_indptr=qo_indptr, kv_lens=kv_lens, batch_size=len(c.q_lens),
                 max_q_len=max(c.q_lens), max_kv_len=max(c.kv_lens))
    dense_k, dense_v = [], []
    if c.storage == "paged":
        pages = [math.ceil(n / c.page_size) for n in c.kv_lens]
        n_pages = sum(pages) + 3
        perm = torch.randperm(n_pages, device=DEVICE).to(torch.int32)
        table = torch.zeros((len(pages), max(pages) + 1), dtype=torch.int32, device=DEVICE)
        table[:, -1] = perm[-1]  # a tail pointing at somebody else's page must be ignored
        k, v = _paged_cache(c, n_pages, kv_dtype)
        used = 0
        for b, (np_, n) in enumerate(zip(pages, c.kv_lens)):
            table[b, :np_] = perm[used: used + np_]
            used += np_
            rows = table[b, :np_].long()
            dense_k.append(k[rows].reshape(-1, c.hkv, c.dqk)[:n].double())
            dense_v.append(v[rows].reshape(-1, c.hkv, c.dvo)[:n].double())
        batch.update(k=k, v=v, block_table=table)
    else:
        k = _rand((total_kv + 5, c.hkv, c.dqk), "float32").to(NAME_DTYPES[kv_dtype])[5:]
        v = _rand((total_kv, c.hkv, c.dvo), "float32").to(NAME_DTYPES[kv_dtype])
        kv_indptr = torch.tensor([0, *torch.tensor(c.kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
        for b in range(len(c.kv_lens)):
            s, e = kv_indptr[b].item(), kv_indptr[b + 1].item()
            dense_k.append(k[s:e].double())
            dense_v.append(v[s:e].double())
        batch.update(k=k, v=v, kv_indptr=kv_indptr)
    return batch, dense_k, dense_v


def _paged_cache(c: Case, n_pages: int, kv_dtype: str):
    """Logical NHD (pages, P, Hkv, D) views; HND caches are permuted views, never copies."""
    out = []
    for d in (c.dqk, c.dvo):
        if c.layout == "HND":
            phys = _rand((n_pages, c.hkv, c.page_size, d), "float32")
            out.append(phys.to(NAME_DTYPES[kv_dtype]).permute(0, 2, 1, 3))
        else:
            out.append(_rand((n_pages, c.page_size, c.hkv, d), "float32").to(NAME_DTYPES[kv_dtype]))
    return out


# ---------------------------------------------------------------------------
# masks, the oracle, and one run
# ---------------------------------------------------------------------------
def spec_bits(bool_rows: torch.Tensor) -> torch.Tensor:
    """(B, Q, Q) bool -> xqa uint16 (B, Q, 2*ceil(Q/32)): little-endian uint32 words as uint16 pairs."""
    b, q, _ = bool_rows.shape
    words = 2 * math.ceil(q / 32)
    out = torch.zeros((b, q, words), dtype=torch.int32)
    for j in range(q):
        out[..., j // 16] |= bool_rows[..., j].to(torch.int32).cpu() << (j % 16)
    return out.to(torch.uint16).to(DEVICE)


def visible(c: Case, b: int, extras: dict) -> torch.Tensor:
    """(q_len, kv_len) bool: the mask semantics of dispatch/problem.py."""
    ql, kl = c.q_lens[b], c.kv_lens[b]
    qpos = torch.arange(ql, device=DEVICE)[:, None] + (kl - ql)
    kidx = torch.arange(kl, device=DEVICE)[None, :]
    keep = torch.ones((ql, kl), dtype=torch.bool, device=DEVICE)
    if c.mask == "custom":
        keep = extras["custom"][b]
    elif c.mask == "spec_bits":
        draft = kidx - (kl - ql)
        keep = (draft < 0) | extras["spec_bool"][b][:, draft.clamp(min=0)[0]]
    elif c.causal:
        keep = kidx <= qpos
    if c.window_left >= 0:
        keep = keep & (kidx >= qpos - c.window_left)
    return keep


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float = 1e4, scale: float = 1.0) -> torch.Tensor:
    """LLaMA rotate-half on (n, H, D) float64 at positions pos (n,)."""
    half = x.shape[-1] // 2
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64, device=x.device) / x.shape[-1]) / scale
    ang = pos.double()[:, None, None] * freq
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)


def oracle(c: Case, q, dense_k, dense_v, sm_scale, out_scale, sinks, extras):
    """Float64 dense attention per request; LSE base 2 over the keys (sinks: denominator only)."""
    outs, lses, start = [], [], 0
    group = c.hq // c.hkv
    for b, (ql, kl) in enumerate(zip(c.q_lens, c.kv_lens)):
        qb = q[start: start + ql].double()
        kb, vb = dense_k[b], dense_v[b]
        if c.pos == "ROPE_LLAMA":
            qb = rope(qb, torch.arange(ql, device=DEVICE) + kl - ql)
            kb = rope(kb, torch.arange(kl, device=DEVICE))
        kb, vb = kb.repeat_interleave(group, 1), vb.repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qb, kb) * sm_scale
        if c.pos == "ALIBI":
            slopes = torch.tensor(alibi_slopes(c.hq), dtype=torch.float64, device=DEVICE)
            rel = (torch.arange(kl, device=DEVICE)[None, :] - torch.arange(ql, device=DEVICE)[:, None]).double()
            s = s + slopes[:, None, None] * rel
        if c.soft_cap > 0:
            s = c.soft_cap * torch.tanh(s / c.soft_cap)
        keep = visible(c, b, extras)
        s = s.masked_fill(~keep, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.double()[:, None, None].expand(c.hq, ql, 1)], -1)
        m = s.amax(-1, keepdim=True).clamp(min=-1e300)
        p = (s - m).exp()
        denom = p.sum(-1)
        o = torch.einsum("hqk,khd->qhd", p[..., :kl], vb) / denom.T[..., None] * out_scale
        lse = (p[..., :kl].sum(-1).log() + m[..., 0]) / math.log(2)  # keys only, not the sink
        empty = ~keep.any(-1)  # fully masked rows: out 0, lse -inf
        o[empty] = 0
        lse[:, empty] = float("-inf")
        outs.append(o)
        lses.append(lse.T)
        start += ql
    return torch.cat(outs), torch.cat(lses)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp(min=1e-30)).item()


def run_case(c: Case, num_splits: Optional[int] = None, config: Optional[TileConfig] = None):
    kw, dense_k, dense_v = build(c)
    total_q = sum(c.q_lens)
    sm = 0.9 / math.sqrt(c.dqk)
    osc = 1.3
    out_buf = torch.full((total_q, c.hq + 1, c.dvo + 8), float("nan"), device=DEVICE,
                         dtype=NAME_DTYPES[c.out_dtype or c.dtype])
    out = out_buf[:, 1:, : c.dvo] if c.strided_q else out_buf[:, : c.hq, : c.dvo].contiguous()
    lse = torch.full((total_q, c.hq), float("nan"), device=DEVICE) if c.lse else None
    sinks = torch.rand(c.hq, device=DEVICE) * 5 if c.sinks else None
    extras = {}
    if c.mask == "custom":
        extras["custom"] = [torch.rand(ql, kl, device=DEVICE) > 0.4 for ql, kl in zip(c.q_lens, c.kv_lens)]
        kw["custom_mask"] = torch.cat([m.flatten() for m in extras["custom"]])
        sizes = [ql * kl for ql, kl in zip(c.q_lens, c.kv_lens)]
        kw["mask_indptr"] = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int32,
                                         device=DEVICE)
    if c.mask == "spec_bits":
        qn = c.q_len_per_req
        bits = (torch.rand(len(c.q_lens), qn, qn, device=DEVICE) > 0.5) | torch.eye(qn, dtype=torch.bool,
                                                                                   device=DEVICE)
        extras["spec_bool"] = [bits[b, :ql, :ql] for b, ql in enumerate(c.q_lens)]
        words = spec_bits(bits)
        if c.spec_ragged:  # (total_q, W) rows, request-major, each request its own q_len
            words = torch.cat([words[b, :ql] for b, ql in enumerate(c.q_lens)])
        kw["spec_mask"] = words
    scale_of = (lambda x: torch.tensor(x, device=DEVICE)) if c.tensor_scales else (lambda x: x)
    batch = AttentionBatch(out=out, lse=lse, sinks=sinks, sm_scale=scale_of(sm), out_scale=scale_of(osc), **kw)
    problem = problem_of(c)
    plan = BACKEND.plan(problem, batch, num_splits=num_splits, config=config)
    BACKEND.run(plan, batch)
    ref_out, ref_lse = oracle(c, kw["q"], dense_k, dense_v, sm, osc, sinks, extras)
    assert not out.isnan().any(), "some output elements were never written"
    if c.strided_q:
        assert out_buf[:, 0].isnan().all() and out_buf[:, :, c.dvo + 1:].isnan().all(), "wrote outside out"
    band = BANDS["fp8"] if (c.kv_dtype or c.dtype).startswith("float8") else BANDS[c.dtype]
    err = rel_err(out, ref_out)
    assert err < band, f"out rel. error {err:.2e} >= {band}"
    lerr = 0.0
    if lse is not None:
        assert not lse.isnan().any(), "some lse elements were never written"
        assert torch.equal(lse.isinf(), ref_lse.isinf()), "fully masked rows must have lse -inf, others finite"
        fin = ~ref_lse.isinf()
        lerr = rel_err(lse[fin], ref_lse[fin]) if fin.any() else 0.0
        assert lerr < band, f"lse rel. error {lerr:.2e} >= {band}"
    return plan, err, lerr


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
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_matches_fp64(name):
    run_case(SCENARIOS[name])


@pytest.mark.parametrize("name,case", [
    ("decode_sinks_lse", Case(sinks=True, page_size=16, hq=8, hkv=2, **LONG_DECODE)),
    ("prefill_causal_window", Case(window_left=5, q_lens=(4, 6), kv_lens=(40, 25))),
    ("spec_decode", Case(phase="spec_decode", mask="spec_bits", causal=False, q_lens=(2, 2), kv_lens=(60, 9),
                         q_len_per_req=2, tensor_scales=True)),
])
def test_split_kv_merge_matches_fp64(name, case):
    hpp = case.hq // case.hkv if case.phase != "prefill" else 1
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=hpp, num_warps=4, num_stages=1)
    plan, _, _ = run_case(case, num_splits=3, config=cfg)
    assert plan.num_splits > 1 and plan.grid[2] == plan.num_splits, "the split-KV path was not exercised"


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
    p = problem_of(Case(dqk=512, dvo=512))
    reasons = BACKEND.check(p, resolve_device("h100"))
    assert [r.field for r in reasons] == ["head_dim_qk", "head_dim_vo"]
    assert reasons[0].value == 512 and "256" in reasons[0].allowed
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


def test_run_refuses_a_batch_larger_than_planned():
    c = Case(q_lens=(2, 2), kv_lens=(5, 6))
    kw, _, _ = build(c)
    out = torch.empty((4, c.hq, c.dvo), device=DEVICE, dtype=torch.float16)
    plan = BACKEND.plan(problem_of(c), AttentionBatch(out=out, **kw))
    big = replace(Case(), q_lens=(3, 3), kv_lens=(5, 6))
    kw2, _, _ = build(big)
    out2 = torch.full((6, c.hq, c.dvo), float("nan"), device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match="plan again"):
        BACKEND.run(plan, AttentionBatch(out=out2, **kw2))
    assert out2.isnan().all(), "nothing may be written when run refuses"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (tools/gpu_native.py runs it)")
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
    run_case(SMALL_TILE_CASES[name], config=cfg)


def test_split_count_fills_two_waves():
    assert best_splits(programs=512, slots=132, max_useful=64) == 1  # 64 requests x 8 heads: no split
    assert best_splits(programs=32, slots=132, max_useful=64) == 8  # 256 programs <= 264 slots x 2
    assert best_splits(programs=8, slots=132, max_useful=64) == 33
    assert best_splits(programs=8, slots=132, max_useful=3) == 3  # short sequences cap the split


# ---------------------------------------------------------------------------
# negative (and zero) softmax scales, against the independent oracle tests/oracle.py
# ---------------------------------------------------------------------------
def run_scaled(c: Case, sm_scale, config: Optional[TileConfig] = None, num_splits: Optional[int] = None):
    """One run with a given sm_scale (float or tensor), compared with oracle.batch_attention_fp64."""
    import oracle

    kw, dense_k, dense_v = build(c)
    total_q = sum(c.q_lens)
    out = torch.full((total_q, c.hq, c.dvo), float("nan"), device=DEVICE, dtype=NAME_DTYPES[c.dtype])
    lse = torch.full((total_q, c.hq), float("nan"), device=DEVICE)
    sinks = torch.rand(c.hq, device=DEVICE) * 5 if c.sinks else None
    batch = AttentionBatch(out=out, lse=lse, sinks=sinks, sm_scale=sm_scale, out_scale=0.8, **kw)
    plan = BACKEND.plan(problem_of(c), batch, config=config, num_splits=num_splits)
    BACKEND.run(plan, batch)
    starts = [0, *torch.tensor(c.q_lens).cumsum(0).tolist()]
    qs = [kw["q"][a:b].cpu() for a, b in zip(starts[:-1], starts[1:])]
    ref_out, ref_lse = oracle.batch_attention_fp64(
        qs, [k.cpu() for k in dense_k], [v.cpu() for v in dense_v], sm_scale=sm_scale, causal=c.causal,
        window_left=c.window_left, soft_cap=c.soft_cap, sinks=None if sinks is None else sinks.cpu(),
        out_scale=0.8)
    assert not out.isnan().any() and not lse.isnan().any(), "NaN (or unwritten) output"
    band = BANDS[c.dtype]
    assert rel_err(out.cpu(), ref_out) < band
    assert torch.equal(lse.cpu().isinf(), ref_lse.isinf())
    fin = ~ref_lse.isinf()
    assert rel_err(lse.cpu()[fin], ref_lse[fin]) < band
    return plan


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
    run_scaled(NEGATIVE_SCALE_CASES[name], scale)


@pytest.mark.parametrize("name", ["causal_window", "window_soft_cap_sinks"])
def test_negative_scale_interior_tiles_and_split_kv(name):
    """Small tiles exercise the unmasked interior path (row max of raw scores times the scale);
    three splits exercise the merge."""
    c = replace(NEGATIVE_SCALE_CASES[name], q_lens=(3, 9), kv_lens=(70, 41))
    cfg = TileConfig(block_m=16, block_n=16, heads_per_program=1, num_warps=4, num_stages=1)
    plan = run_scaled(c, -0.4, config=cfg, num_splits=3)
    assert plan.num_splits == 3


def test_negative_tensor_scale_is_read_on_the_device():
    run_scaled(NEGATIVE_SCALE_CASES["causal_window"], torch.tensor(-0.5, device=DEVICE))


def test_zero_scale_is_a_uniform_softmax():
    """sm_scale 0: every visible key weighs the same ((-inf) * 0 must not become NaN)."""
    run_scaled(NEGATIVE_SCALE_CASES["causal_window"], 0.0)
