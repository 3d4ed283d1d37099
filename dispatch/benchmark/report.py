"""The bench's outputs: JSON (everything), Markdown (the regret and noise figures, then one line
per problem) and, when matplotlib is installed (the ``bench`` extra), two PNG plots: the rate of
every backend per problem, one panel per entry point and phase, problems grouped by feature set
(points, no lines: neighbouring problems are unrelated), auto's choice marked; and the histogram
of auto's regret. Both titles name the device, the grid and the versions."""
from __future__ import annotations

import datetime
import json
import math
import platform
import textwrap
from pathlib import Path
from typing import Any, Optional

import torch

from .problems import SHORT_OF


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def regret_figures(results: list[dict], key: str = "regret") -> dict[str, Any]:
    """Count, p50, p95, max of auto's regret (``key``: "regret", GPU time; "cost_regret", GPU +
    host per eager call) and how many problems are within 3% / 10%; the noise (two timings of one
    backend: auto's run and the forced run of what it served): p50 and max."""
    regrets = sorted(r[key] for r in results if r.get(key) is not None)
    if not regrets:
        return {"count": 0}
    noise = sorted(r["noise"] for r in results if r.get("noise") is not None)
    return {"count": len(regrets), "p50": _pct(regrets, 0.5), "p95": _pct(regrets, 0.95), "max": regrets[-1],
            "within_3pct": sum(x <= 0.03 for x in regrets), "within_10pct": sum(x <= 0.10 for x in regrets),
            "auto_served_fastest": sum(r.get("auto") == r.get("fastest") for r in results if r.get(key) is not None),
            "noise_p50": _pct(noise, 0.5) if noise else None, "noise_max": noise[-1] if noise else None}


def skipped(results: list[dict]) -> dict[str, str]:
    """Backend -> why it did not run here and how to enable it (once, not per problem)."""
    return {b["backend"]: b.get("note", "") for r in results for b in r.get("backends", []) if b["status"] == "skipped"}


def _figures_text(fig: dict) -> str:
    text = (f"Regret of the automatic choice over {fig['count']} problems: p50 {fig['p50']:.1%}, p95 "
            f"{fig['p95']:.1%}, max {fig['max']:.1%}; within 3% of the fastest: {fig['within_3pct']}; auto served "
            f"the fastest backend on {fig.get('auto_served_fastest', '?')} (regret 0)")
    if fig.get("noise_p50") is not None:
        text += (f"; noise (two timings of the same backend): p50 {fig['noise_p50']:.1%}, "
                 f"max {fig['noise_max']:.1%}")
    return text


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.4g}"


def _share(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"


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
    names = sorted({b["backend"] for r in results for b in r.get("backends", [])
                    if b["backend"] != "auto" and b["status"] != "skipped"})
    fig = report["regret"]
    lines = [f"# attn-dispatch bench: {report['grid']} on {env.get('gpu') or 'CPU'}", "",
             ", ".join(f"{k} {v}" for k, v in env.items()), "", report["method"], ""]
    if fig.get("count"):
        lines += [f"**{_figures_text(fig)}**; within 10%: {fig['within_10pct']}.", ""]
    lines += [f"- not run here: {name} ({why})" for name, why in skipped(results).items()]
    lines += [""] if skipped(results) else []
    ratios = [r["auto_over_flashinfer"] for r in results if r.get("auto_over_flashinfer")]
    if ratios:
        lines += [f"**Auto against FlashInfer's own call** (the `flashinfer` column: its own entry point, its own "
                  f"choice) on {len(ratios)} problems: auto faster or within 3% on "
                  f"{sum(x <= 1.03 for x in ratios)}; auto / FlashInfer best {min(ratios):.2f}, worst "
                  f"{max(ratios):.2f}.", ""]
    lines += ["| problem | fastest | auto | regret | noise | " + " | ".join(names) + " |",
              "|---|---|---|---|---|" + "---|" * len(names)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | error: {r['error']} ||||" + "|" * len(names))
            continue
        by = {b["backend"]: b for b in r["backends"]}
        auto = by.get("auto", {"status": "missing"})
        cells = [(_cell(by[n], r["unit"]) if n in by and by[n]["status"] != "skipped" else "") for n in names]
        fastest = f"{r['fastest']}: {_ms(r['fastest_ms'])} ms" if r.get("fastest") else "-"
        lines.append(f"| {r['name']} | {fastest} | {_cell(auto, r['unit'])} | {_share(r.get('regret'))} | "
                     f"{_share(r.get('noise'))} | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines + _profiles(results)) + "\n"


def _profiles(results: list[dict]) -> list[str]:
    """``bench --profile N``: per problem and backend, host us per call and where it goes."""
    lines = []
    for r in results:
        for b in r.get("backends", []):
            if b.get("profile"):
                served = f" (served by {b['served']})" if b.get("served") not in (None, b["backend"]) else ""
                lines += ["", f"profile of {r['name']}, {b['backend']}{served}: host {b['host_us']} us per call",
                          ""] + [f"    {line}" for line in b["profile"]]
                for key, what in (("kernels", "eager"), ("graph_kernels", "CUDA graph")):
                    if b.get(key):
                        lines += ["", f"  CUDA kernels per {what} call:", ""] + [f"    {line}" for line in b[key]]
    return ([""] + ["## Where the host time goes (cProfile; it inflates every Python call alike)"] + lines
            if lines else [])


SUMMARY_COLUMNS = ((38, "problem"), (13, "fastest"), (8, "ms"), (13, "auto"), (8, "ms"), (7, "regret"),
                   (6, "noise"))


def summary_text(report: dict, width: int = 100) -> str:
    """The terminal's form of ``markdown``: the regret figures and one row per problem (fastest,
    auto, their ms, the regret) within ``width`` columns; a backend that failed its check or
    raised is named under its problem. The full table (every backend's time and rate) is the .md."""
    fig, results = report["regret"], report["results"]
    lines = [f"attn-dispatch bench: {report['grid']} on {report['environment'].get('gpu') or 'CPU'}, "
             f"{len(results)} problems"]
    if fig.get("count"):
        lines += textwrap.wrap(_figures_text(fig), width)
    by_why: dict[str, list[str]] = {}
    for name, why in skipped(results).items():  # backends that share a package share a line
        by_why.setdefault(why, []).append(name)
    for why, names in by_why.items():
        lines += textwrap.wrap(f"not run here: {', '.join(names)} ({why})", width, subsequent_indent="    ",
                               break_on_hyphens=False)
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
    cells = [r.get("fastest") or "-", _ms(r.get("fastest_ms")), r.get("auto") or "-", _ms(r.get("auto_ms")),
             _share(r.get("regret")), _share(r.get("noise"))]
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
    """``<stem>-throughput.png`` (every entry point and phase measured) and ``<stem>-regret.png``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # an optional extra: no plot without it
        return []
    results = [r for r in report["results"] if "backends" in r]
    paths = []
    panels: dict[tuple, list[dict]] = {}
    for r in results:
        p = r["problem"]
        panels.setdefault((SHORT_OF[p["entry"]], "decode" if p["q_len"] == 1 else "prefill", r["unit"]), []).append(r)
    if panels:
        names = sorted({b["backend"] for r in results for b in r["backends"] if b.get("rate")} - {"auto"})
        colors = {n: f"C{i % 10}" for i, n in enumerate(names)}
        cols = min(3, len(panels))
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
        for ax, ((entry, phase, unit), rs) in zip(axes.flat, sorted(panels.items())):
            _rate_panel(ax, entry, phase, unit, rs, colors)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        handles = [plt.Line2D([], [], marker="o", linestyle="none", color=c, label=n) for n, c in colors.items()]
        handles.append(plt.Line2D([], [], marker="x", linestyle="none", color="black", markersize=9, label="auto"))
        fig.legend(handles=handles, loc="lower center", ncol=min(8, len(handles)), fontsize=8)
        fig.suptitle(plot_title(report, "rate per problem, grouped by feature set"), fontsize=9)
        fig.tight_layout(rect=(0, 0.05, 1, 0.95))
        paths.append(out / f"{stem}-throughput.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    regrets = [100 * r["regret"] for r in results if r.get("regret") is not None]
    if regrets:
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        ax.hist(regrets, bins=20)
        ax.set_xlabel("regret of the automatic choice, % (the served backend's time / the fastest's - 1)")
        ax.set_ylabel("problems")
        ax.set_title(plot_title(report, "regret"), fontsize=8)
        fig.tight_layout()
        paths.append(out / f"{stem}-regret.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


VERSIONS = ("attn-dispatch", "torch", "triton", "flashinfer", "cudnn")


def plot_title(report: dict, what: str) -> str:
    """Two lines: what, the grid and the device; the versions that made the numbers."""
    env = report.get("environment", {})
    device = env.get("gpu") or f"CPU ({env.get('cpu') or 'unknown'})"
    versions = ", ".join(f"{k} {str(env[k]).split(' (')[0]}" for k in VERSIONS if k in env)
    return f"attn-dispatch bench: {what}; grid {report.get('grid')} on {device}\n{versions}"


def feature_set(name: str) -> str:
    """A problem's name without the entry point and the sizes: heads, head dim, dtype, features."""
    return name.split(" ", 2)[2] if name.count(" ") >= 2 else name


def _rate_panel(ax, entry: str, phase: str, unit: str, rs: list[dict], colors: dict[str, str]) -> None:
    """One point per problem and backend (log rate), problems grouped by feature set and ordered by
    size within a group; a dotted line and a label between groups; auto as a black cross."""
    size = lambda r: (r["problem"]["batch"] * r["problem"]["kv_len"], r["problem"]["q_len"])  # noqa: E731
    rs = sorted(rs, key=lambda r: (feature_set(r["name"]), size(r)))
    groups = [feature_set(r["name"]) for r in rs]
    for x, r in enumerate(rs):
        for b in r["backends"]:
            if b.get("rate") and b["backend"] != "auto":
                ax.plot(x, b["rate"], marker="o", linestyle="none", color=colors.get(b["backend"], "grey"))
        auto = next((b for b in r["backends"] if b["backend"] == "auto" and b.get("rate")), None)
        if auto is not None:
            ax.plot(x, auto["rate"], marker="x", linestyle="none", color="black", markersize=9)
    starts = [i for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    for i in starts:
        if i:
            ax.axvline(i - 0.5, color="grey", linestyle=":", linewidth=0.8)
        ax.annotate(groups[i], (i - 0.4, 1.0), xycoords=("data", "axes fraction"), va="bottom", fontsize=6,
                    annotation_clip=False)
    ax.set_xticks(range(len(rs)))
    p0 = [r["problem"] for r in rs]
    ax.set_xticklabels([f"{p['batch']}x{p['q_len']}x{p['kv_len']}" for p in p0], rotation=60, fontsize=6)
    ax.set_xlim(-0.6, len(rs) - 0.4)
    ax.set_yscale("log")
    ax.set_title(f"{entry} {phase}", fontsize=9, pad=14)
    ax.set_xlabel("problem: batch x q_len x kv_len", fontsize=7)
    ax.set_ylabel(unit, fontsize=8)


def environment(device: str) -> dict:
    """The run's machine and versions (every bench and trace report opens with them)."""
    from .._version import version

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__, "attn-dispatch": version()}
    if device == "cuda":
        env.update(gpu=torch.cuda.get_device_name(), capability="sm_%d%d" % torch.cuda.get_device_capability(),
                   cuda=torch.version.cuda)
    else:
        env.update(gpu=None, cpu=platform.processor() or platform.machine())
    for module in ("triton", "flashinfer", "cudnn"):
        try:
            env[module] = getattr(__import__(module), "__version__", "installed")
        except Exception as exc:  # noqa: BLE001 - a missing package is a fact of the run
            env[module] = f"not installed ({type(exc).__name__})"
    if device == "cuda":  # what auto's column ranked by (an H100 ranks by the H200's table, scaled)
        from capability_db import choice_table

        from .. import devices
        env["timing_table"] = choice_table.describe(devices.live_device(torch.empty(0, device="cuda")))
    from .. import autotune

    kept = autotune.describe_kept()
    if kept:  # auto's column is (partly) what timing on this machine chose: the run says so
        env["autotune"] = kept
    return env
