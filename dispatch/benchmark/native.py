"""native-triton scenarios and their float64 check, shared by tests/test_native_triton.py (which runs
as is on a GPU host: DEVICE is cuda there) and tools/native_h100.py (so that tools/ never imports tests/).

A ``Case`` names a scenario: storage (paged NHD/HND, ragged, dense), sizes, dtypes, mask, position
encoding, sinks, scales. ``build`` draws its random tensors on ``DEVICE`` (paged caches with shuffled
pages and a junk tail in the block table); ``run_case`` plans and runs the native-triton backend
directly (no router) with out/lse poisoned with NaN, and asserts that every element was written and
that out and lse agree with the one fp64 oracle (dispatch/benchmark/oracle.py; ``expected`` hands it the
case's masks, RoPE, ALiBi slopes, sinks and scales) within its ``BANDS``, an fp8 out each element within
one e4m3 spacing of the oracle's rounding. It returns (plan, out rel. error, lse rel. error).

    plan, err, lse_err = run_case(Case(page_size=16, q_lens=(1, 1), kv_lens=(900, 7), phase="decode"))
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from backends import alibi_slopes
from backends.native import nvfp4
from backends.native.triton_backend import NativeTritonBackend, TileConfig

from .oracle import BANDS, batch_attention_fp64, e4m3_ulps_off, pack_spec_bits, spec_decode_mask
from .oracle import relative_error as rel_err
from ..inputs import stored_kv
from ..problem import NAME_DTYPES, AttentionBatch, AttentionProblem

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
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
    kv_dtype: str = ""  # "" = same as dtype; "uint8": NVFP4 (fp4 values, fp8 scale factors per 16)
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
        (k, k_sf), (v, v_sf) = _paged_cache(c, n_pages, kv_dtype)
        k_real, v_real = _real(k, k_sf), _real(v, v_sf)
        used = 0
        for b, (np_, n) in enumerate(zip(pages, c.kv_lens)):
            table[b, :np_] = perm[used: used + np_]
            used += np_
            rows = table[b, :np_].long()
            dense_k.append(k_real[rows].reshape(-1, c.hkv, c.dqk)[:n].double())
            dense_v.append(v_real[rows].reshape(-1, c.hkv, c.dvo)[:n].double())
        batch.update(k=k, v=v, block_table=table)
    else:
        k, k_sf = stored_kv(_rand((total_kv + 5, c.hkv, c.dqk), "float32"), kv_dtype)
        k, k_sf = k[5:], (k_sf[5:] if k_sf is not None else None)
        v, v_sf = stored_kv(_rand((total_kv, c.hkv, c.dvo), "float32"), kv_dtype)
        k_real, v_real = _real(k, k_sf), _real(v, v_sf)
        kv_indptr = torch.tensor([0, *torch.tensor(c.kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
        for b in range(len(c.kv_lens)):
            s, e = kv_indptr[b].item(), kv_indptr[b + 1].item()
            dense_k.append(k_real[s:e].double())
            dense_v.append(v_real[s:e].double())
        batch.update(k=k, v=v, kv_indptr=kv_indptr)
    if k_sf is not None:
        batch.update(k_sf=k_sf, v_sf=v_sf)
    return batch, dense_k, dense_v


def _real(stored: torch.Tensor, sf) -> torch.Tensor:
    """What the oracle reads: the stored values, NVFP4 ones dequantized."""
    return stored if sf is None else nvfp4.dequantize(stored, sf)


def _paged_cache(c: Case, n_pages: int, kv_dtype: str):
    """((k, k_sf), (v, v_sf)): logical NHD (pages, P, Hkv, D) views and their NVFP4 scale factors
    (None unless kv_dtype is uint8); HND caches are permuted views, never copies."""
    out = []
    for d in (c.dqk, c.dvo):
        if c.layout == "HND":
            stored = stored_kv(_rand((n_pages, c.hkv, c.page_size, d), "float32"), kv_dtype)
            out.append(tuple(x.permute(0, 2, 1, 3) if x is not None else None for x in stored))
        else:
            out.append(stored_kv(_rand((n_pages, c.page_size, c.hkv, d), "float32"), kv_dtype))
    return out


# ---------------------------------------------------------------------------
# masks, the expected answer (the one fp64 oracle), and one run
# ---------------------------------------------------------------------------
def spec_bits(bool_rows: torch.Tensor) -> torch.Tensor:
    """(B, Q, Q) bool -> xqa uint16 (B, Q, 2*ceil(Q/32)): little-endian uint32 words as uint16 pairs."""
    return pack_spec_bits(bool_rows.cpu(), bool_rows.shape[-1]).to(DEVICE)


def oracle_masks(c: Case, extras: dict) -> Optional[list]:
    """Per-request (q_len, kv_len) bool masks of a custom or spec-bits case (None otherwise): they
    replace causal (dispatch/problem.py); the oracle applies the window on top."""
    if c.mask == "custom":
        return list(extras["custom"])
    if c.mask == "spec_bits":
        return [spec_decode_mask(extras["spec_bool"][b], kl) for b, kl in enumerate(c.kv_lens)]
    return None


def expected(c: Case, q, dense_k, dense_v, sm_scale, out_scale, sinks, extras):
    """The fp64 oracle's (dispatch/benchmark/oracle.py) out and base-2 LSE of a case's inputs."""
    starts = [0, *torch.tensor(c.q_lens).cumsum(0).tolist()]
    qs = [q[starts[b]:starts[b + 1]] for b in range(len(c.q_lens))]
    slopes = torch.tensor(alibi_slopes(c.hq), dtype=torch.float64) if c.pos == "ALIBI" else None
    return batch_attention_fp64(
        qs, dense_k, dense_v, oracle_masks(c, extras), sm_scale=sm_scale, causal=c.causal and c.mask == "none",
        window_left=c.window_left, soft_cap=c.soft_cap, sinks=sinks, out_scale=out_scale,
        pos_encoding="ROPE_LLAMA" if c.pos == "ROPE_LLAMA" else "NONE", alibi_slopes=slopes, alibi_query="row")


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
    ref_out, ref_lse = expected(c, kw["q"], dense_k, dense_v, sm, osc, sinks, extras)
    assert not out.isnan().any(), "some output elements were never written"
    if c.strided_q:
        assert out_buf[:, 0].isnan().all() and out_buf[:, :, c.dvo + 1:].isnan().all(), "wrote outside out"
    band = BANDS["fp8"] if (c.kv_dtype or c.dtype).startswith("float8") else BANDS[c.dtype]
    err = rel_err(out, ref_out)
    if out.dtype == torch.float8_e4m3fn:  # each element the oracle's rounding, or one spacing off it
        off = e4m3_ulps_off(out, ref_out)
        assert off <= 1.0, f"fp8 out {off:.2f} e4m3 spacings from the oracle's rounding (> 1)"
        band = BANDS["fp8"]  # e4m3 rounds within 2^-4 relative
    assert err < band, f"out rel. error {err:.2e} >= {band}"
    lerr = 0.0
    if lse is not None:
        assert not lse.isnan().any(), "some lse elements were never written"
        assert torch.equal(lse.isinf(), ref_lse.isinf()), "fully masked rows must have lse -inf, others finite"
        fin = ~ref_lse.isinf()
        lerr = rel_err(lse[fin], ref_lse[fin]) if fin.any() else 0.0
        assert lerr < band, f"lse rel. error {lerr:.2e} >= {band}"
    return plan, err, lerr
