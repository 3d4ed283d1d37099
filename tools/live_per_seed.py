"""Live figures per seed: each sweep's automatic choice as it ran (under the table in force when it ran),
counted per random seed. The call cost is judged by ``runner.call_cost`` as the code stands (a path
that plans per call counted once).

    python -m tools.live_per_seed BENCH.json [...] --out DIR --stem NAME
"""
from __future__ import annotations

import collections
import json

from dispatch.benchmark import runner
from tools.lab import table
from tools.lab.figures import bench_files_parser


def figures(rows: list[dict]) -> dict:
    """Within 3% by GPU time and by call cost; auto / FlashInfer <= 1.03 and > 1.10, both ways."""
    gpu = [r["regret"] for r in rows if r.get("regret") is not None]
    costs = [runner.call_cost(r["backends"], r.get("auto"), table.entry_of(r["problem"]["entry"])) for r in rows]
    cost = [c["cost_regret"] for c in costs if c["cost_regret"] is not None]
    own = [r["auto_over_flashinfer"] for r in rows if r.get("auto_over_flashinfer")]
    own_cost = [c["cost_auto_over_flashinfer"] for c in costs if c["cost_auto_over_flashinfer"]]
    return {"problems": len(rows),
            "gpu": [sum(x <= 0.03 for x in gpu), len(gpu), max(gpu, default=0.0)],
            "cost": [sum(x <= 0.03 for x in cost), len(cost)],
            "own_gpu": [sum(x <= 1.03 for x in own), len(own), sum(x > 1.10 for x in own)],
            "own_cost": [sum(x <= 1.03 for x in own_cost), len(own_cost), sum(x > 1.10 for x in own_cost)]}


def line(seed: str, f: dict) -> str:
    g, c, o, oc = f["gpu"], f["cost"], f["own_gpu"], f["own_cost"]
    return (f"| {seed} | {f['problems']} | {g[0]} of {g[1]}, max {g[2]:.0%} | {c[0]} of {c[1]} | "
            f"{o[0]} of {o[1]}, > 1.10: {o[2]} | {oc[0]} of {oc[1]}, > 1.10: {oc[2]} |")


def main() -> int:
    args = bench_files_parser(__doc__, "live-per-seed").parse_args()
    merged, _ = table.merged([str(p) for p in args.bench])
    by_seed: dict[str, list] = collections.defaultdict(list)
    for r in merged["results"]:
        if "backends" in r:
            by_seed[table.seed_of(r[table.FROM])].append(r)
    per_seed = {s: figures(rows) for s, rows in by_seed.items()}
    per_seed["all"] = figures([r for rows in by_seed.values() for r in rows])
    md = ["# Live figures per seed: each sweep's own choice as it ran", "",
          "| seed | problems | within 3%, GPU | within 3%, call cost | auto / FI <= 1.03, GPU | by cost |",
          "|---|---|---|---|---|---|", *(line(s, f) for s, f in per_seed.items()), "",
          "Sources: " + ", ".join(f"`{p.name}`" for p in args.bench), ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stem}.md").write_text("\n".join(md))
    (args.out / f"{args.stem}.json").write_text(json.dumps({"sources": [p.name for p in args.bench],
                                                             "per_seed": per_seed}, indent=1))
    print("\n".join(md[2:-3]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
