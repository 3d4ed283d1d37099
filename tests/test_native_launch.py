"""native-triton's launcher (backends/native/_launch.py): the first call of a specialization goes
through Triton's ``kernel[grid]``, later calls with the same specialization call the cached compiled
kernel's launcher directly, with pointers as addresses and the constexprs in parameter order; any
change Triton would specialize on (alignment, dtype, an integer, None-ness, a per-call constexpr)
and any launch hook go back through ``kernel[grid]``.

Triton's real launcher needs a GPU (tools/native_h100.py runs the kernels through it and checks
them against fp64); here the kernel is a recording stand-in with Triton 3.6's interface.
"""
from __future__ import annotations

import pytest
import torch

from backends.native import _launch
from backends.native._launch import KernelLaunch


class _Compiled:
    """Triton 3.6's CompiledKernel as JITFunction.run uses it."""

    function = 0xF00
    packed_metadata = ("meta",)

    def __init__(self):
        self.direct_calls = []

    def run(self, *args):
        self.direct_calls.append(args)


class _Kernel:
    """``kernel[grid](*args, **options)`` records the call and returns one compiled kernel per key."""

    def __init__(self):
        self.triton_calls = []
        self.compiled = _Compiled()

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.triton_calls.append((grid, args, options))
            return self.compiled
        return launch


@pytest.fixture
def fake_stream(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1000 + index, raising=False)


def _launch_and_args():
    kernel = _Kernel()
    launch = KernelLaunch(kernel, (4, 2), ("C1", 7), {"num_warps": 4}, torch.device("cuda", 3), direct=True)
    q = torch.randn(64, 8)
    idx = torch.arange(5, dtype=torch.int32)
    return kernel, launch, q, idx


def test_second_call_is_direct_with_addresses_and_constexprs_in_order(fake_stream):
    kernel, launch, q, idx = _launch_and_args()
    launch((q, None, idx, 0.5), (8, 1, 16), (True,))
    assert len(kernel.triton_calls) == 1 and kernel.compiled.direct_calls == []
    grid, args, options = kernel.triton_calls[0]
    assert grid == (4, 2, 1) and args == (q, None, idx, 0.5, 8, 1, 16, "C1", 7, True) and options == {"num_warps": 4}
    launch((q, None, idx, 0.25), (8, 1, 16), (True,))  # another float value: not specialized on
    assert len(kernel.triton_calls) == 1
    (call,) = kernel.compiled.direct_calls
    assert call == (4, 2, 1, 1003, 0xF00, ("meta",), None, None, None,
                    q.data_ptr(), None, idx.data_ptr(), 0.25, 8, 1, 16, "C1", 7, True)


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int_value", "none", "flag"])
def test_a_change_triton_specializes_on_goes_through_triton(fake_stream, change):
    kernel, launch, q, idx = _launch_and_args()
    launch((q, None, idx, 0.5), (8, 1, 16), (True,))
    head, ints, flags = (q, None, idx, 0.5), (8, 1, 16), (True,)
    if change == "misaligned":
        head = (q.view(-1)[1:], None, idx, 0.5)  # 4 bytes off a 16-byte boundary
    elif change == "dtype":
        head = (q.half(), None, idx, 0.5)
    elif change == "int_value":
        ints = (8, 2, 16)  # a 1 is a constexpr for Triton
    elif change == "none":
        head = (q, idx, idx, 0.5)
    else:
        flags = (False,)
    launch(head, ints, flags)
    assert len(kernel.triton_calls) == 2 and kernel.compiled.direct_calls == []
    launch(head, ints, flags)  # now known: direct
    assert len(kernel.triton_calls) == 2 and len(kernel.compiled.direct_calls) == 1


def test_a_per_call_grid_is_honoured_on_both_paths(fake_stream):
    kernel, launch, q, idx = _launch_and_args()
    launch((q,), (8,), (), grid=(9, 5, 1))
    launch((q,), (8,), (), grid=(3, 5, 1))
    assert kernel.triton_calls[0][0] == (9, 5, 1) and kernel.compiled.direct_calls[0][:3] == (3, 5, 1)


def test_a_launch_hook_takes_tritons_path(fake_stream, monkeypatch):
    from triton import knobs

    kernel, launch, q, idx = _launch_and_args()
    launch((q,), (8,), ())
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    launch((q,), (8,), ())
    assert len(kernel.triton_calls) == 2 and kernel.compiled.direct_calls == []


def test_interpreter_and_unknown_launchers_always_take_tritons_path(fake_stream):
    kernel, launch, q, idx = _launch_and_args()
    launch.direct = False
    for _ in range(2):
        launch((q,), (8,), ())
    assert len(kernel.triton_calls) == 2 and kernel.compiled.direct_calls == []
    kernel2, launch2, _, _ = _launch_and_args()
    kernel2.compiled = object()  # no run/function/packed_metadata: another Triton's launcher
    for _ in range(2):
        launch2((q,), (8,), ())
    assert len(kernel2.triton_calls) == 2 and launch2.direct is False


def test_variants_per_launch_are_bounded(fake_stream):
    kernel, launch, q, idx = _launch_and_args()
    for i in range(_launch.MAX_VARIANTS + 3):
        launch((q,), (8, i + 2), ())
    assert len(launch._variants) == _launch.MAX_VARIANTS
