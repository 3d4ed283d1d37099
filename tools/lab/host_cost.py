"""Host cost per call of every entry point: dispatch vs the direct adapter vs FlashInfer's own call.

One tiny decode-shaped problem per entry point (batch 1, one query token, KV 64 in pages of 16;
on CUDA bf16 with 32/8 heads and head dim 128, the figures of the "zero-cost dispatch" issue; on
the CPU float32 and smaller heads, served by the reference backend). Columns, in microseconds
of host time per call (N back-to-back calls timed with perf_counter_ns, no sync inside the
loop, one sync after; the median of several repeats; a tiny problem never lets the GPU limit):

* dispatch: the public call through ``import dispatch``;
* adapter: the chosen backend's ``run(plan, batch)`` called directly with the batch and plan
  the router built for that call (captured once, reused for every timed call);
* launcher: the backend's launcher for repeats (``Backend.launcher``) called directly;
* dispatch layer: dispatch - adapter, what our layer adds on top of the adapter;
* flashinfer: FlashInfer's own call of the entry point with the same arguments, or why not.

On CUDA also: the GPU time per call of the dispatch call and of FlashInfer's (CUDA events over
back-to-back calls queued behind a GPU spin, so launch gaps are not counted) and the host
synchronizations one dispatch call makes (torch.cuda sync debug mode).

Second table (``--kernel-bound``; on by default on CUDA, off on the CPU or with --quick): GPU time
per call on kernel-bound sizes (the issue's: single prefill 4096 x 4096 causal and q 1 / kv 8192,
xqa decode 1 x 8192 and 64 x 4096, the paged wrapper's decode 64 x 4096 and causal prefill
8 x 2048, trtllm context 8 x 2048), eager and warm: ours vs the adapter that served vs
FlashInfer's own call of the same kernel (and its other backends), the ratios, the achieved TB/s
or TFLOP/s (one formula each: KERNEL_METHOD) and the backend our choice used. On the CPU the
same rows at tiny sizes (wall time; what the test runs).

    python -m tools.lab.host_cost [--device cuda|cpu] [--quick] [--[no-]kernel-bound] [--profile N] [--out DIR]
    python -m tools.lab.host_cost --cudnn-launch [--quick] [--profile N] [--out DIR]
    python -m tools.lab.host_cost --matrix [--quick] [--[no-]small] [--out DIR]

``--matrix``: every entry point x every backend that serves it (each forced in turn, then the
automatic choice and FlashInfer's own call) x three sizes (tiny 1 x 1 x 64, decode 64 x 4096,
causal prefill 8 x 2048; 32/8 heads, d128, bf16; ``--small``, the CPU's default, scales them
down), host microseconds per eager call; DIR/host-cost-matrix-<device>.json is what
``python -m tools.lab.table`` takes beside bench JSONs for the table's host times.

writes DIR/host-cost-<device>.json and .md and prints the Markdown table; ``--cudnn-launch`` times
only the cuDNN row, path by path (dispatch, the adapter's run, its launcher, FlashInfer's own
call) and writes DIR/cudnn-launch-cuda.json. On the GPU host warm
up JIT-compiled kernels first (the script does: each call runs before any timing).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch

import dispatch
from backends import get_backend
from dispatch import router
from dispatch.benchmark import cases as lab
from dispatch.benchmark.runner import profiled
from dispatch.checks import ENV_VALIDATE
from dispatch.timing import time_ms

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
def captured(fn: Callable[[], Any]) -> tuple[router.Planned, Any]:
    """(plan, batch) the router launched with in one call of ``fn`` (``router.run`` observed)."""
    seen = []
    real = router.run

    def spy(planned, batch):
        seen.append((planned, batch))
        return real(planned, batch)
    router.run = spy
    saved = os.environ.get(ENV_VALIDATE)
    os.environ[ENV_VALIDATE] = "full"  # no fast lane: a repeat would go to the backend's launcher
    try:
        fn()
    finally:
        router.run = real
        if saved is None:
            del os.environ[ENV_VALIDATE]
        else:
            os.environ[ENV_VALIDATE] = saved
    if not seen:
        raise RuntimeError("the call never reached router.run")
    return seen[-1]


def served_by(planned: router.Planned) -> str:
    """The backend that served, and the automatic choice it fell back from, if any."""
    served = planned.backend
    if planned.decision.chosen != served:
        served += f" (fell back from {planned.decision.chosen})"
    return served


def adapter_call(fn: Callable[[], Any]) -> tuple[str, Callable[[], Any], Optional[Callable[[], Any]]]:
    """(backend that served, zero-arg call of its run(plan, batch), zero-arg call of its
    launcher or None) with the plan and the batch the router built for one call of ``fn``."""
    planned, batch = captured(fn)
    backend = get_backend(planned.backend)
    launch = backend.launcher(planned.plan, batch)
    return (served_by(planned), lambda: backend.run(planned.plan, batch),
            (lambda: launch(batch)) if launch is not None else None)


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
    """Host synchronizations one call makes (what torch's sync debug mode reports): the fewest over
    three calls, so a one-time sync of the process (the first row always showed one, the same
    call captured in a CUDA graph shows none) is not charged to one entry point."""
    counts = []
    for _ in range(3):
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        counts.append(sum("synchroniz" in str(w.message).lower() for w in caught))
    return min(counts)


def warmed(fn: Callable[[], Any], n: int) -> Optional[str]:
    """Run ``fn`` n times; None, or the error it raised (as a one-line reason)."""
    try:
        for _ in range(n):
            fn()
    except Exception as exc:  # a failing vendor call is a result to report
        traceback.print_exc()
        return f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:200]
    return None


# -- one row per entry point --------------------------------------------------------------------------
def measure(name: str, fn: Callable[[], Any], vendor: Optional[Callable[[], Any]], vendor_reason: str,
            device: str, cfg: Config) -> dict:
    row: dict[str, Any] = {"entry": name, "chosen": None, "flashinfer": vendor_reason}
    failure = warmed(fn, cfg.warmup)
    if failure is not None:
        return {**row, "error": f"dispatch call {failure}"}
    chosen, adapter, launcher = adapter_call(fn)
    row["chosen"] = chosen
    columns = {"dispatch": fn, "adapter": adapter}
    if launcher is not None:
        columns["launcher"] = launcher
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


# -- kernel-bound sizes: GPU time per call ------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One kernel-bound call: an entry point on requests of these query and KV lengths."""
    name: str
    entry: str
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    causal: bool = False

    @property
    def decode(self) -> bool:
        return all(n == 1 for n in self.q_lens)


def kernel_cases(single: int, single_kv: int, xqa_kv: int, batch: int, kv: int, prefill_b: int, prefill: int) -> tuple:
    """The seven rows of the kernel-bound table at the given sizes (CUDA: the issue's sizes)."""
    s, x, w, t = ENTRIES[0], ENTRIES[4], ENTRIES[5], ENTRIES[3]
    ctx = dict(q_lens=(prefill,) * prefill_b, kv_lens=(prefill,) * prefill_b, causal=True)
    return (Case(f"single prefill {single} x {single} causal", s, (single,), (single,), True),
            Case(f"single prefill q 1, kv {single_kv}", s, (1,), (single_kv,)),
            Case(f"xqa decode 1 x {xqa_kv}", x, (1,), (xqa_kv,)),
            Case(f"xqa decode {batch} x {kv}", x, (1,) * batch, (kv,) * batch),
            Case(f"paged wrapper decode {batch} x {kv}", w, (1,) * batch, (kv,) * batch),
            Case(f"paged wrapper prefill {prefill_b} x {prefill} causal", w, **ctx),
            Case(f"trtllm context {prefill_b} x {prefill} causal", t, **ctx))


KERNEL_CASES = {"cuda": kernel_cases(4096, 8192, 8192, 64, 4096, 8, 2048),
                "cpu": kernel_cases(32, 64, 64, 3, 48, 2, 16)}
KERNEL_CONFIGS = {"quick": Config(calls=5, repeats=3, warmup=2), "full": Config(calls=20, repeats=15, warmup=3)}
L2_READS = 3  # KV copies rotate so that the copies together hold >= 3x the GPU's L2 (at most MAX_KV_SETS)
MAX_KV_SETS = 8
KERNEL_METHOD = (
    "GPU microseconds per call (CPU: wall microseconds): eager, warm (each call ran before timing), median of "
    "{repeats} CUDA-event timings of {calls} back-to-back calls, queued behind a GPU spin so host launch gaps are "
    "not counted (a call that synchronizes the host pays its host time anyway); the columns take turns in every "
    "repeat. K/V rotate over copies (kv sets) that together hold at least 3x the L2, so no call finds its K/V "
    "left in L2 by the previous one. ours: the public entry point (import dispatch); adapter: the backend that "
    "served, its run(plan, batch) called directly with the router's plan and batch; FlashInfer: its own call "
    "of the entry point (single prefill: default backend and fa2/fa3; paged wrapper: backend fa2 and fa3, "
    "planned like ours). Rates, one formula each: decode (every q_len 1) TB/s = bytes of K and V read "
    "[2 * sum(kv_len) * kv heads * head dim * element bytes] / time; prefill TFLOP/s = "
    "4 * q heads * head dim * sum over requests of visible (query, key) pairs [q * kv; bottom-right causal "
    "q * (kv - q) + q * (q + 1) / 2, about half] / time. same kernel: FlashInfer's call of the kernel our "
    "choice ran (ratio ours / it); best: FlashInfer's fastest column.")


def kv_bytes(case: Case, s: Shape) -> float:
    """Bytes of K and V one call reads: 2 * sum(kv_len) * kv heads * head dim * element bytes."""
    return 2.0 * sum(case.kv_lens) * s.hkv * s.d * torch.empty((), dtype=s.dtype).element_size()


def work(case: Case, s: Shape) -> tuple[float, str]:
    """(what one call must do, unit of its rate): K+V bytes for decode, FLOPs for prefill (KERNEL_METHOD)."""
    if case.decode:
        return kv_bytes(case, s), "TB/s"
    pairs = sum(q * (kv - q) + q * (q + 1) / 2 if case.causal else q * kv for q, kv in zip(case.q_lens, case.kv_lens))
    return 4.0 * s.hq * s.d * pairs, "TFLOP/s"


def kernel_api(prefill: Any, decode: Any) -> SimpleNamespace:
    """The four callables the kernel-bound rows use, from a package laid out like flashinfer."""
    return SimpleNamespace(single_prefill_with_kv_cache=prefill.single_prefill_with_kv_cache,
                           xqa_batch_decode_with_kv_cache=decode.xqa_batch_decode_with_kv_cache,
                           trtllm_batch_context_with_kv_cache=prefill.trtllm_batch_context_with_kv_cache,
                           BatchPrefillWithPagedKVCacheWrapper=prefill.BatchPrefillWithPagedKVCacheWrapper)


def case_inputs(case: Case, s: Shape, device: str, l2_bytes: int) -> tuple[dict, list]:
    """(the case's tensors, its KV operands): the operand each call takes, in ``kv_sets`` copies
    (single prefill: (k, v); xqa: (k pages, v pages); wrapper and trtllm: the 5-D NHD page cache)."""
    sizes = dict(device=device, num_qo_heads=s.hq, num_kv_heads=s.hkv, head_dim=s.d)
    if case.entry == ENTRIES[0]:
        c = lab.ragged(case.q_lens, case.kv_lens, s.dtype, **sizes)
        kv: Any = (c["k"], c["v"])
    else:
        c = lab.paged(case.q_lens, case.kv_lens, "NHD", s.dtype, **sizes, page_size=s.page)
        kv = c["cache"]
    c["kv_tokens"] = lab.indptr(case.kv_lens, device)
    sets = 1 if l2_bytes <= 0 else min(MAX_KV_SETS, max(1, math.ceil(L2_READS * l2_bytes / kv_bytes(case, s))))
    copies = [kv] + [tuple(t.clone() for t in kv) if isinstance(kv, tuple) else kv.clone() for _ in range(sets - 1)]
    if case.entry == ENTRIES[4]:
        copies = [(cache[:, 0], cache[:, 1]) for cache in copies]
    return c, copies


def kernel_call(api: SimpleNamespace, case: Case, c: dict, s: Shape, **kw) -> Callable[[Any], Any]:
    """The case's call against ``api`` (dispatch or flashinfer), taking the KV operand; ``kw``:
    single prefill's keywords (backend=), or the paged wrapper's constructor keywords."""
    scale, b = s.d ** -0.5, len(case.kv_lens)
    if case.entry == ENTRIES[0]:
        return lambda kv: api.single_prefill_with_kv_cache(c["q"], kv[0], kv[1], causal=case.causal, **kw)
    if case.entry == ENTRIES[4]:
        ws = lab.ws(c["device"])
        return lambda kv: api.xqa_batch_decode_with_kv_cache(c["q"], kv, ws, c["table"], c["seq"],
                                                             max(case.kv_lens), scale, 1.0)
    if case.entry == ENTRIES[3]:
        ws = lab.ws(c["device"])
        return lambda kv: api.trtllm_batch_context_with_kv_cache(
            c["q"], kv, ws, c["table"], c["seq"], max(case.q_lens), max(case.kv_lens), scale, 1.0, b, c["qo"],
            c["kv_tokens"], kv_layout="NHD")
    w = api.BatchPrefillWithPagedKVCacheWrapper(lab.ws(c["device"]), "NHD", **kw)
    w.plan(c["qo"], c["kv_indptr"], c["perm"], c["last"], s.hq, s.hkv, s.d, s.page, causal=case.causal,
           q_data_type=s.dtype)
    return lambda kv: w.run(c["q"], kv)


def flashinfer_api(device: str) -> tuple[Optional[SimpleNamespace], str]:
    """(FlashInfer's callables, "") where it can run here, else (None, why not)."""
    try:
        import flashinfer.decode
        import flashinfer.prefill
    except Exception as exc:  # an import failure is a result to report
        return None, f"not installed ({type(exc).__name__}: {exc})"[:160]
    if device != "cuda":
        return None, "not measured: FlashInfer runs on CUDA only"
    return kernel_api(flashinfer.prefill, flashinfer.decode), ""


def fi_default_backend(s: Shape) -> str:
    """What FlashInfer's backend="auto" resolves to here for these dtypes (fa2 or fa3)."""
    try:
        from flashinfer.utils import determine_attention_backend
        return determine_attention_backend(torch.device("cuda"), 0, False, False, s.dtype, s.dtype)
    except Exception as exc:  # only a label: never fail the run for it
        return f"unknown ({type(exc).__name__})"


def trtllm_gen_reason(device: str) -> str:
    """"" where FlashInfer's trtllm-gen kernels can run (Blackwell), else why not."""
    cap = torch.cuda.get_device_capability() if device == "cuda" else None
    if cap is not None and cap[0] == 10:
        return ""
    where = "sm_%d%d" % cap if cap else "not a GPU"
    return f"needs Blackwell: trtllm-gen kernels need compute capability 10.x; this is {where}"


def deferred(make: Callable[[], Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """``make()``, or a call that raises what it raised (so the warm-up reports it as the column's failure)."""
    try:
        return make()
    except Exception as exc:  # a vendor refusing at construction or plan time is a result to report
        def failing(_kv: Any, exc: Exception = exc) -> Any:
            raise exc
        return failing


def vendor_columns(case: Case, c: dict, s: Shape, device: str) -> tuple[dict[str, Callable[[Any], Any]], str]:
    """FlashInfer's own calls of the case by column name, or (no columns, why not)."""
    fi, reason = flashinfer_api(device)
    if fi is None:
        return {}, reason
    if case.entry == ENTRIES[3] and trtllm_gen_reason(device):
        return {}, trtllm_gen_reason(device)
    if case.entry == ENTRIES[0]:
        kinds = {f"flashinfer auto={fi_default_backend(s)}": {}, "flashinfer fa2": {"backend": "fa2"},
                 "flashinfer fa3": {"backend": "fa3"}}
    elif case.entry == ENTRIES[5]:
        kinds = {"flashinfer fa2": {"backend": "fa2"}, "flashinfer fa3": {"backend": "fa3"}}
    else:
        kinds = {"flashinfer": {}}
    return {name: deferred(lambda kw=kw: kernel_call(fi, case, c, s, **kw)) for name, kw in kinds.items()}, ""


def cycling(fn: Callable[[Any], Any], operands: list) -> Callable[[], Any]:
    """A zero-arg call of ``fn`` on the next operand, round robin."""
    if len(operands) == 1:
        only = operands[0]
        return lambda: fn(only)
    it = itertools.cycle(operands)
    return lambda: fn(next(it))


SAME_BACKEND = {ENTRIES[4]: "xqa", ENTRIES[3]: "trtllm-gen"}  # FlashInfer's call of these runs this backend


def same_kernel_column(case: Case, planned: router.Planned, columns: dict) -> Optional[str]:
    """FlashInfer's column that runs the kernel our choice ran, if one ran here."""
    if case.entry in SAME_BACKEND:
        name = "flashinfer" if planned.backend == SAME_BACKEND[case.entry] else None
    else:  # single prefill, paged wrapper: FlashInfer's fa2/fa3 when our provider was FlashInfer's
        provider = getattr(planned.plan, "provider", None)
        name = f"flashinfer {provider.kind}" if getattr(provider, "label", "").startswith("flashinfer") else None
    return name if name in columns else None


def kernel_times(columns: dict[str, Callable[[], Any]], device: str, cfg: Config) -> dict[str, list[float]]:
    """Microseconds per call of each column, one value per repeat, the columns taking turns:
    on CUDA CUDA events behind a spin of twice the host time of the calls (at least 2 ms)."""
    ahead = {}
    for name, fn in columns.items():
        sync(device)
        t0 = time.perf_counter_ns()
        for _ in range(cfg.calls):
            fn()
        ahead[name] = min(5e5, max(2000.0, 2 * (time.perf_counter_ns() - t0) / 1e3))
        sync(device)
    times: dict[str, list[float]] = {name: [] for name in columns}
    for _ in range(cfg.repeats):
        for name, fn in columns.items():
            if device == "cuda":
                times[name].append(1e3 * time_ms(fn, reps=1, warmup=0, calls=cfg.calls, ahead_us=ahead[name]))
                continue
            t0 = time.perf_counter_ns()
            for _ in range(cfg.calls):
                fn()
            times[name].append((time.perf_counter_ns() - t0) / cfg.calls / 1e3)
    return times


def kernel_columns(case: Case, s: Shape, device: str, l2_bytes: int, cfg: Config) -> tuple[dict, dict]:
    """(row facts, zero-arg calls by column): ours, the adapter that served it, FlashInfer's own
    calls that ran their warm-up (the others are reasons in row["flashinfer"])."""
    c, kv = case_inputs(case, s, device, l2_bytes)
    ours = deferred(lambda: kernel_call(kernel_api(dispatch, dispatch), case, c, s))
    row: dict[str, Any] = {"kv_sets": len(kv)}
    failure = warmed(cycling(ours, kv), max(cfg.warmup, len(kv)))
    if failure is not None:
        return {**row, "error": f"ours: {failure}"}, {}
    runs = [captured(lambda kv_=kv_: ours(kv_)) for kv_ in kv]
    planned, backend = runs[0][0], get_backend(runs[0][0].backend)
    provider = getattr(getattr(planned.plan, "provider", None), "label", None)
    row.update(chosen=served_by(planned), provider=provider)
    columns = {"ours": cycling(ours, kv), "adapter": cycling(lambda pb: backend.run(pb[0].plan, pb[1]), runs)}
    vendors, reason = vendor_columns(case, c, s, device)
    row["flashinfer"] = {} if vendors else reason
    for name, fn in vendors.items():
        call = cycling(fn, kv)
        row["flashinfer"][name] = warmed(call, max(cfg.warmup, len(kv))) or "ok"
        if row["flashinfer"][name] == "ok":
            columns[name] = call
    row["same_kernel"] = same_kernel_column(case, planned, columns)
    return row, columns


def kernel_row(case: Case, s: Shape, device: str, l2_bytes: int, cfg: Config) -> dict:
    """One row of the kernel-bound table: us per call of every column, ratios, rates, host syncs."""
    amount, unit = work(case, s)
    row: dict[str, Any] = {"case": case.name, "entry": case.entry, "unit": unit}
    facts, columns = kernel_columns(case, s, device, l2_bytes, cfg)
    row.update(facts)
    if not columns:
        return row
    spread = kernel_times(columns, device, cfg)
    us = {col: statistics.median(ts) for col, ts in spread.items()}
    row["us"] = {col: round(t, 2) for col, t in us.items()}
    row["min_max_us"] = {col: [round(min(ts), 2), round(max(ts), 2)] for col, ts in spread.items()}
    row["rate"] = {col: round(amount / (t * 1e-6) / 1e12, 3) for col, t in us.items()}
    row["ours_over_adapter"] = round(us["ours"] / us["adapter"], 3)
    vendors = [col for col in us if col.startswith("flashinfer")]
    if vendors:
        best = min(vendors, key=us.__getitem__)
        row.update(best_flashinfer=best, ours_over_flashinfer_best=round(us["ours"] / us[best], 3))
    if row["same_kernel"]:
        row["ours_over_flashinfer"] = round(us["ours"] / us[row["same_kernel"]], 3)
    if device == "cuda":
        row["host_syncs"] = {col: host_syncs(columns[col]) for col in ("ours", *vendors)}
    return row


def l2_size(device: str) -> int:
    if device != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) or 0)


def kernel_bound_rows(device: str, cfg: Config, cases: Optional[tuple] = None, l2_bytes: Optional[int] = None,
                      shape: Optional[Shape] = None) -> list[dict]:
    """The kernel-bound table: one row per case (default KERNEL_CASES[device]); ``l2_bytes``
    (default: the GPU's L2, 0 on the CPU) sets how many KV copies rotate."""
    shape = shape or SHAPES[device]
    l2 = l2_size(device) if l2_bytes is None else l2_bytes
    rows = []
    for case in cases or KERNEL_CASES[device]:
        t0 = time.time()
        try:
            row = kernel_row(case, shape, device, l2, cfg)
        except Exception as exc:  # one case failing (out of memory, say) is a result; the others still run
            traceback.print_exc()
            row = {"case": case.name, "entry": case.entry, "unit": work(case, shape)[1],
                   "error": f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:200]}
        row["seconds"] = round(time.time() - t0, 1)  # includes first-use JIT compiles
        print(json.dumps(row), flush=True)
        rows.append(row)
        sync(device)
    return rows


# -- the cuDNN launch, path by path -------------------------------------------------------------------
def cudnn_paths(x: dict, s: Shape, device: str = "cuda") -> tuple[dict, dict, dict[str, str]]:
    """The cuDNN row's call by every path, slowest to cheapest: ours through ``import dispatch``
    (repeats take its lane, and the backend's launcher where the lanes use it), the adapter's
    ``run(plan, batch)``, its launcher ``launch(batch)``, and FlashInfer's own call. Returns
    (path -> call, path -> its output buffer where the call writes one in place, path -> why
    it is missing)."""
    from dispatch import decode, entries, prefill

    no_wrappers = {"paged": None, "ragged": None}
    ours = entry_calls(Api(prefill, decode), x, s, no_wrappers)[ENTRIES[2]]
    entries.clear_caches()
    router.clear_caches()
    planned, batch = captured(ours)  # a fresh lane: its first call reaches router.run
    backend = get_backend(planned.backend)
    paths: dict[str, Callable[[], Any]] = {"dispatch": ours, "adapter run": lambda: backend.run(planned.plan, batch)}
    written, missing = {"adapter run": batch.out}, {}
    launch = backend.launcher(planned.plan, batch)
    if launch is not None:
        paths["adapter launcher"], written["adapter launcher"] = (lambda: launch(batch)), batch.out
    else:
        missing["adapter launcher"] = f"{served_by(planned)} has no launcher for this call"
    if device != "cuda":
        missing["flashinfer"] = "not measured: FlashInfer runs on CUDA only"
        return paths, written, missing
    try:
        import flashinfer.decode
        import flashinfer.prefill
        importlib.import_module("cudnn")  # FlashInfer's cuDNN path needs the frontend
        paths["flashinfer"] = entry_calls(Api(flashinfer.prefill, flashinfer.decode), x, s, no_wrappers)[ENTRIES[2]]
    except Exception as exc:  # not installed: a result to report
        missing["flashinfer"] = f"not installed ({type(exc).__name__}: {exc})"[:160]
    return paths, written, missing


def _output(fn: Callable[[], Any], written: Optional[torch.Tensor]) -> torch.Tensor:
    """The out of one call: the buffer it writes in place (poisoned first), else what it returns."""
    if written is not None:
        written.fill_(float("nan"))
        fn()
        return written.clone()
    return fn()[0]


def cudnn_launch_costs(cfg: Config, profile: int = 0, device: str = "cuda") -> dict:
    """Host us per call of each cuDNN path on the cuDNN row's problem, its GPU us, and every
    path's out against dispatch's (max abs difference: the paths must agree). On the CPU (the
    test's smoke run) the reference backend serves and there is neither GPU time nor FlashInfer."""
    shape = SHAPES[device]
    x = inputs(shape, device)
    paths, written, missing = cudnn_paths(x, shape, device)
    outs = {}
    for name, fn in list(paths.items()):
        failure = warmed(fn, cfg.warmup)
        if failure is not None:
            missing[name] = failure
            paths.pop(name)
            continue
        outs[name] = _output(fn, written.get(name)).float()
    spread = host_us(paths, device, cfg)
    first = outs.get("dispatch")
    rows = []
    for name, times in spread.items():
        host = statistics.median(times)
        rows.append({"path": name, "host_us": round(host, 2), "min_max_us": [round(min(times), 2), round(max(times), 2)],
                     "gpu_us": round(gpu_us(paths[name], host), 2) if device == "cuda" else None,
                     "max_abs_diff": None if first is None else float((outs[name] - first).abs().max())})
        if profile:
            rows[-1]["profile"] = profiled(paths[name], cfg.calls, profile)
    return {"problem": f"cudnn_batch_prefill_with_kv_cache, {shape.describe()}, paged HND, no LSE",
            "calls_per_timing": cfg.calls, "repeats": cfg.repeats, "rows": rows, "missing": missing}


def _diff_cell(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.3g}"


def cudnn_launch_markdown(report: dict) -> str:
    lines = [f"cuDNN launch paths: {report['problem']}; host us per call (median of {report['repeats']} x "
             f"{report['calls_per_timing']} calls), GPU us per call, max |out - dispatch's out|.", "",
             "| path | host us | min / max | GPU us | max abs diff |", "|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['path']} | {r['host_us']:.1f} | {r['min_max_us'][0]:.1f} / {r['min_max_us'][1]:.1f} | "
                     f"{_cell(r['gpu_us'])} | {_diff_cell(r['max_abs_diff'])} |")
    lines += [f"| {name} | - | - | - | {why} |" for name, why in report["missing"].items()]
    for r in report["rows"]:
        if r.get("profile"):
            lines += ["", f"profile of {r['path']}:"] + [f"    {line}" for line in r["profile"]]
    return "\n".join(lines) + "\n"


# -- the matrix: every entry x every backend that serves it x several sizes (--matrix) -----------------
# (batch, q_len, kv_len) per size; --small (the CPU's default) scales them down
MATRIX_SIZES = {"tiny": (1, 1, 64), "decode 64 x 4096": (64, 1, 4096), "prefill 8 x 2048": (8, 2048, 2048)}
SMALL_SIZES = {"tiny": (1, 1, 8), "decode 64 x 4096": (2, 1, 16), "prefill 8 x 2048": (2, 8, 16)}
SMALL_CONFIG = Config(calls=1, repeats=1, warmup=1)
MATRIX_SHAPES = {False: dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, dtype="bfloat16"),
                 True: dict(num_qo_heads=4, num_kv_heads=2, head_dim=32, dtype="float32", page_size=8)}


def matrix_problems(small: bool) -> list[tuple[str, Any]]:
    """(size name, BenchProblem or the reason there is none) for every entry point x size: causal
    prefill, single prefill on one request of the size's lengths, xqa at decode sizes only."""
    from dispatch.benchmark.problems import ENTRY_NAMES, SINGLE, SINGLE_LSE, BenchProblem, check_entry
    out = []
    for entry in ENTRY_NAMES:
        for size, (b, q, kv) in (SMALL_SIZES if small else MATRIX_SIZES).items():
            p = BenchProblem(entry, 1 if entry in (SINGLE, SINGLE_LSE) else b, q, kv, causal=q > 1,
                             **MATRIX_SHAPES[small])
            why = check_entry(p)
            out.append((size, why or p))
    return out


def matrix_cell(built: Any, backend: str, device: str, cfg: Config, api: Optional[dict] = None) -> dict:
    """Host us per eager call of one backend (forced; "auto"; "flashinfer": FlashInfer's own call)
    on a built problem, after ``cfg.warmup`` calls; or why it did not run."""
    from dispatch.benchmark import runner
    row: dict[str, Any] = {"backend": backend}
    with runner.backend_scope(backend):
        try:
            call = built.call(api)
            for kv in built.operands[:1] * cfg.warmup:
                call(kv)
            sync(device)
        except router.BackendRefusedError as exc:
            return {**row, "status": "refused", "note": runner._refusal(exc)}
        except Exception as exc:  # a vendor failing is a result to report
            return {**row, "status": "error", "note": runner.one_line(exc)}
        row["served"] = built.served() if api is None else backend
        spread = host_us({"call": runner._cycling(call, built.operands)}, device, cfg)["call"]
    return {**row, "status": "ok", "host_us": round(statistics.median(spread), 2),
            "min_max_us": [round(min(spread), 2), round(max(spread), 2)]}


def host_matrix(device: str, cfg: Config, small: bool) -> list[dict]:
    """Every entry point x every backend that serves it (each forced in turn, then auto and
    FlashInfer's own call) x the sizes: one row per cell (``python -m tools.lab.table`` reads them)."""
    from dispatch.benchmark import build, runner
    rows = []
    api, why = build.flashinfer_api() if device == "cuda" else (None, "FlashInfer runs on a GPU only")
    for size, p in matrix_problems(small):
        if isinstance(p, str):
            rows.append({"size": size, "status": "skipped", "note": p})
            continue
        try:
            built = build.build(p, device, seed=len(rows))
        except Exception as exc:  # out of memory, say: a result
            rows.append({"entry": p.entry, "size": size, "problem": p.name, "status": "error",
                         "note": runner.one_line(exc)})
            continue
        names = runner.backends_to_force(p, device) + [runner.AUTO]
        cells = [matrix_cell(built, name, device, cfg) for name in names]
        fi = api.get(p.entry) if api else None
        cells.append(matrix_cell(built, runner.FLASHINFER, device, cfg, api) if fi is not None else
                     {"backend": runner.FLASHINFER, "status": "absent", "note": why or "not in this version"})
        for cell in cells:
            rows.append({"entry": p.entry, "size": size, "problem": p.name, **cell})
            print(json.dumps(rows[-1]), flush=True)
        del built
    return rows


def matrix_markdown(env: dict, rows: list[dict]) -> str:
    where = f"{env['gpu']} ({env['capability']})" if env["gpu"] else f"CPU ({env['cpu']})"
    lines = [f"# Host cost per eager call: every entry x backend x size, {where}", "",
             f"{env['date']}; Python {env['python']}, torch {env['torch']}, flashinfer {env['flashinfer']}. "
             "Produced by `python -m tools.lab.host_cost --matrix`. Host microseconds per call: median of "
             f"{env['repeats']} timings of {env['calls_per_timing']} back-to-back calls (no sync inside, one "
             "after), each backend forced through the public entry point (dispatch.use_backend), then the "
             "automatic choice and FlashInfer's own call.", "",
             "| entry point | size | backend | served | host us | min / max | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        mm = r.get("min_max_us")
        lines.append(f"| {r.get('entry', '')} | {r['size']} | {r.get('backend', '')} | {r.get('served') or ''} | "
                     f"{_cell(r.get('host_us'))} | {f'{mm[0]:.1f} / {mm[1]:.1f}' if mm else ''} | "
                     f"{r.get('note', '') if r['status'] != 'ok' else ''} |")
    return "\n".join(lines) + "\n"


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
             f"flashinfer {env['flashinfer']}, cudnn {env['cudnn']}. Produced by `python -m tools.lab.host_cost`.", "",
             f"Problem: {env['problem']}. Host microseconds per call: median of {env['repeats']} timings of "
             f"{env['calls_per_timing']} back-to-back calls (one sync after). adapter: the backend's run(plan, "
             "batch) called directly; launcher: the backend's launcher for repeats (what a repeated call of the "
             "entry point runs after its key lookup), called directly. dispatch layer = dispatch - adapter. "
             "ours / FlashInfer = dispatch / FlashInfer. "
             "GPU us: CUDA events over calls queued behind a GPU spin, launch gaps excluded, unless the call "
             "synchronizes the host (host syncs > 0: then it is the time per call, host included).", "",
             "| entry point | backend | dispatch us | adapter us | launcher us | dispatch layer us | FlashInfer us | "
             "ours / FlashInfer | GPU us (dispatch / FlashInfer) | host syncs | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gpu = " / ".join(_cell(r.get(k)) or "-" for k in ("dispatch_gpu_us", "flashinfer_gpu_us")) \
            if "dispatch_gpu_us" in r else ""
        note = r.get("error") or ("" if r["flashinfer"] == "ok" else r["flashinfer"])
        ratio = r["dispatch_us"] / r["flashinfer_us"] if r.get("flashinfer_us") and r.get("dispatch_us") else None
        lines.append(f"| {r['entry']} | {_cell(r['chosen'])} | {_cell(r.get('dispatch_us'))} | "
                     f"{_cell(r.get('adapter_us'))} | {_cell(r.get('launcher_us'))} | "
                     f"{_cell(r.get('dispatch_layer_us'))} | {_cell(r.get('flashinfer_us'))} | "
                     f"{_ratio(ratio)}{'x' if ratio else ''} | {gpu} | {_cell(r.get('dispatch_host_syncs'))} | {note} |")
    return "\n".join(lines) + "\n"


def _ratio(value: Any) -> str:
    return "" if value is None else f"{value:.3f}"


def _rate(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3g}"


def _vendor_cell(r: dict) -> str:
    """FlashInfer's measured columns, 'fa3 250.1 (same kernel), auto=fa3 251.0', or '-'."""
    cells = []
    for col, us in r.get("us", {}).items():
        if col.startswith("flashinfer"):
            label = col[len("flashinfer"):].strip() or "own call"
            cells.append(f"{label} {us:.1f}" + (" (same kernel)" if col == r.get("same_kernel") else ""))
    return ", ".join(cells) or "-"


def _kernel_note(r: dict) -> str:
    if "error" in r:
        return r["error"]
    fi = r["flashinfer"]
    if isinstance(fi, str):
        return fi
    return "; ".join(f"{col}: {why[:120]}" for col, why in fi.items() if why != "ok")


def kernel_markdown(method: str, rows: list[dict]) -> list[str]:
    """The second table: GPU time per call on kernel-bound sizes."""
    lines = ["", "## GPU time per call on kernel-bound sizes: ours vs FlashInfer's own call vs the adapter", "",
             method, "",
             "| case | entry point | ours: backend (provider) | kv sets | ours us | adapter us | FlashInfer us | "
             "ours / FlashInfer same kernel | ours / FlashInfer best | ours / adapter | "
             "rate ours / FlashInfer (same kernel, else best) | "
             "host syncs ours | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        us, rate, unit = r.get("us", {}), r.get("rate", {}), r["unit"]
        ref = r.get("same_kernel") or r.get("best_flashinfer")
        chosen = _cell(r.get("chosen")) + (f" ({r['provider']})" if r.get("provider") else "")
        rates = f"{_rate(rate.get('ours'))} / {_rate(rate.get(ref))} {unit}" if rate else ""
        lines.append(
            f"| {r['case']} | {r['entry']} | {chosen} | {r.get('kv_sets', '')} | {_cell(us.get('ours'))} | "
            f"{_cell(us.get('adapter'))} | {_vendor_cell(r)} | {_ratio(r.get('ours_over_flashinfer'))} | "
            f"{_ratio(r.get('ours_over_flashinfer_best'))} | {_ratio(r.get('ours_over_adapter'))} | {rates} | "
            f"{_cell(r.get('host_syncs', {}).get('ours'))} | {_kernel_note(r)} |")
    return lines


def kernel_bound(device: str, quick: bool) -> dict:
    """The kernel-bound section: its method (sizes, timing, formulas) and its rows."""
    cfg = KERNEL_CONFIGS["quick" if quick else "full"]
    s = SHAPES[device]
    problem = (f"{str(s.dtype).replace('torch.', '')}, {s.hq}/{s.hkv} heads, d{s.d}, pages of {s.page} "
               f"(wrapper, xqa, trtllm: NHD page caches, pages in a random order)")
    method = f"Problem: {problem}. " + KERNEL_METHOD.format(repeats=cfg.repeats, calls=cfg.calls)
    return {"method": method, "problem": problem, "calls_per_timing": cfg.calls, "repeats": cfg.repeats,
            "l2_bytes": l2_size(device), "rows": kernel_bound_rows(device, cfg)}


def write(out: Path, device: str, report: dict) -> str:
    """Write DIR/host-cost-<device>.json and .md; return the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"host-cost-{device}.json").write_text(json.dumps(report, indent=1))
    md = markdown(report["environment"], report["rows"])
    if "kernel_bound" in report:
        md += "\n".join(kernel_markdown(report["kernel_bound"]["method"], report["kernel_bound"]["rows"])) + "\n"
    (out / f"host-cost-{device}.md").write_text(md)
    return md


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lab.host_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats (a smoke run)")
    parser.add_argument("--out", default=".", help="folder for host-cost-<device>.json and .md")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile the dispatch calls (cProfile): the N costliest functions per entry")
    parser.add_argument("--kernel-bound", action=argparse.BooleanOptionalAction, default=None,
                        help="GPU time per call on kernel-bound sizes (default: on for CUDA without --quick)")
    parser.add_argument("--cudnn-launch", action="store_true",
                        help="only the cuDNN row, path by path: dispatch, the adapter's run, its launcher, "
                             "FlashInfer's own call (CUDA); writes DIR/cudnn-launch-cuda.json")
    parser.add_argument("--matrix", action="store_true",
                        help="every entry x every backend that serves it x sizes (tiny, decode 64 x 4096, prefill "
                             "8 x 2048): DIR/host-cost-matrix-<device>.json (python -m tools.lab.table reads it) and .md")
    parser.add_argument("--small", action=argparse.BooleanOptionalAction, default=None,
                        help="with --matrix: sizes scaled down (default: on for the CPU)")
    args = parser.parse_args(argv)
    if (args.device == "cuda" or args.cudnn_launch) and not torch.cuda.is_available():
        parser.error(f"--{'cudnn-launch' if args.cudnn_launch else 'device cuda'}: no CUDA device here")
    cfg = CONFIGS["quick" if args.quick else "full"]
    if args.cudnn_launch:
        report = cudnn_launch_costs(cfg, args.profile)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "cudnn-launch-cuda.json").write_text(json.dumps(report, indent=1))
        print(cudnn_launch_markdown(report))
        return 0
    if args.matrix:
        return _matrix_main(args, cfg)
    if args.kernel_bound is None:
        args.kernel_bound = args.device == "cuda" and not args.quick
    threads = torch.get_num_threads()
    if args.device == "cpu":
        torch.set_num_threads(1)  # tiny problems: thread hand-offs would be the noise
    out = Path(args.out)
    try:
        env = environment(args.device, cfg)
        report: dict[str, Any] = {"environment": env, "rows": measure_all(args.device, cfg, args.profile)}
        if args.kernel_bound:
            write(out, args.device, report)  # the host table is kept should the kernel-bound runs not end
            report["kernel_bound"] = kernel_bound(args.device, args.quick)
    finally:
        torch.set_num_threads(threads)
    print(write(out, args.device, report))
    return 0


def _matrix_main(args: argparse.Namespace, cfg: Config) -> int:
    small = args.device == "cpu" if args.small is None else args.small
    if small:  # the CPU's smoke run: each call is the whole (unfused, interpreted) computation
        cfg = SMALL_CONFIG
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # native-triton on the CPU: Triton's interpreter
    env = environment(args.device, cfg)
    env["problem"] = "matrix: " + ", ".join(f"{k} {v}" for k, v in (SMALL_SIZES if small else MATRIX_SIZES).items())
    rows = host_matrix(args.device, cfg, small)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"host-cost-matrix-{args.device}.json").write_text(json.dumps({"environment": env, "matrix": rows}, indent=1))
    md = matrix_markdown(env, rows)
    (out / f"host-cost-matrix-{args.device}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
