"""FlashInfer 0.7's newer parameters on our entry points, checked on the CPU against the fp64 oracle.

- ``lse_base`` / ``lse_layout`` on both wrappers' ``run`` and ``lse_base`` on the cuDNN entry
  (flashinfer 0.7.1): ``"ln"`` is the base-2 LSE times ln 2, ``"HN"`` its contiguous
  (num_qo_heads, tokens) transpose; a caller's ``lse`` (and ``out``) buffer, poisoned with NaN, is
  written in the asked layout; defaults stay the seeds' base 2 (tokens, heads).
- ``variant_owns_mask`` on both wrappers' constructors (0.7.0): only meaningful with a JIT variant
  (refused here), so ``False`` is served and ``True`` refused, naming it.
- ``backend`` on ``trtllm_batch_context_with_kv_cache`` (0.7.0): an explicit choice as elsewhere.
- ``actual_seq_lens_q/kv`` of the cuDNN entry may be left out where the offsets imply them, and
  ``backend="cubin"`` chooses cuDNN's kernels (our cuDNN backend).

Bad values raise before anything runs: the caller's NaN-poisoned buffers stay NaN.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

import dispatch
from _api_cases import D, HKV, HQ, P, cudnn_args, paged, ragged, trtllm_args, ws
from oracle import LN2, batch_attention_fp64

BASES = ["log2", "ln"]
LAYOUTS = ["NH", "HN"]
BACKENDS = ["reference", pytest.param("native-triton", marks=pytest.mark.native_triton)]
TOL = dict(atol=2e-5, rtol=2e-5)


def _nan(*shape):
    return torch.full(shape, float("nan"))


def _paged_kv(c, b):
    """Request b's keys and values out of the 5-D NHD cache through its block-table row."""
    n = c["kv_lens"][b]
    pages = c["table"][b, : -(-n // P)].long()
    return c["cache"][pages, 0].reshape(-1, HKV, D)[:n], c["cache"][pages, 1].reshape(-1, HKV, D)[:n]


def _oracle_paged(c):
    kvs = [_paged_kv(c, b) for b in range(len(c["q_lens"]))]
    return batch_attention_fp64(list(c["q"].split(c["q_lens"])), [k for k, _ in kvs], [v for _, v in kvs],
                                sm_scale=D ** -0.5, causal=True)


def _oracle_ragged(r):
    return batch_attention_fp64(list(r["q"].split(r["q_lens"])), list(r["k"].split(r["kv_lens"])),
                                list(r["v"].split(r["kv_lens"])), sm_scale=D ** -0.5, causal=True)


def _asked(lse_fp64_base2, base, layout):
    """The oracle's LSE in the asked base and layout."""
    lse = lse_fp64_base2 * (LN2 if base == "ln" else 1.0)
    return lse.t() if layout == "HN" else lse


def _lse_buffer(layout, tokens):
    return _nan(HQ, tokens) if layout == "HN" else _nan(tokens, HQ)


def _wrapper(kind, backend):
    if kind == "paged":
        c = paged()
        w = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws(), "NHD", backend=backend)
        w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, P, causal=True, q_data_type=torch.float32)
        return w, (c["q"], c["cache"]), _oracle_paged(c)
    r = ragged()
    w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(ws(), "NHD", backend=backend)
    w.plan(r["qo"], r["kv"], HQ, HKV, D, causal=True, q_data_type=torch.float32)
    return w, (r["q"], r["k"], r["v"]), _oracle_ragged(r)


# -- lse_base / lse_layout on the wrappers --------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("given", [False, True], ids=["allocated", "caller-buffers"])
def test_wrapper_lse_in_the_asked_base_and_layout(backend, kind, base, layout, given):
    w, inputs, (want_out, want_lse) = _wrapper(kind, backend)
    tokens = want_out.shape[0]
    out, lse = (_nan(tokens, HQ, D), _lse_buffer(layout, tokens)) if given else (None, None)
    got_out, got_lse = w.run(*inputs, return_lse=True, out=out, lse=lse, lse_base=base, lse_layout=layout)
    assert w.decision.chosen == backend
    if given:
        assert got_out is out and got_lse is lse
    shape = (HQ, tokens) if layout == "HN" else (tokens, HQ)
    assert got_lse.shape == shape and got_lse.dtype == torch.float32 and got_lse.is_contiguous()
    torch.testing.assert_close(got_out.double(), want_out, **TOL)
    torch.testing.assert_close(got_lse.double(), _asked(want_lse, base, layout), **TOL)


@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("base, layout", [("ln", "NH"), ("log2", "HN"), ("ln", "HN")])
def test_a_given_lse_without_return_lse_is_written_as_asked(kind, base, layout):
    w, inputs, (want_out, want_lse) = _wrapper(kind, "reference")
    lse = _lse_buffer(layout, want_out.shape[0])
    got = w.run(*inputs, lse=lse, lse_base=base, lse_layout=layout)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got.double(), want_out, **TOL)
    torch.testing.assert_close(lse.double(), _asked(want_lse, base, layout), **TOL)


@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_defaults_stay_base_2_tokens_by_heads(kind):
    w, inputs, (_, want_lse) = _wrapper(kind, "reference")
    _, default = w.run(*inputs, return_lse=True)
    _, spelled = w.run(*inputs, return_lse=True, lse_base="log2", lse_layout="NH")
    torch.testing.assert_close(default.double(), want_lse, **TOL)
    assert torch.equal(default, spelled)
    assert isinstance(w.run(*inputs, lse_base="ln", lse_layout="HN"), torch.Tensor)  # no LSE asked: out only


@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("kw, blamed", [
    (dict(lse_base="e"), "lse_base='e'"),
    (dict(lse_base="LN"), "lse_base='LN'"),
    (dict(lse_layout="NHD"), "lse_layout='NHD'"),
    (dict(lse_layout="HN", lse=_nan(9, HQ)), "lse.shape=(9, 4): allowed (4, 9)"),
    (dict(lse_layout="HN", lse=_nan(9, HQ).t()), "lse.stride()=(1, 4): allowed contiguous"),
    (dict(lse_layout="HN", lse=_nan(HQ, 9).double()), "lse.dtype=float64"),
    (dict(lse_layout="NH", lse_base="ln", lse=_nan(HQ, 9)), "lse.shape=(4, 9)"),
])
def test_bad_lse_options_raise_before_anything_runs(kind, kw, blamed):
    w, inputs, _ = _wrapper(kind, "reference")
    out, kw = _nan(9, HQ, D), dict(kw)
    lse = kw.pop("lse", None)
    if lse is not None:
        lse.fill_(float("nan"))
    with pytest.raises(ValueError, match="^" + re.escape(blamed)):
        w.run(*inputs, return_lse=True, out=out, lse=lse, **kw)
    assert out.isnan().all() and (lse is None or lse.isnan().all())


# -- variant_owns_mask ------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [dispatch.BatchPrefillWithPagedKVCacheWrapper,
                                 dispatch.BatchPrefillWithRaggedKVCacheWrapper])
def test_variant_owns_mask_false_is_served_true_refused(cls):
    cls(ws(), "NHD", variant_owns_mask=False)
    for value in (True, 1):
        with pytest.raises(ValueError, match=r"^variant_owns_mask=(True|1): allowed False \(True needs a custom "
                                             r"attention variant through jit_args"):
            cls(ws(), "NHD", variant_owns_mask=value)


def test_variant_owns_mask_false_plans_and_runs_as_without_it():
    c = paged()
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws(), "NHD", variant_owns_mask=False)
    w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, P, causal=True, q_data_type=torch.float32)
    want_out, _ = _oracle_paged(c)
    torch.testing.assert_close(w.run(c["q"], c["cache"]).double(), want_out, **TOL)


# -- the cuDNN entry: lse_base, lengths left out, backend="cubin" ---------------------------------
def _padded(lse_packed, q_lens, max_q):
    want = torch.full((len(q_lens), max_q, HQ), float("-inf"), dtype=torch.float64)
    for b, rows in enumerate(lse_packed.split(q_lens)):
        want[b, : rows.shape[0]] = rows
    return want


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("given", [False, True], ids=["allocated", "caller-buffers"])
def test_cudnn_entry_lse_base(backend, base, given):
    c = paged()
    want_out, want_lse = _oracle_paged(c)
    b, max_q = len(c["q_lens"]), max(c["q_lens"])
    out, lse = (_nan(9, HQ, D), _nan(b, max_q, HQ)) if given else (None, None)
    args, kw = cudnn_args(c, return_lse=True, out=out, lse=lse, lse_base=base, backend=backend)
    got_out, got_lse = dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    assert dispatch.last_decision().chosen == backend
    if given:
        assert got_out is out and got_lse is lse
    torch.testing.assert_close(got_out.double(), want_out, **TOL)
    torch.testing.assert_close(got_lse.double(), _padded(_asked(want_lse, base, "NH"), c["q_lens"], max_q), **TOL)


def test_cudnn_entry_bad_lse_base_changes_nothing():
    c = paged()
    out, lse = _nan(9, HQ, D), _nan(3, 5, HQ)
    args, kw = cudnn_args(c, return_lse=True, out=out, lse=lse, lse_base="e")
    with pytest.raises(ValueError, match=r"^lse_base='e': allowed 'log2'"):
        dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    assert out.isnan().all() and lse.isnan().all()


def _ragged_cudnn(r, units, **kw):
    rows_q, rows_k = (1, 1) if units == "tokens" else (HQ * D, HKV * D)
    return dispatch.cudnn_batch_prefill_with_kv_cache(
        r["q"], r["k"], r["v"], D ** -0.5, ws(), max_token_per_sequence=max(r["q_lens"]),
        max_sequence_kv=max(r["kv_lens"]), causal=True, return_lse=True, batch_offsets_q=r["qo"] * rows_q,
        batch_offsets_k=r["kv"] * rows_k, batch_offsets_units=units, **kw)


@pytest.mark.parametrize("units", ["tokens", "elements"])
def test_cudnn_entry_lengths_left_out_come_from_the_offsets(units):
    """FlashInfer 0.7 defaults actual_seq_lens_q/kv to None: the lengths are the offsets' spans."""
    r = ragged()
    want_out, want_lse = _oracle_ragged(r)
    got_out, got_lse = _ragged_cudnn(r, units)
    torch.testing.assert_close(got_out.double(), want_out, **TOL)
    torch.testing.assert_close(got_lse.double(), _padded(want_lse, r["q_lens"], max(r["q_lens"])), **TOL)


def test_cudnn_entry_paged_kv_still_needs_its_lengths():
    c = paged()
    out = _nan(9, HQ, D)
    args, kw = cudnn_args(c, return_lse=True, out=out)
    del kw["actual_seq_lens_kv"]
    with pytest.raises(ValueError, match=r"^actual_seq_lens_kv=None: allowed a \(B,1,1,1\) int32 tensor"):
        dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    assert out.isnan().all()


def test_cudnn_entry_cubin_is_our_cudnn_backend_chosen():
    """backend='cubin' is FlashInfer's choice of cuDNN's own kernels: our cuDNN backend, chosen
    explicitly (refused on the CPU, naming it), never 'is not a backend'."""
    c = paged()
    out = _nan(9, HQ, D)
    args, kw = cudnn_args(c, return_lse=True, out=out, backend="cubin")
    with pytest.raises(dispatch.BackendRefusedError, match=r"^backend 'cudnn' \(chosen by backend= argument\)"):
        dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    assert out.isnan().all()


# -- backend on the trtllm entry ---------------------------------------------------------------------
@pytest.mark.parametrize("backend, chosen", [("auto", "reference"), (None, "reference"), ("reference", "reference")])
def test_trtllm_backend_auto_or_ours(backend, chosen):
    c = paged()
    args, kw = trtllm_args(c)
    got = dispatch.trtllm_batch_context_with_kv_cache(*args, backend=backend, **kw)
    assert dispatch.last_decision().chosen == chosen
    torch.testing.assert_close(got.double(), _oracle_paged(c)[0], **TOL)


@pytest.mark.parametrize("backend, error, blamed", [
    ("trtllm-gen", dispatch.BackendRefusedError, r"^backend 'trtllm-gen' \(chosen by backend= argument\)"),
    ("cake", ValueError, r"^backend='cake' is not a backend; valid options are: auto, "),
])
def test_trtllm_backend_refused_changes_nothing(backend, error, blamed):
    c = paged()
    out = _nan(9, HQ, D)
    args, kw = trtllm_args(c)
    with pytest.raises(error, match=blamed):
        dispatch.trtllm_batch_context_with_kv_cache(*args, out=out, backend=backend, **kw)
    assert out.isnan().all()


def test_ln_is_base_2_times_ln2():
    assert LN2 == pytest.approx(math.log(2.0), abs=0)


@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_explain_with_lse_options_writes_nothing(kind):
    w, inputs, (want_out, _) = _wrapper(kind, "reference")
    out, lse = _nan(want_out.shape[0], HQ, D), _lse_buffer("HN", want_out.shape[0])
    decision = dispatch.explain(w, *inputs, return_lse=True, out=out, lse=lse, lse_base="ln", lse_layout="HN")
    assert decision.chosen == "reference" and decision.problem.return_lse
    assert out.isnan().all() and lse.isnan().all()
    c = paged()
    out, lse = _nan(9, HQ, D), _nan(3, 5, HQ)
    args, kw = cudnn_args(c, return_lse=True, out=out, lse=lse, lse_base="ln")
    assert dispatch.explain(dispatch.cudnn_batch_prefill_with_kv_cache, *args, **kw).chosen == "reference"
    assert out.isnan().all() and lse.isnan().all()


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_lse_options_under_torch_compile_match_eager(kind):
    """A compiled call converts the op's LSE the same way, into the caller's (Hq, tokens) buffer."""
    w, inputs, (want_out, _) = _wrapper(kind, "reference")
    tokens = want_out.shape[0]

    def step(*tensors):
        lse = torch.empty(HQ, tokens)
        out, got = w.run(*tensors, return_lse=True, lse=lse, lse_base="ln", lse_layout="HN")
        return out, got, lse
    eager, traced = step(*inputs), _compiled(step)(*inputs)
    assert traced[1].shape == (HQ, tokens) and torch.equal(traced[1], traced[2])
    for got, want in zip(traced, eager):
        assert torch.equal(got, want)


def test_cudnn_lse_base_under_torch_compile_matches_eager():
    args, kw = cudnn_args(paged(), return_lse=True, lse_base="ln")

    def step(*a):
        return dispatch.cudnn_batch_prefill_with_kv_cache(*a, **kw)
    eager, traced = step(*args), _compiled(step)(*args)
    assert all(torch.equal(g, e) for g, e in zip(traced, eager))
