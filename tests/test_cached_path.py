"""The cached per-call path as a GPU takes it (device data not re-read, a wrapper's known run key
skipping every check but the per-call scale values), driven on the CPU: the same results as the
checked path, and a call that differs from a cached one in anything but per-call values still
gets the full checks and its error."""
import math

import pytest
import torch

import dispatch
from _api_cases import HKV, HQ, D, paged, paged_wrapper, ragged, ragged_wrapper
from dispatch.entries import _base


def test_paged_run_cached_equals_checked(gpu_like):
    c = paged()
    w = paged_wrapper(c)
    first = w.run(c["q"], c["cache"], k_scale=0.7)
    again = w.run(c["q"], c["cache"], k_scale=0.7)  # a known key: the fast lane
    assert torch.equal(first, again)
    other = w.run(c["q"], c["cache"], k_scale=0.5)  # a per-call value changes, the result follows
    assert not torch.equal(first, other)


@pytest.mark.parametrize("bad, words", [
    (dict(k_scale=float("nan")), ["k_scale", "nan"]),
    (dict(v_scale=float("inf")), ["v_scale", "inf"]),
    (dict(out=torch.empty(9, HQ, D, dtype=torch.int32)), ["out.dtype", "int32"]),
    (dict(lse=torch.empty(8, HQ)), ["lse.shape"]),
])
def test_paged_run_warm_bad_values_still_refused(gpu_like, bad, words):
    c = paged()
    w = paged_wrapper(c)
    w.run(c["q"], c["cache"], k_scale=1.0)
    w.run(c["q"], c["cache"], k_scale=1.0)
    with pytest.raises((ValueError, TypeError)) as err:
        w.run(c["q"], c["cache"], **{"k_scale": 1.0, **bad})
    assert all(word in str(err.value) for word in words), str(err.value)


def test_paged_run_warm_other_cache_shape_is_checked(gpu_like):
    c = paged()
    w = paged_wrapper(c)
    w.run(c["q"], c["cache"])
    wider = torch.randn(*c["cache"].shape[:3], 2 * HKV, D)  # other kv heads than planned
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(c["q"], wider)
    fewer = c["cache"][: int(c["table"].max())]  # pages the plan uses are missing
    with pytest.raises(ValueError, match="paged_kv_cache"):
        w.run(c["q"], fewer)


def test_ragged_run_warm_other_heads_and_zero_o_scale(gpu_like):
    c = ragged()
    w = ragged_wrapper(c)
    w.run(c["q"], c["k"], c["v"])
    w.run(c["q"], c["k"], c["v"])
    k2 = torch.randn(c["k"].shape[0], 2 * HKV, D)
    with pytest.raises(ValueError, match=r"k\.shape"):
        w.run(c["q"], k2, k2)
    with pytest.raises(ValueError, match="o_scale"):
        w.run(c["q"], c["k"], c["v"], o_scale=0.0)


def test_single_prefill_cached_siblings(gpu_like):
    """Sibling calls on the cached path: other kv heads / head dim / kv length are re-validated
    or computed right (the key holds every fixed dim)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(5, 8, 64, generator=g)
    for hkv, dv, kv_len in ((2, 64, 7), (4, 64, 7), (2, 48, 7), (2, 64, 11), (2, 64, 7)):
        k = torch.randn(kv_len, hkv, 64, generator=g)
        v = torch.randn(kv_len, hkv, dv, generator=g)
        out = dispatch.single_prefill_with_kv_cache(q, k, v, sm_scale=0.2)
        rep = 8 // hkv
        s = torch.einsum("qhd,khd->hqk", q.double(), k.double().repeat_interleave(rep, 1)) * 0.2
        want = torch.einsum("hqk,khd->qhd", s.softmax(-1), v.double().repeat_interleave(rep, 1))
        assert out.shape == want.shape and (out.double() - want).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="sm_scale"):
        dispatch.single_prefill_with_kv_cache(q, k, v, sm_scale=math.nan)


def test_a_reusable_backend_plan_is_kept_per_call_key(gpu_like, monkeypatch):
    """A backend whose plan reads only what the call key proves is planned once per key (the key
    holds the size class: lengths 9..16 share one); other lengths in later calls are read by
    run() and still computed right."""
    from backends import get_backend
    reference = get_backend("reference")
    planned = []
    original = type(reference).plan
    monkeypatch.setattr(type(reference), "plan", lambda self, p, b: planned.append(p) or original(self, p, b))
    g = torch.Generator().manual_seed(7)
    q = torch.randn(5, 8, 64, generator=g)
    for kv_len in (9, 12, 15):
        k, v = (torch.randn(kv_len, 2, 64, generator=g) for _ in range(2))
        out = dispatch.single_prefill_with_kv_cache(q, k, v, causal=True)
        with dispatch.use_backend("reference"), monkeypatch.context() as m:
            m.setattr(type(reference), "plan_reusable", lambda self, p: False)  # the per-call path
            want = dispatch.single_prefill_with_kv_cache(q, k, v, causal=True)
        assert torch.equal(out, want)
    assert len(planned) == 1 + 3  # once for the kept plan, once per call for the per-call path


@pytest.mark.native_triton
def test_wrapper_rope_on_native_holds_no_rotated_copies():
    """The wrapper plans its backend on the first run, with the caller's whole page pool: native
    rotates q and k inside the kernel, so its plan holds no copy of q or of the pool (only the
    (2, D/2) frequency table), and the result matches the reference backend."""
    c = paged()
    pool = torch.randn(64, *c["cache"].shape[1:])
    pool[: c["cache"].shape[0]] = c["cache"]
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), "NHD", backend="native")
    w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, 4, causal=True, q_data_type=torch.float32,
           pos_encoding_mode="ROPE_LLAMA")
    out = w.run(c["q"], pool)
    plan = w._last.plan
    held = [t for t in vars(plan).values() if isinstance(t, torch.Tensor)]
    assert plan.rope_freq is not None and all(t.numel() <= 2 * D for t in held)
    with dispatch.use_backend("reference"):
        ref = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8), "NHD")
        ref.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, 4, causal=True,
                 q_data_type=torch.float32, pos_encoding_mode="ROPE_LLAMA")
        want = ref.run(c["q"], pool)
    assert (out - want).abs().max().item() < 1e-4


def _xqa_call():
    from _api_cases import xqa_args
    c = paged()
    args, kw = xqa_args(c)
    return args, kw


def test_xqa_repeats_equal_the_checked_path(gpu_like):
    args, kw = _xqa_call()
    first = dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    again = dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)  # an exact repeat: no per-call checks
    assert torch.equal(first, again)
    other = list(args)
    other[6] = 0.5 * args[6]  # another bmm1_scale: not a repeat, checked, and computed with it
    assert not torch.equal(dispatch.xqa_batch_decode_with_kv_cache(*other, **kw), first)


@pytest.mark.parametrize("change, words", [
    (lambda a, kw: a.__setitem__(6, float("nan")), ["bmm1_scale", "nan"]),
    (lambda a, kw: kw.__setitem__("o_scale", 0.0), ["o_scale"]),
    (lambda a, kw: kw.__setitem__("out", torch.empty(3, HQ, D, dtype=torch.int32)), ["out.dtype", "int32"]),
    (lambda a, kw: a.__setitem__(4, a[4][:2]), ["seq_lens"]),
    (lambda a, kw: a.__setitem__(5, 0), ["max_seq_len", "0"]),
])
def test_xqa_warm_repeats_still_refuse_bad_calls(gpu_like, change, words):
    args, kw = _xqa_call()
    dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    args, kw = list(args), dict(kw)
    change(args, kw)
    with pytest.raises((ValueError, TypeError)) as err:
        dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_trtllm_repeats_equal_the_checked_path(gpu_like):
    from _api_cases import trtllm_args
    args, kw = trtllm_args(paged())
    first = dispatch.trtllm_batch_context_with_kv_cache(*args, **kw)
    again = dispatch.trtllm_batch_context_with_kv_cache(*args, **kw)
    assert torch.equal(first, again) and len(_base.LANES) >= 1


def test_the_latest_lane_follows_strict_mode_and_a_cleared_cache(gpu_like):
    """A repeat of the latest lane found is served by comparing its key (``Calls.latest``): a call
    in another strict mode still finds its own lane, and clearing the call cache drops the latest
    lane with the others (the next call checks and decides again)."""
    c = ragged()
    w = ragged_wrapper(c)
    args = (c["q"], c["k"], c["v"])
    first, again = w.run(*args), w.run(*args)
    lane = w._calls.latest[1]
    assert isinstance(lane, _base.Lane) and not lane.strict and torch.equal(first, again)
    with dispatch.strict():
        w.run(*args)
        strict_out = w.run(*args)
    assert w._calls.latest[1] is not lane and w._calls.latest[1].strict and torch.equal(strict_out, first)
    w.run(*args)
    assert w._calls.latest[1] is lane
    from dispatch.entries import single
    s = dict(q=torch.randn(5, HQ, D), k=torch.randn(11, HKV, D), v=torch.randn(11, HKV, D))
    out = dispatch.single_prefill_with_kv_cache(s["q"], s["k"], s["v"], causal=True)
    dispatch.single_prefill_with_kv_cache(s["q"], s["k"], s["v"], causal=True)
    kept = single.DECLARATION.calls.latest[1]
    assert isinstance(kept, _base.Lane)
    dispatch.entries.clear_caches()
    assert single.DECLARATION.calls.latest[1] is None and len(_base.LANES) == 0
    s["q"].add_(1.0)  # fresh values: the next call must compute, not return a kept result
    changed = dispatch.single_prefill_with_kv_cache(s["q"], s["k"], s["v"], causal=True)
    dispatch.single_prefill_with_kv_cache(s["q"], s["k"], s["v"], causal=True)
    assert single.DECLARATION.calls.latest[1] is not kept and not torch.equal(changed, out)


def test_an_environment_change_counts_on_the_next_repeat(gpu_like, monkeypatch):
    """ATTN_DISPATCH_STRICT / ATTN_DISPATCH_BACKEND are read on every call, an exact repeat's too."""
    from _api_cases import xqa_args
    from dispatch import policy
    monkeypatch.delenv(policy.ENV_BACKEND, raising=False)
    monkeypatch.delenv(policy.ENV_STRICT, raising=False)
    args, kw = xqa_args(paged())
    first = dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)  # the latest lane: a repeat
    monkeypatch.setenv(policy.ENV_STRICT, "maybe")
    with pytest.raises(ValueError, match="ATTN_DISPATCH_STRICT='maybe'"):
        dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    monkeypatch.setenv(policy.ENV_STRICT, "1")
    assert torch.equal(dispatch.xqa_batch_decode_with_kv_cache(*args, **kw), first)
    assert dispatch.last_decision().strict
    monkeypatch.setenv(policy.ENV_BACKEND, "flash-magic")
    with pytest.raises(ValueError, match="ATTN_DISPATCH_BACKEND='flash-magic'"):
        dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    monkeypatch.delenv(policy.ENV_BACKEND)
    monkeypatch.delenv(policy.ENV_STRICT)
    dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)
    assert not dispatch.last_decision().strict


def test_a_wrapper_repeat_makes_a_new_dense_out_whatever_q_strides(gpu_like):
    """A repeat's ``out`` is a new contiguous tensor of the output's shape: made like q when q is
    dense (``out_like_q``), else from the plan's sizes (a q with padded rows here)."""
    c = ragged()
    w = ragged_wrapper(c)
    q, k, v = c["q"], c["k"], c["v"]
    first, again = w.run(q, k, v), w.run(q, k, v)
    assert again.is_contiguous() and again.data_ptr() not in (first.data_ptr(), q.data_ptr())
    assert torch.equal(first, again)
    wide = torch.randn(q.shape[0], HQ, 2 * D)
    wide[..., :D] = q
    padded = wide[..., :D]  # q's values, strides (HQ*2D, 2D, 1)
    outs = [w.run(padded, k, v) for _ in range(3)]
    assert all(o.is_contiguous() and o.shape == first.shape and torch.equal(o, first) for o in outs)
    assert len({o.data_ptr() for o in outs} | {wide.data_ptr()}) == 4
