"""The one timing helper: CUDA events on a GPU (eager, or a CUDA graph's replay), the wall clock
on the CPU. Used by ``attn-dispatch bench``, ``autotune`` and the scripts under tools/."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Optional, Sequence

import torch

SPIN_CYCLES_PER_US = 2000  # torch.cuda._sleep counts SM clock cycles: ~2 GHz on an H100/H200


def time_ms(fn: Callable[[], Any], reps: int = 30, warmup: int = 5, calls: int = 1, ahead_us: float = 0.0,
            before_rep: Optional[Callable[[], Any]] = None) -> float:
    """Median of ``reps`` CUDA-event timings of ``fn`` after ``warmup`` calls (compiles, caches),
    in ms per call of ``fn``.

    ``calls``: back-to-back calls of ``fn`` between the two events (the time is divided by it).
    ``ahead_us``: queue a GPU spin of about that many microseconds before the start event, so
    the host has queued every call before the GPU reaches them and the events time the GPU's
    work alone, not the host's launch gaps (for problems smaller than their host cost; pass
    about twice the host time of the ``calls`` calls).
    ``before_rep``: run before each repetition, outside its events (the autotune flushes the L2).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before_rep is not None:
            before_rep()
        if ahead_us > 0:
            torch.cuda._sleep(int(ahead_us * SPIN_CYCLES_PER_US))
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def wall_ms(fn: Callable[[], Any], reps: int = 5, warmup: int = 1, calls: int = 1) -> float:
    """Median wall-clock ms per call (the CPU's timer: no events there)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(times)


def device_ms(fn: Callable[[], Any], device: str, reps: int, calls: int = 1,
              before_rep: Optional[Callable[[], Any]] = None) -> float:
    """ms per call on ``device``: CUDA events behind a spin of twice the host time (so launch
    gaps of small problems are not counted), or the wall clock on the CPU. ``fn`` is warm."""
    if device != "cuda":
        return wall_ms(fn, reps=reps, warmup=0, calls=calls)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    return time_ms(fn, reps=reps, warmup=0, calls=calls, ahead_us=min(5e5, max(2000.0, 2 * host_us)),
                   before_rep=before_rep)


def graph_ms(calls: Sequence[Callable[[], Any]], reps: int) -> tuple[float, torch.cuda.CUDAGraph]:
    """ms per call of replaying one CUDA graph that captured every call of ``calls`` once (each
    call warm: planned outside the capture), and the graph (its replay must equal eager)."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captures on its own side stream
        for fn in calls:
            fn()
    torch.cuda.synchronize()
    return time_ms(graph.replay, reps=reps, warmup=1) / len(calls), graph
