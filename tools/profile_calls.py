"""Host time of our calls with a new batch every call, under cProfile (a GPU machine).

    python -m tools.profile_calls --calls 200 --top 25

Three loops after a warm-up: single prefill with new lengths, xqa decode with a new batch, and the
paged wrapper's plan + one run with a new batch. Prints the median host time per call of each loop,
the same loop's through FlashInfer's own calls where it is importable, and the profile's functions
by internal time and those of dispatch/ and backends/ by cumulative time.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time

import torch

import dispatch


def single_loop(rng: random.Random, n: int, lib=dispatch):
    k = torch.randn(4096, 8, 128, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(2048, 32, 128, dtype=torch.bfloat16, device="cuda")

    def call():
        kv = rng.randint(64, 4096)
        ql = rng.randint(17, min(kv, 2048))
        lib.single_prefill_with_kv_cache(q[:ql], k[:kv], k[:kv], causal=True)
    return call


def xqa_loop(rng: random.Random, n: int, lib=dispatch):
    pages, page = 20000, 16
    cache = torch.randn(pages, 2, page, 8, 128, dtype=torch.bfloat16, device="cuda")
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    q = torch.randn(256, 32, 128, dtype=torch.bfloat16, device="cuda")

    def call():
        b = rng.randint(1, 256)
        lens = [rng.randint(100, 2300) for _ in range(b)]
        width = max(-(-n // page) for n in lens)
        table = torch.randint(0, pages, (b, width), dtype=torch.int32, device="cuda")
        seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
        lib.xqa_batch_decode_with_kv_cache(q[:b], cache, ws, table, seq, max(lens), 128 ** -0.5)
    return call


def paged_loop(rng: random.Random, n: int, lib=dispatch):
    pages, page = 20000, 16
    cache = torch.randn(pages, 2, page, 8, 128, dtype=torch.bfloat16, device="cuda")
    wrapper = lib.BatchPrefillWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    q = torch.randn(8192, 32, 128, dtype=torch.bfloat16, device="cuda")

    def call():
        b = rng.randint(8, 64)
        q_lens = [1 if rng.random() < 0.9 else rng.randint(17, 512) for _ in range(b)]
        kv = [ql + rng.randint(100, 2000) for ql in q_lens]
        counts = [-(-n // page) for n in kv]
        qo = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device="cuda")
        indptr = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32, device="cuda")
        ids = torch.randperm(pages, device="cuda")[: sum(counts)].to(torch.int32)
        last = torch.tensor([n - (c - 1) * page for n, c in zip(kv, counts)], dtype=torch.int32, device="cuda")
        wrapper.plan(qo, indptr, ids, last, 32, 8, 128, page, causal=True, q_data_type=torch.bfloat16)
        wrapper.run(q[: sum(q_lens)], cache)
    return call


def timed(call, n: int) -> float:
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--loops", nargs="+", default=["single", "xqa", "paged"], choices=["single", "xqa", "paged"])
    args = parser.parse_args(argv)
    rng = random.Random(0)
    try:
        import flashinfer
    except ImportError:
        flashinfer = None
    loops = {"single": single_loop, "xqa": xqa_loop, "paged": paged_loop}
    for name, make in ((n, loops[n]) for n in args.loops):
        if flashinfer is not None:
            # FlashInfer exports xqa's batch decode from flashinfer.decode only
            lib = flashinfer.decode if name == "xqa" else flashinfer
            theirs = make(random.Random(1), args.calls, lib)
            timed(theirs, args.calls)
            print(f"== {name}: flashinfer host ms per call p50 {timed(theirs, args.calls):.3f}")
        call = make(rng, args.calls)
        timed(call, args.calls)  # warm-up: compiles, decisions
        median = timed(call, args.calls)
        profile = cProfile.Profile()
        profile.enable()
        timed(call, args.calls)
        profile.disable()
        print(f"== {name}: host ms per call p50 {median:.3f}")
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(r"(dispatch|backends)/", args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
