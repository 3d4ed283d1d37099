"""Measured timings per GPU (tools/tables/data/<gpu>.json.gz) and their fit: what the choice tables compile.

A table holds rows of measurements (one problem: its bucket, and the ms per call of every
backend measured there) plus, for the cost model of buckets nobody measured, the GPU's peak
bandwidth and compute and each backend's measured efficiency per phase (achieved / peak) and
launch cost. ``python -m tools.lab.table`` writes one from bench runs; ``python -m tools.tables.compile``
compiles the router's tables (capability_db/tables/<gpu>.json) from its fit. Loaded lazily,
validated by pydantic; this module imports nothing of dispatch.

A bucket's static facts (``Bucket.static_key``: phase, GQA group, head dims, dtypes, causal,
window / soft cap / sinks on or off) must equal the problem's for a row to apply; its sizes
(batch, q_len, kv_len) say how near the row is.

Two times per backend: ``ms`` (GPU time per call: CUDA events behind a GPU spin, what a CUDA
graph's replay costs) and ``host_us`` (host time per eager call of that backend's path: the
Python and launch work before the call returns), per row and per (backend, entry point) in
``TimingTable.host_us``. Tables written before host times existed have neither: the choice
then uses a per-backend default (dispatch/choice.py ``DEFAULT_HOST_US``).

**Per GPU.** ``table_for`` takes the table measured on the device's own GPU (by name:
``gpu_key``); a GPU of a known SM without one borrows a table of the same SM *scaled* to it
(``TimingTable.scaled_to``): decode-shaped rows by the ratio of peak HBM bandwidth, prefill
rows by the ratio of peak bf16 tensor FLOP/s, above each backend's launch floor. The peaks come
from the device description (``DeviceDesc.peak_tb_per_s`` / ``peak_tflops``, which the router
fills from the live GPU's properties where it can) or, by name, from ``GPU_PEAKS`` (NVIDIA's
datasheets). Never another GPU's times unchanged unless nothing is known of this one's peaks
(then the table says so: ``scaling``).

A table with fitted times (``TimingTable.fitted``) beats a GPU's own table without them: a fit over
thousands of random problems, scaled, chooses better than a few dozen rows of one grid measured
on the GPU itself. Over 30 random problems measured on an H100 (seed 2937607121, problems
87-116), the choice for a CUDA graph was within 3% of the fastest on 21 under the H100's own grid
table (78 rows, no fit, max regret 399%) and on 27 under the H200's fitted table scaled to the H100
(max 17%).
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import math
import struct
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from capability_db.choice_table import gpu_key, gpu_peaks
from capability_db.vocabulary import NAME_DTYPES, AttentionProblem, DeviceDesc, visible_pairs

MEASURED_DIR = Path(__file__).resolve().parent / "data"  # <gpu>.json.gz (a table of its own: .json too)


def read_json(path: Path):
    """A table file, gzipped (``.gz``, how the training data is kept) or plain."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            return json.load(f)
    return json.loads(path.read_text())


class Bucket(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    entry: str
    phase: str
    batch: int = Field(ge=1)
    q_len: int = Field(ge=1)
    kv_len: int = Field(ge=1)
    gqa_group: int = Field(ge=1)
    head_dim_qk: int
    head_dim_vo: int
    q_dtype: str
    kv_dtype: str
    causal: bool
    window: bool = False
    soft_cap: bool = False
    sinks: bool = False
    # KV heads of the measured call (0: not recorded, tables before it was); with gqa_group, its
    # query heads: a row at other head counts is scaled like one at other sizes
    num_kv_heads: int = Field(default=0, ge=0)

    def static_key(self) -> tuple:
        return (self.phase, self.gqa_group, self.head_dim_qk, self.head_dim_vo, self.q_dtype, self.kv_dtype,
                self.causal and self.phase != "decode", self.window, self.soft_cap, self.sinks)


def static_key_of(problem: AttentionProblem) -> tuple:
    """The problem's facts a row must match (sizes aside); decode ignores causal (one query row)."""
    return (problem.phase, problem.gqa_group, problem.head_dim_qk, problem.head_dim_vo, problem.q_dtype,
            problem.kv_dtype, problem.causal and problem.phase != "decode", problem.window_left >= 0,
            problem.logits_soft_cap > 0, problem.has_sinks)


class TimingRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    bucket: Bucket
    ms: dict[str, float]  # backend -> GPU ms per call (eager, warm, L2-cold K/V, launch gaps not counted)
    source: str  # the results file (and problem) it came from
    host_us: dict[str, float] = {}  # backend -> host us per eager call (absent in older tables)
    # False: a backend that should have run is missing for a failure of the run (a JIT build, say),
    # not a limit it declared; the row's times stand, but it is no side-by-side evidence against
    # the missing one (dispatch/choice.py shared_row)
    complete: bool = True


class Efficiency(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    bandwidth: float = Field(gt=0, le=1.5)  # achieved / peak bytes per second on decode-shaped work
    compute: float = Field(gt=0, le=1.5)  # achieved / peak FLOP/s on prefill-shaped work
    launch_us: float = Field(ge=0)  # the floor of one call's GPU time
    source: str


Sizes = tuple[int, int, int]  # (batch, q_len, kv_len)


def work(problem: AttentionProblem, sizes: Sizes) -> tuple[float, float]:
    """(bytes moved, FLOPs) of one call: the keys any query sees read once, q and out once; 2 matmuls
    on the visible (query, key) pairs, counted as the oracle masks them (``visible_pairs``)."""
    b, q, kv = sizes
    w = problem.window_left
    keys = min(kv, q + w) if w >= 0 else kv  # from the first query's window start on
    kv_elem = NAME_DTYPES[problem.kv_dtype].itemsize
    q_elem = NAME_DTYPES[problem.q_dtype].itemsize
    dims = problem.head_dim_qk + problem.head_dim_vo
    moved = b * (keys * problem.num_kv_heads * dims * kv_elem + q * problem.num_qo_heads * dims * q_elem)
    pairs = visible_pairs(q, kv, problem.causal, w)
    return float(moved), 2.0 * problem.num_qo_heads * dims * b * max(pairs, q)


QUERY_TILE = 128  # queries per block of a query-tiled kernel (cuDNN's and FlashInfer fa3's prefill tiles)
SMS = 132  # the SMs of the GPUs the fitted terms were shaped on (H100 / H200 SXM)


def features(problem: AttentionProblem, sizes: Sizes) -> dict[str, float]:
    """What ``FittedTimes`` predicts a call's log2 time from: the work (bytes, FLOPs, blocks of a
    query-tiled kernel) and sizes in log2, the problem's facts as 0/1, the entry point as 0/1, and
    the few bends of the curve the sweeps showed (a GPU filling up, very long keys, big batches)."""
    b, q, kv = sizes
    moved, flops = work(problem, sizes)
    keys = min(kv, problem.window_left + 1) if problem.window_left >= 0 else kv
    log = math.log2
    lm, lf = log(moved), log(flops)
    lb = log(b * problem.num_qo_heads * math.ceil(q / QUERY_TILE))
    d = problem.head_dim_qk
    # a kernel that walks every key up to the diagonal and masks the window (FlashInfer fa2's
    # single-request prefill: 10.9 ms against fa3's 0.028 on single 1 x 266 x 129196, window 118,
    # bench-random-150-seed-2591293081-cuda-from-19) pays the unwindowed work: log2 of that / this
    unwindowed = log(work(dataclasses.replace(problem, window_left=-1), sizes)[1]) - lf if keys < kv else 0.0
    single = problem.entry == "single_prefill_with_kv_cache"
    f = {"one": 1.0, "log2 bytes": lm, "log2 flops": lf, "log2 blocks": lb, "log2 batch": log(b), "log2 q": log(q),
         "log2 keys": log(keys), "log2 kv heads": log(problem.num_kv_heads), "log2 group": log(problem.gqa_group),
         "d64": d == 64, "d256": d == 256, "causal": problem.causal and q > 1, "window": problem.window_left >= 0,
         "soft cap": problem.logits_soft_cap > 0, "sinks": problem.has_sinks,
         "fp8 kv": problem.kv_dtype.startswith("float8"), "lse": problem.return_lse, "HND": problem.kv_layout == "HND",
         "custom mask": problem.mask == "custom", "log2 page": log(max(problem.page_size, 1)), "decode": q == 1,
         f"entry {problem.entry}": 1.0,
         "bytes^2": lm * lm / 30, "flops^2": lf * lf / 30, "bytes x flops": lm * lf / 30,
         "bytes past 1 MiB": max(0.0, lm - 20), "flops past 32 GFLOP": max(0.0, lf - 25),
         "blocks up to the SMs": min(lb, log(SMS)), "blocks past the SMs": max(0.0, lb - log(SMS)),
         "blocks past 4 waves": max(0.0, lb - log(4 * SMS)), "keys past 16k": max(0.0, log(kv) - 14),
         "batch past 32": max(0.0, log(b) - 5), f"bytes on entry {problem.entry}": lm / 10,
         "d64 x bytes": (d == 64) * lm / 10, "d256 x bytes": (d == 256) * lm / 10, "d256 x flops": (d == 256) * lf / 10,
         "decode x bytes": (q == 1) * lm / 10, "decode x blocks": (q == 1) * lb / 10,
         "causal x flops": problem.causal * lf / 10, "kv heads x bytes": log(problem.num_kv_heads) * lm / 10,
         "window saving": unwindowed, "window saving on single": single * unwindowed}
    return {k: float(v) for k, v in f.items()}


class Tree(BaseModel):
    """One regression tree of the fit's correction (scikit-learn's layout, made plain): node ``i``
    sends the values left where ``x[feature[i]] <= threshold[i]`` (x rounded to float32, as the
    fitting library compared), else right; a leaf (``left[i] == -1``) adds ``value[i]``."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    feature: list[int]
    threshold: list[float]
    left: list[int]
    right: list[int]
    value: list[float]

    def leaf(self, x: list[float]) -> float:
        left, right, feature, threshold = self.left, self.right, self.feature, self.threshold
        node = 0
        while left[node] >= 0:
            node = left[node] if x[feature[node]] <= threshold[node] else right[node]
        return self.value[node]


class PackedTrees:
    """The trees as full binary trees of one depth in tensors (node ``i``'s children ``2i + 1`` and
    ``2i + 2``; a leaf above the bottom: its value on every bottom position under it, whichever way
    the walk goes there), so that one decision walks every tree at once: a few tensor operations per
    level instead of a Python loop per tree. 800 trees of depth 7, six backends, a 2-core CPU: 4.2-5.0 ms -> 1.5-2.7
    ms per decision, after packing them once (62-64 ms).
    Sums the same leaves as ``Tree.leaf``."""

    def __init__(self, trees: list[Tree]):
        import torch  # a required dependency, loaded once a fit is walked: the data module stays light

        self.depth = max(_depth(t) for t in trees)
        inner, leaves = 2 ** self.depth - 1, 2 ** self.depth
        feature, threshold, value = [0] * (inner * len(trees)), [math.inf] * (inner * len(trees)), [0.0] * (leaves * len(trees))
        for k, t in enumerate(trees):
            stack = [(0, 0, 0)]  # (node, its position in the full tree, its depth)
            while stack:
                node, at, depth = stack.pop()
                if t.left[node] < 0:  # every bottom position under ``at``: one run of the bottom level
                    span = 2 ** (self.depth - depth)
                    first = k * leaves + (at + 1) * span - 1 - inner
                    value[first:first + span] = [t.value[node]] * span
                    continue
                feature[k * inner + at], threshold[k * inner + at] = t.feature[node], t.threshold[node]
                stack += [(t.left[node], 2 * at + 1, depth + 1), (t.right[node], 2 * at + 2, depth + 1)]
        self.feature = torch.tensor(feature, dtype=torch.long)
        self.threshold = torch.tensor(threshold, dtype=torch.float64)
        self.value = torch.tensor(value, dtype=torch.float64)
        self.inner_base = torch.arange(len(trees)) * inner
        self.leaf_base = torch.arange(len(trees)) * leaves - inner
        self.torch = torch
        self.trees = trees  # what was packed: a copy of the fit with other trees packs its own

    def total(self, x: list[float]) -> float:
        """The sum over the trees of the leaf ``x`` reaches (x rounded to float32 by the caller)."""
        return self.totals([x])[0]

    def totals(self, xs: list[list[float]]) -> list[float]:
        """``total`` of each of ``xs``, walked at once: one row of nodes per x."""
        torch = self.torch
        x = torch.tensor(xs, dtype=torch.float64)
        rows = torch.arange(len(xs)).unsqueeze(1)
        node = torch.zeros((len(xs), len(self.inner_base)), dtype=torch.long)
        for _ in range(self.depth):
            at = self.inner_base + node
            node = 2 * node + 2 - (x[rows, self.feature[at]] <= self.threshold[at]).long()  # Tree.leaf's test
        return self.value[self.leaf_base + node].sum(dim=1).tolist()


def _depth(t: Tree) -> int:
    """The longest path from the root to a leaf, in splits."""
    deepest, stack = 0, [(0, 0)]
    while stack:
        node, depth = stack.pop()
        if t.left[node] < 0:
            deepest = max(deepest, depth)
        else:
            stack += [(t.left[node], depth + 1), (t.right[node], depth + 1)]
    return deepest


class FittedTimes(BaseModel):
    """Per backend, log2 of its GPU ms per call as a linear function of ``features`` (ridge
    regression over every timed problem of the table's runs, ``tools.lab.table``), plus, where
    the table was built from enough problems, one boosted-tree correction of those linear fits'
    errors shared by every backend (the backend a 0/1 feature ``backend <name>``): the bends a
    linear fit misses (random problems measured on the H200, 5-fold cross-validation: within 3% of
    the fastest on 76% of problems, 78% among the backends a graph captures, against 75% and 76%
    for the linear fit alone, before the replays kept XQA's known defect out of the choice; 800
    trees of depth 7: 77% and 79% on about 1800 problems). What
    the choice expects where no row was measured at the problem's own sizes; beyond the problems
    it saw the linear part extrapolates and the trees add their edge's correction. A fit of
    features ``features`` no longer computes, or of no row through the problem's entry point,
    is not used (``log2_ms``)."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    names: list[str]  # the features, in the order of each backend's coefficients
    coef: dict[str, list[float]]  # backend -> coefficients
    rows: dict[str, int]  # backend -> timed problems it was fitted on
    ridge: float
    source: str
    trees: list[Tree] = []  # the correction (absent: the linear fits alone)
    tree_features: list[str] = []  # what the trees' ``feature`` indexes: ``names`` + ``backend <name>``
    # The pairwise model (absent: each backend's estimate alone; ``log2_ms_among``): boosted trees of
    # log2(first's ms / second's) on one problem, compared on x in float64, as the fitting library did
    pair_trees: list[Tree] = []
    pair_features: list[str] = []  # ``names`` + ``first <backend>`` + ``second <backend>`` (0/1)
    pair_source: str = ""
    _packed: Optional[PackedTrees] = PrivateAttr(default=None)  # the trees walked at once, made on first use
    _packed_pairs: Optional[PackedTrees] = PrivateAttr(default=None)

    def log2_ms(self, backend: str, values: dict[str, float]) -> Optional[float]:
        """log2 of the backend's expected GPU ms, or None: not fitted, an entry point the fit never
        saw, or a fit of other features than ``features`` computes (an older table)."""
        coef = self.coef.get(backend)
        if coef is None or not set(values) <= set(self.names):
            return None
        if any(n not in values and not n.startswith(PER_ENTRY) for n in self.names):
            return None
        linear = sum(c * values.get(name, 0.0) for name, c in zip(self.names, coef))
        if not self.trees:
            return linear
        x = struct.unpack(f"{len(self.tree_features)}f", struct.pack(
            f"{len(self.tree_features)}f", *(values.get(n, float(n == f"backend {backend}")) for n in self.tree_features)))
        if self._packed is None or self._packed.trees is not self.trees:
            self._packed = PackedTrees(self.trees)
        return linear + self._packed.total(list(x))

    def log2_ms_among(self, backends: list[str], values: dict[str, float]) -> dict[str, float]:
        """log2 of the expected GPU ms of each of ``backends`` that ``log2_ms`` estimates. With a
        pairwise model and two or more of them, their mean stays and each one's place around it is
        the model's: the mean over all of them of its predicted log2(own ms / the other's), made
        antisymmetric. Errors a problem shares across backends cancel in a ratio, and only the order
        decides: on about 2200 random problems measured on the H200 (5 folds) the graph choice
        within 3% of the fastest rose from 82.2% to 84.1%."""
        own = {b: v for b in backends if (v := self.log2_ms(b, values)) is not None}
        if not self.pair_trees or len(own) < 2:
            return own
        names = list(own)
        if self._packed_pairs is None or self._packed_pairs.trees is not self.pair_trees:
            self._packed_pairs = PackedTrees(self.pair_trees)
        pairs = [(a, b) for a in names for b in names if a != b]
        rows = [pair_row(self.pair_features, values, a, b) for a, b in pairs]
        predicted = dict(zip(pairs, self._packed_pairs.totals(rows)))
        level = sum(own.values()) / len(own)
        return {a: level + sum(predicted[a, b] - predicted[b, a] for b in names if b != a) / (2 * len(names))
                for a in names}


def pair_row(columns: list[str], values: dict[str, float], first: str, second: str) -> list[float]:
    """The pairwise model's input for (``first``, ``second``) on a problem of features ``values``:
    each column's feature, or 1 for ``first <first>`` and ``second <second>``, else 0."""
    ones = (f"first {first}", f"second {second}")
    return [values.get(n, float(n in ones)) for n in columns]


PER_ENTRY = ("entry ", "bytes on entry ")  # features of one entry point (0 on the others)


class TimingTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    gpu: str
    sm: int
    source: str
    environment: dict[str, str]
    peak_tb_per_s: float = Field(gt=0)  # HBM bandwidth
    peak_tflops: float = Field(gt=0)  # dense bf16/fp16 tensor-core FLOP/s
    efficiency: dict[str, Efficiency]
    rows: list[TimingRow]
    # backend -> entry point -> host us per eager call (``bench --host-cost`` or the rows' median)
    host_us: dict[str, dict[str, float]] = {}
    fitted: Optional[FittedTimes] = None  # per-backend fit of the rows' GPU times (absent in older tables)
    # how a scaled table's GPU times relate to its own GPU's: decode-shaped by bandwidth, the rest by
    # compute (``scaled_to``; a fitted time is scaled as a row is, above the launch floor)
    bandwidth_ratio: float = 1.0
    compute_ratio: float = 1.0
    scaling: str = ""  # "" for a GPU's own table; else how it was scaled to this GPU (explain shows it)

    @property
    def key(self) -> str:
        return gpu_key(self.gpu) or self.gpu.lower()

    def scaled_to(self, bandwidth: float, tflops: float, target: str) -> "TimingTable":
        """This table as expected on a GPU of ``bandwidth`` TB/s and ``tflops`` TFLOP/s: each row's
        GPU time above the backend's launch floor divided by the bandwidth ratio (decode rows) or
        the compute ratio (prefill rows); peaks replaced (the efficiencies, relative to peak, stay);
        host times unchanged (they are the host's)."""
        bw, fl = bandwidth / self.peak_tb_per_s, tflops / self.peak_tflops

        def scaled(row: TimingRow) -> TimingRow:
            ratio = bw if row.bucket.phase == "decode" else fl
            ms = {}
            for name, t in row.ms.items():
                floor = min(t, self.efficiency[name].launch_us / 1e3) if name in self.efficiency else 0.0
                ms[name] = round(floor + (t - floor) / ratio, 5)
            return row.model_copy(update={"ms": ms})
        how = f"{self.key} table scaled to this GPU ({target}: bandwidth x{bw:.2f}, compute x{fl:.2f})"
        return self.model_copy(update={"rows": [scaled(r) for r in self.rows], "peak_tb_per_s": bandwidth,
                                       "peak_tflops": tflops, "scaling": how, "bandwidth_ratio": bw,
                                       "compute_ratio": fl})

    def rows_for(self, problem: AttentionProblem) -> list[TimingRow]:
        """Rows whose static facts match (same entry first: its own host path and variants)."""
        key = static_key_of(problem)
        rows = [r for r in self.rows if r.bucket.static_key() == key]
        return sorted(rows, key=lambda r: r.bucket.entry != problem.entry)


def device_peaks(device: DeviceDesc) -> tuple[float, float, str]:
    """(TB/s, TFLOP/s, where from) of a device: its description's, else the known table's by name;
    0 where unknown (compute then follows the SM count, when known, against the table's GPU)."""
    known = gpu_peaks(device.name)
    bw = device.peak_tb_per_s or (known.tb_per_s if known else 0.0)
    fl = device.peak_tflops or (known.tflops if known else 0.0)
    return bw, fl, device.name


def table_paths(sm: int) -> list[Path]:
    return [path for path in sorted(MEASURED_DIR.glob("*.json*")) if _summary(path).sm == sm]


def table_path(device: DeviceDesc) -> Optional[Path]:
    """The table the device ranks by: its own (by GPU name) if fitted; else the fitted table of its
    SM with the most rows; else its own; else the first of its SM; None where its SM has none."""
    paths = table_paths(device.sm)
    key = gpu_key(device.name)
    own = [p for p in paths if key and p.name.split(".")[0] == key]
    fitted = sorted((p for p in paths if _summary(p).fitted), key=lambda p: -_summary(p).rows)
    if own and _summary(own[0]).fitted:
        return own[0]
    return (fitted or own or paths or [None])[0]


@dataclasses.dataclass(frozen=True)
class TableSummary:
    sm: int
    fitted: bool  # carries ``TimingTable.fitted``
    rows: int


@functools.lru_cache(maxsize=None)
def _summary(path: Path) -> TableSummary:
    try:
        data = read_json(path)
        return TableSummary(int(data.get("sm", -1)), bool(data.get("fitted")), len(data.get("rows", ())))
    except (OSError, ValueError):
        return TableSummary(-1, False, 0)


def forget() -> None:
    """Drop every table read so far (a tool that swaps ``MEASURED_DIR`` for another table)."""
    for cached in (_summary, load_table, table_for):
        cached.cache_clear()


@functools.lru_cache(maxsize=None)
def load_table(path: Path) -> TimingTable:
    try:
        return TimingTable.model_validate(read_json(path))
    except Exception as exc:  # a broken data file must say which file
        raise RuntimeError(f"tools/tables/data/{path.name} is invalid: {exc}") from exc


@functools.lru_cache(maxsize=None)
def table_for(device: DeviceDesc) -> Optional[TimingTable]:
    """``table_path``'s table: the device's own as measured, another GPU's scaled to its peaks
    (module doc; ``scaling`` says how, and why its own was passed over); None on the CPU or where
    nobody measured the SM."""
    if device.kind != "cuda":
        return None
    path = table_path(device)
    if path is None:
        return None
    table = load_table(path)
    key = gpu_key(device.name)
    if key and key == table.key:
        return table
    passed_over = next((p for p in table_paths(device.sm) if key and p.name.split(".")[0] == key), None)
    why = (f"; its own {key} table has no fitted times ({_summary(passed_over).rows} rows)"
           if passed_over is not None else "")
    bw, fl, name = device_peaks(device)
    known = gpu_peaks(table.gpu)
    if not fl and device.sm_count and known:  # compute follows the SM count at the same clocks
        fl = table.peak_tflops * device.sm_count / known.sms
    if not bw and not fl:
        return table.model_copy(update={"scaling": f"{table.key} table unscaled: no peak figures for "
                                                   f"{name} (capability_db/choice_table.py GPU_PEAKS){why}"})
    scaled = table.scaled_to(bw or table.peak_tb_per_s, fl or table.peak_tflops, name)
    return scaled.model_copy(update={"scaling": scaled.scaling + why}) if why else scaled


def describe(device: DeviceDesc) -> str:
    """Which table the automatic choice ranks by on ``device``, and how it was taken (``info`` and
    each bench run's environment say it)."""
    table = table_for(device)
    if table is None:
        return ("none: the priority list decides (no GPU)" if device.kind != "cuda" else
                f"none for sm_{device.sm}: the cost model and the priority list decide")
    fitted = ", fitted)" if table.fitted else ", no fit)"
    what = f"tools/tables/data/{table.key}.json ({len(table.rows)} rows{fitted}"
    how = table.scaling or "this GPU's own"
    return f"{what}; {how}"
