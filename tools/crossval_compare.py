"""Two cross-validations (tools/crossval_choice.py JSONs) side by side, over all their problems and
over the problems of some sweeps alone (those measured on today's code paths, say): within 3% of
the fastest (CUDA-graph choice by GPU time, eager choice by call cost), auto / FlashInfer's own
call <= 1.03 and > 1.10 (GPU time, call cost), and the geometric-mean regret. Prints Markdown.

    python tools/crossval_compare.py BEFORE.json AFTER.json --part "H, I" tools/results/bench-random-150-seed-259*.json
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def names_in(paths: list[str]) -> set[str]:
    return {r["name"] for p in paths for r in json.loads(Path(p).read_text())["results"] if "backends" in r}


def share(rows: list[dict], key: str, ok) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    hits = sum(ok(v) for v in values)
    return f"{hits} / {len(values)} ({hits / len(values):.0%})" if values else "-"


def count(rows: list[dict], key: str, bad) -> int:
    return sum(bad(r[key]) for r in rows if r.get(key) is not None)


def mean_regret(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    return f"{math.exp(sum(math.log1p(v) for v in values) / len(values)) - 1:.1%}" if values else "-"


def line(label: str, rows: list[dict]) -> str:
    within = lambda v: v <= 0.03  # noqa: E731
    under = lambda v: v <= 1.03  # noqa: E731
    over = lambda v: v > 1.10  # noqa: E731
    return (f"| {label} | {share(rows, 'regret', within)} | {mean_regret(rows, 'regret')} "
            f"| {share(rows, 'cost_regret', within)} | {mean_regret(rows, 'cost_regret')} "
            f"| {share(rows, 'over_flashinfer', under)} ({count(rows, 'over_flashinfer', over)}) "
            f"| {share(rows, 'cost_over_flashinfer', under)} ({count(rows, 'cost_over_flashinfer', over)}) |")


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
