"""The measured choice: order the accepted candidates by their expected time, read from a table.

Called by ``router.decide`` once per (problem, size class, device): the decision is cached, so none
of this is on the per-call path, and what it does is a lookup. Evidence, best first:

1. autotune (``dispatch.autotune``, opt-in): times measured on this machine for the bucket;
2. the GPU's choice table (capability_db/tables/<gpu>.json, ``capability_db.choice_table``): each
   backend's expected GPU time at the size class, compiled ahead of time from the fit of every call
   timed on that GPU (its own table, or its SM's scaled to its bandwidth and compute);
3. neither (the CPU, an SM nobody measured, one candidate): the priority list alone.

**What a call costs.** An eager call costs the backend's GPU time *and* its host path (the Python,
planning and launch work before the call returns: 10x the kernel on small problems for some paths);
a call captured in a CUDA graph replays its kernels alone. So a backend's expected time is GPU time +
host time for an eager call, GPU time alone when the problem declares a CUDA graph (``cuda_graph``)
or the decision is made during capture (``capturing``: part of the router's decision key). Host
time: the table's measured figure for (backend, entry point), else ``DEFAULT_HOST_US``.

A size class is judged at its middle (``class_middle``); without sizes at the phase's anchor sizes.
Estimates within ``TIE`` of the fastest keep the priority order; a backend the table leaves out at
that point (slower there than the ones it keeps) goes after those it has, in priority order.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

import capability_db
from capability_db.choice_table import ANCHORS, ChoiceTable, Sizes, table_for

from . import autotune
from .problem import AttentionProblem, DeviceDesc

TIE = 0.03  # estimates within 3% are a tie: the priority list decides

# Host microseconds per eager call of each backend's path where the table has no measured figure:
# warm calls of a repeated shape on an H100/H200 host (docs/benchmarks.md, host cost per call);
# the unfused PyTorch reference far more.
DEFAULT_HOST_US = {"fa2": 25.0, "fa3": 35.0, "xqa": 25.0, "trtllm-gen": 30.0, "cudnn": 50.0, "torch-flash": 30.0,
                   "native-triton": 25.0, "reference": 500.0}
UNKNOWN_HOST_US = 40.0  # a backend missing from DEFAULT_HOST_US

_CUDA = torch.cuda.is_available()  # a CPU-only torch cannot even ask (a described GPU: never capturing)


def capturing(device: DeviceDesc) -> bool:
    """Whether the current CUDA stream is capturing a graph (then only GPU time counts)."""
    return device.kind == "cuda" and _CUDA and torch.cuda.is_current_stream_capturing()


def with_properties(desc: DeviceDesc, props: Any) -> DeviceDesc:
    """``desc`` with what the live GPU's properties say: SM count, and peak HBM bandwidth
    (2 x memory clock x bus width) where this torch reports them (else 0: the name decides)."""
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    bandwidth = round(2 * clock_khz * 1e3 * bus_bits / 8 / 1e12, 3) if clock_khz and bus_bits else 0.0
    return dataclasses.replace(desc, sm_count=int(getattr(props, "multi_processor_count", 0) or 0),
                               peak_tb_per_s=bandwidth)


@dataclass(frozen=True)
class Estimate:
    backend: str
    ms: float  # expected ms per call at the sizes it was estimated for: GPU time (+ host time, eager)
    basis: str  # "autotune" | "table"
    sizes: Sizes
    source: str
    host_us: Optional[float] = None  # the host time counted in ms (None: not counted, a CUDA graph)
    host_source: str = ""

    def short(self) -> str:
        """The estimate without its source (explain prints the sources once, not per candidate)."""
        b, q, kv = self.sizes
        gpu = self.ms - (self.host_us or 0.0) / 1e3
        text = f"{self.basis}: {gpu:.4g} ms at batch {b} x q {q} x kv {kv}"
        if self.host_us is not None:  # an eager call: what its host path adds
            text += f" + host {self.host_us:.3g} us ({self.host_source}) = {self.ms:.4g} ms"
        return text

    def describe(self) -> str:
        return f"{self.short()} ({self.source})"

    def with_host(self, us: float, source: str) -> "Estimate":
        return dataclasses.replace(self, ms=self.ms + us / 1e3, host_us=us, host_source=source)


@dataclass(frozen=True)
class Ranking:
    order: list[str]  # accepted backends, fastest expected first
    estimates: dict[str, Estimate]  # the evidence behind each place
    basis: str  # one line for explain()
    scores: dict[str, float] = field(default_factory=dict)  # time / the fastest's
    points: int = 1  # kept for explain's layout: one grid point per decision


def host_us(table: Optional[ChoiceTable], backend: str, entry: str) -> tuple[float, str]:
    """(host us per eager call of ``backend`` on ``entry``, where the figure comes from)."""
    measured = table.host_us(backend, entry) if table is not None else None
    if measured is not None:
        return measured, "measured"
    return DEFAULT_HOST_US.get(backend, UNKNOWN_HOST_US), "default"


def plans_per_call(backend: str) -> list[str]:
    """The entry points through which ``backend`` plans again on every call (capability data)."""
    try:
        return capability_db.backend_caps(backend).plans_per_call
    except ValueError:  # a backend the data does not know (FlashInfer's own call, a test's fake): one path
        return []


def rank(problem: AttentionProblem, device: DeviceDesc, accepted: list[str],
         sizes: Optional[Sizes] = None) -> Ranking:
    """``accepted`` (in priority order) ordered by expected time; the priority order breaks ties."""
    tuned = autotune.lookup(problem, device, accepted, sizes) if len(accepted) > 1 else None
    if tuned:
        return _autotuned(problem, device, accepted, tuned)
    table = table_for(device) if len(accepted) > 1 else None
    if table is None:
        why = "one candidate" if len(accepted) <= 1 else f"no choice table for {device.name} (sm {device.sm})"
        return Ranking(list(accepted), {}, f"priority list ({why})")
    wanted = sizes or ANCHORS.get(problem.phase, ANCHORS["prefill"])
    gpu_ms, point = table.gpu_ms(problem, wanted, of_class=bool(sizes))
    graph = problem.cuda_graph or capturing(device)
    ests = {}
    for n in accepted:
        if n in gpu_ms:
            est = Estimate(n, gpu_ms[n], "table", point, table.source)
            ests[n] = est if graph else est.with_host(*host_us(table, n, problem.entry))
    where = (f"the size class {_class_text(sizes)} read at {' x '.join(map(str, point))}" if sizes
             else f"the phase's anchor sizes, read at {' x '.join(map(str, point))}")
    basis = (f"expected time ({table.source}; {where})" if ests
             else f"priority list (no table entry for this problem in {table.source})")
    basis += "; GPU time only (CUDA graph)" if graph else "; GPU time + host time per eager call"
    return _ordered(accepted, ests, basis)


def _class_text(sizes: Sizes) -> str:
    """The sizes one decision serves: batch x q x kv, each (N/2, N] of its power of two."""
    return " x ".join(str(n) if n <= 2 else f"{n // 2 + 1}-{n}" for n in sizes)


def _autotuned(problem: AttentionProblem, device: DeviceDesc, accepted: list[str],
               tuned: dict[str, "autotune.Timed"]) -> Ranking:
    """The GPU times measured on this machine, side by side, plus (an eager call) each backend's host
    time timed with them (else the table's for its path on this entry point). A backend whose timing
    failed goes last."""
    table = table_for(device)
    graph = problem.cuda_graph or capturing(device)
    ests = {}
    for n, t in tuned.items():
        est = Estimate(n, t.ms, "autotune", t.sizes, autotune.describe_cache())
        if not graph and t.host_us is not None:
            est = est.with_host(t.host_us, "autotune")
        elif not graph and table is not None:
            est = est.with_host(*host_us(table, n, problem.entry))
        ests[n] = est
    counted = table is not None or any(t.host_us is not None for t in tuned.values())
    basis = "autotune (timed on this machine)" + ("; GPU time only (CUDA graph)" if graph
                                                  else "; GPU time + host time per eager call" if counted else "")
    return _ordered(accepted, ests, basis)


def _ordered(accepted: list[str], ests: dict[str, Estimate], basis: str) -> Ranking:
    """Estimated backends fastest first (those within TIE of the best in priority order), then the
    ones without an estimate in priority order."""
    timed = [n for n in accepted if n in ests]
    if not timed:
        return Ranking(list(accepted), {}, basis)
    best = min(ests[n].ms for n in timed)
    near = [n for n in timed if ests[n].ms <= best * (1 + TIE)]
    order = near + sorted((n for n in timed if n not in near), key=lambda n: (ests[n].ms, timed.index(n)))
    order += [n for n in accepted if n not in ests]
    return Ranking(order, ests, basis, {n: ests[n].ms / best for n in timed})

