"""A native kernel's launch with its grid and constexprs fixed by a plan, at low host cost.

Why: ``kernel[grid](*args)`` spends about 30 us of Python per launch on Triton 3.6 for our ~60
arguments (binding them, specializing each, hashing the key; measured on the H100 with its compiled
launcher stubbed), more than the 20 us per launch that keeps our host cost at the vendors'. A plan
fixes the grid and the constexprs; per call only pointers, strides and the kinds of the scales vary.

So the first call with a given *specialization* goes through ``kernel[grid]`` (Triton compiles or
finds the right variant and returns its ``CompiledKernel``), and later calls with the same
specialization call that kernel's launcher directly. The specialization is what Triton 3.6 keys its
variants on: each pointer's dtype and 16-byte alignment, each integer's "== 1", "divisible by 16" and
32-bit properties (its value is an argument of the launch), which arguments are None, and the
per-call constexprs. The compiled variants are shared by every plan of the same kernel, constexprs
and options, so a plan made for a new batch launches directly. An unseen key, or a launch hook (a
profiler such as proton), always takes ``kernel[grid]``.

Arguments are given in the kernel's parameter order in three groups: ``head`` (pointers, None or
floats), ``ints``, then the plan's constexprs (held here) and the call's ``flags`` (constexprs chosen
per call). No allocation and no host synchronization: safe under CUDA-graph capture, where the
current stream is the capturing one.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch

from backends._device import BoundedCache

MAX_VARIANTS = 32  # specializations kept per kernel and constexprs (a serving loop sees a few)
# compiled variants per (kernel, constexprs, launch options, device): shared by every plan of those, so
# a plan made for a new batch (every step of a serving loop) launches the kernels compiled before
_COMPILED = BoundedCache(maxsize=256)


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (CPU tensors, no compiled launcher)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


_RUNTIME_KNOBS: list = []  # triton.knobs.runtime, read once (an import per call costs ~0.4 us)


def _hooks_active() -> bool:
    """A launch hook (profilers) needs Triton's own path, which builds the launch metadata."""
    if not _RUNTIME_KNOBS:
        from triton import knobs

        _RUNTIME_KNOBS.append(knobs.runtime)
    runtime = _RUNTIME_KNOBS[0]
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):  # Triton 3.6: an empty HookChain
            return True
    return False


def _values_and_key(head: tuple, ints: tuple, flags: tuple) -> tuple[list, tuple]:
    """The launcher's values of ``head`` (tensors as addresses) and the key of Triton's specialization:
    each tensor's dtype and whether its address is 16-byte aligned, None-ness, the ints, the flags."""
    values, kinds = [], []
    # an integer as Triton specializes it: == 1, divisible by 16, 32-bit (its value is a launch argument)
    ints_key = tuple((n == 1, n % 16 == 0, -2 ** 31 <= n < 2 ** 31) for n in ints)
    for x in head:
        if x is None or type(x) is float:
            values.append(x)
            kinds.append(x is None)
        else:
            ptr = x.data_ptr()
            values.append(ptr)  # an int skips the launcher's data_ptr() and pointer query
            kinds.append((x.dtype, not ptr & 15))
    return values, (tuple(kinds), ints_key, flags)


def _bare_launch(launcher: Any) -> Optional[tuple]:
    """(C launch, cooperative flag, PDL flag) of a Triton 3.6 CudaLauncher that needs no scratch, else
    None. Its Python ``__call__`` only allocates scratch buffers (none here) and forwards to
    ``launch(grid x3, stream, function, cooperative, pdl, global scratch, profile scratch, *args)``:
    calling that directly saves a Python frame and two repacks of ~70 arguments per launch. Other
    Triton versions differ (3.9 passes the metadata and hooks separately) and keep ``run``."""
    import triton

    if not triton.__version__.startswith("3.6.") or type(launcher).__name__ != "CudaLauncher":
        return None
    names = ("launch", "launch_cooperative_grid", "launch_pdl", "global_scratch_size", "profile_scratch_size")
    if not all(hasattr(launcher, n) for n in names) or launcher.global_scratch_size or launcher.profile_scratch_size:
        return None
    return launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl


def _direct_launcher(compiled: Any) -> bool:
    """Whether a CompiledKernel exposes the launcher call Triton 3.6's JITFunction.run makes."""
    return all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata"))


def _with_pointers(values: list, slots: tuple, tensors: tuple) -> Optional[list]:
    """``values`` with the tensors' addresses at ``slots``; None when one is not 16-byte aligned
    (the compiled kernel was specialized on aligned pointers) or a launch hook is active."""
    args = values.copy()
    misaligned = 0
    for i, t in zip(slots, tensors):
        ptr = t.data_ptr()
        misaligned |= ptr & 15
        args[i] = ptr
    return None if misaligned or _hooks_active() else args


class KernelLaunch:
    """One kernel of a plan: its default grid, constexprs (in parameter order) and launch options."""

    __slots__ = ("kernel", "grid", "constexprs", "options", "direct", "device_index", "_variants")

    def __init__(self, kernel: Any, grid: tuple, constexprs: tuple, options: dict, device: torch.device,
                 direct: bool):
        self.kernel = kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.constexprs = constexprs
        self.options = options
        self.direct = direct  # False: the interpreter, or a Triton whose launcher differs
        self.device_index = device.index if device.type == "cuda" else None
        key = (kernel, constexprs, tuple(sorted(options.items())), self.device_index)
        variants = _COMPILED.get(key)
        self._variants: dict = _COMPILED.put(key, {}) if variants is None else variants

    def __call__(self, head: tuple, ints: tuple, flags: tuple, grid: Optional[tuple] = None) -> None:
        grid = self.grid if grid is None else grid
        if not self.direct:
            self.kernel[grid](*head, *ints, *self.constexprs, *flags, **self.options)
            return
        values, key = _values_and_key(head, ints, flags)
        compiled = self._variants.get(key)
        if compiled is None or _hooks_active():
            self._first_launch(key, grid, head, ints, flags)
            return
        compiled.run(grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(self.device_index),
                     compiled.function, compiled.packed_metadata, None, None, None,
                     *values, *ints, *self.constexprs, *flags)

    def compiled(self, head: tuple, ints: tuple, flags: tuple) -> bool:
        """Whether a call with these arguments launches a kernel compiled before (no compile)."""
        return not self.direct or _values_and_key(head, ints, flags)[1] in self._variants

    def repeat(self, head: tuple, ints: tuple, flags: tuple, slots: tuple,
               grid: Optional[tuple] = None) -> Callable[[tuple], None]:
        """A launch for calls equal to (head, ints, flags, grid) but for the tensors at ``slots`` of
        ``head``, given per call in that order with the same dtypes (views of another dtype are
        re-viewed), shapes and strides. Direct: the cached compiled kernel is called with everything
        but those addresses fixed now, so a call costs a data_ptr() per tensor and the launcher; a
        pointer whose 16-byte alignment differs from ``head``'s, a launch hook, or no compiled
        kernel yet for ``head``'s specialization takes the general call."""
        grid = self.grid if grid is None else grid
        template = list(head)
        dtypes = [head[i].dtype for i in slots]

        def general(tensors: tuple) -> None:
            args = list(template)
            for i, t, dtype in zip(slots, tensors, dtypes):
                args[i] = t if t.dtype == dtype else t.view(dtype)
            self(tuple(args), ints, flags, grid)

        if not self.direct:
            return general
        values, key = _values_and_key(head, ints, flags)
        compiled = self._variants.get(key)
        if compiled is None or any(values[i] & 15 for i in slots):
            return general  # not compiled yet, or a misaligned address: the general call decides
        tail = (*ints, *self.constexprs, *flags)
        run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
        g0, g1, g2 = grid
        stream, index = torch._C._cuda_getCurrentRawStream, self.device_index
        bare = _bare_launch(run)
        if bare is not None:  # Triton 3.6's C launch itself, its Python wrapper skipped
            c_launch, coop, pdl = bare

            def direct_bare(tensors: tuple) -> None:
                args = _with_pointers(values, slots, tensors)
                if args is None:
                    general(tensors)
                    return
                c_launch(g0, g1, g2, stream(index), function, coop, pdl, None, None, metadata, None, None, None,
                         *args, *tail)

            return direct_bare

        def direct(tensors: tuple) -> None:
            args = _with_pointers(values, slots, tensors)
            if args is None:
                general(tensors)
                return
            run(g0, g1, g2, stream(index), function, metadata, None, None, None, *args, *tail)

        return direct

    def _first_launch(self, key: tuple, grid: tuple, head: tuple, ints: tuple, flags: tuple) -> None:
        compiled = self.kernel[grid](*head, *ints, *self.constexprs, *flags, **self.options)
        compiled = compiled.result() if hasattr(compiled, "result") else compiled  # async compile mode
        if not _direct_launcher(compiled):
            self.direct = False
        elif len(self._variants) < MAX_VARIANTS:
            self._variants[key] = compiled
