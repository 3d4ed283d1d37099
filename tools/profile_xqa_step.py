"""Where an xqa decode step's host time goes when the batch changes every step (a GPU machine).

    python -m tools.profile_xqa_step --steps 200 --layers 4 [--seed N]

A step is a new batch (1-256 requests of 100-2300 keys, page ids drawn from a pool) called once per
layer, as an engine's decode step calls ``xqa_batch_decode_with_kv_cache``. Sides: FlashInfer's own
call, ours under auto, ours with each backend forced (``dispatch.use_backend``). Per side: host ms of
each call of the step (p50), host and GPU ms per step (p50; the GPU's by CUDA events around the step).
Then, for native-triton, the parts of a new batch's first call timed apart on the same batches: our
layer alone (the backend's run replaced by nothing), the native plan of new sizes, its run on a plan
made before (the general launch), the launcher made for repeats and its call, and a plan of the previous
step's serving this one (``plan_for``: derived from it). ``--profile N``: N steps of new batches under
auto, the first call of each by function (cProfile, own time), the slowest first calls alone, then each
step's CUDA runtime calls and aten operators (torch.profiler). The seed is drawn at run time and
printed unless given.
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

PAGES, PAGE, HQ, HKV, D = 20000, 16, 32, 8, 128


def steps_of(seed: int, n: int) -> list[tuple]:
    rng, out = random.Random(seed), []
    for _ in range(n):
        b = rng.randint(1, 256)
        lens = [rng.randint(100, 2300) for _ in range(b)]
        width = max(-(-k // PAGE) for k in lens)
        table = torch.randint(0, PAGES, (b, width), dtype=torch.int32, device="cuda")
        out.append((b, table, torch.tensor(lens, dtype=torch.int32, device="cuda"), max(lens)))
    return out


def p50(values) -> float:
    return statistics.median(values) if values else float("nan")


def run_side(call, steps: list, layers: int) -> dict:
    """Host ms of each call of a step and per step, GPU ms per step (p50 over the steps)."""
    per_call = [[] for _ in range(layers)]
    host, gpu = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for step in steps:
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        for layer in range(layers):
            t = time.perf_counter()
            call(step)
            per_call[layer].append((time.perf_counter() - t) * 1e3)
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end))
    return dict(calls=[p50(c) for c in per_call], host=p50(host), gpu=p50(gpu))


def native_parts(make_call, steps: list) -> dict:
    """native-triton's parts of a new batch's first call (ms, p50), on the steps given."""
    from backends import get_backend
    from dispatch import router

    native = get_backend("native-triton")
    captured = []
    real_run = router.run

    def spy(planned, batch):
        captured.append((planned, batch))
        return real_run(planned, batch)

    def nothing(planned, batch):
        return planned

    previous = None
    parts = {"our layer": [], "plan of new sizes": [], "plan_for of new sizes": [], "run on a made plan": [],
             "launcher": [], "launcher's call": [], "repeats met": []}
    with dispatch.use_backend("native-triton"):
        for step, other in zip(steps[::2], steps[1::2]):  # batches not called before: each takes a new lane
            router.run = nothing
            native.launcher = lambda plan, batch: None  # a lane after a repeated one asks on its first call
            try:
                t = time.perf_counter()
                make_call(step)
                parts["our layer"].append((time.perf_counter() - t) * 1e3)
                router.run = spy
                make_call(other)  # the plan and batch of a step, for the backend's parts
            finally:
                router.run = real_run
                del native.launcher  # the class's again
            if not captured:  # the batch's shapes and longest length met a lane before: a repeat
                parts["repeats met"].append(1.0)
                continue
            planned, batch = captured.pop()
            torch.cuda.synchronize()
            if previous is not None:  # the previous step's plan serving this batch: derived, as the entries do
                t = time.perf_counter()
                native.plan_for(previous, batch)
                parts["plan_for of new sizes"].append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            fresh = previous = native.plan(planned.plan.problem, batch)
            parts["plan of new sizes"].append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            native.run(fresh, batch)
            parts["run on a made plan"].append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            launch = native.launcher(fresh, batch)
            parts["launcher"].append((time.perf_counter() - t) * 1e3)
            if launch is not None:
                t = time.perf_counter()
                launch(batch)
                parts["launcher's call"].append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()
    met = len(parts.pop("repeats met"))
    return {**{name: p50(v) for name, v in parts.items()}, "steps that met a lane": met}


SLOW_MS = 1.0  # a first call this slow is profiled alone too


def profiled_first_calls(make_call, steps: list, layers: int, top: int) -> None:
    """Steps of new batches under auto: the first call of each by our functions' own time (cProfile),
    the slowest first calls over SLOW_MS alone (cumulative), then each step's CUDA runtime calls and
    aten operators (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    together, slow, half = pstats.Stats(), [], len(steps) // 2
    for i, step in enumerate(steps[:half]):
        profiler = cProfile.Profile()
        t = time.perf_counter()
        profiler.enable()
        make_call(step)
        profiler.disable()
        ms = (time.perf_counter() - t) * 1e3
        together.add(profiler)
        if ms > SLOW_MS:
            slow.append((ms, i, step[0], profiler))
        for _ in range(layers - 1):
            make_call(step)
    torch.cuda.synchronize()
    together.sort_stats("tottime").print_stats(top)
    print(f"first calls over {SLOW_MS} ms: {len(slow)} of {half}")
    for ms, i, requests, profiler in sorted(slow, key=lambda s: -s[0])[:3]:
        print(f"-- step {i}, {requests} requests: {ms:.2f} ms")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for step in steps[half:]:
            for _ in range(layers):
                make_call(step)
    torch.cuda.synchronize()
    count = len(steps) - half
    rows = [(e.key, e.count / count, e.cpu_time_total / count) for e in prof.key_averages()
            if e.key.startswith(("cuda", "aten::"))]
    for key, n, us in sorted(rows, key=lambda r: -r[2])[:top]:
        print(f"  {key:42s} {n:6.2f} a step {us:8.1f} us")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--backends", nargs="*", default=["native-triton", "xqa"])
    parser.add_argument("--profile", type=int, default=0, help="steps of new batches whose first calls are profiled")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    print(f"seed {seed}; {torch.cuda.get_device_name()}; {args.steps} steps x {args.layers} calls")
    cache = torch.randn(PAGES, 2, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda")
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    q = torch.randn(256, HQ, D, dtype=torch.bfloat16, device="cuda")
    warm, steps = steps_of(seed + 1, args.steps), steps_of(seed, args.steps)

    def call_with(lib):
        def call(step):
            b, table, seq, longest = step
            lib.xqa_batch_decode_with_kv_cache(q[:b], cache, ws, table, seq, longest, D ** -0.5)
        return call

    sides = {"ours, auto": (call_with(dispatch), None)}
    sides.update({f"ours, {name}": (call_with(dispatch), name) for name in args.backends})
    try:
        import flashinfer.decode
        sides["flashinfer"] = (call_with(flashinfer.decode), None)
    except ImportError as exc:
        print(f"flashinfer: not importable ({exc})")
    print("| side | host ms per call of the step (p50) | host ms per step | GPU ms per step |")
    print("|---|---|---|---|")
    for name, (call, forced) in sides.items():
        try:
            if forced:
                with dispatch.use_backend(forced):
                    run_side(call, warm, args.layers)
                    row = run_side(call, steps, args.layers)
            else:
                run_side(call, warm, args.layers)
                row = run_side(call, steps, args.layers)
        except Exception as exc:  # noqa: BLE001 - a side that cannot run is reported, the rest go on
            print(f"| {name} | failed: {type(exc).__name__}: {str(exc)[:160]} | | |")
            continue
        calls = " / ".join(f"{c:.3f}" for c in row["calls"])
        print(f"| {name} | {calls} | {row['host']:.3f} | {row['gpu']:.3f} |")
    parts = native_parts(call_with(dispatch), steps_of(seed + 2, 100))  # batches not called before
    print("native-triton, a new batch's first call in parts (ms, p50): "
          + "; ".join(f"{k} {v:.3f}" for k, v in parts.items()))
    if args.profile:
        profiled_first_calls(call_with(dispatch), steps_of(seed + 3, args.profile), args.layers, 30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
