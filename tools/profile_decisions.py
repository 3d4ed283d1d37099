"""What a new size class costs the router: a decision for a described GPU, in one process, on this machine.

    python -m tools.profile_decisions [--gpu h200] [--buckets 300] [--seed N]

The problems an engine's trace meets (the paged wrapper's prefill and decode, xqa decode, single prefill;
32/8 heads, head dim 128, bf16, pages of 16) at sizes drawn from the trace's ranges, each decision new
(its size class not decided before in the process; ``live=False``: the described GPU, no availability
probe). Prints the first decision (the choice table read on first use), then p50 / p99 / max ms of the
new buckets' decisions. The seed is drawn at run time and printed unless given. Measurement code: never
imported by dispatch/.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import capability_db
from capability_db.vocabulary import AttentionProblem, size_class
from dispatch import router

BASE = dict(kv_layout="NHD", num_qo_heads=32, num_kv_heads=8, head_dim_qk=128, head_dim_vo=128,
            q_dtype="bfloat16", kv_dtype="bfloat16", out_dtype="bfloat16", device_type="cuda")
KINDS = (
    dict(entry="BatchPrefillWithPagedKVCacheWrapper", phase="prefill", kv_storage="paged", page_size=16, causal=True),
    dict(entry="BatchPrefillWithPagedKVCacheWrapper", phase="decode", kv_storage="paged", page_size=16, causal=True),
    dict(entry="xqa_batch_decode_with_kv_cache", phase="decode", kv_storage="paged", page_size=16, causal=True),
    dict(entry="single_prefill_with_kv_cache", phase="prefill", kv_storage="dense", causal=True),
)


def buckets(rng: random.Random, n: int) -> list[AttentionProblem]:
    """``n`` problems of distinct (kind, size class), sizes from the trace's ranges."""
    seen, out = set(), []
    while len(out) < n:
        kind = rng.randrange(len(KINDS))
        facts = KINDS[kind]
        batch = 1 if facts["kv_storage"] == "dense" else rng.randint(1, 256)
        q = 1 if facts["phase"] == "decode" else rng.randint(17, 2048)
        sizes = size_class(batch, q, rng.randint(q, q + 8192))
        if (kind, sizes) in seen:
            if len(seen) > 4 * n:
                break  # the ranges hold fewer classes than asked
            continue
        seen.add((kind, sizes))
        out.append(AttentionProblem(**BASE, **facts, sizes=sizes))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--buckets", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    device = capability_db.resolve_device(args.gpu)
    problems = buckets(random.Random(seed), args.buckets + 1)
    t = time.perf_counter()
    router.decide(problems[0], device, strict=False, live=False)
    first = (time.perf_counter() - t) * 1e3
    times = []
    for problem in problems[1:]:
        t = time.perf_counter()
        router.decide(problem, device, strict=False, live=False)
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"seed {seed}; {device.name}; {len(times)} new size classes after the first decision")
    print(f"first decision {first:.1f} ms; a new size class p50 {statistics.median(times):.3f} ms, "
          f"p99 {p99:.3f}, max {times[-1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
