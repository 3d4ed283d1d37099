"""What the tools that read bench JSONs share: their command line and the figures of a ratio
against FlashInfer's own call (the regret figures are the bench's, dispatch.benchmark.report)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any


def ratio_figures(results: list[dict], key: str) -> dict[str, Any]:
    """Count, p50, max of a ratio against FlashInfer's own call (``key``: "over_flashinfer", GPU ms;
    "cost_over_flashinfer", GPU + host) and how many are at most 1.03 and above 1.10."""
    ratios = sorted(r[key] for r in results if r.get(key) is not None)
    if not ratios:
        return {"count": 0}
    p50 = ratios[min(len(ratios) - 1, max(0, math.ceil(0.5 * len(ratios)) - 1))]
    return {"count": len(ratios), "p50": p50, "max": ratios[-1],
            "at_most_1_03": sum(x <= 1.03 for x in ratios), "above_1_10": sum(x > 1.10 for x in ratios)}


def bench_files_parser(doc: str, stem: str) -> argparse.ArgumentParser:
    """The command line of the tools that read bench JSONs (described by ``doc``'s first
    paragraph): the files, then --out DIR (default .) and --stem NAME (default ``stem``)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("bench", nargs="+", type=Path, help="bench JSONs")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--stem", default=stem)
    return ap
