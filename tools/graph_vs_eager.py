"""How a backend's GPU time in a CUDA graph differs from its eager GPU time, over bench JSONs.

The timing table and the judge read eager GPU time (``eager_ms``) for every choice, a graph's too;
a call inside a graph runs at ``graph_ms``. Three figures:

* per backend and size (eager ms up to 0.03, up to 0.2, above), p10 / p50 / p90 of graph / eager;
* rows whose eager time exceeds their graph time by more than 10%, split by whether the sweep had
  to wait for its warm-up workers before that problem (``warm_wait_s`` > 0: they were busy then);
* the ceiling of a choice that knew every eager time exactly, judged by graph times: per problem
  with two or more backends timed both ways, the graph time of the eager-fastest over the
  graph-fastest - 1; the share within 3%.

    python -m tools.graph_vs_eager BENCH.json [...] --out DIR --stem NAME
"""
from __future__ import annotations

import json

from tools.lab.figures import bench_files_parser
from tools.lab.table import NOT_BACKENDS

SIZES = ((0.03, "eager <= 0.03 ms"), (0.2, "eager <= 0.2 ms"), (float("inf"), "eager > 0.2 ms"))


def both_times(result: dict) -> dict[str, tuple[float, float]]:
    """backend -> (eager ms, graph ms) of one problem's backends timed both ways (ours only)."""
    return {b["backend"]: (b["eager_ms"], b["graph_ms"]) for b in result.get("backends", ())
            if b["backend"] not in NOT_BACKENDS and b.get("status") == "ok" and b.get("eager_ms") and b.get("graph_ms")}


def size_of(eager_ms: float) -> str:
    return next(label for bound, label in SIZES if eager_ms <= bound)


def quantiles(values: list[float]) -> list[float]:
    """p10, p50, p90 of ``values`` (sorted)."""
    return [round(values[int(q * (len(values) - 1))], 4) for q in (0.1, 0.5, 0.9)]


def figures(results: list[dict]) -> dict:
    ratios: dict[tuple[str, str], list[float]] = {}
    inflated = {"waited": [0, 0], "not waited": [0, 0]}  # [eager > 1.1 x graph, rows]
    ceiling = []
    for r in results:
        times = both_times(r)
        waited = "waited" if (r.get("warm_wait_s") or 0) > 0 else "not waited"
        for name, (eager, graph) in times.items():
            ratios.setdefault((name, size_of(eager)), []).append(graph / eager)
            if eager > 0.2:  # where eager and graph agree at the median for every backend (the table below)
                inflated[waited][0] += eager > 1.1 * graph
                inflated[waited][1] += 1
        if len(times) >= 2:
            pick = min(times, key=lambda n: times[n][0])
            ceiling.append(times[pick][1] / min(g for _, g in times.values()) - 1.0)
    return {"ratios": {f"{n} / {s}": sorted(v) for (n, s), v in sorted(ratios.items())},
            "inflated_eager": inflated, "ceiling_regrets": sorted(ceiling)}


def markdown(f: dict, sources: list[str]) -> str:
    within = sum(x <= 0.03 for x in f["ceiling_regrets"])
    n = len(f["ceiling_regrets"])
    lines = [f"# Graph against eager GPU time ({len(sources)} bench files)", "",
             f"A choice that knew every eager time, judged by graph times: within 3% on {within} of {n} "
             f"({100 * within / max(n, 1):.1f}%).", "",
             "| eager > 1.1 x graph (rows over 0.2 ms) | rows | share |", "|---|---|---|"]
    for k, (hits, rows) in f["inflated_eager"].items():
        lines.append(f"| {k} for the warm-up workers | {hits} of {rows} | {100 * hits / max(rows, 1):.1f}% |")
    lines += ["", "| backend / size | rows | graph / eager p10 | p50 | p90 |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {len(v)} | " + " | ".join(f"{q:.3f}" for q in quantiles(v)) + " |" for k, v in f["ratios"].items()]
    return "\n".join(lines + ["", "Sources: " + ", ".join(f"`{s}`" for s in sources), ""])


def main() -> int:
    args = bench_files_parser(__doc__, "graph-vs-eager").parse_args()
    results = [r for path in args.bench for r in json.loads(path.read_text()).get("results", ())]
    f = figures(results)
    names = [p.name for p in args.bench]
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"sources": names, "inflated_eager": f["inflated_eager"],
               "ceiling_within_3pct": [sum(x <= 0.03 for x in f["ceiling_regrets"]), len(f["ceiling_regrets"])],
               "graph_over_eager_p10_p50_p90": {k: [len(v), *quantiles(v)] for k, v in f["ratios"].items()}}
    (args.out / f"{args.stem}.json").write_text(json.dumps(summary, indent=1))
    (args.out / f"{args.stem}.md").write_text(markdown(f, names))
    print(markdown(f, names).split("\n\n")[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
