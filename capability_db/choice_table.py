"""The router's choice tables (``tables/<gpu>.json``): compiled ahead of time, looked up at decision time.

A table maps a problem's static key and size bucket to each backend's expected GPU ms there. It is
compiled outside the package (``python -m tools.tables.compile``) from the fit of every call timed on
that GPU; the router only reads it: no model is evaluated and nothing is timed on the request path.

* **Key**: entry point, phase (a speculative decode reads the prefill key), head dim (64, 128 or 256,
  the nearest), causal (prefill), and the GQA group for decode (1, 4 or 8, the nearest).
* **Sizes**: a grid of powers of four, batch (single prefill: query heads) x q x kv. A call's size
  class is read at its middle
  (``class_middle``), its batch in the grid's units (``reference_batch``: heads multiply the work as
  the batch does), and interpolated between the grid points around it (trilinear in log2 sizes).
* **Other facts** (fp8 KV, a window, a soft cap, sinks, LSE) multiply a backend's time by its factor
  for that fact on that entry point.
* **Host time**: microseconds per eager call of each backend's path on each entry point, measured.
* **Another GPU of the same SM** borrows its SM's table, scaled: a decode's GPU time above the
  backend's launch floor by the ratio of peak bandwidth, a prefill's by the ratio of peak compute.

Only backends within a few times the fastest are kept at a point: one missing there is slower.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from pathlib import Path
from typing import Optional

from .vocabulary import AttentionProblem, DeviceDesc, class_middle

TABLES_DIR = Path(__file__).resolve().parent / "tables"
BATCHES = [1, 4, 16, 64, 256]
Q_LENS = [1, 4, 16, 64, 256, 1024, 4096, 16384]
KV_LENS = [64, 256, 1024, 4096, 16384, 65536]
HEAD_DIMS = (64, 128, 256)
GROUPS = (1, 4, 8)
REFERENCE_KV_HEADS = 8
# single prefill's first axis: its query heads (one request; its heads are its parallel work), GQA 4
SINGLE_HEADS = [4, 16, 64]
SINGLE = "single_prefill_with_kv_cache"
FLAGS = ("fp8_kv", "window", "soft_cap", "sinks", "lse")
# (batch, q_len, kv_len) a phase is judged at when the sizes are not known (the anchor workloads)
ANCHORS = {"decode": (64, 1, 4096), "prefill": (8, 2048, 2048), "spec_decode": (64, 4, 4096)}
Sizes = tuple[int, int, int]


def nearest(grid, x: float) -> int:
    """The grid value nearest ``x`` in log2 (the smaller on a tie)."""
    return min(grid, key=lambda g: (abs(math.log2(g) - math.log2(max(x, 1))), g))


def key_phase(problem: AttentionProblem) -> str:
    return "decode" if problem.phase == "decode" else "prefill"


def key_of(problem: AttentionProblem) -> str:
    """The table key of a problem: entry|phase|d<head dim>|causal or full|g<group>."""
    phase = key_phase(problem)
    causal = "causal" if problem.causal and phase == "prefill" else "full"
    group = nearest(GROUPS, problem.gqa_group) if phase == "decode" else 4
    return f"{problem.entry}|{phase}|d{nearest(HEAD_DIMS, problem.head_dim_qk)}|{causal}|g{group}"


def representative(entry: str, phase: str, storage: str, head_dim: int, causal: bool, group: int) -> AttentionProblem:
    """The problem a key's grid is compiled for: bf16, NHD, pages of 16, ``REFERENCE_KV_HEADS`` KV heads."""
    return AttentionProblem(entry=entry, phase=phase, kv_storage=storage, kv_layout="NHD",
                            num_qo_heads=REFERENCE_KV_HEADS * group, num_kv_heads=REFERENCE_KV_HEADS,
                            head_dim_qk=head_dim, head_dim_vo=head_dim, q_dtype="bfloat16", kv_dtype="bfloat16",
                            out_dtype="bfloat16", page_size=16 if storage == "paged" else 0, causal=causal)


def first_axis(problem: AttentionProblem) -> list:
    """The grid's first axis: the batch, or single prefill's query heads (``SINGLE_HEADS``)."""
    return SINGLE_HEADS if problem.entry == SINGLE else BATCHES


def grid_points(problem: AttentionProblem) -> list[Sizes]:
    """The grid a key is compiled on: q = 1 for decode; q <= kv."""
    q_lens = [1] if key_phase(problem) == "decode" else Q_LENS[1:]
    return [(b, q, kv) for b in first_axis(problem) for q in q_lens for kv in KV_LENS if q <= kv]


def reference_batch(problem: AttentionProblem, batch: float) -> float:
    """The batch in the grid's units: a decode's in ``REFERENCE_KV_HEADS`` KV heads (its group is in
    the key), a prefill's in the reference's query heads (its work follows them); single prefill's
    first axis is its query heads."""
    if problem.entry == SINGLE:
        return float(problem.num_qo_heads)
    if key_phase(problem) == "decode":
        return batch * problem.num_kv_heads / REFERENCE_KV_HEADS
    return batch * problem.num_qo_heads / (REFERENCE_KV_HEADS * 4)


def point_of(problem: AttentionProblem, sizes: Sizes, of_class: bool = True) -> tuple[float, float, float]:
    """Where sizes are read: a size class at its middle (``of_class``), the batch in the grid's units,
    q <= kv."""
    b, q, kv = class_middle(tuple(sizes)) if of_class else sizes
    q = 1 if key_phase(problem) == "decode" else min(max(q, Q_LENS[1]), max(kv, Q_LENS[1]))
    return reference_batch(problem, b), q, max(kv, q)


def _bracket(grid: list, x: float) -> list[tuple[int, float]]:
    """The grid values around ``x`` with their weights (linear in log2, clamped to the grid)."""
    if len(grid) == 1 or x <= grid[0]:
        return [(grid[0], 1.0)]
    if x >= grid[-1]:
        return [(grid[-1], 1.0)]
    hi = next(i for i, g in enumerate(grid) if g >= x)
    lo, up = grid[hi - 1], grid[hi]
    t = (math.log2(x) - math.log2(lo)) / (math.log2(up) - math.log2(lo))
    return [(lo, 1.0 - t), (up, t)] if 0.0 < t < 1.0 else [(up if t >= 1.0 else lo, 1.0)]


def corners(problem: AttentionProblem, point: tuple[float, float, float]) -> list[tuple[Sizes, float]]:
    """The grid points around ``point`` with their weights (trilinear in log2 sizes); those off the
    grid (q > kv) are left out and the rest weigh for them."""
    b, q, kv = point
    q_lens = [1] if key_phase(problem) == "decode" else Q_LENS[1:]
    found = [((gb, gq, gk), wb * wq * wk) for gb, wb in _bracket(first_axis(problem), b) for gq, wq in _bracket(q_lens, q)
             for gk, wk in _bracket(KV_LENS, kv) if gq <= gk and wb * wq * wk > 0]
    total = sum(w for _, w in found)
    return [(c, w / total) for c, w in found]


def flags_of(problem: AttentionProblem) -> list[str]:
    on = {"fp8_kv": problem.kv_fp8, "window": problem.window_left >= 0, "soft_cap": problem.logits_soft_cap > 0,
          "sinks": problem.has_sinks, "lse": problem.return_lse}
    return [f for f in FLAGS if on[f]]


@dataclasses.dataclass(frozen=True)
class ChoiceTable:
    gpu: str
    sm: int
    data: dict = dataclasses.field(repr=False, compare=False)
    bandwidth_ratio: float = 1.0  # this GPU's peak bandwidth / the table's GPU's (1: its own table)
    compute_ratio: float = 1.0
    scaling: str = ""  # "" for a GPU's own table; else how it was scaled to this GPU (explain shows it)
    # (table key, grid point) -> its parsed cell: a new size class reads up to eight cells, most read before
    # (bounded by the table's own cells)
    parsed: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def source(self) -> str:
        return f"capability_db/tables/{self.gpu}.json" + (f" ({self.scaling})" if self.scaling else "")

    def gpu_ms(self, problem: AttentionProblem, sizes: Sizes, of_class: bool = True) -> tuple[dict[str, float], Sizes]:
        """(backend -> expected GPU ms of the class ``sizes``, the point read, rounded); {} without a
        key. Between grid points, log2 ms is interpolated (trilinear in log2 sizes); at a corner that
        left a backend out, it counts as ``keep_within`` times that corner's fastest."""
        key = key_of(problem)
        cells = self.data["keys"].get(key)
        point = point_of(problem, sizes, of_class)
        shown = tuple(max(1, round(n)) for n in point)
        if cells is None:
            return {}, shown
        cells_at = [(self._cell(key, cells, corner), weight) for corner, weight in corners(problem, point)]
        cells_at = [(times, weight) for times, weight in cells_at if times]
        total = sum(weight for _, weight in cells_at)
        names = {name for times, _ in cells_at for name in times}
        keep = self.data.get("keep_within", 2.5)
        out = {}
        for name in names:
            log2_ms = sum(weight * math.log2(times[name] if name in times else min(times.values()) * keep)
                          for times, weight in cells_at) / total
            out[name] = self._adjusted(problem, name, 2.0 ** log2_ms)
        return out, shown

    def _cell(self, key: str, cells: dict, corner: Sizes) -> dict[str, float]:
        """The times at one grid point of a key (read-only: shared by every lookup of that point)."""
        found = self.parsed.get((key, corner))
        if found is None:
            words = cells.get(",".join(map(str, corner)), "").split()
            found = {self.data["backends"][int(i)]: float(t) for i, t in zip(words[::2], words[1::2])}
            self.parsed[(key, corner)] = found
        return found

    def _adjusted(self, problem: AttentionProblem, name: str, ms: float) -> float:
        """The problem's other facts' factors, then this GPU's scaling above the launch floor."""
        factors = self.data["factors"].get(f"{problem.entry}|{key_phase(problem)}", {})
        for flag in flags_of(problem):
            ms *= factors.get(flag, {}).get(name, 1.0)
        ratio = self.bandwidth_ratio if key_phase(problem) == "decode" else self.compute_ratio
        floor = min(ms, self.data["launch_us"].get(name, 0.0) / 1e3)
        return floor + (ms - floor) / ratio

    def host_us(self, backend: str, entry: str) -> Optional[float]:
        """Host us per eager call of the backend's path on the entry point (measured), or None."""
        return self.data["host_us"].get(backend, {}).get(entry)


@dataclasses.dataclass(frozen=True)
class GpuPeaks:
    key: str  # the table file's stem: tables/<key>.json
    tb_per_s: float  # peak HBM bandwidth
    tflops: float  # dense bf16 tensor-core TFLOP/s
    sms: int


# Known GPUs by name (NVIDIA datasheets; SXM parts unless named): the first pattern found in the
# upper-cased name wins, so the more specific names come first (GH200 before H200 before H20).
GPU_PEAKS: tuple[tuple[str, GpuPeaks], ...] = (
    (r"GH200", GpuPeaks("gh200", 4.0, 989.0, 132)),
    (r"H200", GpuPeaks("h200", 4.8, 989.0, 132)),
    (r"H100.*PCIE", GpuPeaks("h100-pcie", 2.0, 756.0, 114)),
    (r"H100.*NVL", GpuPeaks("h100-nvl", 3.9, 835.0, 132)),
    (r"H100", GpuPeaks("h100", 3.35, 989.0, 132)),
    (r"H800", GpuPeaks("h800", 3.35, 989.0, 132)),
    (r"H20\b", GpuPeaks("h20", 4.0, 148.0, 78)),
    (r"B200", GpuPeaks("b200", 8.0, 2250.0, 148)),
    (r"A100.*PCIE", GpuPeaks("a100-pcie", 1.94, 312.0, 108)),
    (r"A100", GpuPeaks("a100", 2.04, 312.0, 108)),
    (r"L40S", GpuPeaks("l40s", 0.864, 362.0, 142)),
    (r"L4\b", GpuPeaks("l4", 0.3, 121.0, 58)),
)


def gpu_peaks(name: str) -> Optional[GpuPeaks]:
    """The known peaks of a GPU by its name ("NVIDIA H200", "h100", ...), or None."""
    upper = name.upper()
    return next((peaks for pattern, peaks in GPU_PEAKS if re.search(pattern, upper)), None)


def gpu_key(name: str) -> str:
    """The table key of a GPU name ("NVIDIA H100 80GB HBM3" -> "h100"), or "" when unknown."""
    peaks = gpu_peaks(name)
    return peaks.key if peaks else ""


def device_peaks(device: DeviceDesc) -> tuple[float, float]:
    """(TB/s, TFLOP/s) of a device: its description's, else the known GPU's by name; 0 where unknown."""
    known = gpu_peaks(device.name)
    return (device.peak_tb_per_s or (known.tb_per_s if known else 0.0),
            device.peak_tflops or (known.tflops if known else 0.0))


@functools.lru_cache(maxsize=None)
def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # a broken data file must say which file
        raise RuntimeError(f"capability_db: tables/{path.name} is unreadable: {exc}") from exc


def _sm_of(path: Path) -> int:
    return int(load(path).get("sm", -1))


@functools.lru_cache(maxsize=None)
def table_for(device: DeviceDesc) -> Optional[ChoiceTable]:
    """The device's own table (by GPU name), else its SM's first table scaled to its peaks; None on
    the CPU or where no table holds its SM."""
    if device.kind != "cuda":
        return None
    paths = [p for p in sorted(TABLES_DIR.glob("*.json")) if _sm_of(p) == device.sm]
    key = gpu_key(device.name)
    own = next((p for p in paths if key and p.stem == key), None)
    if own is not None:
        return ChoiceTable(own.stem, device.sm, load(own))
    # borrow a table compiled for the GPU its fit was measured on (another was scaled once already)
    paths.sort(key=lambda p: load(p).get("measured_on") != p.stem)
    if not paths:
        return None
    data = load(paths[0])
    bw, fl = device_peaks(device)
    if not fl and device.sm_count:  # compute follows the SM count at the same clocks
        known = gpu_peaks(data["gpu"])
        fl = data["peak_tflops"] * device.sm_count / known.sms if known else 0.0
    bw_ratio, fl_ratio = (bw / data["peak_tb_per_s"] if bw else 1.0), (fl / data["peak_tflops"] if fl else 1.0)
    how = (f"{paths[0].stem} table scaled to {device.name} (bandwidth x{bw_ratio:.2f}, compute x{fl_ratio:.2f})"
           if bw or fl else f"{paths[0].stem} table unscaled: no peak figures for {device.name}")
    return ChoiceTable(paths[0].stem, device.sm, data, bw_ratio, fl_ratio, how)


def forget() -> None:
    """Drop every table read so far (a tool that writes new tables)."""
    load.cache_clear()
    table_for.cache_clear()


def describe(device: DeviceDesc) -> str:
    """Which table the automatic choice ranks by on ``device`` (``info`` and bench runs say it)."""
    table = table_for(device)
    if table is None:
        return ("none: the priority list decides (no GPU)" if device.kind != "cuda" else
                f"none for sm_{device.sm}: the priority list decides")
    how = table.scaling or "this GPU's own"
    return f"tables/{table.gpu}.json ({len(table.data['keys'])} keys); {how}"
