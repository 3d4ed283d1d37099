"""How the choice does on problems its timing table never saw: K-fold cross-validation over bench
sweeps (no GPU). The measured problems of the given JSONs are split into K folds; for each fold a
timing table is built from the other folds (``bench --to-table``'s code) and the router's choice
for the fold's problems is replayed against their measured times (``bench --replay``'s code).
Prints the regret figures, by GPU time and by call cost (GPU + host per eager call), and writes
DIR/crossval-<stem>.json and .md.

    python tools/crossval_choice.py tools/results/bench-random-150-seed-*-cuda*.json --folds 5 --out DIR
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from unittest import mock

from capability_db import measured
from dispatch import router
from dispatch.lab import replay, table
from dispatch.lab.report import ratio_figures, regret_figures


def folds(results: dict, k: int) -> list[dict]:
    measured_rows = [r for r in results["results"] if "backends" in r]
    return [{**results, "results": measured_rows[i::k]} for i in range(k)]


def replay_fold(train: list[dict], test: dict, source: str) -> list[dict]:
    """The choice for ``test``'s problems under a table built from ``train`` alone."""
    rows = [row for part in train for row in part["results"]]
    trained = table.build_table({**test, "results": rows}, source)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{measured.gpu_key(trained.gpu)}.json"
        path.write_text(trained.model_dump_json())
        with mock.patch.object(measured, "MEASURED_DIR", Path(tmp)):
            measured.forget()  # every cache of a table, or a fold is judged by another fold's table
            router.clear_caches()
            out = replay.replay(test)
    measured.forget()
    router.clear_caches()
    return out


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
    args = ap.parse_args()
    results, source = table.merged(args.json)
    parts = folds(results, args.folds)
    rows = [row for i, test in enumerate(parts)
            for row in replay_fold(parts[:i] + parts[i + 1:], test, f"{source} (fold {i} held out)")]
    gpu, cost = regret_figures(rows), regret_figures(rows, "cost_regret")
    own, own_cost = ratio_figures(rows, "over_flashinfer"), ratio_figures(rows, "cost_over_flashinfer")
    md = ["# The choice on problems its table never saw (K-fold cross-validation)", "",
          f"Sources: {source}; {args.folds} folds; tools/crossval_choice.py.", "",
          "| regret by | problems | within 3% | within 10% | p50 | p95 | max |", "|---|---|---|---|---|---|---|",
          line("GPU time (the choice for a CUDA graph)", gpu),
          line("GPU time, of the backends a graph can capture", regret_figures(rows, "graph_regret")),
          line("call cost (GPU + host; the eager choice)", cost),
          "", "| against FlashInfer's own call | problems | <= 1.03 | > 1.10 | p50 | max |",
          "|---|---|---|---|---|---|",
          own_line("GPU time", own), own_line("call cost", own_cost), "",
          "| problem | chosen (graph) | its ms | fastest | fastest ms | regret | chosen (eager) | cost regret |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['name']} | {r['chosen']} | {replay._ms(r['chosen_ms'])} | {r['fastest']} | "
                  f"{replay._ms(r['fastest_ms'])} | {_pct(r['regret'])} | {r['eager_chosen']} | "
                  f"{_pct(r['cost_regret'])} |")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"crossval-{args.json[-1].stem}"
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"sources": source, "folds": args.folds, "gpu": gpu, "cost": cost,
                                                     "over_flashinfer": own, "cost_over_flashinfer": own_cost,
                                                     "rows": rows}, indent=1))
    print("\n".join(md[4:14]))
    print(f"outputs: {stem}.md {stem}.json")
    return 0


def _pct(x) -> str:
    return "not timed" if x is None else f"{x:.1%}"


if __name__ == "__main__":
    raise SystemExit(main())
