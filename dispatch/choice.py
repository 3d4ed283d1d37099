"""The measured choice: order the accepted candidates by their expected time, read from a table.

Called by ``router.decide`` once per (problem, size class, device): the decision is cached, so none
of this is on the per-call path, and what it does is a lookup. Evidence, best first:

1. autotune (``dispatch.autotune``: timed in a warm-up, kept in a file): times measured here for the bucket;
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

**A CUDA graph fixes its backend.** A graph replays kv lengths up to a bound (the problem's
``replay_kv``: a graph wrapper's capacity, a call's kv length bound such as ``max_seq_len``) with the
backend chosen once for all of them: a graph's candidates are ranked by their expected time summed
over the table's kv buckets from the shortest a replay may read up to that bound, at the plan's batch
and q length (``replay_points``), not by the best of one bucket. The decision is still made once (a
wrapper's at plan time) and cached with the problem; a replay looks nothing up.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import torch

import capability_db
from capability_db.choice_table import ANCHORS, KV_LENS, ChoiceTable, Sizes, key_phase, table_for

from . import autotune
from .problem import AttentionProblem, DeviceDesc, class_middle, size_class

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


@dataclass(frozen=True)
class Estimate:
    backend: str
    ms: float  # expected ms per call at the sizes it was estimated for: GPU time (+ host time, eager)
    basis: str  # "autotune" | "table"
    sizes: Sizes
    source: str
    host_us: Optional[float] = None  # the host time counted in ms (None: not counted, a CUDA graph)
    host_source: str = ""
    # a CUDA graph's estimate: the kv lengths of the buckets it spans (ms: their mean; sizes: the longest)
    replay_kvs: tuple = ()

    def short(self) -> str:
        """The estimate without its source (explain prints the sources once, not per candidate)."""
        b, q, kv = self.sizes
        gpu = self.ms - (self.host_us or 0.0) / 1e3
        if self.replay_kvs:
            return (f"{self.basis}: {gpu:.4g} ms per replay, mean over kv {self.replay_kvs[0]}..{kv} "
                    f"({len(self.replay_kvs)} buckets) at batch {b} x q {q}")
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
    # which evidence ordered them: "measured here (<ISO time>)", "the table" or "the static order"
    evidence: str = "the static order"


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


LEADING = 3  # a new bucket times the table's fastest LEADING candidates ...
WITHIN = 0.15  # ... and every other one predicted within 15% of the fastest


def leading(problem: AttentionProblem, device: DeviceDesc, accepted: list[str], sizes: tuple) -> list[str]:
    """The candidates a new bucket of the warm-up autotune times (``autotune.lookup``'s ``leading``):
    the table's LEADING fastest at the bucket, any other predicted within WITHIN of the fastest
    (GPU time, plus host time for an eager call), and every accepted one the table has no time for
    (nothing says it is slower); every accepted one where there is no table or it knows none of them."""
    table = table_for(device) if len(accepted) > LEADING else None
    if table is None:
        return list(accepted)
    gpu_ms, _ = table.gpu_ms(problem, sizes, of_class=True)
    eager = not problem.cuda_graph
    est = {n: gpu_ms[n] + (host_us(table, n, problem.entry)[0] / 1e3 if eager else 0.0)
           for n in accepted if n in gpu_ms}
    if not est:
        return list(accepted)
    order = sorted(est, key=lambda n: (est[n], accepted.index(n)))
    best = est[order[0]]
    near = [n for i, n in enumerate(order) if i < LEADING or est[n] <= best * (1 + WITHIN)]
    return near + [n for n in accepted if n not in est]


def rank(problem: AttentionProblem, device: DeviceDesc, accepted: list[str],
         sizes: Optional[Sizes] = None) -> Ranking:
    """``accepted`` (in priority order) ordered by expected time; the priority order breaks ties."""
    tuned = _kept_times(problem, device, accepted, sizes) if len(accepted) > 1 else None
    if tuned:
        return _autotuned(problem, device, accepted, tuned)
    table = table_for(device) if len(accepted) > 1 else None
    if table is None:
        why = "one candidate" if len(accepted) <= 1 else f"no choice table for {device.name} (sm {device.sm})"
        return Ranking(list(accepted), {}, f"priority list ({why})")
    wanted = sizes or ANCHORS.get(problem.phase, ANCHORS["prefill"])
    graph = problem.cuda_graph or capturing(device)
    if graph and problem.replay_kv:
        return _over_replays(problem, table, accepted, replay_points(problem, wanted, of_class=bool(sizes)))
    gpu_ms, point = table.gpu_ms(problem, wanted, of_class=bool(sizes))
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
    return _ordered(accepted, ests, basis, "the table")


def _kept_times(problem: AttentionProblem, device: DeviceDesc, accepted: list[str],
                sizes: Optional[Sizes]) -> Optional[dict[str, "autotune.Timed"]]:
    """The autotune's times for the decision (timed now inside a tuning context): a graph with a replay
    bound weighs every kv bucket it replays, as from the table (``autotune.lookup_over``). An eager
    call with a replay bound (an entry point's kv length bound) inside a tuning context times those
    buckets too: the warm-up runs eagerly, the engine captures its graphs after it (lookups only then)."""
    if not problem.replay_kv:
        return autotune.lookup(problem, device, accepted, sizes, leading)
    points = replay_points(problem, sizes or ANCHORS.get(problem.phase, ANCHORS["prefill"]), of_class=bool(sizes))
    if problem.cuda_graph or capturing(device):
        return autotune.lookup_over(problem, device, accepted, points, leading)
    if autotune.tuning(problem.entry) and autotune.may_measure():
        autotune.lookup_over(dataclasses.replace(problem, cuda_graph=True), device, accepted, points, leading)
    return autotune.lookup(problem, device, accepted, sizes, leading)


def replay_bound(max_kv: int) -> int:
    """The ``replay_kv`` of a graph that replays kv lengths up to ``max_kv``: rounded up to a power of
    two, as a size class is, so that the plans of one graph wrapper share one decision."""
    return size_class(1, 1, max_kv)[2]


def replay_points(problem: AttentionProblem, sizes: Sizes, of_class: bool = True) -> list[Sizes]:
    """The sizes a CUDA graph of ``problem`` may replay, one per kv bucket: the plan's batch and q
    length (a class at its middle), kv at the shortest a replay reads (the table's first bucket; a
    prefill's kv holds its own queries), every grid bucket between, and ``replay_kv``."""
    b, q, _ = class_middle(tuple(sizes)) if of_class else sizes
    shortest = KV_LENS[0] if key_phase(problem) == "decode" else max(KV_LENS[0], q)
    longest = max(problem.replay_kv, shortest)
    kvs = [shortest] + [g for g in KV_LENS if shortest < g < longest] + ([longest] if longest > shortest else [])
    return [(b, q, kv) for kv in kvs]


def _over_replays(problem: AttentionProblem, table: ChoiceTable, accepted: list[str],
                  points: list[Sizes]) -> Ranking:
    """``accepted`` ordered by expected GPU time summed over ``points`` (``replay_points``): a graph
    runs its one backend at every kv length it replays. Where the table leaves a backend out at a
    point (slower there than those it keeps), it counts as ``keep_within`` times that point's fastest,
    as between grid points; one the table has at no point goes after the rest."""
    read = [table.gpu_ms(problem, p, of_class=False) for p in points]
    read = [(gpu_ms, at) for gpu_ms, at in read if gpu_ms]
    basis = f"CUDA graph: lowest total expected time over kv buckets {points[0][2]}..{points[-1][2]}"
    if not read:
        return Ranking(list(accepted), {}, f"priority list (no table entry for this problem in {table.source})")
    keep = table.data.get("keep_within", 2.5)
    kvs = tuple(at[2] for _, at in read)
    ests = {}
    for n in (n for n in accepted if any(n in gpu_ms for gpu_ms, _ in read)):
        total = sum(gpu_ms.get(n, min(gpu_ms.values()) * keep) for gpu_ms, _ in read)
        ests[n] = Estimate(n, total / len(read), "table", read[-1][1], table.source, replay_kvs=kvs)
    b, q, _ = read[-1][1]
    basis += (f" ({', '.join(map(str, kvs))}) at batch {b} x q {q}: the graph runs its one backend at every "
              f"kv length it replays, up to {problem.replay_kv} ({table.source}); GPU time only")
    return _ordered(accepted, ests, basis, "the table")


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
    when = max((t.measured for t in tuned.values() if t.measured), default="at a time the file does not say")
    basis = f"measured here ({when})" + ("; GPU time only (CUDA graph)" if graph
                                         else "; GPU time + host time per eager call" if counted else "")
    if graph and problem.replay_kv:
        basis += f", the mean over the kv buckets it replays up to {problem.replay_kv}"
    return _ordered(accepted, ests, basis, f"measured here ({when})")


def _ordered(accepted: list[str], ests: dict[str, Estimate], basis: str, evidence: str) -> Ranking:
    """Estimated backends fastest first (those within TIE of the best in priority order), then the
    ones without an estimate in priority order."""
    timed = [n for n in accepted if n in ests]
    if not timed:
        return Ranking(list(accepted), {}, basis)
    best = min(ests[n].ms for n in timed)
    near = [n for n in timed if ests[n].ms <= best * (1 + TIE)]
    order = near + sorted((n for n in timed if n not in near), key=lambda n: (ests[n].ms, timed.index(n)))
    order += [n for n in accepted if n not in ests]
    return Ranking(order, ests, basis, {n: ests[n].ms / best for n in timed}, evidence=evidence)

