"""How far the choice table's estimates are from one GPU's measured times: per backend, phase and
basis (``table``; ``autotune`` where it is on), the median of measured / estimated GPU ms and the
geometric mean of each estimate's error, over the problems of the bench files given (one GPU's).
The estimates are the router's for a call in a CUDA graph (GPU time alone), on the GPU the files
name, with the table that GPU ranks by (``capability_db.choice_table.table_for``: the GPU's own,
else its SM's scaled). A uniform factor leaves the order of backends as it is; the spread between
backends' medians, and the error of one estimate, do not.

    python -m tools.estimate_error BENCH.json [BENCH.json ...] --out DIR --stem NAME
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import statistics
from pathlib import Path

from dispatch import router
from tools.lab import table


def errors(results: dict) -> dict[tuple[str, str, str], list[float]]:
    """(backend, phase, basis) -> log2(measured / estimated) of each problem that timed the backend."""
    device = table.sweep_device(results["environment"])
    out = collections.defaultdict(list)
    for r in results["results"]:
        timed = {b["backend"]: b["eager_ms"] for b in r.get("backends", ())
                 if b["backend"] not in ("auto", "flashinfer") and b.get("status") == "ok" and b.get("eager_ms")}
        if not timed:
            continue
        p = table.recorded_problem(r)
        decision = router.decide(dataclasses.replace(table.problem_of(p), cuda_graph=True), device, live=False)
        phase = "decode" if p.q_len == 1 else "prefill"
        for c in decision.candidates:
            if c.evidence is not None and c.backend in timed:
                out[(c.backend, phase, c.evidence.basis)].append(math.log2(timed[c.backend] / c.evidence.ms))
    return out


def markdown(sources: list[str], gpu: str, errs: dict) -> str:
    md = [f"# The table's estimates against {gpu}'s measured times", "",
          f"Problems: {' + '.join(sources)} (tools/estimate_error.py). measured / estimated GPU ms.", "",
          "| backend | phase | basis | problems | median | mean error (x) |", "|---|---|---|---|---|---|"]
    for (backend, phase, basis), v in sorted(errs.items()):
        md.append(f"| {backend} | {phase} | {basis} | {len(v)} | {2 ** statistics.median(v):.2f} | "
                  f"{2 ** statistics.mean(map(abs, v)):.2f} |")
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", nargs="+", type=Path, help="bench JSONs of one GPU")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stem", required=True)
    args = ap.parse_args()
    results, _ = table.merged(args.bench)
    text = markdown([p.name for p in args.bench], results["environment"]["gpu"], errors(results))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
