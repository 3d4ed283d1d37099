"""``attn-dispatch bench --trace``: an engine-shaped trace, every step through ours and FlashInfer's calls.

Engines change the batch every step; a call repeated with the same shapes measures the steady state,
this measures the path between steady states (a new shape, a new size class, the first run after a
plan). Each entry point runs a trace of steps; a step is what an engine calls for one forward pass:

* ``paged`` (BatchPrefillWithPagedKVCacheWrapper) and ``ragged`` (BatchPrefillWithRaggedKVCacheWrapper),
  one continuous-batching trace for both: ``plan()`` once per step, then ``run()`` once per layer.
  Requests join with a prefill chunk (their whole prompt), decode one token a step and leave after
  their drawn number of output tokens; the rows of a step are the decode rows of the requests already
  in the batch (oldest first), then the prefill chunks of the requests joining. Paged: each request
  holds pages of ``--page-size`` tokens for its whole life, taken from a free list kept in shuffled
  order, and the step hands the pages that cover its keys (kv_indptr, kv_indices, kv_last_page_len).
  Ragged: K/V packed request after request.
* ``xqa`` (xqa_batch_decode_with_kv_cache): a decode batch drawn afresh every step, pages drawn at
  random from the pool.
* ``cudnn`` (cudnn_batch_prefill_with_kv_cache) and ``trtllm`` (trtllm_batch_context_with_kv_cache):
  one context trace for both, a batch of causal prefill chunks over paged K/V (chunk + a prefix of
  cached keys). cuDNN's maxima are the trace's bounds (an engine passes fixed upper bounds, so a
  step does not change them); trtllm's are the step's.
* ``single`` (single_prefill_with_kv_cache): one causal prefill chunk over its prefix, lengths
  drawn every step.

The function entries are called once per layer per step. The distribution (``Bounds``; each
integer drawn uniformly in its closed range, prefill chunks log-uniformly; GPU, then CPU):

* continuous batching: prefill chunk 17-2048 tokens (CPU 17-96), output tokens 1-128 (CPU 1-16),
  1-2 requests join a step while the batch is under ``--max-batch`` (default 64; CPU 8); when the
  batch is full and no request finishes, the one closest to its end leaves early (a stop token):
  so every step some request joins; at 1.5 joins a step for 64.5 steps each on average, the batch
  reaches its cap after about 60 steps and then turns over there, as a loaded engine's does;
* xqa decode: 1-256 requests (CPU 1-8), each 100-2300 keys (CPU 100-300);
* context (cuDNN, trtllm): 1-8 requests (CPU 1-4), chunk 17-2048 (CPU 17-96), prefix 0-2048 keys
  (CPU 0-96);
* single prefill: chunk 17-2048 (CPU 17-96), prefix 0-2048 (CPU 0-96);
* every trace redraws a step whose lengths equal the previous step's: the batch changes every step.

Sizes: 32/8 heads, head dim 128, bf16, pages of 16 on a GPU; 4/2 heads, head dim 32, fp32 on the
CPU (the reference backend). All index tensors live on the device, built before the step.

Timing, per entry and per side (ours: ``import dispatch``; flashinfer: its own calls, when it is
importable on a GPU; otherwise, or where its call cannot run here, e.g. trtllm-gen off Blackwell,
"not run: <reason>"): a warm-up pass over a separate draw of the trace, then the timed pass. Per step:
host time (``time.perf_counter`` around the step's Python calls, no synchronize inside the step) and
on a GPU the step's GPU time (CUDA events around it, then a synchronize). The two sides take turns
on every step (which goes first alternates). Reported: p50, p99 and max per step, the first step's
host time (the warm-up pass's first step: the first call's cost), the wrappers' plan and first run,
and the steps where our host time exceeds FlashInfer's worst + 1 ms. Nothing asserts speed. Between
the passes the garbage collector's heap is frozen, as engines do after their warm-up (``settle_heap``).

Check: on ``--check-steps`` steps of the timed pass the last layer's output is compared with the
fp64 oracle (dispatch/benchmark/oracle.py) on the last rows of a few requests (relative error against the
dtype's band) and, when FlashInfer ran the step, with FlashInfer's whole output (printed).

    attn-dispatch bench --trace --device cpu --steps 20 --out DIR      # seconds, CI runs it
    attn-dispatch bench --trace --out $OUT                             # a GPU: 300 steps, a new seed
    attn-dispatch bench --trace --seed 1234 --entries paged xqa --layers 8

Writes DIR/trace-<device>-seed-<seed>.json, .md and .png (with matplotlib); the seed is drawn from
os.urandom at run time unless ``--seed`` is given, and recorded. Exit status 1 when a check fails or
our side fails to run.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch

from .. import autotune
from ..entries import last_decision
from . import cases as lab
from .oracle import attention_fp64, band, relative_error

Range = tuple[int, int]


# -- the distribution -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bounds:
    """Closed ranges every step's draw stays in (module docstring)."""
    prefill: Range  # tokens of a joining request's prefill chunk (log-uniform)
    output: Range  # tokens a request decodes before it leaves (the prefill step gives the first)
    joins: Range  # requests joining a step while the batch has room
    decode_batch: Range  # xqa: requests per step
    decode_kv: Range  # xqa: keys per request
    context_batch: Range  # cuDNN, trtllm: requests per step
    context_q: Range  # cuDNN, trtllm, single prefill: chunk tokens (log-uniform)
    context_prefix: Range  # cuDNN, trtllm, single prefill: cached keys before the chunk


BOUNDS = {"cuda": Bounds(prefill=(17, 2048), output=(1, 128), joins=(1, 2), decode_batch=(1, 256),
                         decode_kv=(100, 2300), context_batch=(1, 8), context_q=(17, 2048), context_prefix=(0, 2048)),
          "cpu": Bounds(prefill=(17, 96), output=(1, 16), joins=(1, 2), decode_batch=(1, 8), decode_kv=(100, 300),
                        context_batch=(1, 4), context_q=(17, 96), context_prefix=(0, 96))}


@dataclass(frozen=True)
class Config:
    device: str
    steps: int
    warmup_steps: int
    layers: int
    max_batch: int
    hq: int
    hkv: int
    head_dim: int
    page: int
    dtype: torch.dtype
    bounds: Bounds
    check_steps: int
    tune_cache: Optional[str] = None  # --tune: ours' warm-up pass inside dispatch.autotune, kept in this file

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(dtype=str(self.dtype).replace("torch.", ""), bounds=asdict(self.bounds))
        return d


# -- the trace --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    id: int
    q_len: int
    kv_len: int  # keys it attends to, its own new tokens included
    pages: tuple[int, ...] = ()  # the pages that hold those keys, in order (paged traces)


@dataclass(frozen=True)
class Step:
    requests: tuple[Request, ...]

    @property
    def q_lens(self) -> list[int]:
        return [r.q_len for r in self.requests]

    @property
    def kv_lens(self) -> list[int]:
        return [r.kv_len for r in self.requests]

    def describe(self) -> dict:
        return {"requests": len(self.requests), "q_tokens": sum(self.q_lens), "kv_tokens": sum(self.kv_lens)}


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))


def pages_for(tokens: int, page: int) -> int:
    return -(-tokens // page)


@dataclass
class Live:
    """A request in the continuous batch: its prompt, output tokens to make and made, reserved pages."""
    id: int
    prompt: int
    out_len: int
    made: int
    pages: list[int]

    def row(self, page: int) -> Request:
        kv = self.prompt + self.made
        return Request(self.id, self.prompt if self.made == 0 else 1, kv, tuple(self.pages[:pages_for(kv, page)]))


def continuous(rng: random.Random, steps: int, b: Bounds, max_batch: int, page: int) -> list[Step]:
    """Continuous batching: requests join with a prefill chunk, decode a token a step, leave."""
    free = list(range(max_batch * pages_for(b.prefill[1] + b.output[1], page)))
    rng.shuffle(free)
    live: list[Live] = []
    trace, next_id = [], 0
    for _ in range(steps):
        done = [r for r in live if r.made >= r.out_len]
        if not done and len(live) >= max_batch:  # full and nobody finishes: a stop token ends one early
            done = [min(live, key=lambda r: r.out_len - r.made)]
        for r in done:
            live.remove(r)
            free.extend(r.pages)
        rng.shuffle(free)
        for _ in range(min(rng.randint(*b.joins), max_batch - len(live))):
            prompt, out_len = log_uniform(rng, *b.prefill), rng.randint(*b.output)
            need = pages_for(prompt + out_len - 1, page)
            live.append(Live(next_id, prompt, out_len, 0, [free.pop() for _ in range(need)]))
            next_id += 1
        trace.append(Step(tuple(r.row(page) for r in live)))
        for r in live:
            r.made += 1
    return trace


def fresh_batches(rng: random.Random, steps: int, draw_lens: Callable[[], list[tuple[int, int]]],
                  pool_pages: int, page: int) -> list[Step]:
    """Steps of independently drawn (q_len, kv_len) requests, pages drawn at random from the pool
    (none when pool_pages is 0); a step equal to the previous one in its lengths is drawn again."""
    trace: list[Step] = []
    while len(trace) < steps:
        lens = draw_lens()
        if trace and [(r.q_len, r.kv_len) for r in trace[-1].requests] == lens:
            continue
        ids = rng.sample(range(pool_pages), sum(pages_for(kv, page) for _, kv in lens)) if pool_pages else []
        reqs, at = [], 0
        for i, (q, kv) in enumerate(lens):
            n = pages_for(kv, page) if pool_pages else 0
            reqs.append(Request(i, q, kv, tuple(ids[at:at + n])))
            at += n
        trace.append(Step(tuple(reqs)))
    return trace


def decode_trace(rng: random.Random, steps: int, b: Bounds, page: int) -> list[Step]:
    def lens():
        return [(1, rng.randint(*b.decode_kv)) for _ in range(rng.randint(*b.decode_batch))]
    return fresh_batches(rng, steps, lens, b.decode_batch[1] * pages_for(b.decode_kv[1], page), page)


def context_lens(rng: random.Random, b: Bounds, batch: int) -> list[tuple[int, int]]:
    chunks = [log_uniform(rng, *b.context_q) for _ in range(batch)]
    return [(q, q + rng.randint(*b.context_prefix)) for q in chunks]


def context_trace(rng: random.Random, steps: int, b: Bounds, page: int) -> list[Step]:
    pool = b.context_batch[1] * pages_for(b.context_q[1] + b.context_prefix[1], page)
    return fresh_batches(rng, steps, lambda: context_lens(rng, b, rng.randint(*b.context_batch)), pool, page)


def single_trace(rng: random.Random, steps: int, b: Bounds, page: int) -> list[Step]:
    return fresh_batches(rng, steps, lambda: context_lens(rng, b, 1), 0, page)


def draw(kind: str, seed: int, phase: str, steps: int, cfg: Config) -> list[Step]:
    """The ``kind`` trace of one pass; a pass's draw depends on the seed, the kind and the phase only
    (the paged and ragged wrappers see the same continuous-batching trace)."""
    rng = random.Random(f"{seed}:{kind}:{phase}")
    if kind == "continuous":
        return continuous(rng, steps, cfg.bounds, cfg.max_batch, cfg.page)
    return {"decode": decode_trace, "context": context_trace, "single": single_trace}[kind](
        rng, steps, cfg.bounds, cfg.page)


# -- the tensors of a step ----------------------------------------------------------------------------
@dataclass
class Pools:
    """Random tensors the steps slice: queries, and per layer a page cache or packed K/V."""
    q: torch.Tensor
    caches: list[torch.Tensor] = field(default_factory=list)
    ks: list[torch.Tensor] = field(default_factory=list)
    vs: list[torch.Tensor] = field(default_factory=list)


def make_pools(steps: list[Step], paged: bool, cfg: Config, seed: int) -> Pools:
    """Pools large enough for every step of ``steps``."""
    gen = torch.Generator(device=cfg.device).manual_seed(seed % 2**63)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=cfg.device, dtype=cfg.dtype)
    pools = Pools(q=rand(max(sum(s.q_lens) for s in steps), cfg.hq, cfg.head_dim))
    if paged:
        pages = 1 + max(p for s in steps for r in s.requests for p in r.pages)
        pools.caches = [rand(pages, 2, cfg.page, cfg.hkv, cfg.head_dim) for _ in range(cfg.layers)]
    else:
        tokens = max(sum(s.kv_lens) for s in steps)
        pools.ks = [rand(tokens, cfg.hkv, cfg.head_dim) for _ in range(cfg.layers)]
        pools.vs = [rand(tokens, cfg.hkv, cfg.head_dim) for _ in range(cfg.layers)]
    return pools


def ints(values: list[int], device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def paged_inputs(step: Step, pools: Pools, cfg: Config) -> dict:
    """The paged wrapper's plan arguments (FlashInfer's page lists) and per-layer caches."""
    dev = cfg.device
    return dict(q=pools.q[:sum(step.q_lens)], qo=lab.indptr(step.q_lens, dev),
                kv_indptr=lab.indptr([len(r.pages) for r in step.requests], dev),
                indices=ints([p for r in step.requests for p in r.pages], dev),
                last=ints([(n - 1) % cfg.page + 1 for n in step.kv_lens], dev), caches=pools.caches)


def packed_inputs(step: Step, pools: Pools, cfg: Config) -> dict:
    """Packed K/V, request after request (ragged wrapper, single prefill)."""
    keys = sum(step.kv_lens)
    return dict(q=pools.q[:sum(step.q_lens)], qo=lab.indptr(step.q_lens, cfg.device),
                kv=lab.indptr(step.kv_lens, cfg.device),
                kvs=[(k[:keys], v[:keys]) for k, v in zip(pools.ks, pools.vs)])


def table_inputs(step: Step, pools: Pools, cfg: Config) -> dict:
    """A block table and lengths (xqa, cuDNN, trtllm); cuDNN's (pages, Hkv, P, D) views of the caches."""
    dev, b = cfg.device, len(step.requests)
    width = max(len(r.pages) for r in step.requests)
    table = ints([p for r in step.requests for p in r.pages + (0,) * (width - len(r.pages))], dev).view(b, width)
    qo, seq = lab.indptr(step.q_lens, dev), ints(step.kv_lens, dev)
    row = cfg.hq * cfg.head_dim
    return dict(q=pools.q[:sum(step.q_lens)], qo=qo, table=table, seq=seq, batch=b, max_q=max(step.q_lens),
                max_kv=max(step.kv_lens), kv_indptr=lab.indptr([len(r.pages) for r in step.requests], dev),
                caches=pools.caches, lens_q4=ints(step.q_lens, dev).view(b, 1, 1, 1), lens_kv4=seq.view(b, 1, 1, 1),
                offsets=qo * row, hnd=[(c[:, 0].transpose(1, 2), c[:, 1].transpose(1, 2)) for c in pools.caches],
                cudnn_table=_fixed_width(table, -(-(cfg.bounds.context_q[1] + cfg.bounds.context_prefix[1]) // cfg.page)))


def _fixed_width(table: torch.Tensor, width: int) -> torch.Tensor:
    """The block table ``width`` pages wide, as FlashInfer's cuDNN call needs it: ceil(max_sequence_kv /
    page_size), fixed by the engine (its columns past a request's pages are never read)."""
    if table.shape[1] >= width:
        return table[:, :width].contiguous()
    fixed = table.new_zeros(table.shape[0], width)
    fixed[:, : table.shape[1]] = table
    return fixed


def request_kv(step: Step, x: dict, b: int, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """Request b's keys and values (kv_len, Hkv, D) in the last layer, for the oracle."""
    r = step.requests[b]
    if "caches" in x:
        pages = x["caches"][-1][torch.tensor(r.pages, device=cfg.device, dtype=torch.long)]
        return tuple(pages[:, i].reshape(-1, cfg.hkv, cfg.head_dim)[:r.kv_len] for i in (0, 1))
    at = sum(step.kv_lens[:b])
    k, v = x["kvs"][-1]
    return k[at:at + r.kv_len], v[at:at + r.kv_len]


# -- the two sides' step functions ------------------------------------------------------------------
API_NAMES = ("BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
             "xqa_batch_decode_with_kv_cache", "cudnn_batch_prefill_with_kv_cache",
             "trtllm_batch_context_with_kv_cache", "single_prefill_with_kv_cache")


def ours_api() -> SimpleNamespace:
    import dispatch
    return SimpleNamespace(**{name: getattr(dispatch, name) for name in API_NAMES})


def flashinfer_api(device: str) -> tuple[Optional[SimpleNamespace], str]:
    """(FlashInfer's six callables, "") where it can run here, else (None, "not run: why")."""
    try:
        import flashinfer.decode
        import flashinfer.prefill
    except Exception as exc:  # an import failure is a result of the run
        return None, f"not run: flashinfer not importable ({type(exc).__name__}: {exc})"[:200]
    if device != "cuda":
        return None, "not run: FlashInfer runs on CUDA only"
    module = {name: flashinfer.prefill for name in API_NAMES}
    module["xqa_batch_decode_with_kv_cache"] = flashinfer.decode
    return SimpleNamespace(**{name: getattr(module[name], name) for name in API_NAMES}), ""


def per_layer(call: Callable[[Any], Any], operands: list, parts: dict, first: str = "first_call") -> Any:
    """``call`` on each layer's operand; ``parts[first]``: the first call's host ms. The last output."""
    t0 = time.perf_counter()
    out = call(operands[0])
    parts[first] = (time.perf_counter() - t0) * 1e3
    for operand in operands[1:]:
        out = call(operand)
    return out


def paged_side(api: SimpleNamespace, cfg: Config) -> Callable[[dict, dict], Any]:
    wrapper = api.BatchPrefillWithPagedKVCacheWrapper(lab.ws(cfg.device), "NHD")

    def step(x: dict, parts: dict) -> Any:
        t0 = time.perf_counter()
        wrapper.plan(x["qo"], x["kv_indptr"], x["indices"], x["last"], cfg.hq, cfg.hkv, cfg.head_dim, cfg.page,
                     causal=True, q_data_type=cfg.dtype, kv_data_type=cfg.dtype)
        parts["plan"] = (time.perf_counter() - t0) * 1e3
        return per_layer(lambda cache: wrapper.run(x["q"], cache), x["caches"], parts, "first_run")
    return step


def ragged_side(api: SimpleNamespace, cfg: Config) -> Callable[[dict, dict], Any]:
    wrapper = api.BatchPrefillWithRaggedKVCacheWrapper(lab.ws(cfg.device), "NHD")

    def step(x: dict, parts: dict) -> Any:
        t0 = time.perf_counter()
        wrapper.plan(x["qo"], x["kv"], cfg.hq, cfg.hkv, cfg.head_dim, causal=True, q_data_type=cfg.dtype,
                     kv_data_type=cfg.dtype)
        parts["plan"] = (time.perf_counter() - t0) * 1e3
        return per_layer(lambda kv: wrapper.run(x["q"], kv[0], kv[1]), x["kvs"], parts, "first_run")
    return step


def xqa_side(api: SimpleNamespace, cfg: Config) -> Callable[[dict, dict], Any]:
    ws, fn = lab.ws(cfg.device), api.xqa_batch_decode_with_kv_cache  # zeroed once, as XQA needs

    def step(x: dict, parts: dict) -> Any:
        return per_layer(lambda cache: fn(x["q"], cache, ws, x["table"], x["seq"], x["max_kv"], cfg.scale, 1.0),
                         x["caches"], parts)
    return step


def cudnn_side(api: SimpleNamespace, cfg: Config) -> Callable[[dict, dict], Any]:
    ws, fn, b = lab.ws(cfg.device), api.cudnn_batch_prefill_with_kv_cache, cfg.bounds
    maxima = dict(max_token_per_sequence=b.context_q[1], max_sequence_kv=b.context_q[1] + b.context_prefix[1])

    def step(x: dict, parts: dict) -> Any:
        lens = dict(actual_seq_lens_q=x["lens_q4"], actual_seq_lens_kv=x["lens_kv4"], block_tables=x["cudnn_table"],
                    batch_offsets_q=x["offsets"], batch_offsets_o=x["offsets"])
        return per_layer(lambda kv: fn(x["q"], kv[0], kv[1], cfg.scale, ws, **maxima, **lens, causal=True,
                                       return_lse=False)[0], x["hnd"], parts)
    return step


def trtllm_side(api: SimpleNamespace, cfg: Config) -> Callable[[dict, dict], Any]:
    ws, fn = lab.ws(cfg.device), api.trtllm_batch_context_with_kv_cache

    def step(x: dict, parts: dict) -> Any:
        return per_layer(lambda cache: fn(x["q"], cache, ws, x["table"], x["seq"], x["max_q"], x["max_kv"], cfg.scale,
                                          1.0, x["batch"], x["qo"], x["kv_indptr"], kv_layout="NHD"),
                         x["caches"], parts)
    return step


def single_side(api: SimpleNamespace, cfg: Config) -> Callable[[dict, dict], Any]:
    fn = api.single_prefill_with_kv_cache

    def step(x: dict, parts: dict) -> Any:
        return per_layer(lambda kv: fn(x["q"], kv[0], kv[1], causal=True), x["kvs"], parts)
    return step


@dataclass(frozen=True)
class EntrySpec:
    entry: str  # FlashInfer's name of the entry point
    trace: str  # continuous | decode | context | single
    paged: bool  # K/V in pages (else packed)
    inputs: Callable[[Step, Pools, Config], dict]
    side: Callable[[SimpleNamespace, Config], Callable[[dict, dict], Any]]


ENTRIES = {
    "paged": EntrySpec("BatchPrefillWithPagedKVCacheWrapper", "continuous", True, paged_inputs, paged_side),
    "ragged": EntrySpec("BatchPrefillWithRaggedKVCacheWrapper", "continuous", False, packed_inputs, ragged_side),
    "xqa": EntrySpec("xqa_batch_decode_with_kv_cache", "decode", True, table_inputs, xqa_side),
    "cudnn": EntrySpec("cudnn_batch_prefill_with_kv_cache", "context", True, table_inputs, cudnn_side),
    "trtllm": EntrySpec("trtllm_batch_context_with_kv_cache", "context", True, table_inputs, trtllm_side),
    "single": EntrySpec("single_prefill_with_kv_cache", "single", False, packed_inputs, single_side),
}


def flashinfer_entry_reason(name: str, device: str) -> str:
    """"" where FlashInfer's call of this entry can run here, else "not run: why"."""
    if device != "cuda":  # FlashInfer's side runs on CUDA only (flashinfer_api says so once)
        return ""
    if name == "trtllm":
        major, minor = torch.cuda.get_device_capability()
        if major != 10:
            return (f"not run: trtllm-gen kernels need Blackwell (compute capability 10.x); this GPU is "
                    f"sm_{major}{minor}")
    if name == "cudnn":
        try:
            importlib.import_module("cudnn")  # FlashInfer's cuDNN path needs the frontend
        except Exception as exc:
            return f"not run: cudnn frontend not importable ({type(exc).__name__}: {exc})"[:200]
    return ""


# -- timing ---------------------------------------------------------------------------------------------
PHASES = ("warm-up", "timed")


@dataclass
class Times:
    host: list[float] = field(default_factory=list)
    gpu: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Side:
    name: str  # ours | flashinfer
    step: Optional[Callable[[dict, dict], Any]]
    error: Optional[str] = None  # "not run: ...", or the failure that stopped it
    times: dict[str, Times] = field(default_factory=lambda: {p: Times() for p in PHASES})
    served: dict[str, int] = field(default_factory=dict)  # ours: timed steps per backend that served the last call


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:200]


def make_side(name: str, api: Optional[SimpleNamespace], reason: str, spec: EntrySpec, cfg: Config) -> Side:
    if api is None or reason:
        return Side(name, None, reason)
    try:
        return Side(name, spec.side(api, cfg))
    except Exception as exc:  # a vendor refusing at construction is a result
        return Side(name, None, f"not run: {one_line(exc)}")


class Collections:
    """The time Python's garbage collector ran (``gc.callbacks``), in ms: a full collection walks every
    object of the process, so a step it falls into can take hundreds of ms that no call of ours or
    FlashInfer's spent; ``parts["gc"]`` tells such a step from a slow call."""

    def __init__(self) -> None:
        self.ms, self._t0 = 0.0, None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.ms += (time.perf_counter() - self._t0) * 1e3
            self._t0 = None


COLLECTIONS = Collections()


def timed_step(fn: Callable[[dict, dict], Any], x: dict, cuda: bool) -> tuple[float, Optional[float], Any, dict]:
    """(host ms, GPU ms or None, output, parts) of one step; ``parts["gc"]``: the garbage collector's ms."""
    if COLLECTIONS not in gc.callbacks:
        gc.callbacks.append(COLLECTIONS)
    parts: dict = {}
    collected = COLLECTIONS.ms
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    out = fn(x, parts)
    host = (time.perf_counter() - t0) * 1e3
    parts["gc"] = COLLECTIONS.ms - collected
    if not cuda:
        return host, None, out, parts
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end), out, parts


def run_pass(steps: list[Step], build: Callable[[Step], dict], sides: list[Side], phase: str, cuda: bool,
             after: Optional[Callable[[int, Step, dict, dict], None]] = None) -> None:
    """Every step through every side that still runs (the sides alternate going first)."""
    for i, step in enumerate(steps):
        x = build(step)
        if cuda:
            torch.cuda.synchronize()
        outs = {}
        for side in sides if i % 2 == 0 else sides[::-1]:
            if side.step is None or side.error:
                continue
            try:
                host, gpu, outs[side.name], parts = timed_step(side.step, x, cuda)
            except Exception as exc:  # a failing call is a result to report, the run goes on
                side.error = f"not run: failed at {phase} step {i}: {one_line(exc)}"
                print(f"  {side.name}: {side.error}", file=sys.stderr, flush=True)
                continue
            t = side.times[phase]
            if side.name == "ours" and phase == "timed":
                served = last_decision()
                name = (served.ran or served.chosen) if served is not None else "unknown"
                side.served[name] = side.served.get(name, 0) + 1
            t.host.append(host)
            if gpu is not None:
                t.gpu.append(gpu)
            for part, ms in parts.items():
                t.parts.setdefault(part, []).append(ms)
        if after is not None:
            after(i, step, x, outs)


# -- the check ----------------------------------------------------------------------------------------
ROWS_CHECKED = 8  # the last rows of each request checked (bottom-right alignment: the same rows of the full answer)


def checked_requests(step: Step) -> list[int]:
    """The first, the last and the longest-chunk request of the step."""
    longest = max(range(len(step.requests)), key=lambda b: step.requests[b].q_len)
    return sorted({0, len(step.requests) - 1, longest})


def check(i: int, step: Step, x: dict, outs: dict, cfg: Config) -> Optional[dict]:
    """Our last-layer output against the fp64 oracle on sampled rows, and against FlashInfer's."""
    ours = outs.get("ours")
    if ours is None:
        return None
    ends = lab.indptr(step.q_lens).tolist()[1:]
    got, want = [], []
    for b in checked_requests(step):
        n = min(ROWS_CHECKED, step.requests[b].q_len)
        k, v = request_kv(step, x, b, cfg)
        rows = slice(ends[b] - n, ends[b])
        want.append(attention_fp64(x["q"][rows], k, v, sm_scale=cfg.scale, causal=True)[0])
        got.append(ours[rows])
    dtype = str(cfg.dtype).replace("torch.", "")
    err, tol = relative_error(torch.cat(got), torch.cat(want)), band(dtype, dtype)
    finite = bool(torch.isfinite(ours).all())
    result = {"step": i, "rows": sum(g.shape[0] for g in got), "finite": finite, "rel_err_vs_fp64": err,
              "band": tol, "ok": finite and err <= tol}
    if "flashinfer" in outs:
        result["rel_err_vs_flashinfer"] = relative_error(ours, outs["flashinfer"])
    return result


def check_steps(steps: int, n: int) -> set[int]:
    """n steps spread over the pass, the first and the last among them."""
    if n <= 0:
        return set()
    return {round(j * (steps - 1) / max(1, n - 1)) for j in range(n)} if n > 1 else {0}


# -- one entry ------------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1])."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def summary(values: list[float]) -> Optional[dict]:
    if not values:
        return None
    return {"p50": round(percentile(values, 0.5), 4), "p99": round(percentile(values, 0.99), 4),
            "max": round(max(values), 4), "mean": round(sum(values) / len(values), 4)}


def side_result(side: Side) -> dict:
    """A side's figures, or why it did not run."""
    timed, warm = side.times["timed"], side.times["warm-up"]
    if not timed.host:
        return {"not_run": side.error or "not run"}
    first = (warm.host or timed.host)[0]
    return {"steps": len(timed.host), "host_ms": summary(timed.host), "gpu_ms": summary(timed.gpu),
            "parts_ms": {part: summary(ms) for part, ms in timed.parts.items()},
            "first_step_host_ms": round(first, 4), "warmup_host_ms": summary(warm.host), "error": side.error,
            "served_by": dict(side.served),
            "per_step_host_ms": [round(t, 4) for t in timed.host],
            "per_step_gpu_ms": [round(t, 4) for t in timed.gpu]}


SLACK_MS = 1.0  # a step is flagged when our host time exceeds FlashInfer's worst step by more than this


def over_flashinfer(ours: Side, fi: Side, steps: list[Step]) -> Optional[list[dict]]:
    """The timed steps whose host time exceeds FlashInfer's worst + SLACK_MS (None without FlashInfer)."""
    theirs = fi.times["timed"].host
    if not theirs:
        return None
    worst = max(theirs)
    return [{"step": i, "host_ms": round(t, 4), **steps[i].describe()}
            for i, t in enumerate(ours.times["timed"].host) if t > worst + SLACK_MS]


def settle_heap() -> None:
    """What an engine does after its warm-up (SGLang's ``freeze_gc``, vLLM's ``freeze_gc_heap``): collect
    once, then move every object alive into the collector's permanent generation, so a full collection
    in the timed pass walks only what the steps allocate, not the libraries' and the warm-up's heap
    (one full collection of it took 146 ms inside a step on the GPU). Both sides share the process."""
    gc.collect()
    gc.freeze()


def run_entry(name: str, cfg: Config, seed: int, fi: tuple[Optional[SimpleNamespace], str]) -> dict:
    """Warm-up pass, timed pass and checks of one entry point, ours beside FlashInfer's."""
    spec = ENTRIES[name]
    warm = draw(spec.trace, seed, "warm-up", cfg.warmup_steps, cfg)
    timed = draw(spec.trace, seed, "timed", cfg.steps, cfg)
    pools = make_pools(warm + timed, spec.paged, cfg, seed)
    fi_api, fi_reason = fi
    if fi_api is not None:
        fi_reason = flashinfer_entry_reason(name, cfg.device)
    sides = [make_side("ours", ours_api(), "", spec, cfg), make_side("flashinfer", fi_api, fi_reason, spec, cfg)]
    cuda = cfg.device == "cuda"
    build = lambda step: spec.inputs(step, pools, cfg)  # noqa: E731
    with autotune.autotune(True, cache=cfg.tune_cache) if cfg.tune_cache else contextlib.nullcontext():
        run_pass(warm, build, sides, "warm-up", cuda)
    settle_heap()
    checks, at = [], check_steps(cfg.steps, cfg.check_steps)

    def after(i: int, step: Step, x: dict, outs: dict) -> None:
        if i in at and (result := check(i, step, x, outs, cfg)) is not None:
            checks.append(result)
    run_pass(timed, build, sides, "timed", cuda, after)
    gc.unfreeze()  # the process as it was for the next entry (or the caller that ran the trace)
    pools = build = None  # the K/V pools go before the next entry draws its own
    if cuda:
        torch.cuda.empty_cache()
    shapes = [s.describe() for s in timed]
    return {"entry": spec.entry, "trace": spec.trace, "steps": cfg.steps, "warmup_steps": cfg.warmup_steps,
            "layers": cfg.layers, "ours": side_result(sides[0]), "flashinfer": side_result(sides[1]),
            "over_flashinfer_worst_plus_1ms": over_flashinfer(sides[0], sides[1], timed), "checks": checks,
            "batch": {key: summary([float(s[key]) for s in shapes]) for key in shapes[0]}, "per_step": shapes}


def checks_text(checks: list[dict]) -> str:
    """The checks' relative errors in one line."""
    if not checks:
        return "no check (our side did not run)"
    text = "relative error vs fp64 " + ", ".join(f"{c['rel_err_vs_fp64']:.1e}" for c in checks)
    text += f" (band {checks[0]['band']:g})"
    if "rel_err_vs_flashinfer" in checks[0]:
        text += "; vs FlashInfer " + ", ".join(f"{c.get('rel_err_vs_flashinfer', math.nan):.1e}" for c in checks)
    return text + (": ok" if all(c["ok"] for c in checks) else ": FAIL")


def entry_ok(result: dict) -> bool:
    """Our side ran every step and every check passed."""
    ours = result["ours"]
    return "not_run" not in ours and not ours["error"] and all(c["ok"] for c in result["checks"])


# -- outputs ------------------------------------------------------------------------------------------------
def distribution(cfg: Config) -> list[str]:
    """The trace's distribution, in words, at this run's bounds."""
    b, r = cfg.bounds, lambda lo_hi: f"{lo_hi[0]}-{lo_hi[1]}"
    return [f"continuous batching (paged, ragged): prefill chunk {r(b.prefill)} tokens (log-uniform), "
            f"{r(b.output)} output tokens, {r(b.joins)} requests join a step while the batch is under "
            f"{cfg.max_batch}; when it is full and none finishes, the one closest to its end leaves; pages of "
            f"{cfg.page} from a free list kept shuffled",
            f"xqa decode: {r(b.decode_batch)} requests, {r(b.decode_kv)} keys each, pages drawn at random",
            f"context (cudnn, trtllm): {r(b.context_batch)} requests, chunk {r(b.context_q)} tokens (log-uniform) "
            f"over a prefix of {r(b.context_prefix)} keys, causal; cuDNN's maxima fixed at {b.context_q[1]} / "
            f"{b.context_q[1] + b.context_prefix[1]}, trtllm's the step's",
            f"single prefill: chunk {r(b.context_q)} tokens (log-uniform) over a prefix of {r(b.context_prefix)} "
            f"keys, causal",
            "uniform draws unless said; a step whose lengths equal the previous step's is drawn again"]


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def _count(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def _fig(side: dict, key: str, q: str) -> str:
    return _ms((side.get(key) or {}).get(q)) if "not_run" not in side else "-"


def summary_row(name: str, r: dict) -> str:
    ours, fi = r["ours"], r["flashinfer"]
    cells = [_fig(s, "host_ms", q) for q in ("p50", "p99", "max") for s in (ours, fi)]
    cells += [_fig(s, "gpu_ms", "p50") for s in (ours, fi)]
    over = r["over_flashinfer_worst_plus_1ms"]
    checks = "ok" if r["checks"] and all(c["ok"] for c in r["checks"]) else ("-" if not r["checks"] else "FAIL")
    return f"| {name} | " + " | ".join(cells) + f" | {'-' if over is None else len(over)} | {checks} |"


def side_lines(side_name: str, side: dict) -> list[str]:
    if "not_run" in side:
        return [f"- {side_name}: {side['not_run']}"]
    parts = "; ".join(f"{p} p50 {_ms(s['p50'])} / p99 {_ms(s['p99'])} / max {_ms(s['max'])}"
                      for p, s in side["parts_ms"].items())
    warm = side["warmup_host_ms"]
    line = (f"- {side_name}: first step {_ms(side['first_step_host_ms'])} ms host"
            + (f", warm-up pass p50 {_ms(warm['p50'])} / max {_ms(warm['max'])}" if warm else "")
            + (f"; {parts} (ms)" if parts else "")
            + (f"; served by {', '.join(f'{b} ({n} steps)' for b, n in side['served_by'].items())}"
               if side.get("served_by") else ""))
    return [line] + ([f"- {side_name} stopped: {side['error']}"] if side["error"] else [])


def entry_section(name: str, r: dict) -> list[str]:
    b = r["batch"]
    lines = [f"## {name}: `{r['entry']}` ({r['trace']} trace)", "",
             f"{r['steps']} timed steps after {r['warmup_steps']} warm-up steps, {r['layers']} layers; per step "
             f"requests p50 {_count(b['requests']['p50'])} (max {_count(b['requests']['max'])}), query tokens p50 "
             f"{_count(b['q_tokens']['p50'])} (max {_count(b['q_tokens']['max'])}), keys p50 "
             f"{_count(b['kv_tokens']['p50'])} (max {_count(b['kv_tokens']['max'])}).", "",
             "| side | host p50 ms | host p99 ms | host max ms | GPU p50 ms | GPU p99 ms |", "|---" * 6 + "|"]
    for side in ("ours", "flashinfer"):
        s = r[side]
        lines.append(f"| {side} | " + " | ".join([_fig(s, "host_ms", q) for q in ("p50", "p99", "max")]
                                                  + [_fig(s, "gpu_ms", q) for q in ("p50", "p99")]) + " |")
    lines += [""] + side_lines("ours", r["ours"]) + side_lines("flashinfer", r["flashinfer"])
    over = r["over_flashinfer_worst_plus_1ms"]
    if over is not None:
        shown = ", ".join(f"{o['step']} ({_ms(o['host_ms'])} ms, {o['requests']} requests)" for o in over[:8])
        lines.append(f"- steps over FlashInfer's worst + {SLACK_MS:g} ms: {len(over)}"
                     + (f": {shown}" if over else ""))
    for c in r["checks"]:
        vs_fi = f"; vs FlashInfer {c['rel_err_vs_flashinfer']:.2e}" if "rel_err_vs_flashinfer" in c else ""
        lines.append(f"- check, step {c['step']}: {c['rows']} rows vs fp64, relative error "
                     f"{c['rel_err_vs_fp64']:.2e} (band {c['band']:g}){vs_fi}, finite {c['finite']}: "
                     + ("ok" if c["ok"] else "FAIL"))
    return lines + [""]


def markdown(rep: dict) -> str:
    env, cfg = rep["environment"], rep["config"]
    where = env.get("gpu") or env.get("cpu")
    lines = ["# Trace benchmark: every step a new batch, ours against FlashInfer's own calls", "",
             f"{rep['device']} ({where}); torch {env['torch']}, flashinfer {env['flashinfer']}, attn-dispatch "
             f"{env['attn-dispatch']}; {env['date']}", "",
             f"Seed {rep['seed']} ({rep['seed_source']}); again: `{rep['again']}`", "",
             f"{cfg['hq']}/{cfg['hkv']} heads, head dim {cfg['head_dim']}, {cfg['dtype']}, pages of {cfg['page']}; "
             f"{cfg['steps']} timed steps per entry after a warm-up pass of {cfg['warmup_steps']} steps over a "
             f"separate draw; {cfg['layers']} layers a step."
             + (" Ours tuned in the warm-up pass (dispatch.autotune: each new bucket timed its leading candidates "
                "there); the timed pass only looked up." if cfg.get("tune_cache") else ""), "", "## The trace", ""]
    lines += [f"- {line}" for line in rep["distribution"]]
    lines += ["", "## Host time per step (ms): ours against FlashInfer's", "", rep["method"], "",
              "| entry | host p50 ours | FlashInfer | host p99 ours | FlashInfer | host max ours | FlashInfer "
              "| GPU p50 ours | FlashInfer | steps over FI worst + 1 ms | check |", "|---" * 11 + "|"]
    lines += [summary_row(name, r) for name, r in rep["entries"].items()] + [""]
    for name, r in rep["entries"].items():
        lines += entry_section(name, r)
    return "\n".join(lines)


METHOD = ("Host time: time.perf_counter around the step's Python calls (plan once and run per layer, or the "
          "function once per layer), no synchronize inside the step. GPU time: CUDA events around the step, then a "
          "synchronize (on the CPU: none). The sides take turns on every step, the first alternating. p50 / p99 / "
          "max over the timed steps (nearest rank).")


def plot(rep: dict, path: Path) -> Optional[Path]:
    """Host time per step, ours and FlashInfer's, one panel per entry (None without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = list(rep["entries"])
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.6 * len(names)), squeeze=False, constrained_layout=True)
    for ax, name in zip(axes[:, 0], names):
        for side, style in (("ours", "-"), ("flashinfer", "--")):
            ms = rep["entries"][name][side].get("per_step_host_ms")
            if ms:
                ax.plot(range(len(ms)), ms, style, label=side, linewidth=0.9)
        ax.set_yscale("log")
        ax.set_title(f"{name}: {rep['entries'][name]['entry']}", fontsize=9)
        ax.set_ylabel("host ms / step")
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("step")
    where = rep["environment"].get("gpu") or "CPU"
    fig.suptitle(f"trace, {rep['device']} ({where}), seed {rep['seed']}", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(rep: dict, out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / f"{stem}.json", out / f"{stem}.md"
    js.write_text(json.dumps(rep, indent=1) + "\n")
    md.write_text(markdown(rep) + "\n")
    png = plot(rep, out / f"{stem}.png") if rep["entries"] else None
    return [js, md] + ([png] if png else [])


# -- command line -----------------------------------------------------------------------------------------
DEFAULTS = {"cuda": dict(steps=300, max_batch=64, heads="32/8", head_dim=128, dtype="bfloat16"),
            "cpu": dict(steps=20, max_batch=8, heads="4/2", head_dim=32, dtype="float32")}
USAGE = ("attn-dispatch bench --trace [--steps N] [--warmup-steps N] [--layers L] [--entries NAME ...] [--seed S]\n"
         "                                   [--out DIR] [--device {cpu,cuda}] [--max-batch B] [--heads HQ/HKV]\n"
         "                                   [--head-dim D] [--page-size P] [--dtype DTYPE] [--check-steps N]\n"
         "                                   [--tune] [--first-call]")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-dispatch bench --trace", usage=USAGE,
                                description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, help="timed steps per entry (default: 300 on CUDA, 20 on the CPU)")
    p.add_argument("--warmup-steps", type=int, metavar="N",
                   help="steps of the warm-up pass, over a separate draw of the trace (default: --steps)")
    p.add_argument("--layers", type=int, default=4, help="run() (or calls) per step (default 4)")
    p.add_argument("--entries", nargs="+", default=list(ENTRIES), metavar="NAME",
                   help="entry points, by short name: " + ", ".join(f"{k} ({v.entry})" for k, v in ENTRIES.items()))
    p.add_argument("--seed", type=int, help="the trace's seed (default: drawn from os.urandom now; recorded)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")), metavar="DIR",
                   help="output folder (default $OUT or .)")
    p.add_argument("--max-batch", type=int, metavar="B",
                   help="continuous batching's cap (default: 64 on CUDA, 8 on the CPU)")
    p.add_argument("--heads", metavar="HQ/HKV", help="query/KV heads (default: 32/8 on CUDA, 4/2 on the CPU)")
    p.add_argument("--head-dim", type=int, metavar="D", help="default: 128 on CUDA, 32 on the CPU")
    p.add_argument("--page-size", type=int, default=16, metavar="P", help="tokens per page (default 16)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                   help="default: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--check-steps", type=int, default=3, metavar="N",
                   help="timed steps whose output is checked against the fp64 oracle (default 3)")
    p.add_argument("--tune", action="store_true",
                   help="ours' warm-up pass inside dispatch.autotune(True, cache=DIR/trace-...-autotune.json), as "
                        "an engine that tunes in its warm-up: each new bucket times its leading candidates there; "
                        "the timed pass only looks up")
    p.add_argument("--first-call", action="store_true",
                   help="instead of the trace: each side's first call of each entry in a fresh process, compiles "
                        "excluded on both sides (dispatch/benchmark/first_call.py)")
    return p


def positive(p: argparse.ArgumentParser, option: str, value: int, least: int = 1) -> int:
    if value < least:
        p.error(f"{option} {value}: allowed an integer >= {least}")
    return value


def heads(p: argparse.ArgumentParser, text: str) -> tuple[int, int]:
    try:
        hq, hkv = (int(part) for part in text.split("/"))
    except ValueError:
        p.error(f"--heads {text!r}: allowed HQ/HKV, two integers, e.g. 32/8")
    if hkv < 1 or hq < hkv or hq % hkv:
        p.error(f"--heads {text}: allowed HQ/HKV with HKV >= 1 and HQ a multiple of HKV")
    return hq, hkv


def config(p: argparse.ArgumentParser, args: argparse.Namespace) -> Config:
    dflt = DEFAULTS[args.device]
    steps = positive(p, "--steps", dflt["steps"] if args.steps is None else args.steps)
    hq, hkv = heads(p, args.heads or dflt["heads"])
    unknown = [e for e in args.entries if e not in ENTRIES]
    if unknown:
        p.error(f"--entries {' '.join(unknown)}: allowed {', '.join(ENTRIES)}")
    given = lambda value, default: default if value is None else value  # noqa: E731
    return Config(device=args.device, steps=steps,
                  warmup_steps=positive(p, "--warmup-steps", given(args.warmup_steps, steps), 0),
                  layers=positive(p, "--layers", args.layers),
                  max_batch=positive(p, "--max-batch", given(args.max_batch, dflt["max_batch"])), hq=hq, hkv=hkv,
                  head_dim=positive(p, "--head-dim", given(args.head_dim, dflt["head_dim"])),
                  page=positive(p, "--page-size", args.page_size), dtype=getattr(torch, args.dtype or dflt["dtype"]),
                  bounds=BOUNDS[args.device], check_steps=positive(p, "--check-steps", args.check_steps, 0))


def again(cfg: Config, seed: int, entries: list[str]) -> str:
    return (f"attn-dispatch bench --trace --device {cfg.device} --seed {seed} --steps {cfg.steps} --warmup-steps "
            f"{cfg.warmup_steps} --layers {cfg.layers} --max-batch {cfg.max_batch} --heads {cfg.hq}/{cfg.hkv} "
            f"--head-dim {cfg.head_dim} --page-size {cfg.page} --dtype {str(cfg.dtype).replace('torch.', '')} "
            f"--entries {' '.join(entries)}" + (" --tune" if cfg.tune_cache else ""))


def start(argv: Optional[list[str]]) -> tuple:
    """(parser, args, config, seed, report head) of a run: the trace's, or the first calls' (first_call.py)."""
    from .report import environment
    from .randomgrid import new_seed

    p = parser()
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (use --device cpu)")
    cfg = config(p, args)
    seed = args.seed if args.seed is not None else new_seed()
    print(f"trace: seed {seed} ({'given' if args.seed is not None else 'drawn at run time'}), {cfg.steps} steps, "
          f"entries {' '.join(args.entries)}", file=sys.stderr, flush=True)
    rep = {"benchmark": "trace", "device": cfg.device, "seed": seed,
           "seed_source": "given" if args.seed is not None else "drawn at run time from os.urandom",
           "again": again(cfg, seed, args.entries), "environment": environment(cfg.device), "config": cfg.to_json(),
           "distribution": distribution(cfg), "method": METHOD, "entries": {}}
    return p, args, cfg, seed, rep


def main(argv: Optional[list[str]] = None) -> int:
    p, args, cfg, seed, rep = start(argv)
    if args.first_call:
        p.error("--first-call: run it as attn-dispatch bench --trace --first-call")
    stem, fi = f"trace-{cfg.device}-seed-{seed}" + ("-tuned" if args.tune else ""), flashinfer_api(cfg.device)
    if args.tune:
        cfg = replace(cfg, tune_cache=str(args.out / f"{stem}-autotune.json"))
        rep["config"] = cfg.to_json()
        rep["again"] = again(cfg, seed, args.entries)
    for name in args.entries:
        t0 = time.perf_counter()
        rep["entries"][name] = r = run_entry(name, cfg, seed, fi)
        print(f"  {name}: {time.perf_counter() - t0:.1f} s; {checks_text(r['checks'])}", file=sys.stderr, flush=True)
        paths = write(rep, args.out, stem)  # after each entry: a run cut short keeps what it measured
    rep["ok"] = all(entry_ok(r) for r in rep["entries"].values())
    paths = write(rep, args.out, stem)
    md = markdown(rep)
    print(md[md.index("## Host time"):].split("\n\n## ")[0])
    print("outputs:\n" + "\n".join(f"  {path}" for path in paths))
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
