"""The fit's ranking: order the accepted candidates by their expected time (what the tables compile).

The router does not call it: its tables are compiled from the fit (``tools.tables.compile``), and
the tools that judge a fit before it is compiled replay the router through it (``ranking_by_the_fit``).
Evidence, best first, for each accepted backend:

1. (the router's own ranking only: autotune times measured on this machine for the bucket);
2. the GPU's timing table (tools/tables/data/<gpu>.json.gz): a row whose static facts match
   the problem (phase, heads ratio, head dims, dtypes, causal, window / soft cap / sinks) at its
   sizes and KV heads; else the table's fit (``TimingTable.fitted``: per backend, log2 GPU ms
   linear in ``measured.features``, plus boosted trees on those fits' errors; cross-validated on
   about 1800 random problems measured on the H200, 77% within 3% of the fastest, 79% among the
   backends a graph captures; the nearest row alone reached 53% on a smaller set); else (a table
   without a fit) the nearest row, scaled to the wanted sizes by the cost model's ratio;
3. the cost model: decode-shaped, launch floor + bytes / (bandwidth efficiency x peak); prefill,
   launch floor + max(bytes / 90% of peak, FLOPs / (compute efficiency x peak)), at the backend's
   efficiencies measured on this GPU (a default where it has none); divided by the share of SMs
   a query-tiled kernel keeps busy (``occupancy``: few queries over many keys on cuDNN or fa3).

**What a call costs.** An eager call costs the backend's GPU time *and* its host path (the Python,
planning and launch work before the call returns: 10x the kernel on small problems for some
paths); a call captured in a CUDA graph replays its kernels alone. So a backend's expected time
is GPU time + host time for an eager call, GPU time alone when the problem declares a CUDA graph
(``cuda_graph``: the wrapper's ``use_cuda_graph``, cuDNN's ``is_cuda_graph_compatible``) or the
decision is made during capture (``capturing``: part of the router's decision key). Host time,
best first: the table's (backend, entry point) figure (``TimingTable.host_us``, from ``bench
--host-cost`` or the bench rows' median), the median of the matching rows' ``host_us``, else
``DEFAULT_HOST_US`` (tables written before host times existed keep working).

The entry point's own list (priorities.json ``entry_first``) stays ahead of the family's list
where no row measured through this entry point timed two candidates: its reasons are about the
entry's calling convention (device-side lengths, which FlashInfer's fa2/fa3 re-plan on the host
every call), which rows measured through other entry points do not carry. Where the fit served
the estimates (it knows the entry point), one tier: a backend that plans per call through this
entry (capability data ``plans_per_call``) is estimated at its kernel's fitted GPU time plus its
host path there, the plan and its sync included. Estimates order the candidates within each tier.

With sizes (the problem's size class) the estimates are made at the class's middle
(``class_middle``: 3/4 of each power of two, where the autotune times it too), not at its top, which
would judge every call of the class at its largest (cross-validated on about 2200 random problems
measured on the H200: 1799 of 2211 within 3% against 1781 of 2208).

Without sizes (the router's problem key holds none) a backend's score is the geometric mean,
over the matching rows' sizes (or the phase's anchor sizes), of its estimate over the best
estimate there. Scores within TIE of the best keep the static priority order; no timing table
(the CPU, an unmeasured GPU): the priority order alone.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional
from unittest import mock

import capability_db
from capability_db.choice_table import ANCHORS

from . import measured
from .measured import (QUERY_TILE, SMS, Efficiency, TimingRow, TimingTable, features, gpu_peaks, Sizes, table_for,
                       work)

from capability_db.vocabulary import AttentionProblem, DeviceDesc, class_middle

TIE = 0.03  # estimates within 3% are a tie: the priority list decides
PREFILL_BANDWIDTH = 0.9  # share of peak bandwidth any backend streams on prefill-shaped work
DEFAULT_EFFICIENCY = Efficiency(bandwidth=0.5, compute=0.3, launch_us=10.0, source="default (not measured)")
SLOW_EFFICIENCY = {"reference": Efficiency(bandwidth=0.02, compute=0.005, launch_us=200.0,
                                           source="default: PyTorch reference, unfused")}


# the defaults of host time, the capture test and plans_per_call are the product's (dispatch.choice)
from dispatch import choice  # noqa: E402
from dispatch.choice import DEFAULT_HOST_US, UNKNOWN_HOST_US, capturing, plans_per_call  # noqa: E402,F401


def host_us(table: TimingTable, rows: list[TimingRow], backend: str, entry: str) -> tuple[float, str]:
    """(host us per eager call of ``backend`` on ``entry``, where the figure comes from)."""
    measured = table.host_us.get(backend, {})
    if entry in measured:
        return measured[entry], "measured"
    seen = [r.host_us[backend] for r in rows if backend in r.host_us and r.bucket.entry == entry] or \
        [r.host_us[backend] for r in rows if backend in r.host_us]
    if seen:
        return statistics.median(seen), "measured rows"
    if measured:
        return statistics.median(measured.values()), "measured on other entry points"
    return DEFAULT_HOST_US.get(backend, UNKNOWN_HOST_US), "default"


@dataclass(frozen=True)
class Estimate(choice.Estimate):
    """The product's estimate (``dispatch.choice.Estimate``) and how a row at other sizes became it."""

    note: str = ""

    def short(self) -> str:
        head, host, tail = super().short().partition(" + host")
        return (f"{head} ({self.note})" if self.note else head) + host + tail


@dataclass(frozen=True)
class Ranking:
    order: list[str]  # accepted backends, fastest expected first
    estimates: dict[str, Estimate]  # the evidence behind each place (at the problem's sizes)
    basis: str  # one line for explain()
    scores: dict[str, float] = field(default_factory=dict)  # what the order sorts (time / fastest's)
    points: int = 1  # sizes the scores are a geometric mean over
    evidence: str = "the static order"  # which evidence ordered them (the router's Decision.evidence)


def model_ms(table: TimingTable, backend: str, problem: AttentionProblem, sizes: Sizes) -> float:
    e = table.efficiency.get(backend) or SLOW_EFFICIENCY.get(backend) or DEFAULT_EFFICIENCY
    moved, flops = work(problem, sizes)
    if sizes[1] == 1:  # decode-shaped: the K/V read is the time (its efficiency was measured on such rows)
        seconds = moved / (e.bandwidth * table.peak_tb_per_s * 1e12)
    else:  # a backend's decode efficiency says nothing of its bandwidth on prefill tiles
        seconds = max(moved / (PREFILL_BANDWIDTH * table.peak_tb_per_s * 1e12),
                      flops / (e.compute * table.peak_tflops * 1e12))
    return e.launch_us / 1e3 + seconds * 1e3 / occupancy(table, backend, problem, sizes)


DEFAULT_SMS = SMS  # an H100 / H200 SXM, where the table names a GPU of unknown SM count


def occupancy(table: TimingTable, backend: str, problem: AttentionProblem, sizes: Sizes) -> float:
    """The share of the SMs one call keeps busy (the efficiencies were measured on calls that fill
    the GPU): 1 for a kernel that splits a request's keys over blocks; for one that runs a block per
    (request, query head, tile of queries) (capability data ``parallelism``), those blocks over the
    SMs. A few queries over many keys on such a kernel leave most SMs idle (H200: single prefill
    1 x 91 x 70435 on 4 heads took cuDNN 1.75 ms against fa2's 0.136)."""
    try:
        parallelism = capability_db.backend_caps(backend).parallelism
    except ValueError:  # a backend the data does not know (a test's fake): no term
        return 1.0
    if parallelism != "query_tiles":
        return 1.0
    peaks = gpu_peaks(table.gpu)
    b, q, _ = sizes
    return min(1.0, b * problem.num_qo_heads * math.ceil(q / QUERY_TILE) / (peaks.sms if peaks else DEFAULT_SMS))


def _sizes(row: TimingRow) -> Sizes:
    return (row.bucket.batch, row.bucket.q_len, row.bucket.kv_len)


def _distance(a: Sizes, b: Sizes) -> float:
    return sum(abs(math.log2(x) - math.log2(y)) for x, y in zip(a, b))


def _as_measured(row: TimingRow, problem: AttentionProblem) -> AttentionProblem:
    """The problem with the row's head counts (where the row recorded them): what the row timed."""
    kv_heads = row.bucket.num_kv_heads
    if not kv_heads or kv_heads == problem.num_kv_heads:
        return problem
    return dataclasses.replace(problem, num_kv_heads=kv_heads, num_qo_heads=kv_heads * row.bucket.gqa_group)


def _apart(row: TimingRow, problem: AttentionProblem, sizes: Sizes) -> float:
    """How far the row is from the problem at ``sizes``: log2 steps of batch, queries, keys and
    KV heads (the heads count as the batch does: both multiply the blocks and the bytes)."""
    kv_heads = row.bucket.num_kv_heads or problem.num_kv_heads
    return _distance(_sizes(row), sizes) + abs(math.log2(kv_heads) - math.log2(problem.num_kv_heads))


def _timed(row: TimingRow, backend: str, entry: str) -> bool:
    """Whether the row timed ``backend`` on a path it takes through ``entry``: a backend that plans
    again on every call through some entry points (capability data ``plans_per_call``) is timed
    there with host syncs in its GPU time, comparable with that entry point's rows alone."""
    if backend not in row.ms:
        return False
    per_call = plans_per_call(backend)
    return row.bucket.entry == entry or (row.bucket.entry not in per_call and entry not in per_call)


def shared_row(rows: list[TimingRow], accepted: list[str], problem: AttentionProblem,
               sizes: Sizes) -> Optional[TimingRow]:
    """The complete row (``TimingRow.complete``) nearest ``sizes`` that timed at least two of the
    candidates (more of them breaking ties): the one place where they were measured side by side."""
    def timed(r: TimingRow) -> int:
        return sum(_timed(r, n, problem.entry) for n in accepted)
    shared = [r for r in rows if r.complete and timed(r) >= 2]
    return min(shared, key=lambda r: (_apart(r, problem, sizes), -timed(r)), default=None)


def estimate(table: TimingTable, rows: list[TimingRow], backend: str, problem: AttentionProblem,
             sizes: Sizes, where: str, anchor: Optional[TimingRow] = None,
             fitted_here: Optional[dict[str, float]] = None) -> Estimate:
    """The backend's expected ms at ``sizes``: a row measured there; else the table's fit of the
    backend's times (``TimingTable.fitted``); else the nearest row scaled by the model (``anchor``,
    the shared row, when it timed this backend: candidates compared where they were measured side
    by side, not each at its own nearest row); else the cost model. ``fitted_here``: the table's
    ``fitted_times`` at ``sizes``, when the caller has them. A backend that plans on every call
    through this entry point is never estimated from its rows there: their times hold its host path
    (``_timed``), which the eager estimate adds as its host time (``host_us``)."""
    per_call = problem.entry in plans_per_call(backend)
    measured = [r for r in rows if _timed(r, backend, problem.entry) and not per_call]
    there = [r for r in measured if _apart(r, problem, sizes) == 0]
    if there:
        return Estimate(backend, there[0].ms[backend], "measured", sizes, there[0].source)
    fits = fitted_times(table, problem, sizes) if fitted_here is None else fitted_here
    fitted = fits.get(backend)
    if fitted is not None:
        placed = ("; placed among the others by the pairwise model of time ratios"
                  if table.fitted.pair_trees and len(fits) > 1 else "")
        return Estimate(backend, fitted, "fitted", sizes, table.fitted.source,
                        note=f"fit of {table.fitted.rows[backend]} timed problems{placed}")
    if measured:
        near = anchor if anchor is not None and _timed(anchor, backend, problem.entry) else min(
            measured, key=lambda r: _apart(r, problem, sizes))
        timed = _as_measured(near, problem)
        scale = model_ms(table, backend, problem, sizes) / model_ms(table, backend, timed, _sizes(near))
        b, q, kv = _sizes(near)
        heads = "" if timed is problem else f", {timed.num_qo_heads}/{timed.num_kv_heads} heads"
        return Estimate(backend, near.ms[backend] * scale, "measured, scaled", sizes, near.source,
                        note=f"{near.ms[backend]:.4g} ms at {b} x {q} x {kv}{heads} times the model's ratio")
    how = f"its efficiency on the {where}" if backend in table.efficiency else "a default efficiency"
    return Estimate(backend, model_ms(table, backend, problem, sizes), "model", sizes, f"cost model at {how}")


def fitted_ms(table: TimingTable, backend: str, problem: AttentionProblem, sizes: Sizes) -> Optional[float]:
    """The table's fitted GPU ms of the backend, or None (``fitted_times``)."""
    return fitted_times(table, problem, sizes).get(backend)


def fitted_times(table: TimingTable, problem: AttentionProblem, sizes: Sizes,
                 eager: bool = False) -> dict[str, float]:
    """The table's fitted GPU ms of each backend it fitted, estimated together (the pairwise model
    places them: ``FittedTimes.log2_ms_among``); none where the fit never saw the entry point. A
    backend that plans again on every call through this entry point, which a graph never captures
    there, is estimated for an ``eager`` call only: its kernel's time as the fit of its other entry
    points gives it (the same kernels; its host path, the plan and its sync, is its host time's). The
    pairwise model's places depend on which backends it places, so a graph's choice places only
    those a graph may capture. On a scaled table, scaled as its rows are."""
    if table.fitted is None:
        return {}
    among = [n for n in table.fitted.coef if eager or problem.entry not in plans_per_call(n)]
    ratio = table.bandwidth_ratio if sizes[1] == 1 else table.compute_ratio
    out = {}
    for backend, log2_ms in table.fitted.log2_ms_among(among, features(problem, sizes)).items():
        ms = 2.0 ** log2_ms
        floor = min(ms, table.efficiency[backend].launch_us / 1e3) if backend in table.efficiency else 0.0
        out[backend] = floor + (ms - floor) / ratio
    return out


def rank(problem: AttentionProblem, device: DeviceDesc, accepted: list[str],
         sizes: Optional[Sizes] = None) -> Ranking:
    """``accepted`` (in priority order) ordered by expected time; the priority order breaks ties."""
    table = table_for(device) if len(accepted) > 1 else None
    if table is None:
        why = "one candidate" if len(accepted) <= 1 else f"no timing table for {device.name} (sm {device.sm})"
        return Ranking(list(accepted), {}, f"priority list ({why})")
    where = f"{table.gpu} (tools/tables/data" + (f"; {table.scaling})" if table.scaling else ")")
    rows = table.rows_for(problem)
    # a size class is judged at its middle, where the autotune times it too (at its top, as its largest call)
    points = ([class_middle(sizes)] if sizes else sorted({_sizes(r) for r in rows})
              or [ANCHORS.get(problem.phase, ANCHORS["prefill"])])
    anchors = [shared_row(rows, accepted, problem, pt) if sizes else None for pt in points]
    graph = problem.cuda_graph or capturing(device)
    hosts = {n: host_us(table, rows, n, problem.entry) for n in accepted}
    fits = [fitted_times(table, problem, pt, eager=not graph) for pt in points]
    per_point = [{n: _counted(estimate(table, rows, n, problem, pt, where, anchor, fit), hosts[n], graph)
                  for n in accepted} for pt, anchor, fit in zip(points, anchors, fits)]
    scores = {n: math.exp(sum(math.log(ests[n].ms / min(e.ms for e in ests.values())) for ests in per_point)
                          / len(per_point)) for n in accepted}
    if anchors[0] is not None:  # not timed at the shared row: after those that were (a far row or the
        for n in accepted:      # cost model alone is no evidence against a side-by-side measurement)
            if not _timed(anchors[0], n, problem.entry) and per_point[0][n].basis != "fitted":
                scores[n] += UNMEASURED_BEHIND
    shown = min(per_point, key=lambda ests: _distance(ests[accepted[0]].sizes, ANCHORS.get(problem.phase, (1, 1, 1))))
    fitted = any(e.basis == "fitted" for ests in per_point for e in ests.values())
    basis = (f"measured time ({len(rows)} matching rows of {where}" + ("; the fit of its times elsewhere)" if fitted
                                                                        else ")") if rows
             else f"fitted time ({where}: no row matches this problem's facts)" if fitted
             else f"cost model ({where}: no row matches this problem's facts)")
    basis += "; GPU time only (CUDA graph)" if graph else "; GPU time + host time per eager call"
    if sizes:
        basis += f"; at {' x '.join(map(str, points[0]))}, the middle of the size class {_class_text(sizes)}"
    return _ordered(accepted, shown, scores, basis, _entry_tier(problem, device, rows, accepted, fitted),
                    len(per_point))


def _class_text(sizes: Sizes) -> str:
    """The sizes one decision serves: batch x q x kv, each (N/2, N] of its power of two."""
    return " x ".join(str(n) if n <= 2 else f"{n // 2 + 1}-{n}" for n in sizes)


def _counted(est: Estimate, host: tuple[float, str], graph: bool) -> Estimate:
    """The estimate of what the call costs: GPU time, plus the host path for an eager call."""
    return est if graph else est.with_host(*host)


UNMEASURED_BEHIND = 1e6  # added to a score: behind every candidate of the shared row, order kept


def _entry_tier(problem: AttentionProblem, device: DeviceDesc, rows: Optional[list[TimingRow]] = None,
                accepted: Optional[list[str]] = None, fitted: bool = False) -> set[str]:
    """The backends ahead on this entry point. Where the table's fit served the estimates (it was
    fitted through every entry point), every backend: one that plans per call here (``plans_per_call``)
    is estimated at its kernel's fitted time plus its host path, the plan and its sync included (it
    used to go behind every other, and lost: H100, cudnn 2 x 13684 x 13684 d256, fa3 at 28.9 ms a call
    against the 85.4 of the cuDNN it took). Else the entry
    point's own list (ahead of the family's list on a GPU), unless rows measured through this
    entry point timed two of the candidates side by side: those times carry the entry's calling
    convention (its host path included), which the list stands in for where nothing was measured."""
    if device.kind != "cuda":
        return set()
    if fitted and accepted:
        return set(accepted)
    if rows and accepted and any(r.bucket.entry == problem.entry and sum(n in r.ms for n in accepted) >= 2
                                 for r in rows):
        return set()
    return {e.backend for e in capability_db.priorities().entry_first.get(problem.entry, [])}


def _ordered(accepted: list[str], ests: dict[str, Estimate], scores: dict[str, float], basis: str,
             first_tier: set[str], points: int = 1) -> Ranking:
    """The entry's own tier, then the rest; within each, fastest first, scores within TIE of the
    tier's best in the priority order."""
    order: list[str] = []
    for tier in ([n for n in accepted if n in first_tier], [n for n in accepted if n not in first_tier]):
        if not tier:
            continue
        best = min(scores[n] for n in tier)
        near = [n for n in tier if scores[n] <= best * (1 + TIE)]
        order += near + sorted((n for n in tier if n not in near), key=lambda n: (scores[n], tier.index(n)))
    best = min(scores.values(), default=1.0)
    return Ranking(order, ests, basis, {n: scores[n] / best for n in order}, points, evidence="the fit")


@contextlib.contextmanager
def ranking_by_the_fit(measured_dir: Optional[Path] = None) -> Iterator[None]:
    """Within: the router ranks by the fit (``rank``, over the timing tables of ``measured_dir``;
    default tools/tables/data) instead of its compiled tables: what a replay judges of a fit not
    compiled yet (a cross-validation fold, one GPU's table against another's). Every table and
    decision cached so far is dropped on the way in and on the way out."""
    from dispatch import choice, router
    with mock.patch.object(choice, "rank", rank), \
            mock.patch.object(measured, "MEASURED_DIR", measured_dir or measured.MEASURED_DIR):
        measured.forget()
        router.clear_caches()
        try:
            yield
        finally:
            measured.forget()
            router.clear_caches()
