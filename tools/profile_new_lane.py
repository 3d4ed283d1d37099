"""Our layer's host cost on a call of new sizes, on the CPU, with the backend's run replaced by nothing.

    python -m tools.profile_new_lane [--calls 300] [--seed N]

The path a GPU call takes (``_base.CPU_VALUE_CHECKS = False``: the lanes and the cached checks, driven
with CPU tensors), so what is timed is ours alone: no kernel, no vendor. Prints, in microseconds (p50):
an xqa decode call whose batch is new every call (1-256 requests of 100-2300 keys, pages of 16, 32/8
heads, d128, bf16) and its exact repeat; the paged wrapper's first run after each plan (8-64 requests,
90% decoding one token) with a preallocated ``out``; and the parts of the new xqa call, each timed alone
on one call's arguments (timeit, best of 5): the lane key, the call key, the size class, the size
checks, the lane's sizes. The seed is drawn at run time and printed unless given. Measurement code:
never imported by dispatch/.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
import timeit

import torch

import dispatch
from dispatch import policy, router
from dispatch.entries import _base, xqa

HQ, HKV, D, PAGE = 32, 8, 128, 16


def _p50_us(samples: list) -> float:
    return statistics.median(samples) / 1e3


def xqa_calls(rng: random.Random, calls: int) -> tuple[float, float, tuple]:
    """(new call p50 us, exact repeat p50 us, one new call's argument values)."""
    pool = 4096
    cache = torch.randn(pool, 2, PAGE, HKV, D, dtype=torch.bfloat16)
    ws = torch.zeros(1 << 20, dtype=torch.uint8)

    def values():
        b = rng.randint(1, 256)
        lens = [rng.randint(100, 2300) for _ in range(b)]
        table = torch.randint(0, pool, (b, max(-(-n // PAGE) for n in lens)), dtype=torch.int32)
        return (torch.randn(b, HQ, D, dtype=torch.bfloat16), cache, ws, table, torch.tensor(lens, dtype=torch.int32),
                max(lens), D ** -0.5, 1.0)

    steps = [values() for _ in range(calls + 50)]
    for v in steps[:50]:
        dispatch.xqa_batch_decode_with_kv_cache(*v)
    new, repeat = [], []
    for v in steps[50:]:
        t0 = time.perf_counter_ns()
        dispatch.xqa_batch_decode_with_kv_cache(*v)
        t1 = time.perf_counter_ns()
        dispatch.xqa_batch_decode_with_kv_cache(*v)
        dispatch.xqa_batch_decode_with_kv_cache(*v)
        t2 = time.perf_counter_ns()
        dispatch.xqa_batch_decode_with_kv_cache(*v)
        repeat.append(time.perf_counter_ns() - t2)
        new.append(t1 - t0)
    return _p50_us(new), _p50_us(repeat), values()


def paged_first_runs(rng: random.Random, calls: int) -> float:
    """The paged wrapper's first run after each plan, p50 us (out given: no allocation timed)."""
    pages = 20000
    cache = torch.randn(pages, 2, PAGE, HKV, D, dtype=torch.bfloat16)
    wrapper = dispatch.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    q, out = torch.randn(8192, HQ, D, dtype=torch.bfloat16), torch.empty(8192, HQ, D, dtype=torch.bfloat16)
    times = []
    for i in range(calls + 30):
        b = rng.randint(8, 64)
        q_lens = [1 if rng.random() < 0.9 else rng.randint(17, 512) for _ in range(b)]
        kv = [n + rng.randint(100, 2000) for n in q_lens]
        counts = [-(-n // PAGE) for n in kv]
        wrapper.plan(torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32),
                     torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32),
                     torch.randperm(pages)[: sum(counts)].to(torch.int32),
                     torch.tensor([n - (c - 1) * PAGE for n, c in zip(kv, counts)], dtype=torch.int32),
                     HQ, HKV, D, PAGE, causal=True, q_data_type=torch.bfloat16)
        rows = sum(q_lens)
        t0 = time.perf_counter_ns()
        wrapper.run(q[:rows], cache, out=out[:rows])
        if i >= 30:
            times.append(time.perf_counter_ns() - t0)
    return _p50_us(times)


def xqa_parts(values: tuple) -> dict[str, float]:
    """Each part of a new xqa call, alone on these argument values (us, best of 5 x 20000)."""
    declaration = xqa.DECLARATION
    full = (*values, -1, None, None, "NHD", 1, 1.0, None, None, None)
    args = dict(zip(declaration.params, full))
    size = declaration.size_class(args)
    _, derived = xqa.XqaDecodeSpec.fast(args, values=False)
    strict = policy.strict_mode()
    parts = {
        "lane key": lambda: declaration.forms.latest.match(full, None, strict),
        "call key": lambda: declaration.call_key(args, size),
        "size class": lambda: declaration.size_class(args),
        "size checks": lambda: xqa.XqaDecodeSpec.fast(args, values=False),
        "lane's sizes": lambda: declaration.sizes(args, derived),
    }
    n = 20000
    return {name: min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6 for name, fn in parts.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    rng = random.Random(seed)
    _base.CPU_VALUE_CHECKS = False  # the GPU's cached path, driven on the CPU
    real_run = router.run
    router.run = lambda planned, batch: planned  # our layer alone
    try:
        new, repeat, values = xqa_calls(rng, args.calls)
        first_run = paged_first_runs(rng, args.calls)
        parts = xqa_parts(values)
    finally:
        router.run = real_run
        _base.CPU_VALUE_CHECKS = True
    print(f"seed {seed}; torch {torch.__version__}; {args.calls} calls; host us, p50, the backend's run left out")
    print(f"xqa decode, a new batch every call: {new:.1f}; its exact repeat: {repeat:.1f}")
    print(f"paged wrapper, the first run after each plan: {first_run:.1f}")
    print("xqa, a new call's parts: " + "; ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
