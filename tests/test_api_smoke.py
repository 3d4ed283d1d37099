"""Every entry point runs on CPU (reference backend) and returns the right objects, shapes, dtypes.

Numerical agreement with an fp64 oracle is tests/test_agreement.py's job; here each output is
checked to be fully written (NaN-poisoned buffers) and finite, and the returned objects are the
provided ones where FlashInfer promises that.
"""

import pytest
import torch

import dispatch
from _api_cases import (D, HKV, HQ, P, cudnn_args, paged, paged_wrapper, ragged, ragged_wrapper, trtllm_args,
                        xqa_args, ws)


def poisoned(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


def written(t):
    return not torch.isnan(t).any().item()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_trtllm_out_and_provided_lse(layout):
    c = paged(layout=layout)
    args, kw = trtllm_args(c, return_lse=True)
    kw["kv_layout"] = layout
    out, lse = poisoned(9, HQ, D), poisoned(9, HQ)
    got_out, got_lse = dispatch.trtllm_batch_context_with_kv_cache(*args, out=out, lse=lse, **kw)
    assert got_out is out and got_lse is lse and written(out) and written(lse)
    assert dispatch.last_decision().chosen == "reference"


def test_trtllm_fills_lse_without_return_lse():
    c = paged()
    args, kw = trtllm_args(c)
    lse = poisoned(9, HQ)
    out = dispatch.trtllm_batch_context_with_kv_cache(*args, lse=lse, **kw)
    assert isinstance(out, torch.Tensor) and out.shape == (9, HQ, D) and written(lse)


def test_trtllm_tuple_cache_matches_5d():
    c = paged()
    args, kw = trtllm_args(c)
    ref = dispatch.trtllm_batch_context_with_kv_cache(*args, **kw)
    args[1] = (c["cache"][:, 0], c["cache"][:, 1])
    assert torch.equal(dispatch.trtllm_batch_context_with_kv_cache(*args, **kw), ref)


def test_xqa_decode_and_spec_decode():
    c = paged()
    args, kw = xqa_args(c)
    out = dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    assert out.shape == (3, HQ, D) and out.dtype == torch.float32 and written(out)
    qlen = 2
    q = torch.randn(3 * qlen, HQ, D)
    bits = torch.tensor([[1, 0], [1, 1]], dtype=torch.int32)  # causal drafts, one uint32 word per row
    words = (bits * torch.tensor([1, 2], dtype=torch.int32)).sum(-1, keepdim=True)
    mask = torch.cat([words, torch.zeros_like(words)], -1).to(torch.uint16).expand(3, qlen, 2).contiguous()
    args[0] = q
    out = dispatch.xqa_batch_decode_with_kv_cache(*args, q_len_per_req=qlen, mask=mask, out=poisoned(6, HQ, D))
    assert out.shape == (6, HQ, D) and written(out)
    assert dispatch.explain(dispatch.xqa_batch_decode_with_kv_cache, *args, q_len_per_req=qlen,
                            mask=mask).problem.phase == "spec_decode"


def test_cudnn_paged_returns_tuple_and_padded_base2_lse():
    c = paged()
    args, kw = cudnn_args(c, return_lse=True)
    out, lse = dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)
    assert out.shape == (9, HQ, D) and lse.shape == (3, 5, HQ) and lse.dtype == torch.float32
    for b, n in enumerate(c["q_lens"]):
        assert torch.isfinite(lse[b, :n]).all() and torch.isneginf(lse[b, n:]).all()
    wr = paged_wrapper(c)
    _, packed = wr.run(c["q"], c["cache"], return_lse=True)
    assert torch.allclose(lse[0, :3], packed[:3], atol=1e-5)  # same base-2 values, padded layout
    out2, none = dispatch.cudnn_batch_prefill_with_kv_cache(*args, **{**kw, "return_lse": False})
    assert none is None and torch.equal(out2, out)


def test_cudnn_ragged_token_units():
    c = ragged()
    b = 3
    kw = dict(max_token_per_sequence=5, max_sequence_kv=13, causal=True, return_lse=False,
              batch_offsets_q=c["qo"], batch_offsets_o=c["qo"], batch_offsets_k=c["kv"],
              batch_offsets_units="tokens", actual_seq_lens_kv=torch.tensor(c["kv_lens"], dtype=torch.int32),
              actual_seq_lens_q=torch.tensor(c["q_lens"], dtype=torch.int32))  # required by the seed
    out, _ = dispatch.cudnn_batch_prefill_with_kv_cache(c["q"], c["k"], c["v"], D ** -0.5, ws(), **kw)
    ref = ragged_wrapper(c).run(c["q"], c["k"], c["v"])
    assert torch.allclose(out, ref, atol=1e-6) and b == len(c["q_lens"])


def test_paged_wrapper_outputs_and_decision():
    c = paged()
    w = paged_wrapper(c)
    out, lse = poisoned(9, HQ, D), poisoned(9, HQ)
    r = w.run(c["q"], c["cache"], out=out, lse=lse, return_lse=True)
    assert r[0] is out and r[1] is lse and written(out) and written(lse)
    assert w.decision.chosen == "reference" and dispatch.explain(w) is w.decision
    assert torch.equal(w.run_return_lse(c["q"], c["cache"])[0], out)
    # The deprecated forward() re-states plan-time options, as FlashInfer's does: same options, same result...
    assert torch.equal(w.forward(c["q"], c["cache"], causal=True), out)
    # ...and its defaults (causal=False) replace the planned causal=True for that call.
    plain = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws(), "NHD")
    plain.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, P, q_data_type=torch.float32)
    assert torch.equal(w.forward(c["q"], c["cache"]), plain.run(c["q"], c["cache"]))
    assert not torch.equal(plain.run(c["q"], c["cache"]), out)


def test_paged_wrapper_tuple_and_hnd_views_match():
    c = paged()
    ref = paged_wrapper(c).run(c["q"], c["cache"])
    hnd = c["cache"].transpose(2, 3)  # (pages, 2, Hkv, P, D) view of the same memory
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws(), "HND")
    w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, P, causal=True, q_data_type=torch.float32)
    assert torch.allclose(w.run(c["q"], hnd), ref, atol=1e-6)
    tup = paged_wrapper(c).run(c["q"], (c["cache"][:, 0], c["cache"][:, 1]))
    assert torch.allclose(tup, ref, atol=1e-6)


def test_paged_wrapper_default_q_data_type_is_float16():
    c = paged(dtype=torch.float16)
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws(), "NHD")
    w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, P, causal=True)
    out = w.run(c["q"], c["cache"])
    assert out.dtype == torch.float16 and out.shape == (9, HQ, D)


def test_custom_mask_packed_equals_bool_and_causal():
    c = ragged()
    rows = []
    for n, m in zip(c["q_lens"], c["kv_lens"]):
        rows.append(torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n).reshape(-1))
    flat = torch.cat(rows)
    causal = ragged_wrapper(c).run(c["q"], c["k"], c["v"])
    masked = ragged_wrapper(c, custom_mask=flat).run(c["q"], c["k"], c["v"])
    packed = torch.cat([torch.tensor(__import__("numpy").packbits(r.numpy(), bitorder="little")) for r in rows])
    from_packed = ragged_wrapper(c, packed_custom_mask=packed).run(c["q"], c["k"], c["v"])
    assert torch.allclose(masked, causal, atol=1e-6) and torch.equal(from_packed, masked)


def test_ragged_wrapper_scales():
    c = ragged()
    w = ragged_wrapper(c)
    base = w.run(c["q"], c["k"], c["v"])
    scaled = w.run(c["q"], c["k"], c["v"], v_scale=2.0, o_scale=4.0)
    assert torch.allclose(scaled, base * 0.5, atol=1e-6)
    assert torch.allclose(w.run(c["q"], c["k"], c["v"], k_scale=2.0), w.run(c["q"] * 2, c["k"], c["v"]), atol=1e-5)


def test_single_prefill_variants():
    c = ragged(q_lens=(4,), kv_lens=(7,))
    out = dispatch.single_prefill_with_kv_cache(c["q"], c["k"], c["v"], causal=True)
    out2, lse = dispatch.single_prefill_with_kv_cache_return_lse(c["q"], c["k"], c["v"], causal=True)
    assert out.shape == (4, HQ, D) and lse.shape == (4, HQ) and torch.equal(out, out2)
    hnd = dispatch.single_prefill_with_kv_cache(c["q"], c["k"].transpose(0, 1), c["v"].transpose(0, 1),
                                                causal=True, kv_layout="HND")
    assert torch.equal(hnd, out)
    one = dispatch.single_prefill_with_kv_cache(c["q"][:1], c["k"], c["v"])
    assert one.shape == (1, HQ, D)
    assert dispatch.explain(dispatch.single_prefill_with_kv_cache, c["q"][:1], c["k"], c["v"]).problem.phase == "decode"


def test_explain_does_not_run():
    c = paged()
    args, kw = trtllm_args(c)
    out = poisoned(9, HQ, D)
    decision = dispatch.explain(dispatch.trtllm_batch_context_with_kv_cache, *args, out=out, **kw)
    assert decision.chosen == "reference" and decision.problem.entry == "trtllm_batch_context_with_kv_cache"
    assert torch.isnan(out).all()
    w = paged_wrapper(c)
    sinks = torch.rand(HQ)
    assert dispatch.explain(w, c["q"], c["cache"], sinks=sinks).problem.has_sinks


def test_cudnn_offsets_derived_from_lengths_when_absent():
    """The seed marks batch_offsets_* optional: B > 1 without them means packed rows (FlashInfer's
    code derives them from the lengths), with the lengths on the CPU as the seed documents."""
    c = ragged()
    q_lens = torch.tensor(c["q_lens"], dtype=torch.int32)
    kv_lens = torch.tensor(c["kv_lens"], dtype=torch.int32)
    kw = dict(max_token_per_sequence=5, max_sequence_kv=13, causal=True, return_lse=True,
              actual_seq_lens_q=q_lens, actual_seq_lens_kv=kv_lens)
    k = torch.cat([c["k"][a:a + n] for a, n in zip(c["kv"].tolist(), c["kv_lens"])])  # packed KV rows
    v = torch.cat([c["v"][a:a + n] for a, n in zip(c["kv"].tolist(), c["kv_lens"])])
    out, lse = dispatch.cudnn_batch_prefill_with_kv_cache(c["q"], k, v, D ** -0.5, ws(), **kw)
    ref, ref_lse = ragged_wrapper(c).run(c["q"], c["k"], c["v"], return_lse=True)
    assert torch.allclose(out, ref, atol=1e-6)
    for b, (start, n) in enumerate(zip(c["qo"].tolist(), c["q_lens"])):
        assert torch.allclose(lse[b, :n], ref_lse[start:start + n], atol=1e-5)


def test_validate_env_values(monkeypatch):
    """ATTN_DISPATCH_VALIDATE takes full/first (any case) or nothing; anything else names the variable."""
    from dispatch.checks import full_validation
    for value, full in (("", False), ("first", False), ("FULL", True), ("full", True)):
        monkeypatch.setenv("ATTN_DISPATCH_VALIDATE", value)
        assert full_validation() is full
    monkeypatch.setenv("ATTN_DISPATCH_VALIDATE", "1")
    with pytest.raises(ValueError, match="ATTN_DISPATCH_VALIDATE='1'"):
        full_validation()


def test_paged_run_takes_sinks_as_a_list():
    c = paged()
    w = paged_wrapper(c)
    sinks = torch.randn(HQ)
    want = w.run(c["q"], c["cache"], sinks=sinks)
    assert torch.equal(w.run(c["q"], c["cache"], sinks=sinks.tolist()), want)


@pytest.mark.parametrize("entry", ["paged", "ragged"])
def test_plan_packed_mask_wins_over_custom_mask(entry):
    """The seed: "packed_custom_mask, if provided, the custom_mask will be ignored"."""
    from _calls import make
    import numpy as np
    call = make(entry, 5)  # causal by default: its expectation is the causal answer
    cfg = call.cfg
    rows = [torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n).reshape(-1)
            for n, m in zip(cfg.q_lens, cfg.kv_lens)]
    packed = torch.cat([torch.from_numpy(np.packbits(r.numpy(), bitorder="little")) for r in rows])
    wrong = torch.ones(sum(r.numel() for r in rows), dtype=torch.bool)  # no mask at all: must be ignored
    call.plan_kw.update(causal=False, custom_mask=wrong, packed_custom_mask=packed)
    call.check(call.invoke())


def test_return_lse_overloads_and_last_decision():
    """typing.overload gives ``return_lse=True`` a (Tensor, Tensor) and False a Tensor,
    with the seed signatures unchanged at runtime; dispatch.last_decision() is this context's."""
    import typing
    targets = [dispatch.single_prefill_with_kv_cache, dispatch.trtllm_batch_context_with_kv_cache,
               dispatch.cudnn_batch_prefill_with_kv_cache, dispatch.BatchPrefillWithPagedKVCacheWrapper.run,
               dispatch.BatchPrefillWithRaggedKVCacheWrapper.run]
    for fn in targets:
        returns = [typing.get_type_hints(o, globalns=fn.__globals__)["return"] for o in typing.get_overloads(fn)]
        assert len(returns) == 2, fn
        assert typing.get_origin(returns[0]) is tuple and typing.get_args(returns[0])[1] is torch.Tensor, fn
    c = ragged()
    out = dispatch.single_prefill_with_kv_cache(c["q"][:3], c["k"][:5], c["v"][:5], causal=True)
    assert out.shape == (3, HQ, D) and dispatch.last_decision().chosen == "reference"


@pytest.mark.parametrize("backend", ["reference", "native-triton"])
def test_cudnn_decode_shaped_lse_is_written_in_place_without_a_scatter(monkeypatch, backend):
    """A decode-shaped call (one query row per request): the padded (B, 1, Hq) LSE is the packed one,
    so every backend writes the caller's buffer itself and no scatter runs (its ten small launches
    cost native-triton 200-350 us of host time a call on the H200); values against the fp64 oracle.
    On the GPU host on CUDA tensors (native-triton compiled), else on the CPU (Triton's interpreter)."""
    import dispatch.entries.cudnn as entry
    from dispatch.benchmark import cases
    from oracle import batch_attention_fp64, relative_error
    monkeypatch.setattr(entry, "scatter_padded_lse", lambda *a: pytest.fail("scattered a decode-shaped LSE"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype, tol = (torch.bfloat16, 1e-2) if device == "cuda" else (torch.float32, 1e-5)
    c = cases.paged(q_lens=(1, 1, 1, 1), kv_lens=(9, 4, 13, 1), dtype=dtype, device=device)
    args, kw = cases.cudnn_args(c, return_lse=True)
    lse = torch.full((4, 1, cases.HQ), float("nan"), device=device)
    with dispatch.use_backend(backend):
        out, got = dispatch.cudnn_batch_prefill_with_kv_cache(*args, **{**kw, "causal": False}, lse=lse)
    assert got is lse and dispatch.last_decision().ran == backend
    k, v = c["cache"][:, 0].double().cpu(), c["cache"][:, 1].double().cpu()
    table, hkv, d = c["table"].long().cpu(), cases.HKV, cases.D
    ks = [k[table[b]].reshape(-1, hkv, d)[:n] for b, n in enumerate(c["kv_lens"])]
    vs = [v[table[b]].reshape(-1, hkv, d)[:n] for b, n in enumerate(c["kv_lens"])]
    want_out, want_lse = batch_attention_fp64(list(c["q"].double().cpu().split(1)), ks, vs, sm_scale=d ** -0.5)
    assert relative_error(out.double().cpu(), want_out) < tol
    assert relative_error(lse[:, 0].double().cpu(), want_lse) < tol
