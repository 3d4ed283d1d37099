"""Two cross-validations (tools/crossval_choice.py JSONs) side by side, over all their problems and
over the problems of some sweeps alone (those measured on today's code paths, say): within 3% of
the fastest (CUDA-graph choice by GPU time, eager choice by call cost), auto / FlashInfer's own
call <= 1.03 and > 1.10 (GPU time, call cost), and the geometric-mean regret. Prints Markdown.

    python -m tools.crossval_compare BEFORE.json AFTER.json --part NAME BENCH.json [BENCH.json ...]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from dispatch.benchmark.report import regret_figures
from tools.lab.figures import ratio_figures


def names_in(paths: list[str]) -> set[str]:
    return {r["name"] for p in paths for r in json.loads(Path(p).read_text())["results"] if "backends" in r}


def within(rows: list[dict], key: str) -> str:
    f = regret_figures(rows, key)
    return f"{f['within_3pct']} / {f['count']} ({f['within_3pct'] / f['count']:.0%})" if f["count"] else "-"


def under(rows: list[dict], key: str) -> str:
    f = ratio_figures(rows, key)
    if not f["count"]:
        return "-"
    return f"{f['at_most_1_03']} / {f['count']} ({f['at_most_1_03'] / f['count']:.0%}) ({f['above_1_10']})"


def mean_regret(rows: list[dict], key: str) -> str:
    """The geometric mean of chosen / fastest, less one: what the choice costs on average."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return f"{math.exp(sum(math.log1p(v) for v in values) / len(values)) - 1:.1%}" if values else "-"


def line(label: str, rows: list[dict]) -> str:
    return (f"| {label} | {within(rows, 'regret')} | {mean_regret(rows, 'regret')} "
            f"| {within(rows, 'cost_regret')} | {mean_regret(rows, 'cost_regret')} "
            f"| {under(rows, 'over_flashinfer')} | {under(rows, 'cost_over_flashinfer')} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("sweeps", nargs="*", help="bench JSONs: the part of the problems to show alone")
    ap.add_argument("--part", default="the sweeps given", help="what to call that part")
    args = ap.parse_intermixed_args()
    part = names_in(args.sweeps)
    print("| cross-validation, problems | graph: within 3% | its mean regret | eager: within 3% | its mean regret "
          "| auto / FI <= 1.03, GPU (> 1.10) | auto / FI <= 1.03, cost (> 1.10) |")
    print("|---|---|---|---|---|---|---|")
    for path in (args.before, args.after):
        rows = json.loads(Path(path).read_text())["rows"]
        name = Path(path).stem
        print(line(f"{name}, all", rows))
        if part:
            print(line(f"{name}, {args.part}", [r for r in rows if r["name"] in part]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
