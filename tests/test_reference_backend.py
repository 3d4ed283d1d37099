"""Unit tests of the pure-PyTorch reference backend against a tiny dense fp64 computation.

The dense computation below forms the full score matrix per request (tiny shapes
only) and is written from dispatch/problem.py's conventions, independently of
backends/native/_torch_ops.py. Error bands: rel. Frobenius error fp32 < 1e-5,
fp16/bf16 < 1e-2, fp8 KV < 6e-2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest
import torch

from backends import DeviceDesc, get_backend
from backends.native import reference as ref_mod
from dispatch.problem import AttentionBatch, AttentionProblem, dtype_name

BANDS = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-12}
FP8_BAND = 6e-2


# ----------------------------------------------------------------------------- the dense oracle
def alibi_slopes_paper(num_heads: int) -> list[float]:
    """ALiBi paper recipe: geometric series from 2**(-8/n), interleaved extras for non powers of 2."""
    def power_of_two(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]


def rope_dense(x: torch.Tensor, pos: torch.Tensor, theta: float, scale: float) -> torch.Tensor:
    """Rotate-half RoPE in fp64: pairs (i, i + D/2), angle pos * theta**(-2i/D) / scale."""
    d = x.shape[-1]
    out = x.clone()
    for i in range(d // 2):
        ang = pos.double() * (theta ** (-2.0 * i / d) / scale)
        c, s = ang.cos()[:, None], ang.sin()[:, None]
        out[..., i] = x[..., i] * c - x[..., i + d // 2] * s
        out[..., i + d // 2] = x[..., i + d // 2] * c + x[..., i] * s
    return out


def dense_request(p: AttentionProblem, q, k, v, sm_scale, out_scale, keep_extra=None, sinks=None):
    """One request, full (Hq, L, S) score matrix in fp64. Returns out (L, Hq, Dvo), lse2 (L, Hq)."""
    q, k, v = q.double(), k.double(), v.double()
    L, S = q.shape[0], k.shape[0]
    qi = torch.arange(L)
    qpos, kpos = qi + S - L, torch.arange(S)
    if p.pos_encoding == "ROPE_LLAMA":
        q, k = rope_dense(q, qpos, p.rope_theta, p.rope_scale), rope_dense(k, kpos, p.rope_theta, p.rope_scale)
    g = p.num_qo_heads // p.num_kv_heads
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k) * sm_scale
    if p.pos_encoding == "ALIBI":
        slopes = torch.tensor(alibi_slopes_paper(p.num_qo_heads), dtype=torch.float64)
        s = s + slopes[:, None, None] * (kpos[None, :] - qi[:, None]).double()
    if p.logits_soft_cap > 0:
        s = p.logits_soft_cap * torch.tanh(s / p.logits_soft_cap)
    keep = torch.ones(L, S, dtype=torch.bool)
    if p.causal and p.mask == "none":
        keep &= kpos[None, :] <= qpos[:, None]
    if p.window_left >= 0:
        keep &= kpos[None, :] >= qpos[:, None] - p.window_left
    if keep_extra is not None:
        keep &= keep_extra
    s = s.masked_fill(~keep, -math.inf)
    denom_logits = s if sinks is None else torch.cat(
        [s, sinks.double()[:, None, None].expand(-1, L, 1)], dim=-1)
    lse = torch.logsumexp(denom_logits, dim=-1)  # (Hq, L): the whole denominator's, sink included
    probs = torch.softmax(denom_logits, dim=-1)[..., :S].nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", probs, v) * out_scale
    return out, (lse / math.log(2)).t()


# ----------------------------------------------------------------------------- building problems
@dataclass
class Case:
    q_lens: list
    kv_lens: list
    storage: str = "ragged"
    hq: int = 4
    hkv: int = 2
    dqk: int = 16
    dvo: int = 16
    q_dtype: torch.dtype = torch.float32
    kv_dtype: torch.dtype = torch.float32
    page_size: int = 4
    hnd: bool = False
    opts: dict = field(default_factory=dict)  # AttentionProblem fields


def build(case: Case, seed: int = 0, sm_scale=None, out_scale=1.0, custom_masks=None, spec_mask=None,
          sinks=None):
    """AttentionProblem + AttentionBatch (NaN-poisoned out/lse) + per-request fp64 inputs."""
    gen = torch.Generator().manual_seed(seed)
    B, total_q = len(case.q_lens), sum(case.q_lens)
    q = torch.randn(total_q, case.hq, case.dqk, generator=gen).to(case.q_dtype)
    ks = [torch.randn(n, case.hkv, case.dqk, generator=gen) for n in case.kv_lens]
    vs = [torch.randn(n, case.hkv, case.dvo, generator=gen) for n in case.kv_lens]
    if case.kv_dtype.is_floating_point and case.kv_dtype.itemsize == 1:  # fp8: stored values are the truth
        ks, vs = [x.clamp(-6, 6).to(case.kv_dtype) for x in ks], [x.clamp(-6, 6).to(case.kv_dtype) for x in vs]
    else:
        ks, vs = [x.to(case.kv_dtype) for x in ks], [x.to(case.kv_dtype) for x in vs]
    qo_indptr = torch.tensor([0] + list(_cumsum(case.q_lens)), dtype=torch.int32)
    kv_lens = torch.tensor(case.kv_lens, dtype=torch.int32)
    opts = {"phase": "prefill", **case.opts}
    problem = AttentionProblem(
        entry="test", kv_storage=case.storage, kv_layout="HND" if case.hnd else "NHD",
        num_qo_heads=case.hq, num_kv_heads=case.hkv, head_dim_qk=case.dqk, head_dim_vo=case.dvo,
        q_dtype=dtype_name(case.q_dtype), kv_dtype=dtype_name(case.kv_dtype), out_dtype=dtype_name(case.q_dtype),
        page_size=case.page_size if case.storage == "paged" else 0, device_type="cpu",
        has_sinks=sinks is not None, **opts)
    kv = _paged(case, ks, vs, gen) if case.storage == "paged" else _ragged(ks, vs)
    out = torch.full((total_q, case.hq, case.dvo), float("nan"), dtype=case.q_dtype)
    lse = torch.full((total_q, case.hq), float("nan"), dtype=torch.float32)
    mask_flat, mask_indptr = None, None
    if custom_masks is not None:
        mask_flat = torch.cat([m.reshape(-1) for m in custom_masks])
        mask_indptr = torch.tensor([0] + list(_cumsum([m.numel() for m in custom_masks])), dtype=torch.int32)
    batch = AttentionBatch(
        q=q, qo_indptr=qo_indptr, kv_lens=kv_lens, out=out, lse=lse, batch_size=B,
        max_q_len=max(case.q_lens), max_kv_len=max(case.kv_lens),
        sm_scale=case.dqk ** -0.5 if sm_scale is None else sm_scale, out_scale=out_scale,
        custom_mask=mask_flat, mask_indptr=mask_indptr, spec_mask=spec_mask, sinks=sinks, **kv)
    return problem, batch, ks, vs


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def _ragged(ks, vs):
    kv_indptr = torch.tensor([0] + list(_cumsum([k.shape[0] for k in ks])), dtype=torch.int32)
    return dict(k=torch.cat(ks), v=torch.cat(vs), kv_indptr=kv_indptr)


def _paged(case: Case, ks, vs, gen):
    """Pages in a random permutation, a garbage block-table tail, optionally an HND physical cache."""
    P = case.page_size
    n_pages = [math.ceil(k.shape[0] / P) for k in ks]
    total = sum(n_pages) + 2  # spare pages never referenced
    perm = torch.randperm(total, generator=gen)
    max_pages = max(n_pages) + 1
    block_table = perm[torch.randint(0, total, (len(ks), max_pages), generator=gen)].to(torch.int32)
    shape_k = (total, case.hkv, P, case.dqk) if case.hnd else (total, P, case.hkv, case.dqk)
    shape_v = shape_k[:-1] + (case.dvo,)
    k_phys = torch.randn(shape_k, generator=gen).to(ks[0].dtype)  # garbage everywhere unused
    v_phys = torch.randn(shape_v, generator=gen).to(vs[0].dtype)
    k_log = k_phys.permute(0, 2, 1, 3) if case.hnd else k_phys  # logical NHD view, never a copy
    v_log = v_phys.permute(0, 2, 1, 3) if case.hnd else v_phys
    used = 0
    for b, (k, v) in enumerate(zip(ks, vs)):
        for j in range(n_pages[b]):
            page = int(perm[used])
            used += 1
            block_table[b, j] = page
            rows = slice(j * P, min((j + 1) * P, k.shape[0]))
            k_log[page, : rows.stop - rows.start] = k[rows]
            v_log[page, : rows.stop - rows.start] = v[rows]
    return dict(k=k_log, v=v_log, block_table=block_table)


def run_reference(problem, batch):
    backend = get_backend("reference")
    backend.run(backend.plan(problem, batch), batch)


def expected(problem, batch, ks, vs, custom=None, kv_scale=(1.0, 1.0)):
    """Dense fp64 answer per request, concatenated like batch.out / batch.lse."""
    outs, lses = [], []
    sm = float(batch.sm_scale) / kv_scale[0]  # the oracle multiplies k by its scale instead
    osc = float(batch.out_scale) / kv_scale[1]
    qo = batch.qo_indptr.tolist()
    for b in range(batch.batch_size):
        extra = None if custom is None else custom[b]
        out, lse = dense_request(problem, batch.q[qo[b]:qo[b + 1]], ks[b].double() * kv_scale[0],
                                 vs[b].double() * kv_scale[1], sm, osc, extra, batch.sinks)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm()).item()


def assert_matches(problem, batch, ks, vs, band, custom=None, kv_scale=(1.0, 1.0)):
    run_reference(problem, batch)
    assert not batch.out.isnan().any(), "some out elements were never written"
    assert not batch.lse.isnan().any(), "some lse elements were never written"
    want_out, want_lse = expected(problem, batch, ks, vs, custom, kv_scale)
    assert rel_err(batch.out, want_out) < band
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(batch.lse), finite)
    assert rel_err(batch.lse[finite], want_lse[finite]) < max(band, 1e-6)


# ----------------------------------------------------------------------------- tests
BASE_Q, BASE_KV = [3, 7, 1], [9, 7, 12]


@pytest.mark.parametrize("storage", ["paged", "ragged", "dense"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa2", "mqa6"])
def test_storage_causal_gqa_fp32(storage, causal, heads):
    case = Case(BASE_Q, BASE_KV, storage=storage, hq=heads[0], hkv=heads[1], opts=dict(causal=causal))
    problem, batch, ks, vs = build(case, seed=1)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])


def test_paged_hnd_strided_view_and_page_size_one():
    for page_size, hnd in ((5, True), (1, False)):
        case = Case([4, 2], [13, 6], storage="paged", page_size=page_size, hnd=hnd, opts=dict(causal=True))
        problem, batch, ks, vs = build(case, seed=2)
        assert not batch.k.is_contiguous() or not hnd
        assert_matches(problem, batch, ks, vs, BANDS[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    case = Case(BASE_Q, BASE_KV, storage="paged", q_dtype=dtype, kv_dtype=dtype, opts=dict(causal=True))
    problem, batch, ks, vs = build(case, seed=3)
    assert batch.out.dtype == dtype
    assert_matches(problem, batch, ks, vs, BANDS[dtype])


def test_fp64_inputs_compute_in_fp64():
    case = Case(BASE_Q, BASE_KV, q_dtype=torch.float64, kv_dtype=torch.float64, opts=dict(causal=True))
    problem, batch, ks, vs = build(case, seed=4)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float64])


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_kv_with_folded_scales(fp8):
    """k_scale folded into sm_scale, v_scale into out_scale, both as device tensors."""
    k_scale, v_scale = 0.37, 1.9
    case = Case(BASE_Q, BASE_KV, storage="paged", q_dtype=torch.bfloat16, kv_dtype=fp8, opts=dict(causal=True))
    sm = torch.tensor(16 ** -0.5 * k_scale)  # 0-dim
    problem, batch, ks, vs = build(case, seed=5, sm_scale=sm, out_scale=torch.tensor([v_scale]))
    assert_matches(problem, batch, ks, vs, FP8_BAND, kv_scale=(k_scale, v_scale))
    # the fp8 values are dequantized exactly, so only the bf16 output rounding remains
    want, _ = expected(problem, batch, ks, vs, kv_scale=(k_scale, v_scale))
    assert rel_err(batch.out, want) < BANDS[torch.bfloat16]


def test_scales_float_and_tensor_agree():
    case = Case(BASE_Q, BASE_KV, opts=dict(causal=True))
    problem, batch, ks, vs = build(case, seed=6, sm_scale=0.3, out_scale=2.5)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])
    by_float = batch.out.clone()
    problem, batch, ks, vs = build(case, seed=6, sm_scale=torch.tensor([0.3]), out_scale=torch.tensor(2.5))
    run_reference(problem, batch)
    torch.testing.assert_close(batch.out, by_float, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window_left", [0, 3])
def test_window_left_inclusive(causal, window_left):
    case = Case([5, 1, 4], [11, 8, 4], storage="paged", opts=dict(causal=causal, window_left=window_left))
    problem, batch, ks, vs = build(case, seed=7)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])


def test_window_zero_causal_is_the_diagonal_value():
    """window_left=0 + causal: each row sees only its own key, so out == v at its position."""
    case = Case([4], [6], hq=2, hkv=2, opts=dict(causal=True, window_left=0))
    problem, batch, ks, vs = build(case, seed=8)
    run_reference(problem, batch)
    torch.testing.assert_close(batch.out[:, :, :], vs[0][2:6], rtol=1e-6, atol=1e-6)


def test_soft_cap_after_scaling():
    case = Case(BASE_Q, BASE_KV, storage="paged", opts=dict(causal=True, logits_soft_cap=2.0))
    problem, batch, ks, vs = build(case, seed=9, sm_scale=1.5)  # large logits: the cap matters
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])


def test_sinks_in_denominator_only():
    case = Case([3, 6], [9, 4], storage="paged", opts=dict(causal=True))
    sinks = torch.rand(4, generator=torch.Generator().manual_seed(10)) * 5
    problem, batch, ks, vs = build(case, seed=10, sinks=sinks)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])
    # rows 0-1 of request 1 are fully masked (q_len 6 > kv_len 4): out 0, LSE the sink's alone (sink / ln 2)
    assert torch.equal(batch.out[3:5], torch.zeros_like(batch.out[3:5]))
    torch.testing.assert_close(batch.lse[3:5], (sinks / math.log(2.0)).expand(2, -1))


def test_custom_mask_overrides_causal():
    gen = torch.Generator().manual_seed(11)
    q_lens, kv_lens = [3, 5], [7, 5]
    masks = [torch.rand(q, k, generator=gen) < 0.6 for q, k in zip(q_lens, kv_lens)]
    masks[0][1] = False  # one fully masked row
    case = Case(q_lens, kv_lens, storage="ragged", opts=dict(causal=True, mask="custom", window_left=4))
    problem, batch, ks, vs = build(case, seed=11, custom_masks=masks)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32], custom=masks)
    assert torch.isneginf(batch.lse[1]).all() and torch.equal(batch.out[1], torch.zeros_like(batch.out[1]))


def pack_spec_rows(rows: torch.Tensor) -> torch.Tensor:
    """bool (..., q_len) -> uint16 (..., 2*ceil(q_len/32)): little-endian uint32 words as uint16 pairs."""
    q_len = rows.shape[-1]
    words = 2 * math.ceil(q_len / 32)
    halves = torch.zeros(rows.shape[:-1] + (words,), dtype=torch.int32)
    for j in range(q_len):
        halves[..., j // 16] |= rows[..., j].to(torch.int32) << (j % 16)
    return halves.to(torch.int16).view(torch.uint16) if hasattr(torch, "uint16") else halves.to(torch.int16)


@pytest.mark.parametrize("ragged_rows", [False, True], ids=["batched_3d", "ragged_2d"])
def test_spec_bits_mask(ragged_rows):
    """xqa spec decode, q_len 40 (two uint32 words): prefix always visible, drafts per bit."""
    gen = torch.Generator().manual_seed(12)
    q_len, kv_lens = 40, [50, 45]
    draft = [torch.rand(q_len, q_len, generator=gen) < 0.5 for _ in kv_lens]
    packed = [pack_spec_rows(d) for d in draft]
    spec = torch.cat(packed) if ragged_rows else torch.stack(packed)
    case = Case([q_len] * 2, kv_lens, storage="paged", page_size=16,
                opts=dict(phase="spec_decode", mask="spec_bits", q_len_per_req=q_len, causal=True))
    problem, batch, ks, vs = build(case, seed=12, spec_mask=spec)
    full = [torch.cat([torch.ones(q_len, kv - q_len, dtype=torch.bool), d], dim=1) for d, kv in zip(draft, kv_lens)]
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32], custom=full)


def test_alibi_slopes_match_flashinfer_recipe():
    from backends.native._torch_ops import alibi_slopes
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(6).tolist() == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])
    assert alibi_slopes(12).tolist() == pytest.approx(alibi_slopes_paper(12))


@pytest.mark.parametrize("causal", [True, False])
def test_alibi(causal):
    case = Case(BASE_Q, BASE_KV, storage="paged", hq=6, hkv=2, opts=dict(causal=causal, pos_encoding="ALIBI"))
    problem, batch, ks, vs = build(case, seed=13)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])


def test_alibi_enters_before_the_soft_cap():
    """FlashInfer's order (include/flashinfer/attention/variants.cuh DefaultAttention): the bias is added to
    the scaled logits, then the cap applies to their sum; q_len != kv_len, so the raw row index shows."""
    case = Case(BASE_Q, BASE_KV, storage="ragged", hq=4, hkv=2,
                opts=dict(causal=True, pos_encoding="ALIBI", logits_soft_cap=2.0))
    problem, batch, ks, vs = build(case, seed=16)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])


def test_rope_llama():
    case = Case(BASE_Q, BASE_KV, storage="paged", dqk=16, dvo=8,
                opts=dict(causal=True, pos_encoding="ROPE_LLAMA", rope_theta=500.0, rope_scale=2.0))
    problem, batch, ks, vs = build(case, seed=14)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])


def test_head_dim_qk_differs_from_vo():
    case = Case(BASE_Q, BASE_KV, storage="ragged", dqk=24, dvo=8, opts=dict(causal=True))
    problem, batch, ks, vs = build(case, seed=15)
    assert batch.out.shape[-1] == 8
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])


def test_fully_masked_rows_give_zero_and_neg_inf():
    """Causal with q_len > kv_len: the first q_len - kv_len rows see nothing; kv_len 0 too."""
    case = Case([34, 3], [1, 0], storage="paged", page_size=1, opts=dict(causal=True))
    problem, batch, ks, vs = build(case, seed=16)
    run_reference(problem, batch)
    assert torch.equal(batch.out[:33], torch.zeros_like(batch.out[:33]))
    assert torch.isneginf(batch.lse[:33]).all() and torch.isneginf(batch.lse[34:]).all()
    assert torch.equal(batch.out[34:], torch.zeros_like(batch.out[34:]))
    g = case.hq // case.hkv
    torch.testing.assert_close(batch.out[33], vs[0][0].repeat_interleave(g, dim=0))
    q, k = batch.q[33].double(), ks[0][0].double().repeat_interleave(g, dim=0)
    want_lse = (q * k).sum(-1) * batch.sm_scale / math.log(2)
    torch.testing.assert_close(batch.lse[33].double(), want_lse, rtol=1e-5, atol=1e-5)


def test_chunked_equals_unchunked(monkeypatch):
    """Tiny tiles (3 rows x 5 keys) give the single-tile answer on a long-ish sequence."""
    sinks = torch.rand(4, generator=torch.Generator().manual_seed(17)) * 5
    case = Case([70, 9], [300, 130], storage="paged", page_size=8,
                opts=dict(causal=True, window_left=40, logits_soft_cap=5.0, pos_encoding="ALIBI"))
    problem, batch, ks, vs = build(case, seed=17, sinks=sinks)
    run_reference(problem, batch)
    whole_out, whole_lse = batch.out.clone(), batch.lse.clone()
    monkeypatch.setattr(ref_mod, "Q_CHUNK", 3)
    monkeypatch.setattr(ref_mod, "KV_CHUNK", 5)
    problem, batch, ks, vs = build(case, seed=17, sinks=sinks)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])
    torch.testing.assert_close(batch.out, whole_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(batch.lse, whole_lse, rtol=1e-5, atol=1e-6)


def test_tile_rows_shrink_under_the_element_budget(monkeypatch):
    monkeypatch.setattr(ref_mod, "MAX_TILE_ELEMS", 4 * 2 * ref_mod.KV_CHUNK)
    assert ref_mod._rows_per_block(4) == 2
    case = Case([9], [20], hq=4, hkv=1, opts=dict(causal=True))
    problem, batch, ks, vs = build(case, seed=18)
    assert_matches(problem, batch, ks, vs, BANDS[torch.float32])


def test_argument_errors_name_the_argument():
    case = Case([2], [3], storage="paged")
    problem, batch, _, _ = build(case)
    batch.block_table = None
    with pytest.raises(ValueError, match="block_table"):
        run_reference(problem, batch)
    case = Case([2], [3], opts=dict(mask="custom"))
    problem, batch, _, _ = build(case, custom_masks=[torch.ones(2, 3, dtype=torch.uint8)])
    with pytest.raises(TypeError, match="custom_mask dtype"):
        run_reference(problem, batch)


def test_check_refuses_cuda_graph_only():
    cpu = DeviceDesc(name="cpu", kind="cpu")
    problem, _, _, _ = build(Case([1], [2]))
    backend = get_backend("reference")
    assert backend.check(problem, cpu) == []
    graph = replace(problem, cuda_graph=True)
    assert [r.field for r in backend.check(graph, cpu)] == ["cuda_graph"]
    odd_rope = replace(problem, pos_encoding="ROPE_LLAMA", head_dim_qk=15)
    assert [r.field for r in backend.check(odd_rope, cpu)] == ["head_dim_qk"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors():
    case = Case(BASE_Q, BASE_KV, storage="paged", q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                opts=dict(causal=True, window_left=5, pos_encoding="ROPE_LLAMA"))
    problem, batch, ks, vs = build(case, seed=19)
    for name in ("q", "k", "v", "qo_indptr", "kv_lens", "out", "lse", "block_table"):
        setattr(batch, name, getattr(batch, name).cuda())
    run_reference(replace(problem, device_type="cuda"), batch)
    want, _ = expected(problem, batch, ks, vs)
    assert rel_err(batch.out.cpu(), want) < BANDS[torch.bfloat16]


@pytest.mark.parametrize("storage", ["paged", "ragged"])
@pytest.mark.parametrize("phase,lens", [("prefill", ((6, 3, 5), (4, 9, 33))), ("decode", ((1, 1, 1), (17, 1, 64)))])
def test_reference_and_the_one_oracle_agree_on_sinks(storage, phase, lens):
    """backends/native/reference.py and dispatch/benchmark/oracle.py must share the LSE-with-sinks
    convention (the sink's term in the LSE; a fully masked row's LSE is sink / ln 2): fails if either
    drifts. Random inputs (dispatch/inputs.make_batch), out and LSE poisoned with NaN first."""
    from dispatch.benchmark.oracle import reference_of_batch, relative_error
    from dispatch.inputs import Case as InputCase
    from dispatch.inputs import make_batch

    problem = AttentionProblem(entry="test", phase=phase, kv_storage=storage, kv_layout="NHD", num_qo_heads=4,
                               num_kv_heads=2, head_dim_qk=16, head_dim_vo=16, q_dtype="float32", kv_dtype="float32",
                               out_dtype="float32", page_size=4 if storage == "paged" else 0, causal=True,
                               has_sinks=True, return_lse=True)
    batch = make_batch(InputCase("sinks", problem, *lens), "cpu", seed=len(lens[0]) + 5)
    batch.sinks = batch.sinks * 3  # large enough to move the LSE well beyond the band
    run_reference(problem, batch)
    ref_out, ref_lse = reference_of_batch(problem, batch)
    assert relative_error(batch.out, ref_out) < BANDS[torch.float32]
    assert relative_error(batch.lse, ref_lse) < BANDS[torch.float32]
    assert torch.isfinite(batch.lse).all()  # every row has the sink in its denominator
    _, keys_only = reference_of_batch(replace(problem, has_sinks=False), batch)  # the LSE without the sink's term
    assert relative_error(batch.lse, keys_only) > 10 * BANDS[torch.float32]
