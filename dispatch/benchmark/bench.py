"""``attn-dispatch bench``: the one benchmark runner.

Sweeps a named grid (``--grid quick|h100``; ``--quick`` = ``--grid quick``), a user's JSON list
of problems (``--problems FILE``; fields: dispatch/benchmark/problems.py) or N random problems
(``--random N [--seed S]``: the distribution and its caps are dispatch/benchmark/randomgrid.py's; without
``--seed`` the seed is drawn from os.urandom now; either way it is printed and recorded) through the public entry
points: every available backend forced in turn and the automatic choice, each output checked
against the fp64 oracle, eager and CUDA-graph timing, rates, the fastest backend and auto's
regret (``runner.METHOD``). Writes DIR/bench-<grid>.json and .md (+ PNG plots with matplotlib)
and prints a summary that fits 100 columns (the full table is the .md); a progress bar with tqdm
(plain lines on stderr without it).

    attn-dispatch bench --device cpu --quick --out DIR        # seconds, CI runs it
    attn-dispatch bench --grid h100 --out $OUT --budget-s 500 # one H100, JIT compiles included
    attn-dispatch bench --random 60 --out $OUT                # a fresh seed, printed and recorded
    attn-dispatch bench --random 60 --seed 1234 --start 40    # resume that sweep at problem 40
    attn-dispatch bench --random 60 --tune    # auto after the warm-up autotune (-autotune files, -cache.json)
    attn-dispatch bench --random 150 --seed S --warm-workers 8 --warm-only  # compile its modules, time nothing
    attn-dispatch bench --trace --device cpu --steps 20       # an engine-shaped trace, ours vs FlashInfer (trace.py)

Modules: oracle (the one fp64 oracle; the one timer is dispatch.timing, which autotune uses too),
problems / grids / randomgrid / build / runner / report, and warm (compiles ahead of a sweep).
Turning bench JSONs into a timing table, replaying today's choice against them and the host-cost
runs are measurement tools of the source tree (tools/lab), not part of the installed package.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Optional

import torch

from .. import autotune

# grids, problems, report and runner (which reach the router) are imported by the functions that
# use them.


USAGE = ("%(prog)s [--grid {quick,h100} | --quick | --problems FILE | --random N [--seed S]]\n"
         "                           [--device {cpu,cuda}]\n"
         "                           [--out DIR] [--reps N] [--budget-s S] [--limit N] [--start N]\n"
         "                           [--warm-workers J [--warm-only]] [--profile N] [--tune] [--list]\n"
         "                           [--recheck] [--json]\n"
         "       %(prog)s --trace [its own options: --trace --help]")


def _parser() -> argparse.ArgumentParser:
    from . import grids

    p = argparse.ArgumentParser(
        prog="attn-dispatch bench", usage=USAGE,
        description="The one benchmark runner: a named grid or your problems through the public entry "
                    "points, every available backend forced in turn and the automatic choice, each output "
                    "checked against the fp64 oracle, eager and CUDA-graph times, auto's regret.")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--grid", choices=tuple(grids.GRIDS), help="a named grid (default: quick on the CPU, h100 on a GPU)")
    what.add_argument("--quick", action="store_true", help="the quick grid (tiny problems, seconds)")
    what.add_argument("--problems", type=Path, metavar="FILE", help="a JSON list of problems (see dispatch/benchmark/problems.py)")
    what.add_argument("--trace", action="store_true",
                      help="an engine-shaped trace, the batch changing every step, through ours and FlashInfer's "
                           "calls (dispatch/benchmark/trace.py; the options after it are its own: --trace --help)")
    what.add_argument("--random", type=int, metavar="N",
                      help="N problems drawn from the engine-shaped distribution of dispatch/benchmark/randomgrid.py")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")), metavar="DIR",
                   help="output folder (default $OUT or .)")
    p.add_argument("--reps", type=int, default=0, help="timings per measurement (default: 10 on CUDA, 3 on the CPU)")
    p.add_argument("--budget-s", type=float, default=0.0, metavar="S",
                   help="stop starting problems after S seconds (the rest are listed as skipped)")
    p.add_argument("--limit", type=int, default=0, metavar="N", help="only the first N problems")
    p.add_argument("--start", type=int, default=0, metavar="N", help="skip the first N problems (resume a sweep)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="with --random: the seed (default: drawn from os.urandom now; printed and recorded)")
    p.add_argument("--warm-workers", type=int, default=0, metavar="J",
                   help="J processes compile each problem's vendor modules ahead of the sweep (dispatch/benchmark/warm.py)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="name the N functions with the most host time per call of each backend (cProfile; "
                        "it inflates every Python call alike: read it for where the time goes); on a GPU also the "
                        "CUDA kernels of an eager call and of a graph's (torch.profiler)")
    p.add_argument("--recheck", action="store_true",
                   help="time only each problem's listed backends (no auto, no FlashInfer call): in a table built "
                        "from an earlier sweep and this file, these rows replace those backends'")
    p.add_argument("--tune", action="store_true",
                   help="the sweep runs inside dispatch.autotune(True, cache=DIR/<stem>-cache.json): each new "
                        "bucket's first auto call (a warm call, before any timing) times its leading candidates")
    p.add_argument("--warm-only", action="store_true",
                   help="with --warm-workers J: compile the problems' vendor modules and exit, timing nothing "
                        "(a machine then keeps them for the sweep; --budget-s bounds the wait)")
    p.add_argument("--list", action="store_true", help="list the problems and exit")
    p.add_argument("--json", action="store_true", help="print the regret figures and output paths as JSON only")
    return p


def load_problems(args: argparse.Namespace) -> tuple[str, list]:
    from . import grids, problems, randomgrid

    if args.random is not None:
        if args.random < 1:
            raise ValueError(f"--random {args.random}: allowed a number of problems >= 1")
        return f"random-{args.random}-seed-{args.seed}", randomgrid.draw(args.random, args.seed, args.device)
    if args.problems:
        items = json.loads(args.problems.read_text())
        if not isinstance(items, list):
            raise ValueError(f"--problems {args.problems}: expected a JSON list of problem objects")
        return args.problems.stem, [problems.problem_from_json(item) for item in items]
    name = "quick" if args.quick else (args.grid or ("h100" if args.device == "cuda" else "quick"))
    return name, grids.grid(name)


def _progress(total: int):
    """tqdm when installed (an optional extra), else one line per problem."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="problem", file=sys.stderr)


def sweep(plist: list, device: str, reps: int, budget_s: float = 0.0, on_result=None, warmup=None,
          profile: int = 0, recheck: bool = False) -> list[dict]:
    """Run every problem; ``on_result(results)`` after each (partial outputs survive a timeout);
    ``warmup`` (a ``warm.Warmup``): wait for each problem's compiles first, and keep the workers'
    calls off the GPU while it is timed (``Warmup.timing``); ``profile`` N: each
    row names the N functions with the most host time per call (runner.measure); ``recheck``: the
    listed backends only (runner.run_problem)."""
    from . import runner

    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0) if device == "cuda" else 0
    start, results, bar = time.perf_counter(), [], _progress(len(plist))
    for i, p in enumerate(plist):
        if budget_s and time.perf_counter() - start > budget_s:
            results.append({"problem": p.to_json(), "name": p.name, "error": "skipped: --budget-s spent"})
            continue
        waited = warmup.wait(i) if warmup is not None else None
        try:
            with warmup.timing() if warmup is not None else contextlib.nullcontext():
                r = runner.run_problem(p, device, reps, l2, seed=i, profile=profile, recheck=recheck)
        except Exception as exc:  # one problem failing (out of memory, say) is a result
            r = {"problem": p.to_json(), "name": p.name, "error": runner.one_line(exc)}
        if waited is not None:
            r["warm_wait_s"] = waited
        results.append(r)
        line = (f"[{i + 1}/{len(plist)}] {p.name}: " + (r.get("error") or
                f"fastest {r['fastest']} {r['fastest_ms'] or 0:.4g} ms, auto {r['auto']} "
                + ("-" if r["regret"] is None else f"regret {r['regret']:.1%}") + f" ({r['seconds']} s)"))
        if bar is None:  # progress on stderr, wrapped to the terminal's 100 columns
            print(textwrap.fill(line, 100, subsequent_indent="    "), file=sys.stderr, flush=True)
        else:
            bar.set_postfix_str(p.name[:40])
            bar.update(1)
        if on_result is not None:
            on_result(results)
    if bar is not None:
        bar.close()
    return results


def _warm_sweep(plist: list, args: argparse.Namespace, reps: int, save) -> list[dict]:
    """``sweep``, with ``--warm-workers J`` compiling ahead of it (dispatch/benchmark/warm.py)."""
    if args.warm_workers <= 0:
        return sweep(plist, args.device, reps, args.budget_s, on_result=save, profile=args.profile,
                     recheck=args.recheck)
    if args.recheck:
        raise ValueError("--recheck times the listed backends only: run it without --warm-workers")
    from .warm import Warmup
    warmup = Warmup(plist, args.warm_workers, args.device)
    try:
        return sweep(plist, args.device, reps, args.budget_s, on_result=save, warmup=warmup, profile=args.profile)
    finally:
        warmup.close()


def _warm_only(plist: list, args: argparse.Namespace) -> int:
    """``--warm-only``: the workers warm every problem (warm.py), the sweep times none. A sweep's
    compiles run ahead of its timings on the same cores either way; apart, the compiles can go in
    a run of their own (FlashInfer's modules stay in its cache for the sweep that follows)."""
    from .warm import Warmup

    warmup, start, waited = Warmup(plist, args.warm_workers, args.device), time.perf_counter(), 0
    try:
        for i, p in enumerate(plist):
            if args.budget_s and time.perf_counter() - start > args.budget_s:
                break
            warmup.wait(i)
            waited = i + 1
            print(f"  warm [{i}] {p.name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    finally:
        warmup.close()
    print(f"warm-only: {waited} of {len(plist)} problems warm in {time.perf_counter() - start:.0f} s")
    return 0 if waited == len(plist) else 1


def _parsed(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and its checked options; a random sweep without --seed draws one and says how to
    run it again."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu)")
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # native-triton on the CPU: Triton's interpreter
    if args.seed is not None and args.random is None:
        parser.error("--seed goes with --random N")
    if args.warm_only and args.warm_workers < 1:
        parser.error("--warm-only: allowed with --warm-workers J, J >= 1 (the workers compile)")
    if args.random is not None and args.seed is None:
        from .randomgrid import new_seed
        args.seed = new_seed()
    if args.random is not None:
        print(f"random sweep: {args.random} problems, seed {args.seed} (again: --random {args.random} "
              f"--seed {args.seed})", file=sys.stderr, flush=True)
    return parser, args


def main(argv: Optional[list[str]] = None) -> int:
    from . import report, runner

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--trace" in argv:  # its own options (dispatch/benchmark/trace.py)
        from . import first_call, trace
        own = [a for a in argv if a != "--trace"]
        return first_call.main(own) if "--first-call" in own else trace.main(own)
    parser, args = _parsed(argv)
    try:
        name, plist = load_problems(args)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    plist = plist[args.start:]
    plist = plist[: args.limit] if args.limit else plist
    if args.list:
        print("\n".join(p.name for p in plist))
        return 0
    if args.warm_only:
        return _warm_only(plist, args)
    reps = args.reps or (10 if args.device == "cuda" else 5)
    stem = (f"bench-{name}-{args.device}" + ("-autotune" if args.tune else "")
            + (f"-from-{args.start}" if args.start else ""))  # a resume keeps the first part
    rep = {"grid": name, "environment": report.environment(args.device),
           "method": runner.METHOD.format(rows=16, reps=reps, host_up_to=runner.HOST_ROUNDS_UP_TO_MS,
                                             host_rounds=runner.HOST_ROUNDS), "results": [], "regret": {}}
    if args.random is not None:
        from .randomgrid import DISTRIBUTION
        rep.update(seed=args.seed, random=args.random, start=args.start, distribution=DISTRIBUTION)

    def save(results: list[dict]) -> list[Path]:
        rep.update(results=results, regret=report.regret_figures(results))
        return report.write(rep, args.out, stem)
    tuned = autotune.autotune(True, cache=args.out / f"{stem}-cache.json") if args.tune else contextlib.nullcontext()
    if args.tune:
        rep["environment"]["autotune"] = f"tuning: this sweep's buckets, kept in {stem}-cache.json"
    with tuned:
        paths = save(_warm_sweep(plist, args, reps, save))
    if args.json:
        print(json.dumps({"regret": rep["regret"], "outputs": [str(p) for p in paths]}, indent=1))
    else:
        print(report.summary_text(rep))
        print("outputs:\n" + "\n".join(f"  {p}" for p in paths))  # one a line: paths can be long
    return 0
