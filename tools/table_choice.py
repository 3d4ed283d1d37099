"""Which table should a GPU rank by? The choice for one GPU's measured problems replayed under each
of several timing tables, each table put alone in the timing tables' folder and the router ranking
by its fit (``tools.tables.estimate.ranking_by_the_fit``; the table scaled to the GPU where it is
another GPU's: tools.tables.measured.table_for). Prints and writes
DIR/<stem>.md and .json: per table, within 3% of the fastest (the CUDA-graph choice by GPU time,
the eager choice by call cost) and auto / FlashInfer's own call, over all problems, per random seed
and off the ``xqa`` entry point; then each problem's choices and every miss with its cause.

    python -m tools.table_choice --tables tools/tables/data/h100.json.gz tools/tables/data/h200.json.gz \\
        --bench BENCH.json [BENCH.json ...] --out DIR --stem NAME
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from dispatch.benchmark.problems import XQA
from dispatch.benchmark.report import regret_figures
from tools.lab import replay, table
from tools.lab.figures import ratio_figures
from tools.tables import measured
from tools.tables.estimate import ranking_by_the_fit


def replay_under(results: dict, table_file: Path) -> tuple[list[dict], str]:
    """The replayed rows with ``table_file`` the only table, and how the router took it."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / table_file.name).symlink_to(table_file.resolve())
        with ranking_by_the_fit(Path(tmp)):
            rows = replay.replay(results)
            used = measured.table_for(table.sweep_device(results["environment"]))
            return rows, used.scaling or f"{used.key} table, unscaled (the GPU's own)"


def figures(rows: list[dict]) -> dict:
    return {"graph": regret_figures(rows), "eager": regret_figures(rows, "cost_regret"),
            "over_flashinfer": ratio_figures(rows, "over_flashinfer"),
            "cost_over_flashinfer": ratio_figures(rows, "cost_over_flashinfer")}


def groups(rows: list[dict]) -> dict[str, dict]:
    """Figures per seed, over all, and over all but the ``xqa`` entry point (where FlashInfer's own call
    runs XQA without the fix-up of its recorded defect, tools/lab/replay.py)."""
    seeds: dict[str, list] = {}
    for r in rows:
        seeds.setdefault(table.seed_of(r.get("source") or "?"), []).append(r)
    out = {s: figures(rs) for s, rs in seeds.items()}
    out["all"] = figures(rows)
    out["all but the xqa entry"] = figures([r for r in rows if r.get("entry") != XQA])
    return out


def _within(f: dict) -> str:
    return f"{f['within_3pct']} / {f['count']} ({f['within_3pct'] / f['count']:.0%}), max {f['max']:.1%}" \
        if f.get("count") else "-"


def _under(f: dict) -> str:
    return f"{f['at_most_1_03']} / {f['count']} (> 1.10: {f['above_1_10']})" if f.get("count") else "-"


def markdown(env: dict, sources: list[str], runs: list[dict]) -> str:
    md = [f"# The choice on {env['gpu']} under each table", "",
          f"Problems: {' + '.join(sources)} (measured on {env['gpu']}, FlashInfer {env.get('flashinfer')}); "
          "replayed with each table alone (tools/table_choice.py).", "",
          "| table | as the router took it | graph, within 3% | eager (cost), within 3% | auto / FI <= 1.03, GPU | cost |",
          "|---|---|---|---|---|---|"]
    for run in runs:
        f = run["figures"]
        md.append(f"| {run['table']} | {run['how']} | {_within(f['graph'])} | {_within(f['eager'])} | "
                  f"{_under(f['over_flashinfer'])} | {_under(f['cost_over_flashinfer'])} |")
    for run in runs:
        md += ["", f"## {run['table']}: per seed", "",
               "| seed | graph, within 3% | eager (cost), within 3% | auto / FI <= 1.03, GPU | cost |", "|---|---|---|---|---|"]
        md += [f"| {name} | {_within(f['graph'])} | {_within(f['eager'])} | {_under(f['over_flashinfer'])} | "
               f"{_under(f['cost_over_flashinfer'])} |" for name, f in groups(run["rows"]).items()]
    md += ["", "## Each problem's choices", "",
           "| problem | fastest | " + " | ".join(f"{run['table']}: graph, eager" for run in runs) + " |",
           "|---|---|" + "---|" * len(runs)]
    for i, row in enumerate(runs[0]["rows"]):
        cells = []
        for run in runs:
            r = run["rows"][i]
            regret = "-" if r.get("regret") is None else f"{r['regret']:.1%}"
            cells.append(f"{r.get('chosen')} ({regret}), {r.get('eager_chosen', '-')}")
        md.append(f"| {row['name']} | {row.get('fastest')} | " + " | ".join(cells) + " |")
    for run in runs:
        md += _misses(run)
    return "\n".join(md) + "\n"


def _misses(run: dict) -> list[str]:
    """Every choice of ``run`` more than 3% off the fastest (graph) or the cheapest (eager), with its
    cause as the replay names it, the worst first."""
    md = []
    for what, regret, chosen, best, cause in (("graph", "regret", "chosen", "fastest", "cause"),
                                              ("eager", "cost_regret", "eager_chosen", "cheapest", "eager_cause")):
        missed = sorted((r for r in run["rows"] if (r.get(regret) or 0) > replay.MISS), key=lambda r: -r[regret])
        choices = "choice" if len(missed) == 1 else "choices"
        md += ["", f"## {run['table']}: the {len(missed)} {what} {choices} more than 3% off, and why", "",
               f"| problem | chosen | {best} | regret | why |", "|---|---|---|---|---|"]
        md += [f"| {r['name']} | {r[chosen]} | {r[best]} | {r[regret]:.1%} | {r[cause]} |" for r in missed]
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tables", nargs="+", type=Path, required=True)
    ap.add_argument("--bench", nargs="+", type=Path, required=True, help="bench JSONs of one GPU")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--stem", default="table-choice")
    args = ap.parse_args()
    results, source = table.merged(args.bench)
    runs = []
    for t in args.tables:
        rows, how = replay_under(results, t)
        runs.append({"table": t.name, "how": how, "figures": figures(rows), "per_seed": groups(rows), "rows": rows})
        f = runs[-1]["figures"]
        print(f"{t.name}: graph {_within(f['graph'])}; eager {_within(f['eager'])}; "
              f"auto / FI {_under(f['over_flashinfer'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    sources = [p.name for p in args.bench]
    (args.out / f"{args.stem}.md").write_text(markdown(results["environment"], sources, runs))
    (args.out / f"{args.stem}.json").write_text(json.dumps({"sources": sources, "environment": results["environment"],
                                                            "runs": runs}, indent=1) + "\n")
    print(f"wrote {args.out / args.stem}.md and .json")


if __name__ == "__main__":
    main()
