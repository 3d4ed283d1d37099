"""Check our direct calls of FlashInfer's kernels against FlashInfer's own Python, on a machine
without a GPU (the kernels stand-ins that record what they receive):

* fa2 / fa3 (backends/_fi_prefill.py ``recorded_run``): FlashInfer's real ``BatchPrefillWith{Paged,
  Ragged}KVCacheWrapper`` (plan and run as shipped). For each wrapper kind, layout, LSE on or off,
  features and fa2 / fa3: after the first run records, does our run call the op with exactly what
  FlashInfer's run() passes for the same call?
* XQA (backends/xqa.py ``DirectXqa``, abi "0.7"): FlashInfer's real ``xqa_batch_decode_with_kv_cache``
  against our direct launch and launcher, per layout, sinks, window, fp8 KV and a device scale.
* The host time per call on this CPU of FlashInfer's call, our run and our launcher (the kernel a
  stand-in: what the Python layers cost, not a GPU launch).

    python -m tools.check_fi_direct_runs SITE     # SITE: a folder holding the flashinfer package

SITE: e.g. ``pip install --no-deps --target SITE .whl072/flashinfer_python-0.7.2-*.whl``. The
packages FlashInfer imports for its compiler and downloads (tvm_ffi, requests, pynvml) are
stand-ins here when missing: nothing compiles or downloads.
"""
from __future__ import annotations

import importlib
import itertools
import sys
import time
import types
from types import SimpleNamespace
from typing import Optional
from unittest import mock

import torch

from backends._fi_prefill import FiState, FlashInferPrefill

STAND_INS = ("tvm_ffi", "tvm_ffi.libinfo", "tvm_ffi.cpp", "tvm_ffi.core", "requests", "pynvml")
HEADS, KV_HEADS, HEAD_DIM, PAGE = 4, 2, 64, 16
FEATURES = ({}, {"window_left": 5, "logits_soft_cap": 30.0})
SMS = 132


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class CompiledModule:
    """FlashInfer's compiled batch-prefill module: plan returns a plan info, the runs record."""

    def __init__(self):
        self.ops: list = []

    def plan(self, *args):
        return [7, 7, 7]

    def paged_run(self, *args):
        self.ops.append(("paged_run", args))

    def ragged_run(self, *args):
        self.ops.append(("ragged_run", args))


def load_flashinfer(site: str, compiled: CompiledModule):
    sys.path.insert(0, site)
    for name in STAND_INS:
        try:
            __import__(name)
        except ImportError:
            sys.modules[name] = _StandIn(name)
    # importlib: the package's attribute ``xqa`` is a function, not the module
    decode, prefill, xqa = (importlib.import_module(f"flashinfer.{name}") for name in ("decode", "prefill", "xqa"))
    prefill.get_batch_prefill_module = lambda *a, **k: compiled
    prefill.device_support_pdl = lambda device: False
    # XQA as on an H200: sm_90, 132 SMs, PDL; each kernel variant's entry records what it receives
    decode.device_support_pdl, decode.get_device_sm_count = (lambda device: True), (lambda device: SMS)
    xqa.get_compute_capability = lambda device: (9, 0)
    xqa.get_xqa_module = lambda *variant: SimpleNamespace(xqa=lambda *args: compiled.ops.append(("xqa", variant, args)))
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_properties = lambda device=None: SimpleNamespace(multi_processor_count=SMS)
    return prefill, decode


def unpinned(fn):
    """torch.empty without pin_memory: FlashInfer pins its host buffers, which needs a GPU."""
    def empty(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return fn(*args, **kwargs)
    return empty


def same_arguments(a: tuple, b: tuple, by_value: tuple = ()) -> bool:
    """Tensors the same memory, shape and strides; those at ``by_value`` (made per call: a device
    scale) the same values; the rest equal."""
    def same(x, y):
        if isinstance(x, torch.Tensor) and id(x) in values:
            return isinstance(y, torch.Tensor) and torch.equal(x.reshape(-1).float(), y.reshape(-1).float())
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and (x.data_ptr(), x.shape, x.stride()) == (y.data_ptr(), y.shape, y.stride())
        return x == y
    values = {id(a[i]) for i in by_value if i < len(a)}
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def planned(prefill, kind: str, paged: bool, layout: str, features: Optional[dict] = None):
    provider = FlashInferPrefill(kind)
    provider.version = lambda: sys.modules["flashinfer"].__version__
    provider.loaded = lambda: SimpleNamespace(module=prefill)
    workspace = torch.empty(1 << 20, dtype=torch.uint8)
    qo = torch.tensor([0, 3, 5], dtype=torch.int32)
    if paged:
        wrapper = prefill.BatchPrefillWithPagedKVCacheWrapper(workspace, layout, backend=kind)
        index = (qo, torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32),
                 torch.tensor([5, 9], dtype=torch.int32), HEADS, KV_HEADS, HEAD_DIM, PAGE)
    else:
        wrapper = prefill.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=kind)
        index = (qo, torch.tensor([0, 5, 30], dtype=torch.int32), HEADS, KV_HEADS, HEAD_DIM)
    kwargs = dict(causal=True, sm_scale=0.125, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
                  head_dim_vo=HEAD_DIM, **(features or {}))
    state = FiState(wrapper, index, kwargs, paged)
    provider._apply_plan(state)
    return provider, state


def a_call(paged: bool, with_lse: bool) -> SimpleNamespace:
    q = torch.randn(5, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    shape = (4, PAGE, KV_HEADS, HEAD_DIM) if paged else (30, KV_HEADS, HEAD_DIM)  # logical NHD
    return SimpleNamespace(q=q, k=torch.randn(shape, dtype=torch.bfloat16), v=torch.randn(shape, dtype=torch.bfloat16),
                           out=torch.empty_like(q), lse=torch.empty(5, HEADS) if with_lse else None,
                           sm_scale=0.125, out_scale=1.0)


def check(prefill, compiled: CompiledModule, kind: str, paged: bool, layout: str, with_lse: bool,
          features: dict) -> str:
    provider, state = planned(prefill, kind, paged, layout, features)
    problem = SimpleNamespace(kv_layout=layout)
    provider.run(problem, state, a_call(paged, with_lse))
    call = a_call(paged, with_lse)
    provider.run(problem, state, call)
    ours = compiled.ops[-1]
    k, v = (call.k.permute(0, 2, 1, 3), call.v.permute(0, 2, 1, 3)) if layout == "HND" else (call.k, call.v)
    state.wrapper.run(call.q, *(((k, v),) if paged else (k, v)), out=call.out, lse=call.lse, return_lse=with_lse)
    theirs = compiled.ops[-1]
    same = ours[0] == theirs[0] and same_arguments(ours[1], theirs[1])
    shown = ", ".join(f"{k} {v}" for k, v in features.items()) or "none"
    return (f"| {'paged' if paged else 'ragged'} | {layout} | {with_lse} | {shown} | {kind} | {state.direct is not None} "
            f"| {len(theirs[1])} | {same} |")


def xqa_call(layout: str, sinks: bool, window: int, fp8: bool, tensor_scale: bool):
    """(problem, our batch, FlashInfer's arguments) for one decode call of 3 requests over pages of 16."""
    from dispatch.problem import AttentionBatch
    from dispatch.benchmark.vendors import make_problem
    kv_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    problem = make_problem(entry="xqa_batch_decode_with_kv_cache", phase="decode", num_qo_heads=8, num_kv_heads=2,
                           head_dim_qk=HEAD_DIM, head_dim_vo=HEAD_DIM, page_size=PAGE, kv_layout=layout,
                           window_left=window, kv_dtype="float8_e4m3fn" if fp8 else "bfloat16", device_type="cuda")
    physical = (5, 2, PAGE, HEAD_DIM) if layout == "HND" else (5, PAGE, 2, HEAD_DIM)
    k, v = torch.randn(physical).to(kv_dtype), torch.randn(physical).to(kv_dtype)
    logical = (k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)) if layout == "HND" else (k, v)
    q, out = torch.randn(3, 8, HEAD_DIM, dtype=torch.bfloat16), torch.empty(3, 8, HEAD_DIM, dtype=torch.bfloat16)
    table, lens = torch.tensor([[0, 1], [2, 3], [4, 0]], dtype=torch.int32), torch.tensor([20, 17, 9], dtype=torch.int32)
    scale = torch.tensor(0.125) if tensor_scale else 0.125
    batch = AttentionBatch(q=q, k=logical[0], v=logical[1], qo_indptr=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
                           kv_lens=lens, out=out, batch_size=3, max_q_len=1, max_kv_len=20, sm_scale=scale,
                           out_scale=1.0, block_table=table, sinks=torch.randn(8) if sinks else None)
    fi_args = ((q, (k, v), None, table, lens, 32, scale, 1.0, window),
               dict(out=out, sinks=batch.sinks, kv_layout=layout))
    return problem, batch, fi_args


def check_xqa(decode, compiled: CompiledModule, layout: str, sinks: bool, window: int, fp8: bool,
              tensor_scale: bool) -> str:
    from backends.xqa import XqaBackend, XqaPlan
    problem, batch, (args, kwargs) = xqa_call(layout, sinks, window, fp8, tensor_scale)
    workspace = torch.zeros(16 << 20, dtype=torch.uint8)
    direct = XqaBackend.bind_direct(problem, batch.q.dtype, batch.k.dtype, batch.out.dtype, batch.q.device,
                                    workspace, "0.7")
    decode.xqa_batch_decode_with_kv_cache(args[0], args[1], workspace, *args[3:], **kwargs)
    theirs = compiled.ops[-1]
    XqaBackend._launch_direct(direct, batch)
    ours = compiled.ops[-1]
    same = theirs[1] == (batch.q.dtype, batch.k.dtype, PAGE, HEAD_DIM, 4, window >= 0, batch.out.dtype, 1, False)
    same = same and same_arguments(ours[2], theirs[2], by_value=(4,))  # 4: q_scale
    launched = "n/a (a device scale)"
    launch = XqaBackend().launcher(XqaPlan(problem, None, direct=direct), batch)
    if launch is not None:
        launch(batch)
        launched = str(same_arguments(compiled.ops[-1][2], theirs[2]))
    return (f"| {layout} | {sinks} | {window} | {fp8} | {tensor_scale} | {len(theirs[2])} | {same} | {launched} |")


def per_call_us(fn, calls: int = 5000) -> float:
    for _ in range(200):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def host_times(prefill) -> list[str]:
    provider, state = planned(prefill, "fa2", True, "NHD")
    problem, call = SimpleNamespace(kv_layout="NHD"), a_call(True, False)
    provider.run(problem, state, call)
    launch = provider.launcher(problem, state, call)
    rows = [("FlashInfer's run()", lambda: state.wrapper.run(call.q, (call.k, call.v), out=call.out)),
            ("our run (the recorded op)", lambda: provider.run(problem, state, call)),
            ("our launcher (a lane's repeats)", lambda: launch(call))]
    return [f"| {name} | {per_call_us(fn):.1f} |" for name, fn in rows]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    compiled = CompiledModule()
    torch.empty = unpinned(torch.empty)
    prefill, decode = load_flashinfer(argv[0], compiled)
    print(f"FlashInfer {sys.modules['flashinfer'].__version__} wrapper Python, torch {torch.__version__}, CPU\n")
    print("| wrapper | layout | lse | features | kind | recorded | op arguments | same as FlashInfer's run() |\n"
          "|---|---|---|---|---|---|---|---|")
    for paged, layout in ((True, "NHD"), (True, "HND"), (False, "NHD")):
        for with_lse in (True, False):
            for features in FEATURES:
                for kind in ("fa2", "fa3"):
                    print(check(prefill, compiled, kind, paged, layout, with_lse, features))
    print("\n| XQA layout | sinks | window_left | fp8 KV | device scale | entry arguments | direct launch = "
          "FlashInfer's | launcher = FlashInfer's |\n|---|---|---|---|---|---|---|---|")
    for layout, sinks, window, fp8, tensor_scale in itertools.product(("NHD", "HND"), (False, True), (-1, 7),
                                                                     (False, True), (False, True)):
        print(check_xqa(decode, compiled, layout, sinks, window, fp8, tensor_scale))
    print("\n| paged NHD fa2, stand-in op | host us per call |\n|---|---|")
    print("\n".join(host_times(prefill)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
