"""Named grids of bench problems.

* ``quick``: tiny problems on every entry point, for the CPU (reference, and native-triton under
  Triton's interpreter) and CI: seconds.
* ``h100``: >= 60 problems on every entry point for one H100 within ~9 minutes, FlashInfer's
  JIT compiles included. FlashInfer compiles one module per (entry kind, dtypes, head dim,
  window / soft cap on or off): fa3 takes ~70 s a module, fa2 ~20 s, XQA ~6 s. So the grid keeps
  fa3 to head dim 128 without window or soft cap (two modules: single and batch); the other
  variants (head dims 64 / 256, window, soft cap, fp8 KV) force every backend but fa3 (auto
  still runs; were it fa3, that compile is paid once). Problems are ordered by those module
  keys so each compile is shared by every problem that needs it.
"""
from __future__ import annotations

from dataclasses import replace

from .problems import CUDNN, PAGED, RAGGED, SINGLE, SINGLE_LSE, TRTLLM, XQA, BenchProblem

NOT_FA3 = ("cudnn", "trtllm-gen", "xqa", "fa2", "torch-flash", "native-triton")


def quick() -> list[BenchProblem]:
    base = dict(num_qo_heads=4, num_kv_heads=2, head_dim=32, dtype="float32", page_size=8)
    grid = [
        BenchProblem(SINGLE, 1, 24, 40, causal=True, **base),
        BenchProblem(SINGLE_LSE, 1, 1, 48, **base),
        BenchProblem(CUDNN, 2, 16, 32, causal=True, lse=True, **base),
        BenchProblem(TRTLLM, 2, 8, 40, causal=True, sinks=True, **base),
        BenchProblem(XQA, 3, 1, 64, window_left=15, **base),
        BenchProblem(XQA, 2, 1, 16, **base),
        BenchProblem(PAGED, 2, 1, 64, soft_cap=20.0, **base),
        BenchProblem(PAGED, 2, 16, 48, causal=True, lse=True, **base),
        BenchProblem(RAGGED, 2, 16, 16, causal=True, **base),
        BenchProblem(RAGGED, 1, 8, 32, window_left=7, **base),
    ]
    return grid


def _decode(entry: str, batch: int, kv: int, **kw) -> BenchProblem:
    return BenchProblem(entry, batch, 1, kv, **kw)


def h100() -> list[BenchProblem]:
    """>= 60 problems, bf16, page 16, 32 q heads, ordered so JIT modules are shared."""
    g: list[BenchProblem] = []
    # -- d128, GQA 4, no window/soft cap: every backend (fa3's two modules: batch, single) --------
    for b, kv in ((1, 1024), (1, 32768), (8, 4096), (32, 2048), (64, 4096), (128, 1024), (256, 512), (4, 16384)):
        g.append(_decode(PAGED, b, kv))
    for b, kv in ((1, 8192), (16, 2048), (64, 4096), (256, 1024), (2, 32768)):
        g.append(_decode(XQA, b, kv))
    for b, q, kv in ((64, 16, 2048), (8, 2048, 2048), (1, 16, 8192), (4, 512, 4096), (16, 128, 1024)):
        g.append(BenchProblem(PAGED, b, q, kv, causal=True))
    g += [BenchProblem(PAGED, 2, 4096, 4096, causal=False), BenchProblem(PAGED, 32, 64, 512, causal=True, lse=True)]
    for b, q, kv in ((8, 2048, 2048), (1, 8192, 8192), (32, 256, 256), (4, 1024, 4096)):
        g.append(BenchProblem(RAGGED, b, q, kv, causal=True))
    g.append(BenchProblem(RAGGED, 4, 1024, 1024, causal=False, lse=True))
    for b, q, kv in ((8, 2048, 2048), (1, 16384, 16384), (64, 16, 1024), (16, 512, 512)):
        g.append(BenchProblem(TRTLLM, b, q, kv, causal=True))
    for b, q, kv in ((8, 2048, 2048), (2, 8192, 8192), (32, 128, 1024)):
        g.append(BenchProblem(CUDNN, b, q, kv, causal=True))
    g.append(BenchProblem(CUDNN, 4, 1024, 1024, causal=True, lse=True))
    for q, kv, causal in ((4096, 4096, True), (1, 8192, False), (16, 16, True), (1024, 32768, True),
                          (2048, 2048, False)):
        g.append(BenchProblem(SINGLE, 1, q, kv, causal=causal))
    g += [BenchProblem(SINGLE_LSE, 1, 4096, 4096, causal=True), BenchProblem(SINGLE_LSE, 1, 1, 16384)]
    # -- GQA 1 and 8 (same modules: heads are runtime) ----------------------------------------------
    g += [_decode(PAGED, 64, 4096, num_kv_heads=32), _decode(PAGED, 64, 4096, num_kv_heads=4),
          _decode(XQA, 64, 4096, num_kv_heads=4), BenchProblem(PAGED, 8, 2048, 2048, causal=True, num_kv_heads=32),
          BenchProblem(RAGGED, 8, 2048, 2048, causal=True, num_kv_heads=4)]
    g += _variants()
    return g


def _variants() -> list[BenchProblem]:
    """Head dims 64 / 256, window, soft cap, sinks, fp8 KV: every backend but fa3 (see the module doc)."""
    nf = dict(backends=NOT_FA3)
    g: list[BenchProblem] = []
    for d in (64, 256):
        g += [_decode(PAGED, 64, 4096, head_dim=d, **nf), BenchProblem(PAGED, 8, 2048, 2048, causal=True, head_dim=d, **nf),
              _decode(XQA, 32, 4096, head_dim=d, **nf), BenchProblem(SINGLE, 1, 4096, 4096, causal=True, head_dim=d, **nf)]
    g += [_decode(PAGED, 64, 4096, window_left=1023, **nf), BenchProblem(PAGED, 8, 2048, 2048, causal=True, window_left=511, **nf),
          _decode(XQA, 64, 4096, window_left=1023, **nf), BenchProblem(TRTLLM, 8, 2048, 2048, causal=True, window_left=511, **nf),
          BenchProblem(SINGLE, 1, 8192, 8192, causal=True, window_left=1023, **nf)]
    g += [_decode(PAGED, 64, 4096, soft_cap=30.0, **nf), BenchProblem(PAGED, 8, 2048, 2048, causal=True, soft_cap=30.0, **nf),
          BenchProblem(RAGGED, 8, 2048, 2048, causal=True, soft_cap=30.0, **nf)]
    g += [_decode(XQA, 64, 4096, sinks=True, **nf), _decode(PAGED, 64, 4096, sinks=True, **nf),
          BenchProblem(TRTLLM, 8, 2048, 2048, causal=True, sinks=True, **nf),
          _decode(XQA, 64, 4096, window_left=1023, sinks=True, **nf)]
    fp8 = dict(kv_dtype="float8_e4m3fn", **nf)
    g += [_decode(XQA, 64, 4096, **fp8), _decode(PAGED, 64, 4096, **fp8), _decode(XQA, 1, 32768, **fp8)]
    return g


GRIDS = {"quick": quick, "h100": h100}


def grid(name: str) -> list[BenchProblem]:
    if name not in GRIDS:
        raise ValueError(f"--grid {name!r}: allowed one of {', '.join(GRIDS)}")
    return GRIDS[name]()


def with_dtype(problems: list[BenchProblem], dtype: str) -> list[BenchProblem]:
    return [replace(p, dtype=dtype) for p in problems]
