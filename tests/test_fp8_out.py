"""fp8 e4m3 outputs through the entry points, as FlashInfer 0.7.2 serves them: out = bmm2_scale *
softmax(bmm1_scale * q.k) v (xqa's ``o_scale`` cancels inside), stored rounded to nearest even and
saturated at +-448 (FlashInfer's kernels convert with satfinite: a value past 448 stores 448, never
NaN). Served by native-triton (on the CPU through Triton's interpreter) and
the reference; each element within one e4m3 spacing of the fp64 oracle's rounding (oracle.stored_e4m3).
"""
from __future__ import annotations

import math
import os

import pytest
import torch

import dispatch
from oracle import BANDS, attention_fp64, e4m3_ulps_off, relative_error, stored_e4m3

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NATIVE = pytest.param("native-triton", marks=pytest.mark.skipif(
    DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1", reason="Triton on the CPU needs its interpreter"))
BACKENDS = [NATIVE, "reference"]


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == torch.float8_e4m3fn and not out.isnan().any(), "an element unwritten or NaN"
    assert e4m3_ulps_off(out, ref) <= 1.0
    assert relative_error(out, stored_e4m3(ref)) < BANDS["fp8"]


def _xqa(q, k_cache, v_cache, seq_lens, bmm2_scale, out_dtype=torch.float8_e4m3fn, o_scale=1.0):
    batch, per = len(seq_lens), k_cache.shape[0] // len(seq_lens)
    table = torch.arange(batch * per, dtype=torch.int32, device=DEVICE).reshape(batch, per)
    out = torch.full(q.shape, math.nan, dtype=out_dtype, device=DEVICE)
    dispatch.decode.xqa_batch_decode_with_kv_cache(
        q, (k_cache, v_cache), torch.empty(1 << 16, dtype=torch.uint8, device=DEVICE), table,
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE), max(seq_lens), q.shape[-1] ** -0.5, bmm2_scale,
        out=out, o_scale=o_scale)
    return out


def _decode_case(seed=0, batch=2, hkv=2, group=4, d=64, page=16, kv_len=40):
    g = torch.Generator().manual_seed(seed)
    per = -(-kv_len // page)
    q = torch.randn(batch, hkv * group, d, generator=g).to(torch.bfloat16).to(DEVICE)
    k = torch.randn(batch * per, page, hkv, d, generator=g).to(torch.bfloat16).to(DEVICE)
    v = torch.randn(batch * per, page, hkv, d, generator=g).to(torch.bfloat16).to(DEVICE)
    refs = [attention_fp64(q[b:b + 1].cpu(), k[b * per:(b + 1) * per].flatten(0, 1)[:kv_len].cpu(),
                           v[b * per:(b + 1) * per].flatten(0, 1)[:kv_len].cpu(), sm_scale=d ** -0.5, causal=True)[0]
            for b in range(batch)]
    return q, k, v, [kv_len] * batch, torch.cat(refs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_xqa_fp8_out_rounds_and_saturates_as_flashinfer(backend):
    """bmm2_scale 2000 puts most outputs past 448: they store 448 (with its sign), never NaN; the rest
    round to the nearest e4m3 value; o_scale cancels as in FlashInfer's XQA."""
    q, k, v, seq_lens, ref = _decode_case()
    with dispatch.use_backend(backend):
        out = _xqa(q, k, v, seq_lens, 2000.0, o_scale=0.7)
    ref = ref * 2000.0
    _check(out, ref)
    past = ref.abs() > 464  # beyond the rounding's reach of 448
    assert past.float().mean() > 0.3, "the case must reach past e4m3's range"
    assert torch.equal(out.double().cpu()[past], 448.0 * ref[past].sign())


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_prefill_o_dtype_fp8(backend):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(9, 4, 64, generator=g).to(torch.float16).to(DEVICE)
    k = torch.randn(21, 2, 64, generator=g).to(torch.float16).to(DEVICE)
    v = torch.randn(21, 2, 64, generator=g).to(torch.float16).to(DEVICE)
    with dispatch.use_backend(backend):
        out = dispatch.single_prefill_with_kv_cache(q, k, v, causal=True, o_dtype=torch.float8_e4m3fn)
    ref, _ = attention_fp64(q.cpu(), k.cpu(), v.cpu(), sm_scale=64 ** -0.5, causal=True)
    _check(out, ref)
