"""How one GPU's times relate to another's on the same problems: per phase and backend, the p10,
median and p90 of (time on A) / (time on B) over the problems both bench sets timed. It checks the
scaling a borrowed table gets (capability_db.choice_table.table_for: decode by the ratio of
peak bandwidth, the rest by compute). Prints Markdown; --out writes it too.

    python -m tools.gpu_ratio --a BENCH-ON-A.json [...] --b BENCH-ON-B.json [...]
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from tools.lab import table


def times(paths: list[Path]) -> tuple[dict, dict]:
    results, _ = table.merged(paths)
    out = {}
    for r in results["results"]:
        if "backends" in r:
            ms = {b["backend"]: b["eager_ms"] for b in r["backends"]
                  if b.get("status") == "ok" and b.get("eager_ms") and b["backend"] != "auto"}
            out[r["name"]] = (table.bucket_of(table.recorded_problem(r)).phase, ms)  # the phase a table's row scales by
    return out, results["environment"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", nargs="+", type=Path, required=True, help="bench JSONs of GPU A")
    ap.add_argument("--b", nargs="+", type=Path, required=True, help="bench JSONs of GPU B, the same problems")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    (a, env_a), (b, env_b) = times(args.a), times(args.b)
    ratios: dict[tuple[str, str], list[float]] = {}
    for name in a.keys() & b.keys():
        phase, ms_a = a[name]
        for backend in ms_a.keys() & b[name][1].keys():
            ratios.setdefault((phase, backend), []).append(ms_a[backend] / b[name][1][backend])
    md = [f"# {env_a['gpu']} time / {env_b['gpu']} time, the same problems", "",
          f"A: {' + '.join(p.name for p in args.a)} (FlashInfer {env_a.get('flashinfer')}); "
          f"B: {' + '.join(p.name for p in args.b)} (FlashInfer {env_b.get('flashinfer')}).", "",
          "| phase | backend | problems | p10 | median | p90 |", "|---|---|---|---|---|---|"]
    for (phase, backend), values in sorted(ratios.items()):
        values.sort()
        md.append(f"| {phase} | {backend} | {len(values)} | {values[len(values) // 10]:.2f} | "
                  f"{statistics.median(values):.2f} | {values[9 * len(values) // 10]:.2f} |")
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
