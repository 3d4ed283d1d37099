"""FlashInfer 0.7's ``lse_base``/``lse_layout`` tests on the prefill wrappers, restated through
``dispatch`` (see docs/flashinfer-tests.md).

The default LSE (base 2, (tokens, heads)) is bitwise what ``lse_base="log2"`` gives; ``"ln"`` is the
natural-log logsumexp of the scaled scores (the fp64 oracle's base-2 LSE times ln 2: atol 1e-2,
rtol 1e-3) and the base-2 result times ln 2 (1e-5); the output never depends on the options;
``lse_layout="HN"`` is the contiguous (heads, tokens) transpose, in either base, also into a
caller's buffer; wrong buffers and unknown values are refused by name. Both wrappers, causal or
not; on a GPU also with ``backend="fa2"`` and ``"fa3"`` (refused off Hopper); and ``lse_base`` on
``cudnn_batch_prefill_with_kv_cache``.
"""
import math

import pytest
import torch

import dispatch
from _fi_semantics import (close, expect_hardware_refusal, grid, indptr, needs_other_hardware, paged_pool, randn,
                           single_ref, workspace)
from oracle import LN2

HQ, HKV, D, PAGE = 8, 2, 128, 16
Q_LENS, KV_LENS = [5, 16, 7], [37, 16, 30]
CASES = [(True,), (False,)]


def reference_ln(q, ks, vs, causal):
    rows, start = [], 0
    for n, k, v in zip(Q_LENS, ks, vs):
        rows.append(single_ref(q[start:start + n], k, v, causal=causal)[1] * LN2)
        start += n
    return torch.cat(rows)


def check_options(run, ks, vs, q, causal):
    out_default, lse_default = run()
    out_log2, lse_log2 = run(lse_base="log2")
    out_ln, lse_ln = run(lse_base="ln")
    assert torch.equal(out_default, out_log2) and torch.equal(out_default, out_ln)
    assert torch.equal(lse_default, lse_log2), "lse_base='log2' must equal the default"
    ref_ln = reference_ln(q, ks, vs, causal)
    close(lse_ln, ref_ln, rtol=1e-3, atol=1e-2)
    close(lse_log2, ref_ln / LN2, rtol=1e-3, atol=1e-2)
    close(lse_ln, lse_log2.double() * math.log(2.0), rtol=1e-6, atol=1e-5)
    buf = torch.empty_like(lse_ln)
    _, filled = run(lse_base="ln", lse=buf)
    assert filled is buf and torch.equal(buf, lse_ln)
    with pytest.raises(ValueError, match="lse_base"):
        run(lse_base="e")
    tokens = q.shape[0]
    for base, nh in (("log2", lse_log2), ("ln", lse_ln)):
        _, hn = run(lse_base=base, lse_layout="HN")
        assert hn.shape == (HQ, tokens) and hn.is_contiguous() and torch.equal(hn, nh.t())
    buf = torch.empty(HQ, tokens, dtype=torch.float32, device=q.device)
    _, hn = run(lse_base="ln", lse_layout="HN", lse=buf)
    assert hn is buf and torch.equal(buf, lse_ln.t())
    with pytest.raises(ValueError):
        run(lse_layout="HN", lse=torch.empty(tokens, HQ, dtype=torch.float32, device=q.device))
    with pytest.raises(ValueError, match="contiguous"):
        run(lse_layout="HN", lse=torch.empty(tokens, HQ, dtype=torch.float32, device=q.device).t())
    with pytest.raises(ValueError, match="lse_layout"):
        run(lse_layout="TH")


@grid("causal", CASES, CASES, named=("fa2", "fa3"))
def test_ragged_lse_base(device, backend, causal):
    q = randn(sum(Q_LENS), HQ, D, dtype=torch.bfloat16, device=device, seed=0)
    k = randn(sum(KV_LENS), HKV, D, dtype=torch.bfloat16, device=device, seed=1)
    v = randn(sum(KV_LENS), HKV, D, dtype=torch.bfloat16, device=device, seed=2)
    wrapper = dispatch.BatchPrefillWithRaggedKVCacheWrapper(workspace(device), "NHD", backend=backend)

    def plan():
        wrapper.plan(indptr(Q_LENS, device), indptr(KV_LENS, device), HQ, HKV, D, causal=causal,
                     q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    if needs_other_hardware(device, backend):
        return expect_hardware_refusal(plan)
    plan()
    check_options(lambda **kw: wrapper.run(q, k, v, return_lse=True, **kw), list(k.split(KV_LENS)),
                  list(v.split(KV_LENS)), q, causal)


@grid("causal", CASES, CASES, named=("fa2", "fa3"))
def test_paged_lse_base(device, backend, causal):
    q = randn(sum(Q_LENS), HQ, D, dtype=torch.bfloat16, device=device, seed=0)
    pool = paged_pool(KV_LENS, PAGE, HKV, D, dtype=torch.bfloat16, device=device)
    cache = (pool["cache"][:, 0], pool["cache"][:, 1])
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(device), "NHD", backend=backend)

    def plan():
        wrapper.plan(indptr(Q_LENS, device), pool["indptr"].to(device), pool["indices"].to(device),
                     pool["last"].to(device), HQ, HKV, D, PAGE, causal=causal, q_data_type=torch.bfloat16,
                     kv_data_type=torch.bfloat16)
    if needs_other_hardware(device, backend):
        return expect_hardware_refusal(plan)
    plan()
    check_options(lambda **kw: wrapper.run(q, cache, return_lse=True, **kw), pool["ks"], pool["vs"], q, causal)


@grid("causal", CASES, CASES, named="cudnn")
def test_cudnn_lse_base(device, backend, causal):
    """cudnn_batch_prefill_with_kv_cache's lse_base: its padded LSE in natural log on request."""
    q = randn(sum(Q_LENS), HQ, D, dtype=torch.bfloat16, device=device, seed=0)
    k = randn(sum(KV_LENS), HKV, D, dtype=torch.bfloat16, device=device, seed=1)
    v = randn(sum(KV_LENS), HKV, D, dtype=torch.bfloat16, device=device, seed=2)
    common = dict(max_token_per_sequence=max(Q_LENS), max_sequence_kv=max(KV_LENS),
                  actual_seq_lens_q=torch.tensor(Q_LENS, dtype=torch.int32).view(-1, 1, 1, 1),
                  actual_seq_lens_kv=torch.tensor(KV_LENS, dtype=torch.int32).view(-1, 1, 1, 1), causal=causal,
                  return_lse=True, batch_offsets_q=indptr(Q_LENS, device), batch_offsets_k=indptr(KV_LENS, device),
                  batch_offsets_units="tokens", backend=None if backend == "auto" else backend)
    out2, lse2 = dispatch.cudnn_batch_prefill_with_kv_cache(q, k, v, D ** -0.5, workspace(device), **common)
    out_ln, lse_ln = dispatch.cudnn_batch_prefill_with_kv_cache(q, k, v, D ** -0.5, workspace(device), lse_base="ln",
                                                                **common)
    assert torch.equal(out2, out_ln)
    rows = torch.cat([lse_ln[b, :n] for b, n in enumerate(Q_LENS)])
    close(rows, reference_ln(q, list(k.split(KV_LENS)), list(v.split(KV_LENS)), causal), rtol=1e-3, atol=1e-2)
    with pytest.raises(ValueError, match="lse_base"):
        dispatch.cudnn_batch_prefill_with_kv_cache(q, k, v, D ** -0.5, workspace(device), lse_base="e", **common)
