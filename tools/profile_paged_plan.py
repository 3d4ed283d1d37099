"""Where the paged wrapper's plan time goes, ours against FlashInfer's (a GPU machine with FlashInfer).

    python -m tools.profile_paged_plan --batches 200

New batches shaped like a continuous-batching step (8-64 requests, 90% decoding one token, the rest a
chunk of 17-512; 100-2000 keys each; page ids drawn from a shuffled pool), each planned and run 4 times
through both wrappers. Prints per side the p50 of plan(), the first run after it and the later runs;
FlashInfer's compiled plan alone (its module's plan, timed inside its own plan()); the CUDA runtime
calls and aten operators per plan of each side (torch.profiler); our plan's functions under cProfile,
and the slowest plans over SLOW_MS alone.
The seed is drawn at run time and printed unless given.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import statistics
import time

import torch

import dispatch

PAGES, PAGE, HQ, HKV, D = 20000, 16, 32, 8, 128
SLOW_MS = 1.5  # a plan this slow is profiled alone too


def batches(seed: int, n: int) -> list[tuple]:
    rng, out = random.Random(seed), []
    for _ in range(n):
        b = rng.randint(8, 64)
        q_lens = [1 if rng.random() < 0.9 else rng.randint(17, 512) for _ in range(b)]
        kv = [ql + rng.randint(100, 2000) for ql in q_lens]
        counts = [-(-x // PAGE) for x in kv]
        qo = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        indptr = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        ids = torch.randperm(PAGES, device="cuda")[: sum(counts)].to(torch.int32)
        last = torch.tensor([x - (c - 1) * PAGE for x, c in zip(kv, counts)], dtype=torch.int32, device="cuda")
        out.append((qo, indptr, ids, last, sum(q_lens)))
    return out


def plan(wrapper, item) -> None:
    qo, indptr, ids, last, _ = item
    wrapper.plan(qo, indptr, ids, last, HQ, HKV, D, PAGE, causal=True, q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16)


def timed(wrapper, items, q, cache) -> tuple[float, float, float]:
    """p50 ms of plan(), the first run after it, and the later runs (3 a batch)."""
    plans, firsts, laters = [], [], []
    for item in items:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        plan(wrapper, item)
        t1 = time.perf_counter()
        wrapper.run(q[: item[4]], cache)
        t2 = time.perf_counter()
        for _ in range(3):
            wrapper.run(q[: item[4]], cache)
        t3 = time.perf_counter()
        plans.append(t1 - t0), firsts.append(t2 - t1), laters.append((t3 - t2) / 3)
    return tuple(round(statistics.median(x) * 1e3, 4) for x in (plans, firsts, laters))


def runtime_calls(wrapper, items) -> None:
    """CUDA runtime calls and aten operators per plan, by host time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for item in items:
            plan(wrapper, item)
    torch.cuda.synchronize()
    rows = [(e.key, e.count / len(items), e.cpu_time_total / len(items)) for e in prof.key_averages()
            if e.key.startswith(("cuda", "aten::"))]
    for key, count, us in sorted(rows, key=lambda r: -r[2])[:20]:
        print(f"  {key:42s} {count:6.2f} a plan {us:8.1f} us")


def compiled_plan_ms(fi_wrapper, items, q, cache) -> float:
    """p50 ms of FlashInfer's compiled plan inside its own plan() (its module's plan, wrapped)."""
    module, spent = fi_wrapper._cached_module, []
    original = module.plan

    def timed_plan(*args):
        t0 = time.perf_counter()
        result = original(*args)
        spent.append(time.perf_counter() - t0)
        return result
    module.plan = timed_plan
    try:
        timed(fi_wrapper, items, q, cache)
    finally:
        module.plan = original
    return round(statistics.median(spent) * 1e3, 4)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None, help="default: drawn at run time")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    import flashinfer

    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed} ({'given' if args.seed is not None else 'drawn at run time'}); GPU "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashinfer {flashinfer.__version__}")
    cache = torch.randn(PAGES, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(8192, HQ, D, dtype=torch.bfloat16, device="cuda")
    workspace = lambda: torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # noqa: E731
    sides = {"flashinfer": flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD"),
             "ours": dispatch.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")}
    warm, items = batches(seed, 60), batches(seed + 1, args.batches)
    for name, wrapper in sides.items():
        timed(wrapper, warm, q, cache)
        print(f"{name}: plan / first run / later runs, p50 ms: {timed(wrapper, items, q, cache)}")
    print(f"flashinfer's compiled plan alone, p50 ms: {compiled_plan_ms(sides['flashinfer'], items, q, cache)}")
    for name, wrapper in sides.items():
        print(f"-- {name}: per plan")
        runtime_calls(wrapper, items[:50])
    together, slow = pstats.Stats(), []
    for item in items:
        profile = cProfile.Profile()
        t = time.perf_counter()
        profile.enable()
        plan(sides["ours"], item)
        profile.disable()
        ms = (time.perf_counter() - t) * 1e3
        together.add(profile)
        if ms > SLOW_MS:
            slow.append((ms, len(item[0]) - 1, profile))
    together.sort_stats("cumulative").print_stats(r"(dispatch|backends)/", args.top)
    print(f"plans over {SLOW_MS} ms: {len(slow)} of {len(items)}")
    for ms, requests, profile in sorted(slow, key=lambda s: -s[0])[:3]:
        print(f"-- a plan of {requests} requests: {ms:.2f} ms")
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
