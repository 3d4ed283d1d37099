"""Compile the fitted timing model into the router's choice tables (capability_db/tables/<gpu>.json).

The router never evaluates the fit: it looks up a table compiled here, ahead of time, from it.

    python -m tools.tables.compile                 # every GPU with a fit (and its SM's scaled kin)
    python -m tools.tables.compile --check 400     # plus: how often the table agrees with the fit

A table maps (entry point, phase, head dim, causal, GQA group for decode) and a point of a grid of
sizes (batch x q x kv, powers of four; the batch counted in units of ``REFERENCE_KV_HEADS`` KV
heads) to the GPU ms of each backend the fit knows that accepts the key, fastest first, dropping those more than
``KEEP_WITHIN`` times the fastest. The problem's other facts (fp8 KV, window, soft cap, sinks, LSE)
are per (entry, backend) factors: the geometric mean, over the grid, of the fit's time with the fact
over its time without. Host us per eager call come from the measured table per (backend, entry).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import struct
from pathlib import Path
from typing import Iterator

import backends
import capability_db
from capability_db.choice_table import (BATCHES, FLAGS, GROUPS, HEAD_DIMS, KV_LENS, Q_LENS, REFERENCE_KV_HEADS,
                                  SINGLE, SINGLE_HEADS, TABLES_DIR, grid_points, key_of, representative)

from . import measured

KEEP_WITHIN = 2.5  # a backend slower than this times the fastest at a grid point is left out there
ENTRIES = {  # entry point -> the phases it serves and how it stores K/V
    "BatchPrefillWithPagedKVCacheWrapper": ("paged", ("prefill", "decode")),
    "BatchPrefillWithRaggedKVCacheWrapper": ("ragged", ("prefill", "decode")),
    "single_prefill_with_kv_cache": ("dense", ("prefill", "decode")),
    "cudnn_batch_prefill_with_kv_cache": ("paged", ("prefill", "decode")),
    "trtllm_batch_context_with_kv_cache": ("paged", ("prefill", "decode")),
    "xqa_batch_decode_with_kv_cache": ("paged", ("decode",)),
}


def key_problems() -> Iterator[tuple[str, capability_db.AttentionProblem]]:
    """(table key, representative problem) for every static key the table holds."""
    for entry, (storage, phases) in ENTRIES.items():
        for phase in phases:
            for d in HEAD_DIMS:
                for causal in ((False, True) if phase == "prefill" else (False,)):
                    for group in (GROUPS if phase == "decode" else (4,)):
                        p = representative(entry, phase, storage, d, causal, group)
                        yield key_of(p), p


def times_at(table: measured.TimingTable, problem, sizes) -> dict[str, float]:
    """GPU ms per backend the fit knows, every backend placed together (an eager call's view)."""
    return times_many(table, [(problem, sizes)])[0]


_PACKED: dict[int, measured.PackedTrees] = {}


def _packed(trees: list) -> measured.PackedTrees:
    if id(trees) not in _PACKED:
        _PACKED[id(trees)] = measured.PackedTrees(trees)
    return _PACKED[id(trees)]


def _totals(packed: measured.PackedTrees, rows: list[list[float]], chunk: int = 4096) -> list[float]:
    return [t for i in range(0, len(rows), chunk) for t in packed.totals(rows[i:i + chunk])]


def times_many(table: measured.TimingTable, items: list) -> list[dict[str, float]]:
    """``estimate.fitted_times(table, problem, sizes, eager=True)`` for each (problem, sizes), the
    trees walked for every item at once (the same sums, in batches)."""
    fit = table.fitted
    values = [measured.features(p, s) for p, s in items]
    own_lin = [{b: lin for b in fit.coef if (lin := _linear(fit, b, v)) is not None} for v in values]
    tree_rows, where = [], []
    for i, own in enumerate(own_lin):
        for b in own:
            x = [values[i].get(n, float(n == f"backend {b}")) for n in fit.tree_features]
            tree_rows.append(list(struct.unpack(f"{len(x)}f", struct.pack(f"{len(x)}f", *x))))
            where.append((i, b))
    if fit.trees and tree_rows:
        for (i, b), t in zip(where, _totals(_packed(fit.trees), tree_rows)):
            own_lin[i][b] += t
    if fit.pair_trees:
        _place_pairs(fit, values, own_lin)
    return [_scaled(table, own, s[1]) for own, (_, s) in zip(own_lin, items)]


def _linear(fit, backend: str, values: dict[str, float]):
    if not set(values) <= set(fit.names):
        return None
    if any(n not in values and not n.startswith(measured.PER_ENTRY) for n in fit.names):
        return None
    return sum(c * values.get(name, 0.0) for name, c in zip(fit.names, fit.coef[backend]))


def _place_pairs(fit, values: list[dict], own_lin: list[dict]) -> None:
    """The pairwise model's places around each item's mean (``FittedTimes.log2_ms_among``)."""
    rows, keys = [], []
    for i, own in enumerate(own_lin):
        names = list(own)
        if len(names) < 2:
            continue
        for a in names:
            for b in names:
                if a != b:
                    rows.append(measured.pair_row(fit.pair_features, values[i], a, b))
                    keys.append((i, a, b))
    predicted = dict(zip(keys, _totals(_packed(fit.pair_trees), rows)))
    for i, own in enumerate(own_lin):
        names = list(own)
        if len(names) < 2:
            continue
        level = sum(own.values()) / len(own)
        own_lin[i] = {a: level + sum(predicted[i, a, b] - predicted[i, b, a] for b in names if b != a)
                      / (2 * len(names)) for a in names}


def _scaled(table, own: dict[str, float], q_len: int) -> dict[str, float]:
    ratio = table.bandwidth_ratio if q_len == 1 else table.compute_ratio
    out = {}
    for backend, log2_ms in own.items():
        ms = 2.0 ** log2_ms
        floor = min(ms, table.efficiency[backend].launch_us / 1e3) if backend in table.efficiency else 0.0
        out[backend] = floor + (ms - floor) / ratio
    return out


def flag_variant(problem, flag: str):
    if flag == "fp8_kv":
        return dataclasses.replace(problem, kv_dtype="float8_e4m3fn")
    if flag == "window":
        return dataclasses.replace(problem, window_left=127)
    if flag == "soft_cap":
        return dataclasses.replace(problem, logits_soft_cap=30.0)
    if flag == "sinks":
        return dataclasses.replace(problem, has_sinks=True)
    return dataclasses.replace(problem, return_lse=True)


def servers(problem) -> set[str]:
    """The backends whose capability data accept the key's representative problem on its GPU's SM."""
    device = capability_db.resolve_device("sm_90")
    return {name for name in backends.REGISTRY if not backends.get_backend(name).check(problem, device)}


def at_point(problem, point):
    """(problem, sizes) the fit is asked at for a grid point: single prefill's first axis is its
    query heads (one request, the key's GQA group), the others' the batch."""
    if problem.entry != SINGLE:
        return problem, point
    heads, q, kv = point
    group = problem.gqa_group
    heads = max(heads, group)
    return dataclasses.replace(problem, num_qo_heads=heads, num_kv_heads=heads // group), (1, q, kv)


def compile_key(table, problem, names: list[str]) -> tuple[dict, dict]:
    """(grid point -> "<backend index> <ms> ..." fastest first, flag -> backend -> factor) of one key;
    a backend's index is its place in ``names``."""
    points = grid_points(problem)
    variants = [problem] + [flag_variant(problem, f) for f in FLAGS]
    serving = servers(problem)
    times = [{n: ms for n, ms in t.items() if n in serving}
             for t in times_many(table, [at_point(v, s) for v in variants for s in points])]
    base, flagged = times[:len(points)], times[len(points):]
    cells, logs = {}, {f: {} for f in FLAGS}
    for k, sizes in enumerate(points):
        if not base[k]:
            continue
        best = min(base[k].values())
        kept = sorted((ms, n) for n, ms in base[k].items() if ms <= KEEP_WITHIN * best)
        cells[",".join(map(str, sizes))] = " ".join(f"{names.index(n)} {ms:.3g}" for ms, n in kept)
        for f, flag in enumerate(FLAGS):
            for n, ms in flagged[f * len(points) + k].items():
                if n in base[k]:
                    logs[flag].setdefault(n, []).append(math.log2(ms / base[k][n]))
    factors = {f: {n: round(2 ** (sum(v) / len(v)), 3) for n, v in per.items()} for f, per in logs.items() if per}
    return cells, factors


def compile_table(table: measured.TimingTable, target: str) -> dict:
    """The choice table of GPU ``target`` (a key: h200, h100) from ``table``, the fit it ranks by."""
    keys, factors, names = {}, {}, sorted(table.fitted.coef)
    for key, problem in key_problems():
        cells, key_factors = compile_key(table, problem, names)
        if cells:
            keys[key] = cells
            factors[f"{problem.entry}|{problem.phase}"] = key_factors
    launch = {n: round(e.launch_us, 2) for n, e in table.efficiency.items()}
    return {"gpu": target, "sm": table.sm, "measured_on": table.key, "keep_within": KEEP_WITHIN, "peak_tb_per_s": table.peak_tb_per_s, "peak_tflops": table.peak_tflops,
            "compiled_from": f"{table.fitted.source[:300]} ({sum(table.fitted.rows.values())} timed calls)"
                             + (f"; {table.scaling}" if table.scaling else ""),
            "grid": {"batch": BATCHES, "single_prefill_heads": SINGLE_HEADS, "q": Q_LENS, "kv": KV_LENS,
                     "kv_heads": REFERENCE_KV_HEADS},
            "backends": names, "host_us": table.host_us, "launch_us": launch, "factors": factors, "keys": keys}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=TABLES_DIR)
    parser.add_argument("--gpus", nargs="*", default=["h200", "h100"])
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for gpu in args.gpus:
        table = measured.table_for(capability_db.resolve_device(gpu))
        if table is None or table.fitted is None:
            print(f"{gpu}: no fitted table, skipped")
            continue
        compiled = compile_table(table, gpu)
        path = args.out / f"{gpu}.json"
        path.write_text(json.dumps(compiled, separators=(",", ":"), sort_keys=True) + "\n")
        print(f"{gpu}: {len(compiled['keys'])} keys, {path.stat().st_size / 1024:.0f} KiB -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
