"""How far the sweeps' own judgement repeats: two bench runs of the same problems (the same seed and
``--start``, one after the other) compared. Per problem, the backend fastest in the first run is
judged by the second run's times, as the choice is judged (GPU ms; call cost = GPU ms + host us per
eager call): were the first run's times the choice, how often would it be within 3% of the second
run's fastest? That is the most any choice can score against a judge this noisy. Also the spread of
one backend's two timings (GPU ms, host us).

    python -m tools.judge_repeat RUN1.json RUN2.json --out DIR --stem NAME
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

from tools.lab.table import NOT_BACKENDS


def times(result: dict, cost: bool) -> dict[str, float]:
    """backend -> GPU ms (``cost``: plus host us / 1e3) of one problem's timed backends (ours only)."""
    return {b["backend"]: b["eager_ms"] + (b["host_us"] / 1e3 if cost else 0.0) for b in result["backends"]
            if b["backend"] not in NOT_BACKENDS and b.get("status") == "ok" and b.get("eager_ms")
            and (not cost or b.get("host_us") is not None)}


def oracle_regrets(first: dict[str, dict], second: dict[str, dict], cost: bool) -> list[float]:
    """Per problem both runs timed: the second run's time of the first run's fastest over its own fastest - 1."""
    out = []
    for name in first.keys() & second.keys():
        a, b = times(first[name], cost), times(second[name], cost)
        common = a.keys() & b.keys()
        if common:
            pick = min(common, key=a.__getitem__)
            out.append(b[pick] / min(b[n] for n in common) - 1.0)
    return sorted(out)


def spreads(first: dict[str, dict], second: dict[str, dict], key: str) -> list[float]:
    """|second / first - 1| of one backend's ``key`` ("eager_ms" or "host_us") over the problems both timed."""
    out = []
    for name in first.keys() & second.keys():
        a = {b["backend"]: b.get(key) for b in first[name]["backends"]}
        for b in second[name]["backends"]:
            if b.get(key) and a.get(b["backend"]):
                out.append(abs(b[key] / a[b["backend"]] - 1.0))
    return sorted(out)


def _at(values: list[float], share: float) -> Optional[float]:
    return values[min(len(values) - 1, int(share * len(values)))] if values else None


def figures(run1: dict, run2: dict) -> dict:
    first, second = ({r["name"]: r for r in run["results"] if "backends" in r} for run in (run1, run2))
    out = {"problems": len(first.keys() & second.keys())}
    for label, cost in (("gpu", False), ("cost", True)):
        regrets = oracle_regrets(first, second, cost)
        out[label] = {"count": len(regrets), "within_3pct": sum(x <= 0.03 for x in regrets),
                      "within_10pct": sum(x <= 0.10 for x in regrets), "p90": _at(regrets, 0.9),
                      "max": regrets[-1] if regrets else None}
    for key in ("eager_ms", "host_us"):
        values = spreads(first, second, key)
        out[f"spread_{key}"] = {"count": len(values), "p50": _at(values, 0.5), "p90": _at(values, 0.9)}
    return out


def markdown(sources: list[str], fig: dict, method: str) -> str:
    def pct(x) -> str:
        return "-" if x is None else f"{x:.1%}"
    rows = [f"| {label} | {fig[k]['count']} | {fig[k]['within_3pct']} ({fig[k]['within_3pct'] / max(1, fig[k]['count']):.0%})"
            f" | {fig[k]['within_10pct']} | {pct(fig[k]['p90'])} | {pct(fig[k]['max'])} |"
            for label, k in (("GPU time (a CUDA graph's choice)", "gpu"), ("call cost (an eager call's)", "cost"))]
    spread = [f"| {label} | {fig[k]['count']} | {pct(fig[k]['p50'])} | {pct(fig[k]['p90'])} |"
              for label, k in (("GPU ms", "spread_eager_ms"), ("host us", "spread_host_us"))]
    return "\n".join([
        "# The sweeps' judgement, run twice", "", f"Runs: {sources[0]} (first), {sources[1]} (second); "
        f"{fig['problems']} problems both timed. tools/judge_repeat.py.", "", f"Host times: {method}", "",
        "The first run's fastest, judged by the second run's times:", "",
        "| regret by | problems | within 3% | within 10% | p90 | max |", "|---|---|---|---|---|---|", *rows, "",
        "One backend timed in both runs, |second / first - 1|:", "", "| time | pairs | p50 | p90 |", "|---|---|---|---|",
        *spread, ""])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--stem", default="judge-repeat")
    args = ap.parse_args()
    run1, run2 = (json.loads(p.read_text()) for p in (args.first, args.second))
    fig = figures(run1, run2)
    method = run2.get("method", "")
    method = method[method.find("host:"):].split("; graph:")[0] if "host:" in method else "(not stated)"
    text = markdown([args.first.name, args.second.name], fig, method)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stem}.md").write_text(text)
    (args.out / f"{args.stem}.json").write_text(json.dumps({"sources": [str(args.first), str(args.second)],
                                                            **fig}, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
