"""``attn-dispatch tune``: the warm-up autotune offline, and its cache files.

    attn-dispatch tune --shapes SHAPES [--cache FILE]   # time the buckets of a list of shapes
    attn-dispatch tune --trace TRACE.json [--cache FILE] [--steps N]   # ... of a recorded trace
    attn-dispatch tune show [--cache FILE] [--json]     # what a cache holds
    attn-dispatch tune export OUT [--cache FILE]        # a copy to ship (merged into OUT if it exists)
    attn-dispatch tune merge FILE [FILE ...] [--into FILE]   # others' caches into one (default: this machine's)

Without --cache the file is this machine's default: $ATTN_DISPATCH_CACHE_DIR (default
~/.cache/attn-dispatch)/autotune-<environment fingerprint>.json, as dispatch.autotune's.

Shapes (--shapes): a text file, one shape a line, written as the options of 'attn-dispatch query'
without --gpu (this machine's device), --sizes BATCH MAX_Q MAX_KV giving the bucket (without it,
the phase's anchor sizes); # starts a comment, blank lines are skipped:

    # Llama-3-8B on one GPU: decode at two batch sizes, a prefill chunk
    --phase decode --heads 32/8 --head-dim 128 --sizes 8 1 4096
    --phase decode --heads 32/8 --head-dim 128 --sizes 64 1 4096 --cuda-graph
    --phase prefill --causal --heads 32/8 --head-dim 128 --sizes 4 512 512

Trace (--trace): a file 'attn-dispatch bench --trace' wrote; its steps are drawn again from
its seed and configuration and run through this package's entry points (one layer), so every bucket
the trace reaches is decided inside the tuning context, with the trace's own tensors.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from . import autotune


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-dispatch tune", description=__doc__.split(": ", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="attn-dispatch tune {show,export,merge} -h: those actions' options")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--shapes", type=Path, metavar="FILE", help="one shape a line: query's options (above)")
    what.add_argument("--trace", type=Path, metavar="FILE", help="a trace-<device>-seed-<seed>.json of bench --trace")
    p.add_argument("--cache", type=Path, metavar="FILE", help="the cache file (default: this machine's)")
    p.add_argument("--steps", type=int, metavar="N", help="--trace: the first N steps of each entry (default all)")
    p.add_argument("--json", action="store_true")
    return p


def action_parser(action: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"attn-dispatch tune {action}")
    if action == "export":
        p.add_argument("out", type=Path, metavar="OUT")
    if action == "merge":
        p.add_argument("files", type=Path, nargs="+", metavar="FILE")
        p.add_argument("--into", type=Path, metavar="FILE", help="default: this machine's cache")
    else:
        p.add_argument("--cache", type=Path, metavar="FILE", help="default: this machine's cache")
    if action == "show":
        p.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv and argv[0] in ("show", "export", "merge"):
        args = action_parser(argv[0]).parse_args(argv[1:])
        return {"show": show, "export": export, "merge": merge}[argv[0]](args)
    p = parser()
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error(f"argument --steps: {args.steps} is not allowed; expected a positive integer")
    try:
        rows = tune_shapes(args.shapes, args.cache) if args.shapes else tune_trace(args.trace, args.cache, args.steps)
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for row in rows:
            print(f"{row['chosen']:14s} {row['decided_by']:38s} {row['shape']}")
        print(f"cache: {_cache_or_default(args.cache)}")
    return 0


def _device():
    return autotune.current_device()


def tune_shapes(path: Path, cache: Optional[Path]) -> list[dict]:
    """Decide every shape of ``path`` inside a tuning context; one row per shape."""
    from . import problem_options, router

    device, query = _device(), argparse.ArgumentParser(prog=f"attn-dispatch tune --shapes {path}", add_help=False)
    problem_options.add_problem_options(query, gpu_required=False)
    problems = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            args = query.parse_args(shlex.split(text))
        except SystemExit:
            raise ValueError(f"--shapes {path}, line {number}: {text!r} is not a list of query's options "
                             "(attn-dispatch query -h)") from None
        if args.gpu is not None:
            raise ValueError(f"--shapes {path}, line {number}: --gpu is not allowed; a shape is tuned on this machine")
        problems.append((text, problem_options.build_problem(args, device, query)))
    rows = []
    with autotune.autotune(True, cache=cache):
        for text, problem in problems:
            try:
                decision = router.decide(problem, device)
            except router.NoBackendError as exc:  # a shape nothing serves here is a row, not the end
                rows.append({"shape": text, "chosen": "none", "decided_by": str(exc).splitlines()[0][:120]})
                continue
            rows.append({"shape": text, "chosen": decision.chosen, "decided_by": decision.evidence})
    return rows


def tune_trace(path: Path, cache: Optional[Path], steps: Optional[int]) -> list[dict]:
    """Run a recorded trace's steps through our entry points inside a tuning context (module doc)."""
    from .benchmark import trace
    from .entries import last_decision

    rep = json.loads(Path(path).read_text())
    if rep.get("benchmark") != "trace" or "config" not in rep or "seed" not in rep:
        raise ValueError(f"--trace {path}: not a file of attn-dispatch bench --trace (no benchmark/config/seed)")
    cfg = dict(rep["config"])
    if cfg["device"] == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--trace {path}: recorded on cuda; no CUDA device here")
    cfg = trace.Config(**{**cfg, "dtype": getattr(torch, cfg["dtype"]), "bounds": trace.Bounds(**cfg["bounds"]),
                          "layers": 1})
    rows = []
    with autotune.autotune(True, cache=cache):
        for name in rep["entries"]:
            spec = trace.ENTRIES[name]
            drawn = trace.draw(spec.trace, rep["seed"], "timed", steps or cfg.steps, cfg)
            pools = trace.make_pools(drawn, spec.paged, cfg, rep["seed"])
            side = trace.make_side("ours", trace.ours_api(), "", spec, cfg)
            trace.run_pass(drawn, lambda step: spec.inputs(step, pools, cfg), [side], "warm-up", cfg.device == "cuda")
            served = last_decision()
            rows.append({"shape": f"{name}: {len(drawn)} steps" + (f" ({side.error})" if side.error else ""),
                         "chosen": served.chosen if served else "none",
                         "decided_by": served.evidence if served else ""})
    return rows


def _cache_or_default(path: Optional[Path]) -> Path:
    return path or autotune.default_file(_device())


def show(args: argparse.Namespace) -> int:
    path = _cache_or_default(args.cache)
    try:
        data = autotune.load(path)
    except (OSError, ValueError) as exc:
        print(f"attn-dispatch tune show: {path}: {exc}", file=sys.stderr)
        return 1
    if data is None:
        print(f"attn-dispatch tune show: {path}: no such file (nothing tuned here yet)", file=sys.stderr)
        return 1
    differs = autotune.mismatch(data.get("environment"), autotune.fingerprint(_device()))
    if args.json:
        print(json.dumps({"file": str(path), "matches_here": not differs, **data}, indent=1))
        return 0
    print(f"{path}: {len(data['buckets'])} buckets; "
          + ("made here" if not differs else "made elsewhere: " + ", ".join(f"{k} {a}" for k, (a, _) in differs.items())))
    for key, entry in sorted(data["buckets"].items(), key=lambda kv: kv[1].get("measured") or ""):
        times = {n: t["ms"] if isinstance(t, dict) else t for n, t in entry["times"].items() if t is not None}
        ranked = ", ".join(f"{n} {ms:.4g} ms" for n, ms in sorted(times.items(), key=lambda kv: kv[1]))
        print(f"  {entry.get('measured') or 'undated'}  {_short_key(key)}: {ranked or 'every timing failed'}")
    return 0


def _short_key(key: str) -> str:
    """A bucket key in a line: the entry point, phase and sizes (the full key: --json)."""
    problem, _, sizes = key.rpartition("|")
    fields = dict(part.split("=", 1) for part in problem[problem.find("(") + 1:-1].split(", ") if "=" in part)
    return f"{fields.get('entry', '?').strip(chr(39))} {fields.get('phase', '?').strip(chr(39))} {sizes}"


def export(args: argparse.Namespace) -> int:
    source = _cache_or_default(args.cache)
    data = autotune.load(source)
    if data is None:
        print(f"attn-dispatch tune export: {source}: no such file", file=sys.stderr)
        return 1
    written = autotune.save(args.out, data["buckets"], data.get("environment") or autotune.fingerprint(_device()))
    print(f"{args.out}: {len(data['buckets'])} buckets from {source}" + ("" if written else " NOT written (see log)"))
    return 0 if written else 1


def merge(args: argparse.Namespace) -> int:
    """Each file whose environment matches the target's (this machine's, for the default) goes in."""
    into = _cache_or_default(args.into)
    target = autotune.load(into) if into.exists() else None
    env = (target or {}).get("environment") or autotune.fingerprint(_device())
    merged, code = dict((target or {}).get("buckets", {})), 0
    for path in args.files:
        data = autotune.load(path)
        differs = autotune.mismatch((data or {}).get("environment"), env)
        if data is None or differs:
            print(f"  {path}: skipped: " + ("no such file" if data is None else "made in another environment ("
                                             + ", ".join(differs) + ")"))
            code = 1
            continue
        autotune.adopt(merged, data["buckets"])
        print(f"  {path}: {len(data['buckets'])} buckets")
    if merged and not autotune.save(into, merged, env):  # the latest measured of each bucket (adopt)
        return 1
    print(f"{into}: {len(merged)} buckets")
    return code

