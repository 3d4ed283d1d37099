"""Host overhead per call of each entry point's dispatch path, kernel excluded (CPU micro-benchmark).

The chosen backend's ``run`` is replaced by a no-op, so what is timed is: signature, cached
spec checks, normalization, AttentionBatch, router decide/plan/run bookkeeping and out/lse
allocation. "first" is the first call of a fresh key (full pydantic validation + routing);
"median" is the median of N later calls.

    python tools/overhead.py [-n 2000]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: dispatch, backends

import dispatch  # noqa: E402
from dispatch import entries, router  # noqa: E402
from dispatch.entries import _base  # noqa: E402
from dispatch.lab import (cudnn_args, paged, paged_wrapper, ragged, ragged_wrapper, trtllm_args,  # noqa: E402
                          xqa_args)
from backends import get_backend  # noqa: E402


def calls():
    """(name, setup -> zero-arg callable); setup runs after the caches are cleared."""
    c, r = paged(), ragged()

    def trtllm():
        args, kw = trtllm_args(c)
        return lambda: dispatch.trtllm_batch_context_with_kv_cache(*args, **kw)

    def xqa():
        args, kw = xqa_args(c)
        return lambda: dispatch.xqa_batch_decode_with_kv_cache(*args, **kw)

    def cudnn():
        args, kw = cudnn_args(c)
        return lambda: dispatch.cudnn_batch_prefill_with_kv_cache(*args, **kw)

    def single():
        return lambda: dispatch.single_prefill_with_kv_cache(r["q"], r["k"], r["v"], causal=True)

    def paged_run():
        w = paged_wrapper(c)
        return lambda: w.run(c["q"], c["cache"])

    def ragged_run():
        w = ragged_wrapper(r)
        return lambda: w.run(r["q"], r["k"], r["v"])

    def paged_plan():
        return lambda: paged_wrapper(c)

    return [("trtllm_batch_context_with_kv_cache", trtllm), ("xqa_batch_decode_with_kv_cache", xqa),
            ("cudnn_batch_prefill_with_kv_cache", cudnn), ("single_prefill_with_kv_cache", single),
            ("BatchPrefillWithPagedKVCacheWrapper.run", paged_run),
            ("BatchPrefillWithRaggedKVCacheWrapper.run", ragged_run),
            ("BatchPrefillWithPagedKVCacheWrapper.plan", paged_plan)]


def measure(setup, n: int) -> tuple[float, float, float]:
    entries.clear_caches()
    router.clear_caches()
    fn = setup()
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    medians = []
    for gpu_path in (False, True):  # True: what CUDA tensors pay after the first call (the fast lanes)
        _base.CPU_VALUE_CHECKS = not gpu_path
        try:
            fn()  # the lane's first call: its checked call
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        finally:
            _base.CPU_VALUE_CHECKS = True
        medians.append(statistics.median(times) * 1e6)
    return first * 1e6, medians[0], medians[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="timed calls per entry point")
    args = parser.parse_args(argv)
    backend = get_backend("reference")
    backend.run = lambda plan, batch: None  # exclude the kernel: the dispatch path only
    backend.launcher = lambda plan, batch: (lambda b: None)  # a repeat takes a launcher, as GPU backends give
    torch.set_num_threads(1)
    print(f"host overhead per call, CPU tensors, reference backend's run replaced by a no-op (n={args.n})")
    print(f"{'entry point':44s} {'first call us':>14s} {'median us':>10s} {'GPU path (lane)':>16s}")
    for name, setup in calls():
        first, median, fast = measure(setup, args.n)
        print(f"{name:44s} {first:14.1f} {median:10.1f} {fast:16.1f}")
    print("note: CPU tensors run the device-data (value) checks on every call; CUDA tensors only on the\n"
          "first call per key, and an exact repeat takes the fast lane (ATTN_DISPATCH_VALIDATE=full restores\n"
          "per-call checks). The last column drives the GPU's path with CPU tensors.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
