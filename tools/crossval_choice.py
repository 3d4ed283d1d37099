"""How the choice does on problems its timing table never saw: K-fold cross-validation over bench
sweeps (no GPU). The measured problems of the given JSONs are split into K folds; for each fold a
timing table is built from the other folds (tools/lab/table.py) and the router's choice, ranked
by that table's fit (``tools.tables.estimate.ranking_by_the_fit``: what its compiled table would
follow), is replayed for the fold's problems against their measured times (tools/lab/replay.py).
Prints the regret figures, by GPU time and by call cost (GPU + host per eager call), and writes
DIR/crossval-<stem>.json and .md.

    python -m tools.crossval_choice BENCH.json [BENCH.json ...] --folds 5 --out DIR

``--learning-curve 0.25 0.5 0.75 1``: the same, with each fold's table built from that share of the
other folds' problems (drawn at random, ``--draws`` times per share): how the choice grows with the
problems measured. Writes DIR/crossval-<stem>-learning-curve.json and .md instead.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

from dispatch.benchmark.report import regret_figures
from tools.lab import replay, table
from tools.lab.figures import ratio_figures
from tools.tables import measured
from tools.tables.estimate import ranking_by_the_fit


def folds(results: dict, k: int) -> list[dict]:
    measured_rows = [r for r in results["results"] if "backends" in r]
    return [{**results, "results": measured_rows[i::k]} for i in range(k)]


def replay_fold(train: list[dict], test: dict, source: str, host_now: bool = False) -> list[dict]:
    """The choice for ``test``'s problems under a table built from ``train`` alone; ``host_now``:
    the eager choice judged by that table's host times, not the rows' (``replay.replay``)."""
    rows = [row for part in train for row in part["results"]]
    trained = table.build_table({**test, "results": rows}, source)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{measured.gpu_key(trained.gpu)}.json"
        path.write_text(trained.model_dump_json())
        with ranking_by_the_fit(Path(tmp)):  # every cache dropped: no fold judged by another's table
            return replay.replay(test, trained.host_us if host_now else None)


def learning_curve(parts: list[dict], source: str, shares: list[float], draws: int) -> list[dict]:
    """Per share of the training problems: the within-3% figures of the graph and eager choices and
    auto / FlashInfer <= 1.03, each the mean over ``draws`` random draws (seeded by the draw)."""
    curve = []
    for share in shares:
        figures = []
        for draw in range(draws):
            pick = random.Random(draw)
            rows = []
            for i, test in enumerate(parts):
                train = [row for part in parts[:i] + parts[i + 1:] for row in part["results"]]
                kept = pick.sample(train, max(1, round(share * len(train))))
                rows += replay_fold([{"results": kept}], test, f"{source} (fold {i}, {share:.0%} of the rest)")
            gpu, cost, own = regret_figures(rows), regret_figures(rows, "cost_regret"), ratio_figures(rows, "over_flashinfer")
            figures.append((len(kept), _share(gpu, "within_3pct"), _share(cost, "within_3pct"),
                            _share(own, "at_most_1_03")))
        mean = [statistics.mean(f[i] for f in figures) if figures[0][i] is not None else None for i in range(4)]
        curve.append({"share": share, "training_problems": round(mean[0]), "graph_within_3pct": mean[1],
                      "eager_within_3pct": mean[2], "auto_over_flashinfer_at_most_1_03": mean[3], "draws": draws})
    return curve


def _share(fig: dict, key: str):
    return fig[key] / fig["count"] if fig.get("count") else None


def write_curve(curve: list[dict], source: str, folds: int, stem: Path) -> None:
    md = ["# How the choice grows with the problems measured (K-fold cross-validation, learning curve)", "",
          f"Sources: {source}; {folds} folds; each fold's table built from a random share of the other folds' "
          "problems, the mean of the draws; tools/crossval_choice.py --learning-curve.", "",
          "| share | problems per table | graph choice within 3% | eager choice within 3% | auto / FI <= 1.03 |",
          "|---|---|---|---|---|"]
    def cell(x) -> str:
        return "-" if x is None else f"{x:.1%}"
    md += [f"| {c['share']:.0%} | {c['training_problems']} | {cell(c['graph_within_3pct'])} | "
           f"{cell(c['eager_within_3pct'])} | {cell(c['auto_over_flashinfer_at_most_1_03'])} |" for c in curve]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"sources": source, "folds": folds, "curve": curve}, indent=1))
    print("\n".join(md[4:]))
    print(f"outputs: {stem}.md {stem}.json")


def line(name: str, fig: dict) -> str:
    if not fig.get("count"):
        return f"| {name} | 0 | - | - | - | - | - |"
    return (f"| {name} | {fig['count']} | {fig['within_3pct']} ({fig['within_3pct'] / fig['count']:.0%}) | "
            f"{fig['within_10pct']} | {fig['p50']:.1%} | {fig['p95']:.1%} | {fig['max']:.1%} |")


def own_line(name: str, fig: dict) -> str:
    if not fig.get("count"):
        return f"| {name} | 0 | - | - | - | - |"
    return (f"| {name} | {fig['count']} | {fig['at_most_1_03']} ({fig['at_most_1_03'] / fig['count']:.0%}) | "
            f"{fig['above_1_10']} | {fig['p50']:.3f} | {fig['max']:.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", type=Path, nargs="+")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--learning-curve", type=float, nargs="+", metavar="SHARE")
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--host-now", action="store_true",
                    help="judge the eager choice by the table's host times (python -m tools.lab.host_cost --matrix), not the "
                         "rows': for rows measured before a backend's host path changed")
    args = ap.parse_args()
    results, source = table.merged(args.json)
    parts = folds(results, args.folds)
    if args.learning_curve:
        args.out.mkdir(parents=True, exist_ok=True)
        curve = learning_curve(parts, source, args.learning_curve, args.draws)
        write_curve(curve, source, args.folds, args.out / f"crossval-{args.json[-1].stem}-learning-curve")
        return 0
    rows = [row for i, test in enumerate(parts)
            for row in replay_fold(parts[:i] + parts[i + 1:], test, f"{source} (fold {i} held out)", args.host_now)]
    gpu, cost = regret_figures(rows), regret_figures(rows, "cost_regret")
    own, own_cost = ratio_figures(rows, "over_flashinfer"), ratio_figures(rows, "cost_over_flashinfer")
    md = ["# The choice on problems its table never saw (K-fold cross-validation)", "",
          f"Sources: {source}; {args.folds} folds; tools/crossval_choice.py"
          + (" --host-now (the eager choice judged by the table's host times)." if args.host_now else "."), "",
          "| regret by | problems | within 3% | within 10% | p50 | p95 | max |", "|---|---|---|---|---|---|---|",
          line("GPU time (the choice for a CUDA graph)", gpu),
          line("GPU time, of the backends a graph can capture", regret_figures(rows, "graph_regret")),
          line("call cost (GPU + host; the eager choice)", cost),
          "", "| against FlashInfer's own call | problems | <= 1.03 | > 1.10 | p50 | max |",
          "|---|---|---|---|---|---|",
          own_line("GPU time", own), own_line("call cost", own_cost), "", *replay.cause_table(rows), "",
          "| problem | chosen (graph) | its ms | fastest | fastest ms | regret | chosen (eager) | cost regret "
          "| why the graph choice missed |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['name']} | {r['chosen']} | {replay._ms(r['chosen_ms'])} | {r['fastest']} | "
                  f"{replay._ms(r['fastest_ms'])} | {_pct(r['regret'])} | {r['eager_chosen']} | "
                  f"{_pct(r['cost_regret'])} | {r.get('cause', '')} |")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"crossval-{args.json[-1].stem}"
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"sources": source, "folds": args.folds, "gpu": gpu, "cost": cost,
                                                     "over_flashinfer": own, "cost_over_flashinfer": own_cost,
                                                     "rows": rows}, indent=1))
    print("\n".join(md[4:14 + len(replay.cause_kinds(rows)) + 3]))
    print(f"outputs: {stem}.md {stem}.json")
    return 0


def _pct(x) -> str:
    return "not timed" if x is None else f"{x:.1%}"


if __name__ == "__main__":
    raise SystemExit(main())
