"""On a GPU: a wrapper's runs captured in a CUDA graph, then plan() again (FlashInfer's CUDA-graph
mode: the engine plans the next step and replays). With use_cuda_graph=True the replay does the new
plan's work on every backend that can follow (dispatch/entries/_captures.py), and what it cannot
do is refused before anything changes; without it the graph keeps replaying the plan it captured.
Each replay is checked against the CPU reference of the plan it should do.

Runs on the GPU host (``pytest tests/test_gpu_graphs.py``); without CUDA every test skips.
"""
import pytest
import torch

import dispatch
from _api_cases import HKV, HQ

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
D, P, DT, BATCH, POOL = 128, 16, torch.bfloat16, 8, 8 * 64
ROOM = 1024  # plan(max_sequence_kv=ROOM): the longest request any replay brings


def page_lists(lens, gen):
    """(kv_indptr, kv_indices, last_page_len) on the GPU: each request's pages drawn from the pool."""
    counts = [-(-n // P) for n in lens]
    ids = torch.randperm(POOL, generator=gen)[: sum(counts)]
    indptr = torch.tensor([0] + counts).cumsum(0)
    last = torch.tensor([(n - 1) % P + 1 for n in lens])
    return [t.to(torch.int32).cuda() for t in (indptr, ids, last)]


def plan(w, q_len, lens, gen, **kw):
    qo = (torch.arange(len(lens) + 1) * q_len).to(torch.int32).cuda()
    pages = page_lists(lens, gen)
    w.plan(qo, *pages, HQ, HKV, D, P, causal=True, q_data_type=DT, max_sequence_kv=ROOM, **kw)
    return qo, pages


def want(qo, pages, q, cache):
    """The reference backend's answer on the CPU for this plan."""
    with dispatch.use_backend("reference"):
        ref = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(16, dtype=torch.uint8))
        ref.plan(qo.cpu(), *(t.cpu() for t in pages), HQ, HKV, D, P, causal=True, q_data_type=DT)
        return ref.run(q.cpu(), cache.cpu()).float()


def wrapper(backend, **kw):
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    return dispatch.BatchPrefillWithPagedKVCacheWrapper(ws, backend=backend, **kw)


def capture(w, q, cache, out):
    w.run(q, cache, out=out)  # eager first: the backend plans
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, out=out)
    return graph


@pytest.mark.parametrize("backend", ["fa2", "fa3", "native-triton", "auto"])
@pytest.mark.parametrize("q_len", [1, 5])
def test_a_captured_graph_follows_plan(backend, q_len):
    gen = torch.Generator().manual_seed(7 + q_len)
    cache = torch.randn(POOL, 2, P, HKV, D, generator=gen).to(DT).cuda()
    q = torch.randn(BATCH * q_len, HQ, D, generator=gen).to(DT).cuda()
    out = torch.empty_like(q)
    w = wrapper(backend, use_cuda_graph=True)
    try:
        plan(w, q_len, torch.randint(q_len, 300, (BATCH,), generator=gen).tolist(), gen)
        graph = capture(w, q, cache, out)
    except (dispatch.BackendRefusedError, dispatch.NoBackendError) as exc:
        pytest.skip(f"{backend}: {str(exc).splitlines()[0][:160]}")
    before = None
    for top in (600, ROOM):  # longer requests, other pages, new queries: the graph must follow each plan
        qo, pages = plan(w, q_len, torch.randint(q_len, top, (BATCH,), generator=gen).tolist(), gen)
        q.copy_(torch.randn(q.shape, generator=gen).to(DT))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        err = (out.float().cpu() - want(qo, pages, q, cache)).abs().max().item()
        assert err < 3e-2, f"{backend}: replay after plan() is off by {err}"
        assert before is None or not torch.equal(out, before)
        before = out.clone()
    ran = w.decision.ran or w.decision.chosen
    assert backend == "auto" or ran == backend, w.decision.explain()
    print(f"graph follows plan() on {ran}, q_len {q_len}")


def test_what_a_captured_graph_cannot_do_is_refused_unchanged():
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(POOL, 2, P, HKV, D, generator=gen).to(DT).cuda()
    q = torch.randn(BATCH, HQ, D, generator=gen).to(DT).cuda()
    out = torch.empty_like(q)
    w = wrapper("fa2", use_cuda_graph=True)
    qo, pages = plan(w, 1, [100] * BATCH, gen)
    graph = capture(w, q, cache, out)
    with pytest.raises(ValueError, match=r"qo_indptr\.shape.*\(10,\).*\(9,\), the captured batch size"):
        plan(w, 1, [50] * (BATCH + 1), gen)
    with pytest.raises(ValueError, match="causal"):
        w.plan(qo, *pages, HQ, HKV, D, P, causal=False, q_data_type=DT)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert (out.float().cpu() - want(qo, pages, q, cache)).abs().max().item() < 3e-2


@pytest.mark.parametrize("backend", ["fa2", "native-triton"])
def test_without_graph_mode_a_graph_keeps_the_plan_it_captured(backend):
    """use_cuda_graph=False: plan() after a capture leaves the graph on its own plan, whose tensors
    the wrapper keeps (another plan on another wrapper of the same problem included)."""
    gen = torch.Generator().manual_seed(5)
    cache = torch.randn(POOL, 2, P, HKV, D, generator=gen).to(DT).cuda()
    q = torch.randn(BATCH, HQ, D, generator=gen).to(DT).cuda()
    out = torch.empty_like(q)
    w, other = wrapper(backend), wrapper(backend)
    qo, pages = plan(w, 1, torch.randint(1, 300, (BATCH,), generator=gen).tolist(), gen)
    graph = capture(w, q, cache, out)
    for x in (w, other):  # new plans of the same problem, each run once
        plan(x, 1, torch.randint(1, 300, (BATCH,), generator=gen).tolist(), gen)
        x.run(q, cache)
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert (out.float().cpu() - want(qo, pages, q, cache)).abs().max().item() < 3e-2
