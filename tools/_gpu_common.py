"""Timing shared by the tools/gpu_*.py scripts and tools/host_cost.py (run on the device machine)."""
from __future__ import annotations

import torch

SPIN_CYCLES_PER_US = 2000  # torch.cuda._sleep counts SM clock cycles: ~2 GHz on an H100/H200


def time_ms(fn, reps: int = 30, warmup: int = 5, calls: int = 1, ahead_us: float = 0.0) -> float:
    """Median of ``reps`` CUDA-event timings of ``fn`` after ``warmup`` calls (compiles, caches),
    in ms per call of ``fn``.

    ``calls``: back-to-back calls of ``fn`` between the two events (the time is divided by it).
    ``ahead_us``: queue a GPU spin of about that many microseconds before the start event, so
    the host has queued every call before the GPU reaches them and the events time the GPU's
    work alone, not the host's launch gaps (for problems smaller than their host cost; pass
    about twice the host time of the ``calls`` calls).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if ahead_us > 0:
            torch.cuda._sleep(int(ahead_us * SPIN_CYCLES_PER_US))
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]
