"""FlashInfer's finite-sentinel regression tests, through every entry point and every backend.

Ported from FlashInfer's tests/attention/test_single_prefill.py (main after 0.6.18, PR #4401):
``test_single_prefill_extreme_negative_logits`` (every raw logit q.k at a target far below
FlashInfer's old -5e4 mask sentinel, key 0 higher by 1024: the answer is ~v[0], never zeros) and
``test_single_prefill_masked_key_never_dominates`` (masked keys carry the largest logits: they
must not leak). Here each runs through single (with and without LSE), the paged and ragged
wrappers, xqa, cudnn and trtllm, checked against the fp64 oracle (dispatch/benchmark/oracle.py) within
the contract's band; plus fully masked rows (out 0, LSE -inf).

Backends: on the CPU reference and native-triton (Triton's interpreter; small sizes); on a GPU
every registered backend, forced (``backend=`` where the entry has it, else ``dispatch.use_backend``).
A backend that is not installed or refuses the call is a SKIP with its reason; a backend whose
installed provider has a known defect covering the case (capability_db/defects.json) is an XFAIL
naming it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import capability_db
import dispatch
from backends import get_backend
from backends._providers import installed_defects
from dispatch.benchmark import oracle
from _calls import forced_or_skip

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
BACKENDS = capability_db.BACKEND_NAMES if GPU else ("reference", "native-triton")
# FlashInfer's sizes on a GPU; small ones under Triton's interpreter.
EXTREME = dict(hq=16, hkv=1, d=128, kv=64) if GPU else dict(hq=2, hkv=1, d=32, kv=16)
MASKED = dict(hq=4, hkv=1, d=128, q=32) if GPU else dict(hq=2, hkv=1, d=32, q=12)
PAGE = 16 if GPU else 4
LOGITS = (-1e4, -5e4, -5.5e4, -6e4, -1e5, -2e5, -2.45e5)
DTYPES = (torch.float16, torch.bfloat16)
ENTRIES = ("single", "single_lse", "paged", "ragged", "xqa", "cudnn", "trtllm")
POISON_K, POISON_V = 64.0, 1e3  # the page tail beyond the keys: the largest logits, huge values


@dataclass
class Case:
    q: torch.Tensor  # (L, Hq, D)
    k: torch.Tensor  # (S, Hkv, D)
    v: torch.Tensor
    causal: bool
    window_left: int = -1

    @property
    def scale(self) -> float:
        return self.q.shape[-1] ** -0.5

    def oracle(self):
        return oracle.attention_fp64(self.q, self.k, self.v, sm_scale=self.scale, causal=self.causal,
                                     window_left=self.window_left)


def paged_cache(c: Case):
    """NHD cache (pages, 2, P, Hkv, D), pages stored in reverse order; the last page's tail poisoned."""
    s, hkv, d = c.k.shape
    n = math.ceil(s / PAGE)
    kv = torch.empty(n, 2, PAGE, hkv, d, dtype=c.k.dtype, device=DEV)
    kv[:, 0], kv[:, 1] = POISON_K, POISON_V  # q > 0 in every case here: the largest logits
    order = torch.arange(n - 1, -1, -1, dtype=torch.int32, device=DEV)
    for i in range(n):
        rows = slice(i * PAGE, min(s, (i + 1) * PAGE))
        width = rows.stop - rows.start
        kv[order[i], 0, :width], kv[order[i], 1, :width] = c.k[rows], c.v[rows]
    return kv, order


def indptr(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEV)


def run_entry(entry: str, backend: str, c: Case):
    """(out, lse or None) of one entry point with ``backend`` forced."""
    (L, hq, d), (S, hkv, _) = c.q.shape, c.k.shape
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=DEV)
    if entry in ("single", "single_lse"):
        res = dispatch.single_prefill_with_kv_cache(c.q, c.k, c.v, causal=c.causal, window_left=c.window_left,
                                                    sm_scale=c.scale, return_lse=entry == "single_lse",
                                                    backend=backend)
        return res if entry == "single_lse" else (res, None)
    if entry == "ragged":
        w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(indptr(0, L), indptr(0, S), hq, hkv, d, causal=c.causal, window_left=c.window_left,
               sm_scale=c.scale, q_data_type=c.q.dtype)
        return w.run(c.q, c.k, c.v, return_lse=True)
    cache, order = paged_cache(c)
    n, last = cache.shape[0], (S - 1) % PAGE + 1
    table, seq = order.view(1, -1), indptr(S)
    if entry == "paged":
        w = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(indptr(0, L), indptr(0, n), order, indptr(last), hq, hkv, d, PAGE, causal=c.causal,
               window_left=c.window_left, sm_scale=c.scale, q_data_type=c.q.dtype)
        return w.run(c.q, cache, return_lse=True)
    if entry == "cudnn":
        k, v = cache[:, 0].transpose(1, 2), cache[:, 1].transpose(1, 2)  # (pages, Hkv, P, D) views
        out, lse = dispatch.cudnn_batch_prefill_with_kv_cache(
            c.q, k, v, c.scale, ws, max_token_per_sequence=L, max_sequence_kv=S,
            actual_seq_lens_q=indptr(L).view(1, 1, 1, 1), actual_seq_lens_kv=seq.view(1, 1, 1, 1),
            block_tables=table, causal=c.causal, return_lse=True, batch_offsets_q=indptr(0, L * hq * d),
            batch_offsets_o=indptr(0, L * hq * d), backend=backend)
        return out, lse[0]  # lse (batch, max_token_per_sequence, Hq): one request
    with dispatch.use_backend(backend):
        if entry == "xqa":
            if L != 1:
                pytest.skip("xqa is decode: one query row per request")
            return dispatch.xqa_batch_decode_with_kv_cache(c.q, cache, ws, table, seq, S, bmm1_scale=c.scale,
                                                           bmm2_scale=1.0, window_left=c.window_left), None
        return dispatch.trtllm_batch_context_with_kv_cache(
            c.q, cache, ws, table, seq, L, S, c.scale, 1.0, 1, indptr(0, L), indptr(0, n), window_left=c.window_left,
            kv_layout="NHD", causal=c.causal, return_lse=True)


def forced(entry: str, backend: str, c: Case):
    return forced_or_skip(backend, entry, lambda: run_entry(entry, backend, c))


# The recorded defects (capability_db/defects.json) an extreme-logit case can hit, by the raw logit.
HITS = {"flashinfer-finite-mask-sentinel": lambda target: target + 1024 < -5e4,
        "xqa-nonfinite-at-extreme-logits": lambda target: target <= -2e5}


def xfail_known_defect(backend: str, target: float, decode: bool = False) -> None:
    """A known defect of the installed provider (capability_db/defects.json) that this case hits:
    an expected failure naming it (auto never chooses that backend; an explicit choice warns) unless
    the adapter guards it on decode (Backend.guards: xqa's fix-up), where the answer must be right."""
    for d in _defects(backend):
        if d.id in HITS and HITS[d.id](target) and not (decode and d.id in get_backend(backend).guards):
            pytest.xfail(f"{backend}: known defect {d.id} ({d.versions.text()})")


def _defects(backend: str):
    try:
        return installed_defects(get_backend(backend))
    except Exception:  # noqa: BLE001 - an adapter that cannot even import has no provider version
        return []


def check(c: Case, out: torch.Tensor, lse: Optional[torch.Tensor], rows=slice(None)) -> None:
    ref_out, ref_lse = c.oracle()
    assert out.shape == ref_out.shape and not out.isnan().any()
    got, ref = out[rows].double().cpu(), ref_out[rows].cpu()
    assert got.norm() > 0, "all zeros: valid logits read as masked"
    band = oracle.band(str(c.q.dtype).removeprefix("torch."), str(c.k.dtype).removeprefix("torch."))
    err = oracle.relative_error(got, ref)
    assert err < band, f"relative error {err:.3g} >= band {band}"
    if lse is not None:
        lse, ref_lse = lse.double().cpu(), ref_lse.cpu()
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "LSE -inf rows differ"
        fin = torch.isfinite(ref_lse)
        assert ((lse[fin] - ref_lse[fin]).abs() <= 1e-4 * ref_lse[fin].abs() + 1e-3).all(), \
            f"LSE off: {lse[fin][:4].tolist()} vs {ref_lse[fin][:4].tolist()}"


def extreme_case(target: float, dtype: torch.dtype, gen: torch.Generator) -> Case:
    """FlashInfer's fixture: q = 1, every raw q.k = target, key 0 at target + 1024; v random."""
    hq, hkv, d, kv = EXTREME["hq"], EXTREME["hkv"], EXTREME["d"], EXTREME["kv"]
    q = torch.ones(1, hq, d, dtype=dtype, device=DEV)
    k = torch.full((kv, hkv, d), target / d, dtype=dtype, device=DEV)
    k[0] = (target + 1024.0) / d
    v = torch.randn(kv, hkv, d, generator=gen).to(device=DEV, dtype=dtype)
    return Case(q, k, v, causal=False)


@pytest.mark.parametrize("target", LOGITS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_extreme_negative_logits(backend, entry, dtype, target):
    c = extreme_case(target, dtype, torch.Generator().manual_seed(int(-target) % 9973))
    out, lse = forced(entry, backend, c)
    xfail_known_defect(backend, target, decode=c.q.shape[0] == 1)
    check(c, out, lse)


def masked_case(dtype: torch.dtype, gen: torch.Generator, decode: bool) -> Case:
    """FlashInfer's fixture: valid keys give q.k = -64, masked ones +512 (and the page tail +64 x
    huge values). Prefill: causal over q = kv rows, the later half of the keys dominant. Decode
    (one row, xqa): a window, the keys before it dominant."""
    hq, hkv, d, n = MASKED["hq"], MASKED["hkv"], MASKED["d"], MASKED["q"]
    rows = 1 if decode else n
    q = torch.full((rows, hq, d), 8.0 / d, dtype=dtype, device=DEV)
    k = torch.full((n, hkv, d), -8.0, dtype=dtype, device=DEV)
    v = torch.randn(n, hkv, d, generator=gen).to(device=DEV, dtype=dtype)
    if decode:
        k[: n // 2] = 64.0
        return Case(q, k, v, causal=True, window_left=n - n // 2 - 1)
    k[n // 2:] = 64.0
    return Case(q, k, v, causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_key_never_dominates(backend, entry, dtype):
    gen = torch.Generator().manual_seed(5)
    c = masked_case(dtype, gen, decode=entry == "xqa")
    check(c, *forced(entry, backend, c))
    if entry not in ("xqa", "cudnn"):  # the decode row alone, through a window (the cudnn entry has none)
        c = masked_case(dtype, gen, decode=True)
        check(c, *forced(entry, backend, c))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("entry", [e for e in ENTRIES if e not in ("single", "xqa")])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_give_zero_and_lse_minus_inf(backend, entry, dtype):
    """Bottom-right causal with more queries than keys: the first rows see no key at all."""
    gen = torch.Generator().manual_seed(11)
    hq, hkv, d = MASKED["hq"], MASKED["hkv"], MASKED["d"]
    kv, extra = 5, 3
    q = torch.randn(kv + extra, hq, d, generator=gen).to(device=DEV, dtype=dtype)
    k, v = (torch.randn(kv, hkv, d, generator=gen).to(device=DEV, dtype=dtype) for _ in range(2))
    c = Case(q, k, v, causal=True)
    out, lse = forced(entry, backend, c)
    assert torch.equal(out[:extra].float().cpu(), torch.zeros_like(out[:extra].float().cpu())), \
        "fully masked rows must be 0"
    assert lse is not None and torch.isneginf(lse[:extra]).all(), "fully masked rows: LSE -inf"
    check(c, out, lse, rows=slice(extra, None))
