"""On a GPU: every entry point under CUDA-graph capture, cuDNN through the wrappers, and run-time
scales honoured on every backend that serves the call (checked against the CPU reference).

Runs on the GPU host (``pytest tests/test_gpu_entries.py``); without CUDA every test skips.
"""
import pytest
import torch

import _api_cases
import dispatch
from _api_cases import HKV, HQ, cudnn_args, on_device, paged, ragged, trtllm_args, xqa_args

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
D, P, DT = 128, 16, torch.bfloat16
GRAPH_BACKENDS = ("native-triton", "cudnn", "xqa", "torch-flash", "fa2", "fa3")  # capability data: cuda_graph after_warmup
PER_CALL_PLANS = {"fa2": ("trtllm", "xqa", "cudnn"), "fa3": ("trtllm", "xqa", "cudnn")}  # refused in a capture (data)


def to_cuda(value):
    return on_device("cuda", value)


def cases():
    """name -> (device -> zero-argument call), built with head_dim 128 and pages of 16."""
    saved = _api_cases.P, _api_cases.D
    _api_cases.P, _api_cases.D = P, D
    try:
        pc, rc = paged(kv_lens=(40, 17, 70), dtype=DT), ragged(dtype=DT)
        t, x, c = trtllm_args(pc), xqa_args(pc), cudnn_args(pc)
    finally:
        _api_cases.P, _api_cases.D = saved

    def on(dev, value):
        return to_cuda(value) if dev == "cuda" else value

    def paged_wrapper(dev):
        w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=dev))
        w.plan(*on(dev, [pc["qo"], pc["kv_indptr"], pc["perm"], pc["last"]]), HQ, HKV, D, P, causal=True,
               q_data_type=DT)
        q, cache = on(dev, pc["q"]), on(dev, pc["cache"])
        return lambda: w.run(q, cache)

    def ragged_wrapper(dev):
        w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=dev))
        w.plan(on(dev, rc["qo"]), on(dev, rc["kv"]), HQ, HKV, D, causal=True, q_data_type=DT)
        q, k, v = on(dev, [rc["q"], rc["k"], rc["v"]])
        return lambda: w.run(q, k, v)

    def function(fn, args, kw, first=False):
        def build(dev):
            a, k = on(dev, args), on(dev, kw)
            return (lambda: fn(*a, **k)[0]) if first else (lambda: fn(*a, **k))
        return build

    return {
        "single": function(dispatch.single_prefill_with_kv_cache, [rc["q"][:5], rc["k"][:9], rc["v"][:9]],
                           {"causal": True}),
        "paged": paged_wrapper, "ragged": ragged_wrapper,
        "trtllm": function(dispatch.trtllm_batch_context_with_kv_cache, *t),
        "xqa": function(dispatch.xqa_batch_decode_with_kv_cache, *x),
        "cudnn": function(dispatch.cudnn_batch_prefill_with_kv_cache, *c, first=True),
    }


def reference(name):
    with dispatch.use_backend("reference"):
        return cases()[name]("cpu")().float()


def forced(backend, call):
    try:
        with dispatch.use_backend(backend):
            return call()
    except (dispatch.BackendRefusedError, dispatch.NoBackendError) as exc:
        pytest.skip(f"{backend}: {str(exc).splitlines()[0][:160]}")


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
@pytest.mark.parametrize("name", ["single", "paged", "ragged", "trtllm", "xqa", "cudnn"])
def test_graph_replay_equals_eager(name, backend):
    if name in PER_CALL_PLANS.get(backend, ()):  # served eagerly, refused inside a capture
        call = cases()[name]("cuda")
        forced(backend, call)
        with pytest.raises(dispatch.BackendRefusedError, match="cuda_graph"):
            with dispatch.use_backend(backend), torch.cuda.graph(torch.cuda.CUDAGraph()):
                call()
        return
    call = forced(backend, lambda: cases()[name]("cuda"))  # a wrapper decides at plan(): inside the choice
    eager = forced(backend, call).clone()  # the eager call with the same shapes plans everything
    assert (eager.float().cpu() - reference(name)).abs().max().item() < 3e-2
    graph = torch.cuda.CUDAGraph()
    with dispatch.use_backend(backend):
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            captured = call()
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager), f"{name} on {backend}: replay differs from eager"


@pytest.mark.parametrize("entry", ["paged", "ragged"])
@pytest.mark.parametrize("how", ["use_backend", "backend="])
def test_cudnn_through_the_wrappers(entry, how):
    """cuDNN plans against the real layout on the first run (not the plan's placeholders)."""
    saved = _api_cases.P, _api_cases.D
    _api_cases.P, _api_cases.D = P, D
    try:
        c = paged(kv_lens=(40, 17, 70), dtype=DT) if entry == "paged" else ragged(dtype=DT)
    finally:
        _api_cases.P, _api_cases.D = saved
    c = to_cuda(c)
    ws = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    kw = {"backend": "cudnn"} if how == "backend=" and entry == "ragged" else {}
    if entry == "paged":
        w = dispatch.BatchPrefillWithPagedKVCacheWrapper(ws)
        plan = lambda: w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, P, causal=True,  # noqa: E731
                              q_data_type=DT)
        run = lambda: w.run(c["q"], c["cache"], return_lse=True)  # noqa: E731
    else:
        w = dispatch.BatchPrefillWithRaggedKVCacheWrapper(ws, **kw)
        scale = (HQ * D, HKV * D) if kw else (1, 1)  # backend='cudnn': element offsets, as FlashInfer's
        plan = lambda: w.plan(c["qo"] * scale[0], c["kv"] * scale[1], HQ, HKV, D, causal=True,  # noqa: E731
                              q_data_type=DT, **({"seq_lens": (c["kv"][1:] - c["kv"][:-1]).view(-1, 1, 1, 1),
                                                 "seq_lens_q": (c["qo"][1:] - c["qo"][:-1]).view(-1, 1, 1, 1),
                                                 "max_token_per_sequence": 5, "max_sequence_kv": 13} if kw else {}))
        run = lambda: w.run(c["q"], c["k"], c["v"], return_lse=True)  # noqa: E731
    with dispatch.use_backend("cudnn") if not kw else dispatch.strict(False):
        plan()
        out, lse = run()
    assert w.decision.chosen == "cudnn" and (w.decision.ran or "cudnn") == "cudnn", w.decision.explain()
    with dispatch.use_backend("reference"):
        cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
        ref_w = type(w)(torch.empty(16, dtype=torch.uint8))
        if entry == "paged":
            ref_w.plan(cpu["qo"], cpu["kv_indptr"], cpu["perm"], cpu["last"], HQ, HKV, D, P, causal=True,
                       q_data_type=DT)
            want, want_lse = ref_w.run(cpu["q"], cpu["cache"], return_lse=True)
        else:
            ref_w.plan(cpu["qo"], cpu["kv"], HQ, HKV, D, causal=True, q_data_type=DT)
            want, want_lse = ref_w.run(cpu["q"], cpu["k"], cpu["v"], return_lse=True)
    assert (out.float().cpu() - want.float()).abs().max().item() < 3e-2
    assert (lse.cpu() - want_lse).abs().max().item() < 1e-2


@pytest.mark.parametrize("backend", ["native-triton", "cudnn", "fa2", "torch-flash"])
def test_run_time_k_scale_is_honoured(backend):
    """run(q, kv, k_scale=0.5) == run(q * 0.5, kv): the scale is never baked into a cached plan."""
    saved = _api_cases.P, _api_cases.D
    _api_cases.P, _api_cases.D = P, D
    try:
        c = to_cuda(paged(kv_lens=(40, 17, 70), dtype=DT))
    finally:
        _api_cases.P, _api_cases.D = saved
    w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    forced(backend, lambda: w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], HQ, HKV, D, P, causal=True,
                                   q_data_type=DT))
    plain = forced(backend, lambda: w.run(c["q"] * 0.5, c["cache"])).float()
    scaled = forced(backend, lambda: w.run(c["q"], c["cache"], k_scale=0.5)).float()
    again = forced(backend, lambda: w.run(c["q"], c["cache"], k_scale=2.0)).float()
    assert (scaled - plain).abs().max().item() < 2e-2, f"{backend}: k_scale ignored"
    assert (again - plain).abs().max().item() > 1e-2, f"{backend}: a second k_scale reused the first"
    assert w.decision.chosen == backend and (w.decision.ran or backend) == backend, w.decision.explain()


@pytest.mark.parametrize("entry", ["paged", "xqa"])
def test_32_layer_decode_step_in_one_graph(entry):
    """A whole decode step (32 layers, one cache each) captured in one CUDA graph replays bit-identical
    to eager. The wrapper is built with use_cuda_graph=True, so only graph-safe backends are chosen."""
    layers, batch, kv_len = 32, 8, 300
    pages_per = -(-kv_len // P)
    g = torch.Generator(device="cuda").manual_seed(0)
    caches = [torch.randn(batch * pages_per, 2, P, HKV, D, device="cuda", dtype=DT, generator=g)
              for _ in range(layers)]
    qs = [torch.randn(batch, HQ, D, device="cuda", dtype=DT, generator=g) for _ in range(layers)]
    table = torch.randperm(batch * pages_per, device="cuda", generator=g).to(torch.int32).view(batch, pages_per)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    if entry == "paged":
        w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"),
                                                         use_cuda_graph=True)
        w.plan(torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
               torch.arange(batch + 1, dtype=torch.int32, device="cuda") * pages_per, table.reshape(-1),
               torch.full((batch,), (kv_len - 1) % P + 1, dtype=torch.int32, device="cuda"), HQ, HKV, D, P,
               causal=True, q_data_type=DT)
        step = lambda: [w.run(q, c) for q, c in zip(qs, caches)]  # noqa: E731
    else:
        ws = torch.zeros(1 << 24, dtype=torch.uint8, device="cuda")
        step = lambda: [dispatch.xqa_batch_decode_with_kv_cache(q, c, ws, table, lens, kv_len, D ** -0.5)  # noqa: E731
                        for q, c in zip(qs, caches)]
    eager = [o.clone() for o in step()]
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = step()
    for o in captured:
        o.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(captured, eager))
    ran = w.decision.ran or w.decision.chosen if entry == "paged" else \
        dispatch.last_decision().chosen
    print(f"32-layer {entry} decode step served by {ran}")


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_prefill_on_flashinfer_single_request_kernel(backend, layout):
    """single_prefill through FlashInfer's single-request kernel (no batch re-plan), vs the reference."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(37, HQ, D, generator=g).to(DT)
    k, v = (torch.randn(300, HKV, D, generator=g).to(DT) for _ in range(2))
    if layout == "HND":
        k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    kw = dict(causal=True, kv_layout=layout, return_lse=True)
    with dispatch.use_backend("reference"):
        want, want_lse = dispatch.single_prefill_with_kv_cache(q, k, v, **kw)
    out, lse = forced(backend, lambda: dispatch.single_prefill_with_kv_cache(q.cuda(), k.cuda(), v.cuda(), **kw))
    assert dispatch.last_decision().chosen == backend
    assert (out.float().cpu() - want.float()).abs().max().item() < 3e-2
    assert (lse.cpu() - want_lse).abs().max().item() < 1e-2


@pytest.mark.parametrize("backend", ["native-triton", "cudnn", "xqa"])
@pytest.mark.parametrize("entry", ["trtllm", "xqa"])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_scales_as_device_tensors_and_sinks(entry, backend, with_sinks):
    """bmm1/bmm2 as 0-dim fp32 device tensors give what the same floats give, sinks are applied,
    and both agree with the CPU reference (out = bmm2 * softmax(bmm1 * q.k) v)."""
    saved = _api_cases.P, _api_cases.D
    _api_cases.P, _api_cases.D = P, D
    try:
        pc = paged(kv_lens=(40, 17, 70), dtype=DT)
        args, kw = trtllm_args(pc) if entry == "trtllm" else xqa_args(pc)
    finally:
        _api_cases.P, _api_cases.D = saved
    i1, i2 = (7, 8) if entry == "trtllm" else (6, 7)
    args[i1], args[i2] = 0.6 * D ** -0.5, 0.7
    if with_sinks:
        kw = {**kw, "sinks": torch.randn(HQ)}
    fn = dispatch.trtllm_batch_context_with_kv_cache if entry == "trtllm" else dispatch.xqa_batch_decode_with_kv_cache
    with dispatch.use_backend("reference"):
        want = fn(*args, **kw).float()
    gargs, gkw = to_cuda(args), to_cuda(kw)
    floats = forced(backend, lambda: fn(*gargs, **gkw)).float().cpu()
    targs = list(gargs)
    targs[i1] = torch.tensor(args[i1], dtype=torch.float32, device="cuda")
    targs[i2] = torch.tensor(args[i2], dtype=torch.float32, device="cuda")
    tensors = forced(backend, lambda: fn(*targs, **gkw)).float().cpu()
    assert dispatch.last_decision().chosen == backend
    assert (floats - want).abs().max().item() < 3e-2
    assert (tensors - floats).abs().max().item() < 1e-2


@pytest.mark.parametrize("entry", ["single", "paged", "xqa"])
def test_negative_scale_is_computed_on_the_gpu(entry):
    """A negative softmax scale is valid math: the vendors that fold scale*log2e refuse it before
    launch and the router hands the call to one that computes it (native-triton), logged."""
    saved = _api_cases.P, _api_cases.D
    _api_cases.P, _api_cases.D = P, D
    try:
        pc, rc = paged(kv_lens=(40, 17, 70), dtype=DT), ragged(dtype=DT)
        x_args, x_kw = xqa_args(pc)
    finally:
        _api_cases.P, _api_cases.D = saved

    def call(dev):
        on = to_cuda if dev == "cuda" else (lambda v: v)
        if entry == "single":
            return dispatch.single_prefill_with_kv_cache(*on([rc["q"][:5], rc["k"][:9], rc["v"][:9]]), causal=True,
                                                         sm_scale=-0.05)
        if entry == "xqa":
            a = list(x_args)
            a[6] = -0.05
            return dispatch.xqa_batch_decode_with_kv_cache(*on(a), **x_kw)
        w = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=dev))
        w.plan(*on([pc["qo"], pc["kv_indptr"], pc["perm"], pc["last"]]), HQ, HKV, D, P, causal=True,
               q_data_type=DT, sm_scale=-0.05)
        return w.run(on(pc["q"]), on(pc["cache"]))
    with dispatch.use_backend("reference"):
        want = call("cpu").float()
    got = call("cuda").float().cpu()
    assert torch.isfinite(got).all() and (got - want).abs().max().item() < 3e-2


@pytest.mark.parametrize("backend", ["xqa", "native-triton", "cudnn"])
def test_decode_reads_a_sliced_page_table_and_strided_lengths(backend):
    """A page table sliced from a wider one and every-other lengths (a kernel that takes only their
    data pointers would read the wrong entries) give what their contiguous copies give, for XQA
    and every backend that serves the call; the first call and the launcher's repeat alike."""
    saved = _api_cases.P, _api_cases.D
    _api_cases.P, _api_cases.D = P, D
    try:
        pc = paged(kv_lens=(40, 17, 70), dtype=DT)
        args, kw = xqa_args(pc)
    finally:
        _api_cases.P, _api_cases.D = saved
    with dispatch.use_backend("reference"):
        want = dispatch.xqa_batch_decode_with_kv_cache(*args, **kw).float()
    gargs, gkw = to_cuda(args), to_cuda(kw)
    table, lens = gargs[3], gargs[4]
    # valid but wrong fillers: a wrong read shows as a wrong answer, not as a crash of the run
    wide = torch.cat([table, torch.zeros_like(table)], dim=1)
    pairs = torch.stack([lens, torch.ones_like(lens)], dim=1)
    gargs[3], gargs[4] = wide[:, :table.shape[1]], pairs[:, 0]
    assert not gargs[3].is_contiguous() and not gargs[4].is_contiguous()
    for _ in range(3):  # the checked call, the lane's first run, the launcher
        got = forced(backend, lambda: dispatch.xqa_batch_decode_with_kv_cache(*gargs, **gkw)).float().cpu()
        assert dispatch.last_decision().chosen == backend
        assert (got - want).abs().max().item() < 3e-2
