"""Measured timings per GPU (``measured/<gpu>.json``): what the router ranks accepted backends by.

A table holds rows of measurements (one problem: its bucket, and the ms per call of every
backend measured there) plus, for the cost model of buckets nobody measured, the GPU's peak
bandwidth and compute and each backend's measured efficiency per phase (achieved / peak) and
launch cost. ``attn-dispatch bench --to-table`` writes one from a bench run; the first H100
table was built from tools/results/*-h100.json. Loaded lazily (first decision on a GPU of
that SM), validated by pydantic; this module imports nothing of dispatch.

A bucket's static facts (``Bucket.static_key``: phase, GQA group, head dims, dtypes, causal,
window / soft cap / sinks on or off) must equal the problem's for a row to apply; its sizes
(batch, q_len, kv_len) say how near the row is.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from .vocabulary import AttentionProblem, DeviceDesc

MEASURED_DIR = Path(__file__).resolve().parent / "measured"
# (batch, q_len, kv_len) a phase is judged at when the sizes are not known (the anchor workloads)
ANCHORS = {"decode": (64, 1, 4096), "prefill": (8, 2048, 2048), "spec_decode": (64, 4, 4096)}


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
    ms: dict[str, float]  # backend -> ms per call (eager, warm, L2-cold K/V)
    source: str  # the results file (and problem) it came from


class Efficiency(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    bandwidth: float = Field(gt=0, le=1.5)  # achieved / peak bytes per second on decode-shaped work
    compute: float = Field(gt=0, le=1.5)  # achieved / peak FLOP/s on prefill-shaped work
    launch_us: float = Field(ge=0)  # the floor of one call's GPU time
    source: str


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

    def rows_for(self, problem: AttentionProblem) -> list[TimingRow]:
        """Rows whose static facts match (same entry first: its own host path and variants)."""
        key = static_key_of(problem)
        rows = [r for r in self.rows if r.bucket.static_key() == key]
        return sorted(rows, key=lambda r: r.bucket.entry != problem.entry)


def table_path(device: DeviceDesc) -> Optional[Path]:
    for path in sorted(MEASURED_DIR.glob("*.json")):
        if _sm_of(path) == device.sm:
            return path
    return None


@functools.lru_cache(maxsize=None)
def _sm_of(path: Path) -> int:
    try:
        return int(json.loads(path.read_text()).get("sm", -1))
    except (OSError, ValueError):
        return -1


@functools.lru_cache(maxsize=None)
def table_for(device: DeviceDesc) -> Optional[TimingTable]:
    """The timing table of the device's SM, or None (CPU, or a GPU nobody measured)."""
    if device.kind != "cuda":
        return None
    path = table_path(device)
    if path is None:
        return None
    try:
        return TimingTable.model_validate(json.loads(path.read_text()))
    except Exception as exc:  # a broken data file must say which file
        raise RuntimeError(f"capability_db: measured/{path.name} is invalid: {exc}") from exc
