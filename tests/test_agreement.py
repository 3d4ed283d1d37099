"""Every entry point x every scenario it supports, against the independent fp64 oracle.

Ids: ``<entry>-<scenario>-<dtype>-<backend>``. Backends come from AGREEMENT_BACKENDS
(default "reference,native-triton"); each runs under ``dispatch.use_backend(name)``.
native-triton params carry the ``native_triton`` mark: they are collected and run
(never skipped); select or deselect them with ``-m``.

Checks per case: rel. Frobenius error within the METHOD band (fp32 < 1e-5,
fp16/bf16 < 1e-2, fp8 KV < 6e-2) plus a max-abs sanity bound; every element of a
NaN-poisoned ``out`` written and the provided buffers returned as themselves; LSE
finite where expected and -inf on fully masked rows; inputs unchanged; the xqa
workspace left zero.
"""
from __future__ import annotations

import os
import zlib

import pytest
import torch

import dispatch
from scenarios import FP8, SCENARIOS, Setup, build

BACKENDS = [b.strip() for b in os.environ.get("AGREEMENT_BACKENDS", "reference,native-triton").split(",") if b.strip()]
BAND_FP32, BAND_HALF, BAND_FP8 = 1e-5, 1e-2, 6e-2
# LSE (base 2) abs + rel tolerance: a few ulps of the input dtype times the logit size, since an
# implementation may round intermediate operands (e.g. RoPE-rotated q/k) to the input dtype.
LSE_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _backend_params():
    return [pytest.param(b, id=b, marks=[pytest.mark.native_triton] if b == "native-triton" else [])
            for b in BACKENDS]


def _case_params():
    return [pytest.param(entry, name, dtype, id=f"{entry}-{name}-{dtype}")
            for name, sc in SCENARIOS.items() for entry, dtypes in sc.dtypes.items() for dtype in dtypes]


def _seed(*parts) -> int:
    return zlib.crc32("-".join(parts).encode())


def _snapshot(inputs: dict) -> dict:
    return {name: (t.detach().clone(), t.shape, t.stride()) for name, t in inputs.items()}


def _same(a: torch.Tensor, before) -> bool:
    """Same values, shape and strides (no in-place edit, no resize) as when snapshotted."""
    copy, shape, stride = before
    if a.shape != shape or a.stride() != stride:
        return False
    if a.dtype in (FP8, torch.float8_e5m2):
        a, copy = a.contiguous().view(torch.uint8), copy.contiguous().view(torch.uint8)
    return bool(torch.equal(a, copy))


def _band(case) -> float:
    if case.fp8:
        return BAND_FP8
    return BAND_FP32 if case.out_dtype == torch.float32 else BAND_HALF


def _run_case(case, backend):
    before = _snapshot(case.inputs)
    try:
        with dispatch.use_backend(backend):
            result = case.call()
    except dispatch.BackendRefusedError as exc:
        if backend == "reference":
            raise  # the reference accepts every valid problem: a refusal is a bug
        pytest.skip(f"{backend} declines this problem (an honest refusal, reported, not a pass): {exc}")
    changed = [name for name, t in case.inputs.items() if not _same(t, before[name])]
    assert not changed, f"the call modified its inputs: {changed}"
    for name, buf in case.zero_buffers.items():
        written = int(torch.count_nonzero(buf))
        assert written == 0, f"{name} must stay zero (semaphores): {written} bytes written"
    return case.unpack(result)


def check_out(case, out: torch.Tensor) -> None:
    ref = case.expected.out
    if case.out_buffer is not None:
        assert out is case.out_buffer, "the entry must write the provided `out` and return that object"
    assert out.dtype == case.out_dtype, f"out dtype {out.dtype}, expected {case.out_dtype}"
    assert tuple(out.shape) == tuple(ref.shape), f"out shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    got = out.double()
    unwritten = int(torch.isnan(got).sum())
    assert unwritten == 0, f"{unwritten} of {got.numel()} output elements left NaN (not written)"
    band = _band(case)
    err = torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)
    assert err < band, f"rel. Frobenius error {err:.3e} >= {band:g}"
    max_abs = (got - ref).abs().max().item() if ref.numel() else 0.0
    bound = 10 * band * max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
    assert max_abs <= bound, f"max abs error {max_abs:.3e} > {bound:.3e} (a localized error)"


def check_lse(case, lse) -> None:
    exp = case.expected.lse
    if exp is None:
        assert lse is None, "an LSE was returned although none was asked for"
        return
    assert lse is not None, "no LSE returned"
    if case.lse_buffer is not None:
        assert lse is case.lse_buffer, "the entry must write the provided `lse` and return that object"
    assert lse.dtype == torch.float32 and tuple(lse.shape) == tuple(exp.shape), \
        f"lse {lse.dtype} {tuple(lse.shape)}, expected float32 {tuple(exp.shape)}"
    rows = case.expected.lse_rows if case.expected.lse_rows is not None else torch.ones_like(exp, dtype=torch.bool)
    got, exp = lse.double()[rows], exp[rows]
    masked = torch.isneginf(exp)
    assert torch.equal(torch.isneginf(got), masked), \
        f"-inf LSE rows differ: got {int(torch.isneginf(got).sum())}, expected {int(masked.sum())} (fully masked rows)"
    assert torch.all(torch.isfinite(got[~masked])), "LSE not finite where the row has keys"
    tol = LSE_TOL[case.out_dtype] if not case.fp8 else LSE_TOL[torch.bfloat16]
    err = (got[~masked] - exp[~masked]).abs() - tol * exp[~masked].abs()
    assert err.numel() == 0 or err.max().item() <= tol, f"LSE (base 2) off by up to {err.max().item() + tol:.3e}"


@pytest.mark.parametrize("backend", _backend_params())
@pytest.mark.parametrize("entry,name,dtype", _case_params())
def test_agreement(entry, name, dtype, backend):
    case = SCENARIOS[name](entry, dtype, _seed(entry, name, dtype))
    out, lse = _run_case(case, backend)
    check_out(case, out)
    check_lse(case, lse)


@pytest.mark.parametrize("backend", _backend_params())
@pytest.mark.parametrize("entry", ["cudnn", "trtllm", "xqa", "paged", "single"])
def test_scale_is_not_cached_with_the_plan(entry, backend):
    """Same shapes, two scales (cuDNN graph-cache-key test): both results must follow their scale."""
    for sm_scale in (0.05, 0.3):
        setup = Setup(q_lens=[3, 2] if entry != "xqa" else [1, 1], kv_lens=[9, 12], sm_scale=sm_scale)
        case = build(entry, setup, "bf16", _seed(entry, "scale-cache"))
        out, _ = _run_case(case, backend)
        check_out(case, out)


def test_every_entry_has_scenarios():
    entries = {e for sc in SCENARIOS.values() for e in sc.dtypes}
    assert entries == {"cudnn", "trtllm", "xqa", "paged", "ragged", "single", "single_lse"}
