"""Every cache a backend keeps is keyed on the GPU (with its index) and, when keyed on per-call
sizes, bounded. CPU-only: CUDA devices are simulated by monkeypatching what would touch a GPU;
one test runs on two real GPUs where present.
"""
from __future__ import annotations

import math
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import _fake_vendors as fv
from backends import _device, _numerics, _vendor
from backends import cudnn as cudnn_adapter
from backends._fi_prefill import MAX_WRAPPERS, FlashInferPrefill
from backends.native import triton_backend as tb

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


@pytest.fixture
def current_gpu_1(monkeypatch):
    """Pretend GPU 1 is current: a bare 'cuda' must resolve to it, never to GPU 0."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


@pytest.fixture
def fake_alloc(monkeypatch):
    """torch.zeros/empty on a CUDA device give CPU buffers tagged with the device asked for."""
    real_zeros, real_empty = torch.zeros, torch.empty

    def alloc(real):
        def make(*shape, device=None, **kw):
            buf = real(*shape, **kw)
            buf.asked_device = torch.device(device) if device is not None else None
            return buf
        return make
    monkeypatch.setattr(torch, "zeros", alloc(real_zeros))
    monkeypatch.setattr(torch, "empty", alloc(real_empty))
    _vendor._workspaces.clear()
    yield
    _vendor._workspaces.clear()


# -- the shared pieces ----------------------------------------------------------------------
def test_device_key_makes_the_index_explicit(current_gpu_1):
    assert _device.device_key("cuda") == CUDA1
    assert _device.device_key(torch.device("cuda")) == CUDA1
    assert _device.device_key(CUDA0) == CUDA0 and _device.device_key(0) == CUDA0
    assert _device.device_key("cpu") == torch.device("cpu")


def test_on_device_guards_cuda_only():
    guard = _device.on_device(CUDA1)
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert not isinstance(_device.on_device(torch.device("cpu")), torch.cuda.device)


def test_bounded_cache_keeps_the_most_recently_used():
    cache = _device.BoundedCache(3)
    for i in range(100):
        cache.put(i, str(i))
        cache.get(0)  # used every time: never evicted
    assert len(cache) == 3 and 0 in cache and list(cache) == [98, 99, 0]
    assert cache.get(50) is None


# -- _vendor ------------------------------------------------------------------------------
def test_vendor_workspace_is_one_per_gpu(fake_alloc, current_gpu_1):
    w0 = _vendor.workspace("xqa", CUDA0, 64, zeroed=True)
    w1 = _vendor.workspace("xqa", CUDA1, 64, zeroed=True)
    assert w0 is not w1 and (w0.asked_device, w1.asked_device) == (CUDA0, CUDA1)
    assert _vendor.workspace("xqa", "cuda", 64, zeroed=True) is w1  # bare 'cuda' = the current GPU
    assert _vendor.workspace("xqa", CUDA0, 32, zeroed=True) is w0
    assert set(_vendor._workspaces) == {("xqa", CUDA0), ("xqa", CUDA1)}


def test_has_param_is_bounded():
    _vendor.has_param.cache_clear()
    fns = [eval(f"lambda x{i}: None") for i in range(400)]
    for i, fn in enumerate(fns):
        assert _vendor.has_param(fn, f"x{i}")
    assert _vendor.has_param.cache_info().currsize <= 256


# -- FlashInfer fa2/fa3 wrappers -------------------------------------------------------------
def test_flashinfer_wrappers_are_per_gpu_and_bounded(monkeypatch, fake_alloc, current_gpu_1):
    for name, mod in fv.make_flashinfer(fv.Recorder()).items():
        monkeypatch.setitem(sys.modules, name, mod)
    _vendor.forget_imports()
    provider = FlashInferPrefill("fa2")
    problem = fv.make_problem()
    w0, w1 = provider._wrapper(problem, CUDA0, True), provider._wrapper(problem, CUDA1, True)
    assert w0 is not w1 and provider._wrapper(problem, "cuda", True) is w1
    assert provider._wrapper(problem, CUDA0, True) is w0
    for window in range(3 * MAX_WRAPPERS):
        provider._wrapper(replace(problem, window_left=window), CUDA0, True)
    assert len(provider._wrappers) == MAX_WRAPPERS
    _vendor.forget_imports()


# -- cuDNN --------------------------------------------------------------------------------
class _OnGpu:
    """A CPU tensor that reports a CUDA device (graph_key reads only device, strides, shape)."""

    def __init__(self, t, device):
        self._t, self.device = t, device

    def __getattr__(self, name):
        return getattr(self._t, name)


def _cudnn_batch(problem, q_lens=(3, 5), kv_lens=(9, 13), sm_scale=0.1):
    batch, _ = fv.make_batch(problem, list(q_lens), list(kv_lens), sm_scale=sm_scale)
    return batch


def test_cudnn_graph_key_holds_the_gpu():
    problem = fv.make_problem(kv_storage="ragged", q_dtype="float32", kv_dtype="float32", out_dtype="float32")
    batch = _cudnn_batch(problem)
    keys = []
    for device in (CUDA0, CUDA1):
        keys.append(cudnn_adapter.graph_key(problem, replace(batch, q=_OnGpu(batch.q, device))))
    assert (keys[0].device, keys[1].device) == (CUDA0, CUDA1) and keys[0] != keys[1]
    assert replace(keys[0], device=CUDA1) == keys[1]  # nothing else tells them apart


def test_cudnn_graph_cache_is_bounded(monkeypatch):
    sys.path.insert(0, "tests")
    from test_cudnn_contract import make_fake_cudnn

    monkeypatch.setitem(sys.modules, "cudnn", make_fake_cudnn())
    monkeypatch.setattr(cudnn_adapter, "MAX_GRAPHS", 4)
    backend = cudnn_adapter.CudnnBackend()
    problem = fv.make_problem(kv_storage="ragged", q_dtype="float32", kv_dtype="float32", out_dtype="float32")
    plans = [backend.plan(problem, _cudnn_batch(problem, sm_scale=0.01 * (i + 1))) for i in range(10)]
    assert len(backend.cached_keys()) == 4  # ten float scales, ten graphs, four kept
    assert backend.cached_keys() == [p.key for p in plans[-4:]]
    assert plans[0].entry.graph is not None  # an evicted graph still serves its plan


def test_cudnn_handle_is_per_gpu(monkeypatch, current_gpu_1):
    made = []
    fake = SimpleNamespace(create_handle=lambda: made.append(object()) or made[-1], set_stream=lambda h, s: None)
    monkeypatch.setattr(cudnn_adapter, "on_device", lambda d: _device.on_device(torch.device("cpu")))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=0))
    backend = cudnn_adapter.CudnnBackend()
    h0, h1 = backend._handle(fake, CUDA0), backend._handle(fake, CUDA1)
    assert h0 is not h1 and backend._handle(fake, torch.device("cuda")) is h1 and len(made) == 2


# -- native-triton --------------------------------------------------------------------------
def test_native_sm_count_is_per_gpu(monkeypatch, current_gpu_1):
    counts = {0: 132, 1: 78}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=counts[i]))
    monkeypatch.setattr(tb, "_SM_COUNT", {})
    assert (tb._sm_count(CUDA0), tb._sm_count(CUDA1), tb._sm_count(torch.device("cuda"))) == (132, 78, 78)


def _native_case():
    problem = fv.make_problem(q_dtype="float32", kv_dtype="float32", out_dtype="float32", num_qo_heads=4,
                              num_kv_heads=2, head_dim_qk=16, head_dim_vo=16, page_size=4)
    batch, refs = fv.make_batch(problem, [2, 3], [7, 9], sm_scale=-0.3)
    return problem, batch, refs


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the Triton interpreter (CI's form)")
def test_native_plan_remembers_its_gpu_and_runs_under_the_tensors_gpu(monkeypatch):
    problem, batch, refs = _native_case()
    backend = tb.NativeTritonBackend()
    plan = backend.plan(problem, batch)
    assert plan.device == torch.device("cpu")
    moved = replace(plan, device=CUDA1, facts=(*plan.facts[:-1], CUDA1))  # a plan made on another GPU
    assert backend.plan_for(moved, batch) is not moved  # never launched with another GPU's buffers
    guarded = []
    monkeypatch.setattr(tb, "on_device", lambda d: guarded.append(d) or _device.on_device(d))
    backend.run(plan, batch)
    assert guarded == [batch.q.device]
    out_ref, _ = fv.reference(problem, batch, refs)
    assert (batch.out.double() - out_ref).norm() / out_ref.norm() < 1e-5


def test_alibi_slopes_cache_holds_the_gpu_and_is_bounded():
    _numerics.alibi_tensor.cache_clear()
    a = _numerics.alibi_tensor(8, torch.device("cpu"))
    b = _numerics.alibi_tensor(8, torch.device("meta"))
    assert a.device != b.device and _numerics.alibi_tensor(8, torch.device("cpu")) is a
    for heads in range(1, 200):
        _numerics.alibi_tensor(heads, torch.device("cpu"))
    assert _numerics.alibi_tensor.cache_info().currsize <= 64


# -- two real GPUs --------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_native_triton_on_two_gpus_after_one_another():
    """The observed bug: after a call on cuda:0, the same problem on cuda:1 must still be right."""
    problem, batch0, refs = _native_case()
    problem = replace(problem, device_type="cuda")
    backend = tb.NativeTritonBackend()
    out_ref, _ = fv.reference(problem, batch0, refs)
    for device in (CUDA0, CUDA1, CUDA0):
        batch = fv.to_device(replace(batch0, out=batch0.out.clone()), device)
        backend.run(backend.plan(problem, batch), batch)
        torch.cuda.synchronize(device)
        assert batch.out.device == device
        assert (batch.out.double().cpu() - out_ref).norm() / out_ref.norm() < 1e-5
        assert not math.isnan(batch.out.double().sum().item())
