"""Check the recorded fa2 / fa3 run (backends/_fi_prefill.py ``recorded_run``) against FlashInfer's
own wrapper Python, on a machine without a GPU: FlashInfer's real ``BatchPrefillWith{Paged,Ragged}
KVCacheWrapper`` (plan and run as shipped) with a stand-in compiled module that records what its
op receives. For each wrapper kind, layout, LSE on or off and fa2 / fa3: after the first run
records, does our run call the op with exactly what FlashInfer's run() passes for the same call?
And the host time per call on this CPU of FlashInfer's run(), our run and our launcher (the op a
stand-in: what the Python layers cost, not a GPU launch).

    python tools/check_fi_recorded_run.py SITE     # SITE: a folder holding the flashinfer package

SITE: e.g. ``pip install --no-deps --target SITE .whl072/flashinfer_python-0.7.2-*.whl``. The
packages FlashInfer imports for its compiler and downloads (tvm_ffi, requests, pynvml) are
stand-ins here when missing: nothing compiles or downloads.
"""
from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Optional
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from backends._fi_prefill import FiState, FlashInferPrefill  # noqa: E402

STAND_INS = ("tvm_ffi", "tvm_ffi.libinfo", "tvm_ffi.cpp", "tvm_ffi.core", "requests", "pynvml")
HEADS, KV_HEADS, HEAD_DIM, PAGE = 4, 2, 64, 16
FEATURES = ({}, {"window_left": 5, "logits_soft_cap": 30.0})


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
    import flashinfer.prefill as prefill
    prefill.get_batch_prefill_module = lambda *a, **k: compiled
    prefill.device_support_pdl = lambda device: False
    return prefill


def unpinned(fn):
    """torch.empty without pin_memory: FlashInfer pins its host buffers, which needs a GPU."""
    def empty(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return fn(*args, **kwargs)
    return empty


def same_arguments(a: tuple, b: tuple) -> bool:
    def same(x, y):
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and (x.data_ptr(), x.shape, x.stride()) == (y.data_ptr(), y.shape, y.stride())
        return x == y
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
    prefill = load_flashinfer(argv[0], compiled)
    print(f"FlashInfer {sys.modules['flashinfer'].__version__} wrapper Python, torch {torch.__version__}, CPU\n")
    print("| wrapper | layout | lse | features | kind | recorded | op arguments | same as FlashInfer's run() |\n"
          "|---|---|---|---|---|---|---|---|")
    for paged, layout in ((True, "NHD"), (True, "HND"), (False, "NHD")):
        for with_lse in (True, False):
            for features in FEATURES:
                for kind in ("fa2", "fa3"):
                    print(check(prefill, compiled, kind, paged, layout, with_lse, features))
    print("\n| paged NHD fa2, stand-in op | host us per call |\n|---|---|")
    print("\n".join(host_times(prefill)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
