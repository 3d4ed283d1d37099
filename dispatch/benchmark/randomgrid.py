"""Random bench problems: ``attn-dispatch bench --random N [--seed S]``.

The seed: ``--seed S``, or drawn from ``os.urandom`` at the time of the run (``new_seed``);
bench prints it and records it in the JSON and the Markdown, so a committed run's seed was
drawn when it ran, not picked, and ``--random N --seed S`` draws the same N problems again
(``--start`` resumes them).

The distribution (engine-shaped; each problem drawn independently from ``random.Random(seed)``):

* entry point: uniform over the seven (single, single_lse, cudnn, trtllm, xqa, paged, ragged);
* batch: log-uniform integer in [1, 256] (single prefill: 1);
* q_len: 1 (decode) with probability 0.4 on the batch entries, 0.2 on single prefill, always on
  xqa; else log-uniform
  in [2, 16384]; kv_len: log-uniform in [16, 131072], at least q_len;
* heads: kv heads uniform in {1, 2, 4, 8}, GQA group uniform in {1, 2, 4, 8} (q heads = product);
  head dim uniform in {64, 128, 256}; dtype bf16 (fp16 with probability 0.2);
* paged caches: page size in {1, 2, 4, 8, 16, 32, 64} (16 with probability 0.4, the rest
  uniform), layout HND with probability 0.3, a (K, V) pair of tensors with probability 0.3;
  single prefill HND with probability 0.3;
* features, each drawn only where the entry's FlashInfer signature can say it
  (problems.check_entry): causal 0.6 (prefill), sliding window 0.15 (window_left log-uniform in
  [16, kv_len / 2]), soft cap 0.1 (30), sinks 0.15, fp8 e4m3 KV 0.15, LSE 0.3, a random custom
  mask 0.1 (with neither causal nor window: a custom mask replaces them).

Caps per problem (``CAPS``; a drawn problem over a cap is shrunk, never redrawn, so the
distribution of entries and features is kept): halve the batch, then kv_len (q_len with it
when it would exceed kv_len), then q_len, until one K/V operand holds at most ``kv_bytes``,
q and out at most ``q_bytes``, the FLOPs of one call (4 * q heads * head dim * batch * q * kv)
at most ``flops`` and a custom mask at most ``mask_elems`` booleans. GPU: 4 GiB of K/V, 1 GiB of
q, 2e13 FLOPs (about 40 ms at 500 TFLOP/s, so each backend's timing stays well under a second),
64 M mask elements. ``--device cpu`` scales every size down so that CI runs ``bench --random 6
--device cpu`` in well under a minute: batch <= 4, q_len <= 24, kv_len in [8, 96], kv heads in
{1, 2}, group in {1, 2, 4}, head dim in {16, 32}, pages of 1-16, float32 (the CPU's backends:
the reference and native-triton under Triton's interpreter).

Problems are then ordered by the JIT modules they need (entry, dtypes, head dim, window / soft
cap on or off), as the h100 grid is, so a GPU sweep compiles each module once.
"""
from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, replace

from .problems import CUDNN, ENTRY_NAMES, PAGED, RAGGED, SINGLE, SINGLE_LSE, TRTLLM, XQA, BenchProblem, check_entry


@dataclass(frozen=True)
class Caps:
    kv_bytes: float
    q_bytes: float
    flops: float
    mask_elems: float


CAPS = {"cuda": Caps(kv_bytes=4 * 2**30, q_bytes=2**30, flops=2e13, mask_elems=64e6),
        "cpu": Caps(kv_bytes=2**20, q_bytes=2**20, flops=2e8, mask_elems=2e4)}


@dataclass(frozen=True)
class Ranges:
    batch: int
    q: int
    kv: tuple
    kv_heads: tuple
    groups: tuple
    head_dims: tuple
    pages: tuple
    dtypes: tuple  # (dtype, probability of the second)


RANGES = {"cuda": Ranges(batch=256, q=16384, kv=(16, 131072), kv_heads=(1, 2, 4, 8), groups=(1, 2, 4, 8),
                         head_dims=(64, 128, 256), pages=(1, 2, 4, 8, 16, 32, 64), dtypes=("bfloat16", "float16")),
          "cpu": Ranges(batch=4, q=24, kv=(8, 96), kv_heads=(1, 2), groups=(1, 2, 4), head_dims=(16, 32),
                        pages=(1, 2, 4, 8, 16), dtypes=("float32", "float32"))}
BATCH_ENTRIES = (CUDNN, TRTLLM, PAGED, RAGGED)
FEATURES = (("causal", 0.6), ("window", 0.15), ("soft_cap", 0.1), ("sinks", 0.15), ("fp8_kv", 0.15), ("lse", 0.3),
            ("custom_mask", 0.1))


def new_seed() -> int:
    """A seed drawn at run time (os.urandom), for a run without ``--seed``."""
    return int.from_bytes(os.urandom(4), "little")


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))))


def _shape(rng: random.Random, entry: str, r: Ranges) -> dict:
    batch = 1 if entry in (SINGLE, SINGLE_LSE) else _log_uniform(rng, 1, r.batch)
    decode = rng.random() < (1.0 if entry == XQA else 0.4 if entry in BATCH_ENTRIES else 0.2)
    q = 1 if decode else _log_uniform(rng, 2, r.q)
    kv = max(q, _log_uniform(rng, *r.kv))
    hkv, group = rng.choice(r.kv_heads), rng.choice(r.groups)
    page = 16 if 16 in r.pages and rng.random() < 0.4 else rng.choice([n for n in r.pages if n != 16])
    return dict(entry=entry, batch=batch, q_len=q, kv_len=kv, num_qo_heads=hkv * group, num_kv_heads=hkv,
                head_dim=rng.choice(r.head_dims), dtype=r.dtypes[rng.random() < 0.2], page_size=page,
                kv_layout="HND" if rng.random() < 0.3 else "NHD", kv_pair=rng.random() < 0.3)


def _feature(name: str, shape: dict, rng: random.Random) -> dict:
    kv = shape["kv_len"]
    return {"causal": {"causal": True},
            "window": {"window_left": _log_uniform(rng, 1, max(1, kv // 2)) if kv < 32 else
                       _log_uniform(rng, 16, max(16, kv // 2))},
            "soft_cap": {"soft_cap": 30.0}, "sinks": {"sinks": True}, "fp8_kv": {"kv_dtype": "float8_e4m3fn"},
            "lse": {"lse": True}, "custom_mask": {"custom_mask": True, "causal": False, "window_left": -1}}[name]


def draw_one(rng: random.Random, device: str) -> BenchProblem:
    """One problem of the distribution (module doc), capped for ``device``."""
    entry = rng.choice(ENTRY_NAMES)
    fields = _shape(rng, entry, RANGES[device])
    form = {name: fields.pop(name) for name in ("kv_layout", "kv_pair")}
    p = BenchProblem(**fields)
    for name, value in form.items():
        p = _fit(p, name, value)
    for name, chance in FEATURES:
        if rng.random() < chance:
            feat = _feature(name, fields, rng)
            p = _fit_all(p, feat)
    return cap(p, CAPS[device])


def _fit(p: BenchProblem, name: str, value) -> BenchProblem:
    """``p`` with ``name = value`` where the entry can say it, else unchanged."""
    return _fit_all(p, {name: value})


def _fit_all(p: BenchProblem, changes: dict) -> BenchProblem:
    q = replace(p, **changes)
    return q if check_entry(q) is None else p


def _over(p: BenchProblem, c: Caps) -> bool:
    kv_elem = 1 if p.kv_type.startswith("float8") else (4 if p.kv_type == "float32" else 2)
    q_elem = 4 if p.dtype == "float32" else 2
    kv_bytes = 2 * p.batch * p.kv_len * p.num_kv_heads * p.head_dim * kv_elem
    q_bytes = 2 * p.batch * p.q_len * p.num_qo_heads * p.head_dim * q_elem  # q and out
    flops = 4.0 * p.num_qo_heads * p.head_dim * p.batch * p.q_len * p.kv_len
    mask = p.batch * p.q_len * p.kv_len if p.custom_mask else 0
    return kv_bytes > c.kv_bytes or q_bytes > c.q_bytes or flops > c.flops or mask > c.mask_elems


def cap(p: BenchProblem, c: Caps) -> BenchProblem:
    """Shrink ``p`` under the caps: halve batch, then kv_len (q_len with it), then q_len."""
    while _over(p, c):
        if p.batch > 1:
            p = replace(p, batch=p.batch // 2)
        elif p.kv_len > 16:
            kv = p.kv_len // 2
            window = p.window_left if p.window_left < kv else kv // 2
            p = replace(p, kv_len=kv, q_len=min(p.q_len, kv), window_left=window)
        elif p.q_len > 1 and p.entry != XQA:
            p = replace(p, q_len=max(1 if p.entry in BATCH_ENTRIES else 2, p.q_len // 2))
        else:
            break
    return p


def _module_key(p: BenchProblem) -> tuple:
    return (p.entry, p.dtype, p.kv_type, p.head_dim, p.window_left >= 0, p.soft_cap > 0)


def draw(n: int, seed: int, device: str) -> list[BenchProblem]:
    """``n`` problems of the distribution for ``device`` ("cuda" or "cpu"), ordered by JIT module."""
    if device not in RANGES:
        raise ValueError(f"device={device!r}: allowed 'cuda' or 'cpu'")
    rng = random.Random(seed)
    drawn = [draw_one(rng, device) for _ in range(n)]
    order = sorted(range(n), key=lambda i: (_module_key(drawn[i]), i))
    return [drawn[i] for i in order]


DISTRIBUTION = __doc__.split("The distribution", 1)[1].split("\n\nProblems are then", 1)[0].strip()
