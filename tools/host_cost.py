"""Host cost per call of every entry point: dispatch vs the direct adapter vs FlashInfer's own call.

One tiny decode-shaped problem per entry point (batch 1, one query token, KV 64 in pages of 16;
on CUDA bf16 with 32/8 heads and head dim 128, the figures of the "zero-cost dispatch" issue; on
the CPU float32 and smaller heads, served by the reference backend). Columns, in microseconds
of host time per call (N back-to-back calls timed with perf_counter_ns, no sync inside the
loop, one sync after; the median of several repeats; a tiny problem never lets the GPU limit):

* dispatch: the public call through ``import dispatch``;
* adapter: the chosen backend's ``run(plan, batch)`` called directly with the batch and plan
  the router built for that call (captured once, reused for every timed call);
* dispatch layer: dispatch - adapter, what our layer adds on top of the adapter;
* flashinfer: FlashInfer's own call of the entry point with the same arguments, or why not.

On CUDA also: the GPU time per call of the dispatch call and of FlashInfer's (CUDA events over
back-to-back calls queued behind a GPU spin, so launch gaps are not counted) and the host
synchronizations one dispatch call makes (torch.cuda sync debug mode).

    python tools/host_cost.py [--device cuda|cpu] [--quick] [--out DIR]

writes DIR/host-cost-<device>.json and .md and prints the Markdown table. On the GPU host warm
up JIT-compiled kernels first (the script does: each call runs before any timing).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import platform
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS.parent), str(TOOLS)]

import dispatch  # noqa: E402
from backends import get_backend  # noqa: E402
from dispatch import router  # noqa: E402
from _gpu_common import time_ms  # noqa: E402

ENTRIES = ("single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse",
           "cudnn_batch_prefill_with_kv_cache", "trtllm_batch_context_with_kv_cache",
           "xqa_batch_decode_with_kv_cache", "BatchPrefillWithPagedKVCacheWrapper.run",
           "BatchPrefillWithRaggedKVCacheWrapper.run")
WORKSPACE_BYTES = {"cuda": 128 << 20, "cpu": 1 << 16}


# -- the problem ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    hq: int
    hkv: int
    d: int
    page: int
    kv: int
    dtype: torch.dtype

    def describe(self) -> str:
        return (f"batch 1, q_len 1, kv {self.kv} in pages of {self.page}, {self.hq}/{self.hkv} heads, "
                f"d{self.d}, {str(self.dtype).replace('torch.', '')}")


SHAPES = {"cuda": Shape(32, 8, 128, 16, 64, torch.bfloat16), "cpu": Shape(4, 2, 32, 16, 64, torch.float32)}


def inputs(shape: Shape, device: str) -> dict:
    """Every tensor the seven calls take, built once (NHD pages in a random order)."""
    g = torch.Generator().manual_seed(0)
    s, pages = shape, shape.kv // shape.page

    def rand(*dims):
        return torch.randn(*dims, generator=g).to(device=device, dtype=s.dtype)

    def ints(values, *view):
        return torch.tensor(values, dtype=torch.int32, device=device).view(*view) if view else \
            torch.tensor(values, dtype=torch.int32, device=device)
    cache = rand(pages, 2, s.page, s.hkv, s.d)  # (pages, 2, P, Hkv, D): NHD
    table = torch.randperm(pages, generator=g).to(device=device, dtype=torch.int32).view(1, pages)
    return dict(
        q=rand(1, s.hq, s.d), k=rand(s.kv, s.hkv, s.d), v=rand(s.kv, s.hkv, s.d), cache=cache,
        kv_tuple=(cache[:, 0], cache[:, 1]), k_hnd=cache[:, 0].transpose(1, 2), v_hnd=cache[:, 1].transpose(1, 2),
        table=table, seq=ints([s.kv]), qo=ints([0, 1]),
        page_indptr=ints([0, pages]), page_ids=table[0].clone(), last=ints([(s.kv - 1) % s.page + 1]),
        kv_indptr=ints([0, s.kv]), lens_q4=ints([1], 1, 1, 1, 1), lens_kv4=ints([s.kv], 1, 1, 1, 1),
        scale=1.0 / math.sqrt(s.d), ws=torch.empty(WORKSPACE_BYTES[device], dtype=torch.uint8, device=device),
        ws_xqa=torch.zeros(WORKSPACE_BYTES[device], dtype=torch.uint8, device=device))


# -- the calls --------------------------------------------------------------------------------------
def entry_calls(api: Any, x: dict, s: Shape, wrappers: dict) -> dict[str, Callable[[], Any]]:
    """The seven calls, spelled FlashInfer's way, against ``api`` (dispatch or flashinfer)."""
    paged, ragged = wrappers["paged"], wrappers["ragged"]
    return {
        ENTRIES[0]: lambda: api.single_prefill_with_kv_cache(x["q"], x["k"], x["v"]),
        ENTRIES[1]: lambda: api.single_prefill_with_kv_cache_return_lse(x["q"], x["k"], x["v"]),
        ENTRIES[2]: lambda: api.cudnn(
            x["q"], x["k_hnd"], x["v_hnd"], x["scale"], x["ws"],
            max_token_per_sequence=1, max_sequence_kv=s.kv, actual_seq_lens_q=x["lens_q4"],
            actual_seq_lens_kv=x["lens_kv4"], block_tables=x["table"], causal=False, return_lse=False),
        ENTRIES[3]: lambda: api.trtllm(x["q"], x["cache"], x["ws"], x["table"], x["seq"], 1, s.kv, x["scale"], 1.0,
                                       1, x["qo"], x["page_indptr"], kv_layout="NHD"),
        ENTRIES[4]: lambda: api.xqa(x["q"], x["kv_tuple"], x["ws_xqa"], x["table"], x["seq"], s.kv, x["scale"], 1.0),
        ENTRIES[5]: lambda: paged.run(x["q"], x["cache"]),
        ENTRIES[6]: lambda: ragged.run(x["q"], x["k"], x["v"]),
    }


def planned_wrappers(module: Any, x: dict, s: Shape, **kw) -> dict:
    paged = module.BatchPrefillWithPagedKVCacheWrapper(x["ws"], "NHD", **kw)
    paged.plan(x["qo"], x["page_indptr"], x["page_ids"], x["last"], s.hq, s.hkv, s.d, s.page, q_data_type=s.dtype)
    ragged = module.BatchPrefillWithRaggedKVCacheWrapper(x["ws"], "NHD", **kw)
    ragged.plan(x["qo"], x["kv_indptr"], s.hq, s.hkv, s.d, q_data_type=s.dtype)
    return {"paged": paged, "ragged": ragged}


class Api:
    """The five functions of a package laid out like flashinfer (its prefill and decode modules)."""

    def __init__(self, prefill: Any, decode: Any):
        self.single_prefill_with_kv_cache = prefill.single_prefill_with_kv_cache
        self.single_prefill_with_kv_cache_return_lse = prefill.single_prefill_with_kv_cache_return_lse
        self.cudnn = prefill.cudnn_batch_prefill_with_kv_cache
        self.trtllm = prefill.trtllm_batch_context_with_kv_cache
        self.xqa = decode.xqa_batch_decode_with_kv_cache


def dispatch_calls(x: dict, s: Shape) -> dict[str, Callable[[], Any]]:
    from dispatch import decode, prefill
    return entry_calls(Api(prefill, decode), x, s, planned_wrappers(dispatch, x, s))


def flashinfer_calls(x: dict, s: Shape, device: str) -> tuple[dict, dict[str, str]]:
    """(calls, reasons): FlashInfer's own calls where it can run them here, else why not."""
    try:
        import flashinfer
        import flashinfer.decode
        import flashinfer.prefill
    except Exception as exc:  # an import failure is a result to report
        return {}, {name: f"not installed ({type(exc).__name__}: {exc})"[:160] for name in ENTRIES}
    if device != "cuda":
        return {}, {name: "not measured: FlashInfer runs on CUDA only" for name in ENTRIES}
    calls = entry_calls(Api(flashinfer.prefill, flashinfer.decode), x, s,
                        planned_wrappers(flashinfer, x, s, backend="fa2"))
    return calls, unavailable_vendors(calls)


def unavailable_vendors(calls: dict) -> dict[str, str]:
    """Drop (and say why) the FlashInfer calls this machine cannot run."""
    reasons = {}
    major, minor = torch.cuda.get_device_capability()
    if major != 10:
        reasons[ENTRIES[3]] = (f"trtllm-gen kernels need Blackwell (compute capability 10.x); this GPU is "
                               f"sm_{major}{minor}")
    try:
        importlib.import_module("cudnn")  # FlashInfer's cuDNN path needs the frontend
    except Exception as exc:
        reasons[ENTRIES[2]] = f"cudnn frontend not importable ({type(exc).__name__}: {exc})"[:160]
    for name in reasons:
        calls.pop(name)
    return reasons


# -- capture: the adapter's own run, with the router's batch and plan ------------------------------
def adapter_call(fn: Callable[[], Any]) -> tuple[str, Callable[[], Any]]:
    """(backend that served, zero-arg call of its run(plan, batch)): one call of ``fn`` with
    ``router.run`` observed hands over the plan and the batch the router launched with."""
    seen = []
    real = router.run

    def spy(planned, batch):
        seen.append((planned, batch))
        return real(planned, batch)
    router.run = spy
    try:
        fn()
    finally:
        router.run = real
    if not seen:
        raise RuntimeError("the call never reached router.run")
    planned, batch = seen[-1]
    backend = get_backend(planned.backend)
    served = planned.backend
    if planned.decision.chosen != served:
        served += f" (fell back from {planned.decision.chosen})"
    return served, lambda: backend.run(planned.plan, batch)


# -- timing -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    calls: int  # back-to-back calls per timing
    repeats: int  # timings per column (the median is reported)
    warmup: int  # calls before any timing (JIT compiles, plan caches)


CONFIGS = {"quick": Config(calls=20, repeats=5, warmup=3), "full": Config(calls=200, repeats=15, warmup=20)}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def host_us(columns: dict[str, Callable[[], Any]], device: str, cfg: Config) -> dict[str, list[float]]:
    """Host microseconds per call of each column, one value per repeat; the columns take turns
    in every repeat (a drifting clock or a noisy neighbour hits them alike)."""
    times: dict[str, list[float]] = {name: [] for name in columns}
    for _ in range(cfg.repeats):
        for name, fn in columns.items():
            sync(device)
            t0 = time.perf_counter_ns()
            for _ in range(cfg.calls):
                fn()
            sync(device)
            times[name].append((time.perf_counter_ns() - t0) / cfg.calls / 1e3)
    return times


def gpu_us(fn: Callable[[], Any], host: float) -> float:
    """GPU microseconds per call: CUDA events over 20 calls queued behind a GPU spin."""
    calls = 20
    return 1e3 * time_ms(fn, reps=10, warmup=1, calls=calls, ahead_us=max(2000.0, 3 * host * calls))


def host_syncs(fn: Callable[[], Any]) -> int:
    """Host synchronizations one call makes (what torch's sync debug mode reports)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def warmed(fn: Callable[[], Any], n: int) -> Optional[str]:
    """Run ``fn`` n times; None, or the error it raised (as a one-line reason)."""
    try:
        for _ in range(n):
            fn()
    except Exception as exc:  # a failing vendor call is a result to report
        traceback.print_exc()
        return f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:200]
    return None


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


# -- one row per entry point --------------------------------------------------------------------------
def measure(name: str, fn: Callable[[], Any], vendor: Optional[Callable[[], Any]], vendor_reason: str,
            device: str, cfg: Config) -> dict:
    row: dict[str, Any] = {"entry": name, "chosen": None, "flashinfer": vendor_reason}
    failure = warmed(fn, cfg.warmup)
    if failure is not None:
        return {**row, "error": f"dispatch call {failure}"}
    chosen, adapter = adapter_call(fn)
    row["chosen"] = chosen
    columns = {"dispatch": fn, "adapter": adapter}
    failure = warmed(adapter, cfg.warmup)
    if failure is not None:
        return {**row, "error": f"adapter call {failure}"}
    if vendor is not None:
        row["flashinfer"] = warmed(vendor, cfg.warmup) or "ok"
        if row["flashinfer"] == "ok":
            columns["flashinfer"] = vendor
    spread = host_us(columns, device, cfg)
    us = {col: statistics.median(ts) for col, ts in spread.items()}
    row.update({f"{col}_us": round(t, 2) for col, t in us.items()})
    row["min_max_us"] = {col: [round(min(ts), 2), round(max(ts), 2)] for col, ts in spread.items()}
    row["dispatch_layer_us"] = round(us["dispatch"] - us["adapter"], 2)
    if device == "cuda":
        row["dispatch_host_syncs"] = host_syncs(fn)
        row["dispatch_gpu_us"] = round(gpu_us(fn, us["dispatch"]), 2)
        if "flashinfer" in columns:
            row["flashinfer_gpu_us"] = round(gpu_us(vendor, us["flashinfer"]), 2)
    return row


def measure_all(device: str, cfg: Config, profile: int = 0) -> list[dict]:
    shape = SHAPES[device]
    x = inputs(shape, device)
    ours = dispatch_calls(x, shape)
    vendor, reasons = flashinfer_calls(x, shape, device)
    rows = []
    for name in ENTRIES:
        t0 = time.time()
        row = measure(name, ours[name], vendor.get(name), reasons.get(name, ""), device, cfg)
        row["seconds"] = round(time.time() - t0, 1)  # includes first-use JIT of the vendors
        if profile and "error" not in row:
            row["profile"] = profiled(ours[name], cfg.calls, profile)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# -- report -------------------------------------------------------------------------------------------
def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for module in ("triton", "flashinfer"):
        try:
            out[module] = __import__(module).__version__
        except Exception as exc:
            out[module] = f"not installed ({type(exc).__name__})"
    try:
        out["cudnn"] = get_backend("cudnn").version() or "not installed"
    except Exception as exc:
        out["cudnn"] = f"unknown ({type(exc).__name__})"
    return out


def environment(device: str, cfg: Config) -> dict:
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    cap = "sm_%d%d" % torch.cuda.get_device_capability() if device == "cuda" else None
    return {"device": device, "gpu": gpu, "capability": cap, "cpu": platform.processor() or platform.machine(),
            **versions(), "problem": SHAPES[device].describe(), "calls_per_timing": cfg.calls,
            "repeats": cfg.repeats, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _cell(value: Any) -> str:
    return "" if value is None else (f"{value:.1f}" if isinstance(value, float) else str(value))


def markdown(env: dict, rows: list[dict]) -> str:
    where = f"{env['gpu']} ({env['capability']})" if env["gpu"] else f"CPU ({env['cpu']})"
    lines = [f"# Host cost per call: dispatch vs adapter vs FlashInfer, {where}", "",
             f"{env['date']}; Python {env['python']}, torch {env['torch']}, triton {env['triton']}, "
             f"flashinfer {env['flashinfer']}, cudnn {env['cudnn']}. Produced by `tools/host_cost.py`.", "",
             f"Problem: {env['problem']}. Host microseconds per call: median of {env['repeats']} timings of "
             f"{env['calls_per_timing']} back-to-back calls (one sync after). dispatch layer = dispatch - adapter. "
             "GPU us: CUDA events over calls queued behind a GPU spin, launch gaps excluded, unless the call "
             "synchronizes the host (host syncs > 0: then it is the time per call, host included).", "",
             "| entry point | backend | dispatch us | adapter us | dispatch layer us | FlashInfer us | "
             "GPU us (dispatch / FlashInfer) | host syncs | note |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gpu = " / ".join(_cell(r.get(k)) or "-" for k in ("dispatch_gpu_us", "flashinfer_gpu_us")) \
            if "dispatch_gpu_us" in r else ""
        note = r.get("error") or ("" if r["flashinfer"] == "ok" else r["flashinfer"])
        lines.append(f"| {r['entry']} | {_cell(r['chosen'])} | {_cell(r.get('dispatch_us'))} | "
                     f"{_cell(r.get('adapter_us'))} | {_cell(r.get('dispatch_layer_us'))} | "
                     f"{_cell(r.get('flashinfer_us'))} | {gpu} | {_cell(r.get('dispatch_host_syncs'))} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats (a smoke run)")
    parser.add_argument("--out", default=".", help="folder for host-cost-<device>.json and .md")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile the dispatch calls (cProfile): the N costliest functions per entry")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    cfg = CONFIGS["quick" if args.quick else "full"]
    threads = torch.get_num_threads()
    if args.device == "cpu":
        torch.set_num_threads(1)  # tiny problems: thread hand-offs would be the noise
    try:
        env = environment(args.device, cfg)
        rows = measure_all(args.device, cfg, args.profile)
    finally:
        torch.set_num_threads(threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"host-cost-{args.device}.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    md = markdown(env, rows)
    (out / f"host-cost-{args.device}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
