"""torch.compile(fullgraph=True) traces through every entry point (they are torch.library custom
ops under compilation) and matches eager. Wrappers are planned outside the compiled function.

``aot_eager`` runs dynamo and AOT autograd with the fake (meta) implementations, which is what
a graph break or a wrong fake would fail, without needing a C++ toolchain in CI.
"""
import pytest
import torch

import dispatch
from _api_cases import D, HKV, HQ, P, cudnn_args, paged, ragged, trtllm_args, ws, xqa_args
from _api_cases import on_device as on


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="the GPU half runs on the GPU host"))]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def assert_same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if w is None:
            assert g is None
        else:
            assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.parametrize("return_lse", [False, True])
def test_single_prefill(return_lse, device):
    c = on(device, ragged())
    q, k, v = c["q"][:5], c["k"][:9], c["v"][:9]

    def step(q, k, v):
        return dispatch.single_prefill_with_kv_cache(q, k, v, causal=True, window_left=4, return_lse=return_lse)
    assert_same(compiled(step)(q, k, v), step(q, k, v))


def test_single_prefill_return_lse_partial(device):
    c = on(device, ragged())
    q, k, v = c["q"][:5], c["k"][:9], c["v"][:9]

    def step(q, k, v):
        out, lse = dispatch.single_prefill_with_kv_cache_return_lse(q, k, v, causal=True, sm_scale=0.3)
        return out * 2, lse
    assert_same(compiled(step)(q, k, v), step(q, k, v))


def test_trtllm_with_buffers(device):
    args, kw = on(device, trtllm_args(paged()))
    sinks = torch.randn(HQ, device=device)

    def step(*a):
        out = torch.full((a[0].shape[0], HQ, D), float("nan"), device=a[0].device)
        lse = torch.full((a[0].shape[0], HQ), float("nan"), device=a[0].device)
        return dispatch.trtllm_batch_context_with_kv_cache(*a, out=out, sinks=sinks, **kw, lse=lse, return_lse=True)
    assert_same(compiled(step)(*args), step(*args))


def test_xqa(device):
    args, kw = on(device, xqa_args(paged()))

    def step(*a):
        return dispatch.xqa_batch_decode_with_kv_cache(*a, **kw)
    assert_same(compiled(step)(*args), step(*args))


@pytest.mark.parametrize("return_lse", [False, True])
def test_cudnn(return_lse, device):
    args, kw = on(device, cudnn_args(paged(), return_lse=return_lse))

    def step(*a):
        return dispatch.cudnn_batch_prefill_with_kv_cache(*a, **kw)
    assert_same(compiled(step)(*args), step(*args))


def test_paged_wrapper_run(device):
    c = on(device, paged())
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, P, causal=True, q_data_type=torch.float32)

    def step(q, cache):
        out, lse = w.run(q, cache, return_lse=True)
        return out + 1, lse
    assert_same(compiled(step)(c["q"], c["cache"]), step(c["q"], c["cache"]))


def test_ragged_wrapper_run_with_out(device):
    c = on(device, ragged())
    w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 16, dtype=torch.uint8, device=device))
    w.plan(c["qo"], c["kv"], HQ, HKV, D, causal=True, q_data_type=torch.float32)

    def step(q, k, v):
        out = torch.empty(q.shape[0], HQ, D, device=q.device)
        return w.run(q, k, v, out=out, k_scale=0.5)
    assert_same(compiled(step)(c["q"], c["k"], c["v"]), step(c["q"], c["k"], c["v"]))


def test_bad_input_still_raises_under_compile():
    """Validation runs inside the op: a bad call fails as it does in eager, naming the argument."""
    c = ragged()
    q, k = c["q"][:5], c["k"][:9]

    def step(q, k):
        return dispatch.single_prefill_with_kv_cache(q, k, k[:, :, :8], window_left=-3)
    with pytest.raises(Exception, match="window_left"):
        compiled(step)(q, k)


def test_workspace_is_not_needed_as_graph_input():
    """A workspace captured from the enclosing scope is fine (the op ignores its contents)."""
    c = paged()
    args, kw = xqa_args(c)
    buf = ws()

    def step(q, cache):
        return dispatch.xqa_batch_decode_with_kv_cache(q, cache, buf, *args[3:], **kw)
    assert_same(compiled(step)(args[0], args[1]), step(args[0], args[1]))
