"""The bench's outputs: JSON (everything), Markdown (one line per problem, then the regret
figures) and, when matplotlib is installed, two PNG plots: throughput vs length per backend
(auto's choice marked) and the histogram of auto's regret."""
from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any, Optional

from .problems import SHORT_OF


def regret_figures(results: list[dict]) -> dict[str, Any]:
    """Count, p50, p95, max of auto's regret and how many problems are within 3% / 10%."""
    regrets = sorted(r["regret"] for r in results if r.get("regret") is not None)
    if not regrets:
        return {"count": 0}

    def pct(q: float) -> float:
        return regrets[min(len(regrets) - 1, max(0, math.ceil(q * len(regrets)) - 1))]
    return {"count": len(regrets), "p50": pct(0.5), "p95": pct(0.95), "max": regrets[-1],
            "within_3pct": sum(x <= 0.03 for x in regrets), "within_10pct": sum(x <= 0.10 for x in regrets)}


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.4g}"


def _cell(r: dict, unit: str) -> str:
    if r["status"] != "ok":
        note = r.get("note", "")
        return r["status"] + (f" ({note[:60]})" if note and r["status"] != "refused" else "")
    text = f"{_ms(r['eager_ms'])} ms, {r['rate']:.3g} {unit}"
    if r.get("graph_ms"):
        text += f", graph {_ms(r['graph_ms'])}"
    if r["backend"] == "auto" and r.get("served"):
        text = f"{r['served']}: " + text
    return text


def markdown(report: dict) -> str:
    env, results = report["environment"], report["results"]
    names = sorted({b["backend"] for r in results for b in r.get("backends", []) if b["backend"] != "auto"})
    fig = report["regret"]
    lines = [f"# attn-dispatch bench: {report['grid']} on {env.get('gpu') or 'CPU'}", "",
             ", ".join(f"{k} {v}" for k, v in env.items()), "", report["method"], ""]
    if fig.get("count"):
        lines += [f"**Regret of the automatic choice** over {fig['count']} problems: p50 {fig['p50']:.1%}, "
                  f"p95 {fig['p95']:.1%}, max {fig['max']:.1%}; within 3% of the fastest: {fig['within_3pct']}, "
                  f"within 10%: {fig['within_10pct']}.", ""]
    ratios = [r["auto_over_flashinfer"] for r in results if r.get("auto_over_flashinfer")]
    if ratios:
        lines += [f"**Auto against FlashInfer's own call** (the `flashinfer` column: its own entry point, its own "
                  f"choice) on {len(ratios)} problems: auto faster or within 3% on "
                  f"{sum(x <= 1.03 for x in ratios)}; auto / FlashInfer best {min(ratios):.2f}, worst "
                  f"{max(ratios):.2f}.", ""]
    lines += ["| problem | fastest | auto | regret | " + " | ".join(names) + " |",
              "|---|---|---|---|" + "---|" * len(names)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error']} |||" + "|" * len(names))
            continue
        by = {b["backend"]: b for b in r["backends"]}
        auto = by.get("auto", {"status": "missing"})
        regret = "-" if r.get("regret") is None else f"{r['regret']:.1%}"
        cells = [(_cell(by[n], r["unit"]) if n in by else "") for n in names]
        lines.append(f"| {r['name']} | {r.get('fastest') or '-'} | {_cell(auto, r['unit'])} | {regret} | "
                     + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


SUMMARY_COLUMNS = ((42, "problem"), (14, "fastest"), (9, "ms"), (14, "auto"), (9, "ms"), (7, "regret"))


def summary_text(report: dict, width: int = 100) -> str:
    """The terminal's form of ``markdown``: the regret figures and one row per problem (fastest,
    auto, their ms, the regret) within ``width`` columns; a backend that failed its check or
    raised is named under its problem. The full table (every backend's time and rate) is the .md."""
    fig, results = report["regret"], report["results"]
    lines = [f"attn-dispatch bench: {report['grid']} on {report['environment'].get('gpu') or 'CPU'}, "
             f"{len(results)} problems"]
    if fig.get("count"):
        lines += textwrap.wrap(f"regret of the automatic choice: p50 {fig['p50']:.1%}, p95 {fig['p95']:.1%}, "
                               f"max {fig['max']:.1%}; within 3% of the fastest: {fig['within_3pct']} of "
                               f"{fig['count']}", width)
    ratios = [r["auto_over_flashinfer"] for r in results if r.get("auto_over_flashinfer")]
    if ratios:
        lines += textwrap.wrap(f"auto / FlashInfer's own call: best {min(ratios):.2f}, worst {max(ratios):.2f}, "
                               f"auto faster or within 3% on {sum(x <= 1.03 for x in ratios)} of {len(ratios)}",
                               width)
    lines += ["", _columns([title for _, title in SUMMARY_COLUMNS])]
    for r in results:
        lines += _summary_rows(r, width)
    return "\n".join(line[:width] for line in lines)


def _columns(cells: list[str]) -> str:
    return " ".join(f"{c:<{w}.{w}}" for (w, _), c in zip(SUMMARY_COLUMNS, cells)).rstrip()


def _summary_rows(r: dict, width: int) -> list[str]:
    name = r["name"]
    if "error" in r:
        return textwrap.wrap(f"{name}: {r['error']}", width, subsequent_indent="  ")
    regret = "-" if r.get("regret") is None else f"{r['regret']:.1%}"
    cells = [r.get("fastest") or "-", _ms(r.get("fastest_ms")), r.get("auto") or "-", _ms(r.get("auto_ms")), regret]
    fits = len(name) <= SUMMARY_COLUMNS[0][0]
    rows = [_columns([name if fits else "", *cells])] if fits else [name, _columns(["", *cells])]
    bad = [f"{b['backend']} {b['status']}" + (f" ({b['note']})" if b.get("note") else "")
           for b in r.get("backends", []) if b["status"] in ("DISAGREES", "error")]
    if bad:
        rows += textwrap.wrap("; ".join(bad), width, initial_indent="  ! ", subsequent_indent="    ")
    return rows


def write(report: dict, out: Path, stem: str) -> list[Path]:
    """DIR/<stem>.json and .md, and the PNG plots when matplotlib is installed."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(report, indent=1, default=str))
    paths[1].write_text(markdown(report))
    return paths + plots(report, out, stem)


def plots(report: dict, out: Path, stem: str) -> list[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # an optional extra: no plot without it
        return []
    results = [r for r in report["results"] if "backends" in r]
    paths = []
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        p = r["problem"]
        groups.setdefault((SHORT_OF[p["entry"]], "decode" if p["q_len"] == 1 else "prefill", r["unit"]), []).append(r)
    panels = [(k, v) for k, v in groups.items() if len(v) >= 2]
    if panels:
        cols = min(3, len(panels))
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
        for ax, ((entry, phase, unit), rs) in zip(axes.flat, panels):
            _throughput_panel(ax, entry, phase, unit, rs)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.tight_layout()
        paths.append(out / f"{stem}-throughput.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    regrets = [100 * r["regret"] for r in results if r.get("regret") is not None]
    if regrets:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.hist(regrets, bins=20)
        ax.set_xlabel("regret of the automatic choice, % (auto / fastest - 1)")
        ax.set_ylabel("problems")
        fig.tight_layout()
        paths.append(out / f"{stem}-regret.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def _throughput_panel(ax, entry: str, phase: str, unit: str, rs: list[dict]) -> None:
    """Rate vs total KV length (batch x kv_len) per backend; auto drawn as crosses."""
    rs = sorted(rs, key=lambda r: r["problem"]["batch"] * r["problem"]["kv_len"])
    xs = [r["problem"]["batch"] * r["problem"]["kv_len"] for r in rs]
    names = sorted({b["backend"] for r in rs for b in r["backends"]})
    for name in names:
        pts = [(x, b["rate"]) for x, r in zip(xs, rs) for b in r["backends"] if b["backend"] == name and b.get("rate")]
        if pts:
            style = dict(marker="x", linestyle="none", color="black", markersize=8) if name == "auto" else dict(marker="o")
            ax.plot(*zip(*pts), label=name, **style)
    ax.set_xscale("log")
    ax.set_title(f"{entry} {phase}")
    ax.set_xlabel("batch x kv_len (keys)")
    ax.set_ylabel(unit)
    ax.legend(fontsize=7)
