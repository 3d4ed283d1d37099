"""Measure one problem: every available backend forced in turn, then the automatic choice.

Per backend: make the public call under ``dispatch.use_backend(name)`` (automatic: no choice),
poison the out buffer, run once and check the output against the fp64 oracle, warm every K/V
copy, time eager (``timing.device_ms``: CUDA events, calls queued behind a GPU spin; the CPU's
wall clock) and, where the backend that served declares CUDA-graph support, the replay of one
graph of one call per K/V copy (which must equal eager). A refusal (the backend's reasons) or an
error is a result, never a crash. ``METHOD`` states the rates' formulas.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import torch

import backends
from capability_db.vocabulary import visible_pairs

from .. import policy, router
from .. import timing
from ..choice import plans_per_call
from .build import Built, build, flashinfer_api, flashinfer_own_not_run
from .problems import BenchProblem, problem_of

AUTO = "auto"
FLASHINFER = "flashinfer"  # FlashInfer's own call of the entry point (its own "auto"), beside ours
METHOD = (
    "Each problem runs through the public entry point (import dispatch), every available backend forced in "
    "turn (dispatch.use_backend) and the automatic choice (auto). Check: the out buffer is poisoned with NaN, "
    "one call, then the last {rows} query rows of the first, middle and last request (and their LSE) against "
    "the fp64 oracle (dispatch/benchmark/oracle.py): relative Frobenius error within the band (bf16/fp16 1e-2, "
    "fp8 KV 6e-2, fp32 1e-5), else the backend's row says DISAGREES and is not timed. Time: milliseconds per "
    "call, eager and warm, median of {reps} CUDA-event timings of back-to-back calls queued behind a GPU spin "
    "(host launch gaps not counted; CPU: the wall clock); host: microseconds of host time per eager call "
    "(back-to-back calls on the host clock, no sync inside, median of 3; on a GPU, where the GPU time is at most {host_up_to} ms, "
    "the least of that and {host_rounds} more timings in rounds that interleave the problem's backends); graph: the replay of one CUDA graph holding one call "
    "per K/V copy, where the backend that served declares CUDA-graph support. K/V rotate over copies that "
    "together hold at least 3x the L2, so no call reads K/V left in the L2 by the previous one. Rates, one "
    "formula each: decode (q_len 1) TB/s = bytes of K and V read [2 * batch * keys read * kv heads * head dim * "
    "element bytes; keys read = kv_len, or window_left + 1 with a window] / time; prefill TFLOP/s = 4 * q heads "
    "* head dim * batch * visible (query, key) pairs [bottom-right causal, window inclusive] / time. A "
    "backend's time: the best of its timings (forced, and auto's run when auto served it). fastest: the "
    "backend with the lowest time; regret = the time of the backend auto served / the fastest's - 1 (0 when "
    "auto served the fastest: two runs of one backend differ by noise, not by choice); noise = |auto's own "
    "time / the forced time of the backend it served - 1|, the spread of two timings of the same backend. A "
    "backend not usable here is listed as skipped, with how to enable it.")


def work(p: BenchProblem) -> tuple[float, str]:
    """(what one call must do, its rate's unit): K+V bytes read for decode, FLOPs for prefill (METHOD)."""
    if p.decode:
        keys = min(p.kv_len, p.window_left + 1) if p.window_left >= 0 else p.kv_len
        elem = torch.empty((), dtype=getattr(torch, p.kv_type)).element_size()
        return 2.0 * p.batch * keys * p.num_kv_heads * p.head_dim * elem, "TB/s"
    pairs = visible_pairs(p.q_len, p.kv_len, p.causal, p.window_left)
    return 4.0 * p.num_qo_heads * p.head_dim * p.batch * pairs, "TFLOP/s"


def rate(p: BenchProblem, ms: float) -> float:
    amount, _ = work(p)
    return amount / (ms * 1e-3) / 1e12


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def backend_scope(backend: str):
    return contextlib.nullcontext() if backend in (AUTO, FLASHINFER) else policy.use_backend(backend)


def _cycling(fn: Callable[[Any], Any], operands: list) -> Callable[[], Any]:
    it = itertools.cycle(operands)
    return lambda: fn(next(it))


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:240]


def measure(built: Built, backend: str, device: str, reps: int, api: Optional[dict] = None,
            profile: int = 0, calls: Optional[dict] = None) -> dict:
    """One backend (or auto; or, with ``api``, FlashInfer's own call) on one built problem:
    status, served, errors, eager/graph ms; with ``profile`` N, the N functions that took the
    most host time per call (cProfile). ``calls``: where a timed backend's call is kept (for
    ``_host_rounds``)."""
    row: dict[str, Any] = {"backend": backend}
    with backend_scope(backend):
        try:
            call = built.call(api)
            built.poison()
            result = call(built.operands[0])
            _sync(device)
        except router.BackendRefusedError as exc:
            return {**row, "status": "refused", "note": _refusal(exc)}
        except Exception as exc:  # a vendor failing is a result to report
            traceback.print_exc()
            return {**row, "status": "error", "note": one_line(exc)}
        row["served"] = built.served() if api is None else backend
        err, lse_err, band = built.check(result)
        row.update(rel_err=err, lse_rel_err=lse_err, band=band)
        if not (err <= band and (lse_err is None or lse_err <= band)):
            return {**row, "status": "DISAGREES"}
        row["status"] = "ok"
        row["eager_ms"] = _eager_ms(call, built, device, reps)
        row["host_us"] = _host_us(call, built, device)
        if calls is not None:
            calls[backend] = call
        if profile:
            row["profile"] = profiled(_cycling(call, built.operands), HOST_CALLS, profile)
            if device == "cuda":
                copies = len(built.operands)
                row["kernels"] = kernels_traced(_cycling(call, built.operands), copies, copies)
        if device == "cuda" and api is None and _graph_capable(row["served"]):
            row.update(_graph(call, built, reps, profile))
    return row


def profiled(fn: Callable[[], Any], calls: int, top: int) -> list[str]:
    """The ``top`` functions by own time over ``calls`` calls (cProfile inflates every
    Python call alike: read it for where the time goes, not for how much)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, func) -> (cc, ncalls, tottime, cumtime, callers)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [f"{1e6 * tt / calls:8.2f} us own, {1e6 * ct / calls:8.2f} us cum, {nc / calls:5.1f}x  "
            f"{Path(f).name}:{line}({func})" for (f, line, func), (_, nc, tt, ct, _c) in rows]


def kernels_traced(fn: Callable[[], Any], runs: int, calls: int) -> list[str]:
    """The CUDA kernels ``runs`` runs of ``fn``, holding ``calls`` calls in all, launch
    (torch.profiler): per kernel, launches and GPU us per call, longest first; where an eager
    call's GPU time differs from its graph's."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.count]
    rows.sort(key=lambda e: -e.self_device_time_total)
    return [f"{e.self_device_time_total / calls:9.2f} us, {e.count / calls:4.1f}x  {e.key[:140]}" for e in rows]


def _refusal(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines()[1:] if line.strip().startswith("- ")]
    return ("; ".join(line[2:] for line in lines) or one_line(exc))[:240]


def _graph_capable(name: Optional[str]) -> bool:
    return name is not None and backends.get_backend(name).caps.cuda_graph != "never"


def _eager_ms(call: Callable[[Any], Any], built: Built, device: str, reps: int) -> float:
    for kv in built.operands:  # warm every copy: plans, JIT compiles, first-touch
        call(kv)
    _sync(device)
    t0 = time.perf_counter()
    call(built.operands[0])
    _sync(device)
    one_ms = max(1e-3, (time.perf_counter() - t0) * 1e3)
    calls = max(len(built.operands), min(50, math.ceil(2.0 / one_ms))) if device == "cuda" else 1
    return timing.device_ms(_cycling(call, built.operands), device, reps=reps, calls=calls)


HOST_CALLS = 20  # calls per host timing (few enough that the GPU's launch queue never fills)


def _host_us(call: Callable[[Any], Any], built: Built, device: str, repeats: int = 3) -> float:
    """Host microseconds per eager call (warm): back-to-back calls timed on the host clock, no
    sync inside the loop, the median of ``repeats``; what the choice adds to GPU time for an eager
    call (dispatch/choice.py). On the CPU it is the whole call."""
    fn = _cycling(call, built.operands)
    calls = max(len(built.operands), HOST_CALLS if device == "cuda" else 1)
    repeats = repeats if device == "cuda" else 1  # the CPU's figure is the whole call: once is enough
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) * 1e6 / calls)
        _sync(device)
    return round(sorted(times)[len(times) // 2], 2)


# Host times again, in rounds that interleave the problem's backends (``_host_rounds``). Why: on the H100
# one path's host time, the median of three timings in a row, differed between two runs of the same
# problems by a median 23% and a p90 72%, so the cheapest backend by call cost changed between the runs
# on 10 of 49 problems. The noise follows the machine's phase, not the path (nor the warm-up workers):
# timed in turn, every backend of a problem sees the same phases, and the least of its timings drops
# the spikes.
HOST_ROUNDS = 4
HOST_ROUNDS_UP_TO_MS = 1.0  # GPU ms up to which a host time can decide the call's cost (and a round is cheap)


def _host_rounds(rows: list[dict], calls: dict, built: Built, device: str) -> None:
    """Each timed row's ``host_us`` becomes the least of it and HOST_ROUNDS more timings, taken in
    rounds in which every such row takes its turn (rotating order), for the rows of GPU time up to
    HOST_ROUNDS_UP_TO_MS; on a GPU only (the CPU's figure is the whole call)."""
    timed = [r for r in rows if r["backend"] in calls and r.get("host_us") is not None
             and r.get("eager_ms", math.inf) <= HOST_ROUNDS_UP_TO_MS]
    if device != "cuda" or len(timed) < 2:
        return
    for k in range(HOST_ROUNDS):
        for r in timed[k % len(timed):] + timed[:k % len(timed)]:
            with backend_scope(r["backend"]):
                r["host_us"] = min(r["host_us"], _host_us(calls[r["backend"]], built, device, repeats=1))
    for r in timed:
        r["host_rounds"] = HOST_ROUNDS


def _graph(call: Callable[[Any], Any], built: Built, reps: int, profile: int = 0) -> dict:
    """Replay ms per call of a graph of one call per K/V copy; the replay must equal eager
    (``profile``: with the kernels of a replay, per call)."""
    try:
        ms, graph = timing.graph_ms([lambda kv=kv: call(kv) for kv in built.operands], reps)
        # one replay holds one call per K/V copy
        traced = {"graph_kernels": kernels_traced(graph.replay, 1, len(built.operands))} if profile else {}
        out = built.out
        if out is None:
            return {"graph_ms": ms, **traced}
        call(built.operands[-1])  # eager result of the graph's last call
        eager = out.clone()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        same = torch.equal(out, eager)
        return {"graph_ms": ms, **traced} if same else {"graph_ms": None, "graph_note": "replay differs from eager"}
    except Exception as exc:  # capture refused: a result, eager still stands
        return {"graph_ms": None, "graph_note": one_line(exc)}


# Not forced on a GPU unless a problem lists it: the fp64-accurate PyTorch path runs 100-1000x
# slower there (0.9-620 ms a call in the first H100 sweep), so timing it spent most of a sweep's
# budget; it is never the fastest, and auto never picks it while a GPU backend accepts.
SLOW_ON_GPU = ("reference",)


def backends_to_force(p: BenchProblem, device: str) -> list[str]:
    """Every registered backend whose package is usable here (or the problem's own list); on a
    GPU, not the SLOW_ON_GPU ones unless the problem lists them."""
    return [name for name in _candidates(p, device) if backends.get_backend(name).available() is None]


def _candidates(p: BenchProblem, device: str) -> list[str]:
    return list(p.backends) or [n for n in backends.REGISTRY if device != "cuda" or n not in SLOW_ON_GPU]


def skipped_rows(p: BenchProblem, device: str) -> list[dict]:
    """A row per backend not usable here: its reason says how to enable it (the package's install
    line; native-triton on the CPU: TRITON_INTERPRET=1)."""
    rows = []
    for name in _candidates(p, device):
        missing = backends.get_backend(name).available()
        if missing is not None:
            rows.append({"backend": name, "status": "skipped",
                         "note": f"{missing.field}: {missing.value}; to enable: {missing.allowed}"})
    return rows


def run_problem(p: BenchProblem, device: str, reps: int, l2_bytes: int, seed: int = 0, profile: int = 0,
                recheck: bool = False) -> dict:
    """Every backend, then auto, on one problem; the fastest and auto's regret (``profile``: see measure).
    ``recheck``: the problem's listed backends only, no auto and no FlashInfer call."""
    t0 = time.perf_counter()
    built = build(p, device, l2_bytes, seed)
    amount, unit = work(p)
    if recheck and not p.backends:
        raise ValueError(f"{p.name}: a recheck times the problem's listed backends; it lists none")
    calls: dict = {}
    rows = [measure(built, name, device, reps, profile=profile, calls=calls) for name in backends_to_force(p, device)]
    if not recheck:
        rows.append(measure(built, AUTO, device, reps, profile=profile, calls=calls))
        rows.append(_flashinfer_row(built, device, reps, profile, calls))
        rows += skipped_rows(p, device)
    _host_rounds(rows, calls, built, device)
    for r in rows:
        if r.get("eager_ms"):
            r["rate"] = amount / (r["eager_ms"] * 1e-3) / 1e12
    _mark_guarded(rows, p)
    result = {"problem": p.to_json(), "name": p.name, "unit": unit, "work": amount,
              "kv_copies": len(built.operands), "backends": rows}
    result.update(summarize(rows, problem_of(p).entry))
    result["seconds"] = round(time.perf_counter() - t0, 2)
    del built
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def _mark_guarded(rows: list[dict], p: BenchProblem) -> None:
    """A timed backend row lists the known defects its adapter guarded on this problem (Backend.guarded):
    its time includes the guard, so a replay may choose it despite them (replay.defect_gated)."""
    problem = problem_of(p)
    for r in rows:
        if r.get("status") == "ok" and r["backend"] in backends.REGISTRY:
            backend = backends.get_backend(r["backend"])
            guarded = [d for d in backend.guards if backend.guarded(d, problem)]
            if guarded:
                r["guarded"] = guarded


def _flashinfer_row(built: Built, device: str, reps: int, profile: int = 0, calls: Optional[dict] = None) -> dict:
    """FlashInfer's own call of the entry point with the same inputs (on a GPU where it imports),
    checked and timed like ours; else the reason."""
    api, why = flashinfer_api() if device == "cuda" else (None, "FlashInfer runs on a GPU only")
    if api is None or api.get(built.problem.entry) is None:
        return {"backend": FLASHINFER, "status": "absent", "note": why or "no such entry point in this version"}
    not_run = flashinfer_own_not_run(built.problem)
    if not_run:
        return {"backend": FLASHINFER, "status": "absent", "note": not_run}
    return measure(built, FLASHINFER, device, reps, api, profile, calls)


def summarize(rows: list[dict], entry: str = "") -> dict:
    """A backend's time: the best of its timings (forced, and auto's run when auto served it: noise
    only ever adds time). fastest: the backend with the lowest; regret: the time of the backend auto
    served over the fastest's - 1, so 0 when auto served the fastest (two runs of one backend differ
    by noise, not by choice); noise: |auto's own time / the forced time of the backend it served - 1|;
    auto_over_flashinfer: auto against FlashInfer's own call (< 1 is faster). ``entry``: the entry
    point the rows were timed through (``call_cost``)."""
    fi_ms = next((r.get("eager_ms") for r in rows if r["backend"] == FLASHINFER), None)
    forced = {r["backend"]: r["eager_ms"] for r in rows if r.get("eager_ms") and r["backend"] not in (AUTO, FLASHINFER)}
    auto = next((r for r in rows if r["backend"] == AUTO), {})
    served, auto_ms = auto.get("served"), auto.get("eager_ms")
    out = {"fastest": None, "fastest_ms": None, "auto": served, "auto_ms": auto_ms, "regret": None, "noise": None,
           "flashinfer_ms": fi_ms, "auto_over_flashinfer": auto_ms / fi_ms if auto_ms and fi_ms else None}
    best_of = dict(forced)
    if auto_ms and served:
        best_of[served] = min(auto_ms, forced.get(served, auto_ms))
    if not best_of:
        return out
    fastest = min(best_of, key=best_of.__getitem__)
    out.update(fastest=fastest, fastest_ms=best_of[fastest])
    if served in best_of:
        out["regret"] = best_of[served] / best_of[fastest] - 1.0
    if served in forced and auto_ms:
        out["noise"] = abs(auto_ms / forced[served] - 1.0)
    out.update(call_cost(rows, served, entry))
    return out


def eager_cost_ms(row: dict, backend: Optional[str], entry: str, host_us: Optional[float] = None) -> Optional[float]:
    """What one eager call of ``backend`` through ``entry`` costs, in ms (None: not timed): its eager
    GPU time plus its host path (``host_us``, else the row's). A path that plans on every call through
    the entry (capability data ``plans_per_call``: FlashInfer's fa2 / fa3 behind a function entry, which
    copy the lengths to the host) waits for the GPU in its host path, and the GPU waits for it: its
    eager time already holds the host path, and its host time holds the GPU's. Added together they
    counted such a call twice: H100, cudnn 2 x 13684 x 13684 d256, fa3 28.9 ms eager and 28.4 ms
    host, judged at 57.3 ms."""
    host = row.get("host_us") if host_us is None else host_us
    if not row.get("eager_ms") or host is None:
        return None
    if backend and entry and entry in plans_per_call(backend):
        return row["eager_ms"]
    return row["eager_ms"] + host / 1e3


def call_cost(rows: list[dict], served: Optional[str], entry: str = "") -> dict:
    """What the choice ranks by for an eager call (dispatch/choice.py): GPU ms + host us per call
    (``eager_cost_ms``), per backend (the best of its timings, as ``summarize``); the fastest by that
    cost, auto's cost regret, and auto against FlashInfer's own call by cost."""
    costs: dict[str, float] = {}
    for r in rows:
        name = served if r["backend"] == AUTO else r["backend"]
        c = eager_cost_ms(r, name, entry)
        if c is not None and name and name != FLASHINFER:
            costs[name] = min(c, costs.get(name, c))
    fi = next((eager_cost_ms(r, FLASHINFER, entry) for r in rows if r["backend"] == FLASHINFER), None)
    if not costs:
        return {"cost_fastest": None, "cost_regret": None, "cost_auto_over_flashinfer": None}
    fastest = min(costs, key=costs.__getitem__)
    auto = costs.get(served) if served else None
    return {"cost_fastest": fastest, "cost_regret": auto / costs[fastest] - 1.0 if auto else None,
            "cost_auto_over_flashinfer": auto / fi if auto and fi else None}
