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


def test_compiled_says_whether_a_call_would_compile(fake_stream):
    """What a launch under CUDA-graph capture asks first (padded_lse.write): only a known variant."""
    kernel, launch, q, idx = _launch_and_args()
    head, ints = (q, None, idx, 0.5), (8, 1, 16)
    assert not launch.compiled(head, ints, (True,))
    launch(head, ints, (True,))
    assert launch.compiled(head, ints, (True,)) and launch.compiled((q, None, idx, 0.25), ints, (True,))
    assert not launch.compiled(head, (8, 2, 16), (True,)) and not launch.compiled(head, ints, (False,))
    launch.direct = False  # the interpreter: nothing is compiled ahead, every call may run
    assert launch.compiled(head, (8, 2, 16), (True,))


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
        launch((q,), (8,), (i,))  # a per-call constexpr: a variant each
    assert len(launch._variants) == _launch.MAX_VARIANTS


def test_an_integer_of_the_same_specialization_launches_directly(fake_stream):
    """A new value that Triton specializes alike (not 1, as divisible by 16, 32-bit) reuses the
    compiled variant: a serving loop's sizes change every step."""
    kernel, launch, q, idx = _launch_and_args()
    launch((q,), (8, 32, 3), ())
    for ints in ((24, 48, 5), (8, 2 ** 20, 7)):
        launch((q,), ints, ())
    assert len(kernel.triton_calls) == 1 and [c[-5:-2] for c in kernel.compiled.direct_calls] == [
        (24, 48, 5), (8, 2 ** 20, 7)]
    for ints in ((1, 32, 3), (8, 33, 3), (8, 32, 2 ** 31)):  # == 1, not divisible by 16, 64-bit
        launch((q,), ints, ())
    assert len(kernel.triton_calls) == 4


def test_plans_of_one_kernel_and_constexprs_share_its_compiled_variants(fake_stream):
    """A new plan (a new batch) launches what an earlier plan's launch compiled."""
    kernel, first, q, idx = _launch_and_args()
    first((q,), (8,), ())
    later = KernelLaunch(kernel, (9, 2), ("C1", 7), {"num_warps": 4}, torch.device("cuda", 3), direct=True)
    later((q,), (24,), ())
    other = KernelLaunch(kernel, (9, 2), ("C1", 8), {"num_warps": 4}, torch.device("cuda", 3), direct=True)
    other((q,), (24,), ())  # other constexprs: its own variant
    assert len(kernel.triton_calls) == 2 and kernel.compiled.direct_calls[0][:3] == (9, 2, 1)


# -- repeat: the launch behind NativeTritonBackend.launcher -----------------------------------------
def test_repeat_calls_the_compiled_kernel_with_only_the_new_addresses(fake_stream):
    kernel, launch, q, idx = _launch_and_args()
    head, ints, flags = (q, None, idx, 0.5), (8, 1, 16), (True,)
    launch(head, ints, flags)  # Triton's path compiles the specialization
    repeat = launch.repeat(head, ints, flags, slots=(0, 2))
    q2, idx2 = torch.randn(64, 8), torch.arange(5, dtype=torch.int32) + 1
    repeat((q2, idx2))
    assert len(kernel.triton_calls) == 1
    launch((q2, None, idx2, 0.5), ints, flags)  # the general direct call of the same arguments
    assert kernel.compiled.direct_calls[0] == kernel.compiled.direct_calls[1]
    assert kernel.compiled.direct_calls[0][9:13] == (q2.data_ptr(), None, idx2.data_ptr(), 0.5)


def test_repeat_takes_the_general_call_when_not_proven(fake_stream, monkeypatch):
    """A misaligned address, a launch hook, or a specialization never compiled: Triton's path."""
    kernel, launch, q, idx = _launch_and_args()
    head, ints, flags = (q, None, idx, 0.5), (8, 1, 16), (True,)
    never = launch.repeat(head, ints, flags, slots=(0, 2))  # before any launch: nothing compiled
    never((q, idx))
    assert len(kernel.triton_calls) == 1 and kernel.compiled.direct_calls == []
    repeat = launch.repeat(head, ints, flags, slots=(0, 2))
    repeat((q.view(-1)[1:].view(-1), idx))  # 4 bytes off: another specialization
    assert len(kernel.triton_calls) == 2 and kernel.compiled.direct_calls == []
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    repeat((q, idx))
    assert len(kernel.triton_calls) == 3 and kernel.compiled.direct_calls == []


def test_repeat_reviews_tensors_of_another_dtype_on_the_general_path(fake_stream):
    kernel, launch, q, idx = _launch_and_args()
    launch.direct = False
    bits = torch.randint(0, 1 << 15, (4, 2), dtype=torch.int16)
    repeat = launch.repeat((bits,), (8,), (), slots=(0,))
    repeat((bits.view(torch.uint16),))
    (_, args, _), = kernel.triton_calls
    assert args[0].dtype == torch.int16 and torch.equal(args[0], bits)


# -- NativeTritonBackend.launcher under the interpreter: equal to run and to fp64 ---------------------
def _fresh_batch(c, extras_seed: int):
    from dispatch.benchmark.native import DEVICE, build
    from dispatch.problem import NAME_DTYPES, AttentionBatch

    torch.manual_seed(extras_seed)
    kw, dense_k, dense_v = build(c)
    total_q = sum(c.q_lens)
    out = torch.full((total_q, c.hq, c.dvo), float("nan"), device=DEVICE, dtype=NAME_DTYPES[c.dtype])
    lse = torch.full((total_q, c.hq), float("nan"), device=DEVICE)
    sinks = torch.rand(c.hq, device=DEVICE) * 3 if c.sinks else None
    scale = (lambda x: torch.tensor(x, device=DEVICE)) if c.tensor_scales else (lambda x: x)
    batch = AttentionBatch(out=out, lse=lse, sinks=sinks, sm_scale=scale(0.3), out_scale=scale(1.2), **kw)
    return batch, kw, dense_k, dense_v


LAUNCHER_CASES = {
    "paged_decode_gqa4": dict(page_size=4, hq=8, hkv=2, phase="decode", q_lens=(1, 1), kv_lens=(50, 9)),
    "ragged_rope_causal": dict(storage="ragged", pos="ROPE_LLAMA", q_lens=(3, 5), kv_lens=(40, 50)),
    "fp8_kv_sinks_tensor_scales": dict(kv_dtype="float8_e4m3fn", dtype="bfloat16", sinks=True, tensor_scales=True,
                                       q_lens=(3, 5), kv_lens=(45, 50)),
}


@pytest.mark.parametrize("split", [None, "fused merge", "merge kernel"])
@pytest.mark.parametrize("name", list(LAUNCHER_CASES))
def test_backend_launcher_equals_run_and_fp64_on_fresh_inputs(name, split):
    from backends.native.triton_backend import TileConfig
    from dispatch.benchmark.native import BACKEND, Case, problem_of
    from test_native_triton import assert_agrees_with_oracle

    c = Case(**LAUNCHER_CASES[name])
    first, *_ = _fresh_batch(c, 1)
    hpp = c.hq // c.hkv if c.phase != "prefill" else 1
    cfg = TileConfig(16, 16, hpp, num_warps=4, num_stages=1, fused_merge=split == "fused merge") if split else None
    plan = BACKEND.plan(problem_of(c), first, config=cfg, num_splits=3 if split else None)
    BACKEND.run(plan, first)
    launch = BACKEND.launcher(plan, first)
    assert launch is not None and (plan.merge is not None) == (split == "merge kernel")
    assert (plan.split_count is not None) == (split == "fused merge")
    batch, kw, dense_k, dense_v = _fresh_batch(c, 2)  # new tensors, same shapes and strides, poisoned out
    launch(batch)
    got, got_lse = batch.out.clone(), batch.lse.clone()
    assert_agrees_with_oracle(c, kw, dense_k, dense_v, batch.out, batch.lse, sm_scale=0.3, causal=c.causal,
                              sinks=None if batch.sinks is None else batch.sinks.cpu(), out_scale=1.2,
                              pos_encoding=c.pos)
    batch.out.fill_(float("nan"))
    batch.lse.fill_(float("nan"))
    BACKEND.run(plan, batch)
    assert torch.equal(batch.out, got) and torch.equal(batch.lse, got_lse)
    if plan.split_count is not None:  # each launch leaves the arrival counters as the plan made them
        assert not plan.split_count.any()


def test_backend_launcher_serves_other_sizes_as_run_does():
    """A batch larger than planned: the launcher launches the plan of the batch's own sizes, the one
    run uses (kept by the first plan), never the small plan's buffers; its output is run's."""
    from dispatch.benchmark.native import BACKEND, Case, problem_of

    c = Case(q_lens=(2, 2), kv_lens=(5, 6))
    small, *_ = _fresh_batch(c, 3)
    plan = BACKEND.plan(problem_of(c), small)
    big, *_ = _fresh_batch(Case(q_lens=(3, 3), kv_lens=(5, 6)), 4)
    launch = BACKEND.launcher(plan, big)
    assert launch is not None and len(plan.others) == 1
    launch(big)
    got, got_lse = big.out.clone(), big.lse.clone()
    assert not got.isnan().any()
    big.out.fill_(float("nan"))
    BACKEND.run(plan, big)
    assert torch.equal(big.out, got) and torch.equal(big.lse, got_lse) and len(plan.others) == 1


class CudaLauncher:
    """Triton 3.6's launcher as the bare launch sees it (same class name, scratch sizes, flags)."""

    global_scratch_size = 0
    profile_scratch_size = 0
    launch_cooperative_grid = False
    launch_pdl = True

    def __init__(self):
        self.c_calls, self.wrapper_calls = [], []

    def launch(self, *args):
        self.c_calls.append(args)

    def __call__(self, *args):
        self.wrapper_calls.append(args)


@pytest.mark.parametrize("version,scratch", [("3.6.0", 0), ("3.6.0", 256), ("3.9.0", 0)])
def test_repeat_calls_triton_36s_c_launch_without_its_wrapper(fake_stream, monkeypatch, version, scratch):
    """On Triton 3.6 with no scratch the repeat calls the C launch with the wrapper's own argument
    layout (cooperative, pdl, two scratch Nones, then what run() receives after function); otherwise run()."""
    import triton

    monkeypatch.setattr(triton, "__version__", version)
    kernel, launch, q, idx = _launch_and_args()
    launcher = CudaLauncher()
    launcher.global_scratch_size = scratch
    kernel.compiled.run = launcher
    head, ints, flags = (q, None, idx, 0.5), (8, 1, 16), (True,)
    launch(head, ints, flags)
    launch.repeat(head, ints, flags, slots=(0, 2))((q, idx))
    launch(head, ints, flags)  # the general direct call: through the wrapper
    via_wrapper = launcher.wrapper_calls[0]
    if version == "3.6.0" and scratch == 0:
        (c_call,) = launcher.c_calls
        assert c_call[:5] == via_wrapper[:5] and c_call[5:9] == (False, True, None, None)
        assert c_call[9:] == via_wrapper[5:]
    else:
        assert launcher.c_calls == [] and launcher.wrapper_calls == [via_wrapper] * 2
