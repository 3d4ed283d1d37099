"""The router's choice today, replayed against times a sweep measured (no GPU needed).

A sweep's own ``auto`` column measured the choice of the timing table in force *when it ran*;
after the table learns from that sweep, ``replay`` asks the router (``router.decide`` on the
sweep's GPU, not live) what it would choose now for each measured problem, and reads that
backend's measured time. Two choices, as the router makes them: for a call captured in a CUDA
graph (GPU time alone counts; ``regret`` = its GPU ms / the fastest's - 1; ``graph_regret``
against the backends a graph can capture only: fa2 and fa3 cannot through our adapters,
capability data ``cuda_graph``) and for an eager call (GPU + host time; ``cost_regret`` by that
sum). Each also against FlashInfer's own call where it ran: ``over_flashinfer`` (GPU ms) and
``cost_over_flashinfer`` (GPU + host), unless that call is known to compute something else there
(``build.flashinfer_own_wrong``). A choice the sweep did not time (a backend it did not
force) is listed and left out of the figures. The problem is rebuilt from
the bench problem as the entry points build it (layouts and phases as ``build`` calls them).

    python -m tools.lab.replay BENCH.json [BENCH.json ...] [--autotune-file FILE] [--out DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Optional

import capability_db
from backends._providers import defect_facts
from dispatch import autotune, router
from dispatch.benchmark.build import flashinfer_own_wrong
from dispatch.benchmark.problems import entry_of, problem_of
from dispatch.benchmark.report import regret_figures
from dispatch.benchmark.runner import call_cost, eager_cost_ms

from .figures import ratio_figures
from .table import FROM, merged, recorded_problem, sweep_device


def replay(results: dict, host_now: Optional[dict[str, dict[str, float]]] = None,
           autotune_file: Optional[Path] = None) -> list[dict]:
    """Per measured problem: today's choice, its measured ms, the fastest, the regret (None when
    the choice was not timed). ``host_now`` (a table's ``host_us``: backend -> entry -> us): judge
    the eager choice by those host times instead of the rows' own, for rows measured before a
    backend's host path changed (their host times are of a path that no longer runs).
    ``autotune_file`` (an autotune sweep's ``-cache.json``): the choice from the times the autotune
    kept there, as it ran, so a miss names the autotune's times against the problem's."""
    if autotune_file is not None:
        with autotune.replaying(autotune_file):
            return replay(results, host_now)
    env = results["environment"]
    device = sweep_device(env)
    rows = []
    for r in results["results"]:
        if "backends" not in r:
            continue
        p = recorded_problem(r)
        timed = {b["backend"]: b["eager_ms"] for b in r["backends"]
                 if b["backend"] not in ("auto", "flashinfer") and b.get("status") == "ok" and b.get("eager_ms")}
        if r.get("auto") and r.get("auto_ms") and r["auto"] not in timed:  # a backend only auto ran (fa3 off d128)
            timed[r["auto"]] = r["auto_ms"]
        if not timed:
            continue
        problem = problem_of(p)
        gated = defect_gated(env, problem, device, r["backends"])
        graph = router.decide(dataclasses.replace(problem, cuda_graph=True), device, live=False)
        chosen, capturable = automatic(graph, gated), [n for n in graph.accepted() if n in timed]
        eager_decision = router.decide(problem, device, live=False)
        eager = automatic(eager_decision, gated)
        fastest = min(timed, key=timed.__getitem__)
        ms = timed.get(chosen)
        entry = entry_of(p.entry)
        cost = call_cost(r["backends"], r.get("auto"), entry)  # eager GPU + host, as the choice counts it
        now = {n: hosts[entry] for n, hosts in (host_now or {}).items() if entry in hosts}
        costs = {b["backend"]: eager_cost_ms(b, b["backend"], entry, now.get(b["backend"])) for b in r["backends"]
                 if b["backend"] in timed and b.get("host_us") is not None}
        own = next((b for b in r["backends"] if b["backend"] == "flashinfer" and b.get("status") == "ok"
                    and not flashinfer_own_wrong(p, env)), {})
        own_cost = eager_cost_ms(own, "flashinfer", entry) if own.get("host_us") else None
        regret = None if ms is None else ms / timed[fastest] - 1
        cheapest = min(costs, key=costs.__getitem__) if costs else None
        cost_regret = costs[eager] / costs[cheapest] - 1 if eager in costs else None
        rows.append({"name": r["name"], "entry": p.entry, "source": r.get(FROM), "chosen": chosen,
                     "chosen_ms": ms, "fastest": fastest, "fastest_ms": timed[fastest], "regret": regret,
                     "cause": miss_cause(graph, timed, fastest, chosen, gated)
                     if regret is not None and regret > MISS else "",
                     "graph_regret": ms / min(timed[n] for n in capturable) - 1 if ms and capturable else None,
                     "eager_chosen": eager, "cheapest": cheapest, "cost_regret": cost_regret,
                     "eager_cause": miss_cause(eager_decision, costs, cheapest, eager, gated)
                     if cost_regret is not None and cost_regret > MISS else "",
                     "over_flashinfer": ms / own["eager_ms"] if ms and own.get("eager_ms") else None,
                     "cost_over_flashinfer": costs[eager] / own_cost if eager in costs and own_cost else None,
                     "auto_when_measured": r.get("auto"), "auto_regret_when_measured": r.get("regret"),
                     "auto_cost_regret_when_measured": cost["cost_regret"]})
    return rows


MISS = 0.03  # a regret above this is a miss, and gets its cause


def defect_gated(env: dict, problem, device, rows: tuple = ()) -> dict[str, str]:
    """Backend -> the known defect (capability_db/defects.json) of the sweep's installed version
    that keeps it out of the automatic choice for this problem. Live, the router rejects it (XQA
    on FlashInfer 0.7.2: non-finite rows at extreme logits); a replay off the GPU has no versions
    installed, so it reads them from the sweep's environment. A backend whose timing row (in
    ``rows``) lists the defect as guarded was timed with its guard (runner._mark_guarded): not gated."""
    facts = defect_facts(problem, device)
    guarded = {(r["backend"], d) for r in rows for d in r.get("guarded", ())}
    gated: dict[str, str] = {}
    for defect in capability_db.known_defects():
        version = str(env.get(defect.provider) or "")
        for name in defect.backends:
            if (version[:1].isdigit() and name not in gated and (name, defect.id) not in guarded
                    and defect.affects(name, defect.provider, version, facts)):
                gated[name] = defect.id
    return gated


def automatic(decision: router.Decision, gated: dict[str, str]) -> str:
    """The backend the live router serves: the first of the automatic order that no defect gates."""
    return next((n for n in decision.accepted() if n not in gated), decision.chosen)


def miss_cause(decision: router.Decision, timed: dict[str, float], fastest: str, chosen: Optional[str] = None,
               gated: Optional[dict[str, str]] = None) -> str:
    """Why the choice (``chosen``, default the decision's) missed the fastest backend, in one line:
    the fastest is never chosen automatically (a known defect of its version) or was not a
    candidate (its first reason), or the estimates that ranked the chosen ahead, each against its
    measured time (which estimate was off, by how much, and on what basis), or a ranking rule
    that put the chosen first although it expected it slower."""
    chosen = chosen or decision.chosen
    if gated and fastest in gated:
        return f"{fastest} not chosen automatically: known defect {gated[fastest]} of its version"
    by_name = {c.backend: c for c in decision.candidates}
    candidate = by_name.get(fastest)
    if candidate is None or not candidate.accepted:
        why = str(candidate.reasons[0]) if candidate is not None and candidate.reasons else "not installed"
        return f"{fastest} not a candidate: {why[:160]}"
    if not candidate.ranked:
        return f"{fastest} not in the automatic order ({candidate.why})"
    ours, theirs = by_name[chosen].evidence, candidate.evidence
    if ours is None or theirs is None:
        return f"no estimate to rank {chosen} against {fastest} ({decision.ranking})"
    if ours.ms > theirs.ms:
        return (f"ranked {chosen} first though it expected it {ours.ms / theirs.ms:.2f}x {fastest}'s time "
                f"({decision.ranking})")
    off = {n: timed[n] / e.ms for n, e in ((chosen, ours), (fastest, theirs))}
    worse = max(off, key=lambda n: abs(math.log(off[n])))
    basis = (ours if worse == chosen else theirs).basis
    return (f"expected {chosen} {ours.ms:.4g} ms, {fastest} {theirs.ms:.4g} ms; measured {timed[chosen]:.4g}, "
            f"{timed[fastest]:.4g}: {worse}'s estimate ({basis}) off by {off[worse]:.2f}x")


def cause_kinds(rows: list[dict], eager: bool = False) -> list[tuple[str, int]]:
    """The misses' causes by kind, commonest first: a fastest that was no candidate, a ranking
    rule, no estimate, or which estimate was off and on what basis. ``eager``: the eager choice's
    misses by call cost (the cheapest call in the fastest's place)."""
    kinds: dict[str, int] = {}
    for r in rows:
        cause = r.get("eager_cause" if eager else "cause")
        if not cause:
            continue
        chosen, fastest = (r["eager_chosen"], r["cheapest"]) if eager else (r["chosen"], r["fastest"])
        if "estimate (" in cause:
            whose = "the chosen's estimate too low" if cause.split(": ")[-1].startswith(chosen) \
                else "the fastest's estimate too high"
            kind = f"{whose} ({cause.split('estimate (')[1].split(')')[0]})"
        elif cause.startswith("ranked "):
            kind = "ranked the chosen first though it expected it slower (a tie within 3%, or a ranking rule)"
        else:
            kind = cause.split(":")[0].split(" (")[0].replace(fastest, "the fastest").replace(chosen, "the chosen")
        kinds[kind] = kinds.get(kind, 0) + 1
    return sorted(kinds.items(), key=lambda kv: -kv[1])


def markdown(rows: list[dict], sources: list[str], notes: tuple[str, ...] = ()) -> str:
    fig = regret_figures(rows)
    untimed = sum(r["regret"] is None for r in rows)
    lines = [f"# The router's choice today, replayed against measured times ({', '.join(sources)})", "",
             " ".join(__doc__.split("\n\n")[0].split()), "",
             f"**Regret of today's choice** over {fig.get('count', 0)} problems (and {untimed} whose choice was not "
             f"timed): p50 {fig.get('p50', 0):.1%}, p95 {fig.get('p95', 0):.1%}, max {fig.get('max', 0):.1%}; "
             f"within 3%: {fig.get('within_3pct', 0)}, within 10%: {fig.get('within_10pct', 0)}. "
             + _cost_text(regret_figures(rows, "cost_regret")), "", _servable_text(rows), "", _flashinfer_text(rows), "",
             *(line for note in notes for line in (note, "")),
             *cause_table(rows), "", *cause_table(rows, eager=True), "",
             "| problem | chosen now (graph) | its ms | fastest | fastest ms | regret | auto when measured (regret) "
             "| why, where it missed | eager choice (cost regret) | why, where the eager choice missed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        regret = "not timed" if r["regret"] is None else f"{100 * r['regret']:.1f}%"
        was, cost = r["auto_regret_when_measured"], r.get("cost_regret")
        lines.append(f"| {r['name']} | {r['chosen']} | {_ms(r['chosen_ms'])} | {r['fastest']} | "
                     f"{_ms(r['fastest_ms'])} | {regret} | {r['auto_when_measured']}"
                     f"{'' if was is None else f' ({100 * was:.1f}%)'} | {r.get('cause', '')} | {r['eager_chosen']}"
                     f"{'' if cost is None else f' ({100 * cost:.1f}%)'} | {r.get('eager_cause', '')} |")
    return "\n".join(lines) + "\n"


def cause_table(rows: list[dict], eager: bool = False) -> list[str]:
    """Markdown lines: the graph choice's misses (regret over 3%) by cause; ``eager``: the eager
    choice's (cost regret over 3%)."""
    head = "the eager choice missed (cost regret" if eager else "the graph choice missed (regret"
    return [f"| why {head} > 3%) | problems |", "|---|---|",
            *(f"| {kind} | {n} |" for kind, n in cause_kinds(rows, eager))]


def _cost_text(fig: dict) -> str:
    if not fig.get("count"):
        return ""
    return (f"By what an eager call costs (GPU + host, as the choice counts it), over {fig['count']}: p50 "
            f"{fig['p50']:.1%}, p95 {fig['p95']:.1%}, max {fig['max']:.1%}; within 3%: {fig['within_3pct']}, "
            f"within 10%: {fig['within_10pct']}.")


OUT_OF_REACH = ("not chosen automatically", "not a candidate")  # causes no estimate could have avoided


def _servable_text(rows: list[dict]) -> str:
    """The graph choice where its fastest is one the automatic choice may serve: not a backend a
    known defect keeps out, nor one the call cannot run (fa2/fa3 through a function entry in a graph)."""
    kept = [r for r in rows if r.get("regret") is not None and not any(why in r.get("cause", "") for why in OUT_OF_REACH)]
    fig = regret_figures(kept)
    if not fig["count"]:
        return ""
    return (f"**Where the fastest is one the automatic choice may serve** ({sum(r.get('regret') is not None for r in rows) - len(kept)} "
            f"left out: its fastest gated by a known defect, or not a candidate): within 3% on {fig['within_3pct']} of "
            f"{fig['count']} ({fig['within_3pct'] / fig['count']:.0%}), more than 10% over on "
            f"{fig['count'] - fig['within_10pct']}.")


def _flashinfer_text(rows: list[dict]) -> str:
    """Today's choice over FlashInfer's own call: the graph choice by GPU time, the eager by cost."""
    parts = []
    for key, what in (("over_flashinfer", "graph choice, GPU time"), ("cost_over_flashinfer", "eager, call cost")):
        fig = ratio_figures(rows, key)
        if fig["count"]:
            parts.append(f"{what}: at most 1.03 on {fig['at_most_1_03']} of {fig['count']}, above 1.10 on "
                         f"{fig['above_1_10']}, p50 {fig['p50']:.2f}, max {fig['max']:.2f}")
    return "**Against FlashInfer's own call** (where it ran and computes the same): " + ("; ".join(parts) or "none") + "."


def tuning_text(path: Path) -> str:
    """What the autotune's timing cost: seconds per bucket (the wait of a new bucket's first call)."""
    buckets = json.loads(Path(path).read_text())["buckets"].values()
    times = [b.get("times", b) if isinstance(b.get("times"), dict) else b for b in buckets]  # {"measured", "times"}
    waits = sorted(sum(t.get("tune_s", 0.0) for t in b.values() if isinstance(t, dict)) for b in times)
    if not any(waits):
        return f"The autotune file ({Path(path).name}, {len(waits)} buckets) does not record its timing's seconds."
    return (f"**The autotune's timing** ({Path(path).name}): {len(waits)} buckets; a new bucket's first call waited "
            f"p50 {waits[len(waits) // 2]:.2f} s, p95 {waits[int(0.95 * (len(waits) - 1))]:.2f} s, max {waits[-1]:.2f} s "
            f"(the backends it timed, compiles included); {sum(waits):.0f} s in all.")


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4g}"


def write(paths: list[Path], out: Path, autotune_file: Optional[Path] = None) -> tuple[Path, Path]:
    """Replay every problem of ``paths`` (a later file's result of a problem wins) into out/."""
    results, _ = merged(paths)
    rows = replay(results, autotune_file=autotune_file)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"replay-{Path(paths[-1]).stem}"
    md, js = stem.with_suffix(".md"), stem.with_suffix(".json")
    md.write_text(markdown(rows, [Path(p).name for p in paths], (tuning_text(autotune_file),) if autotune_file else ()))
    js.write_text(json.dumps({"sources": [Path(p).name for p in paths], "rows": rows}, indent=1) + "\n")
    return md, js


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lab.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", nargs="+", type=Path, metavar="JSON", help="bench JSONs of one GPU")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")), metavar="DIR",
                        help="output folder for replay-<last file>.md and .json (default $OUT or .)")
    parser.add_argument("--autotune-file", type=Path, default=None, metavar="FILE",
                        help="decide from this autotune sweep's kept times (its -cache.json), never timing")
    args = parser.parse_args(argv)
    try:
        md, js = write(args.bench, args.out, args.autotune_file)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    print(md.read_text().split("\n\n")[2])
    print(f"outputs: {md} {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
