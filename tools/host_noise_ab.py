"""Do the sweep's warm-up workers move its host timings, and does stopping them help?

    python -m tools.host_noise_ab PROBLEMS.json --load-seed S [--workers 4] [--rounds 12] --out DIR

Builds each problem of PROBLEMS.json once (warm: every backend called first), then starts
``--workers`` warm-up workers (dispatch/benchmark/warm.py) on the small copies of a random sweep drawn
with ``--load-seed``: FlashInfer and Triton compiles like a sweep's. While they run, it times the
host path of every (problem, backend) ``--rounds`` times, each round three times: with the workers
running (``free``), with them and every process they started (compilers) stopped by SIGSTOP
(``paused``), and stopped with the timing process allowed every core again (``paused-wide``:
Warmup pins it to warm.SWEEP_CORES), in rotating order. After the workers are closed, the same
timings once more (``alone``).
Writes DIR/host-noise-ab.{json,md}: per mode, the median spread of a row's timings (p90 / p10 of
its rounds) and the median ratio of its median to ``alone``'s.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

from dispatch.benchmark import randomgrid, runner
from dispatch.benchmark.report import environment
from dispatch.benchmark.build import build, flashinfer_api
from dispatch.benchmark.problems import problem_from_json
from dispatch.benchmark.warm import Warmup

MODES = ("free", "paused", "paused-wide")


def calls(problems: list, device: str) -> dict:
    """(problem name, backend) -> (call, built), every call made once (plans, compiles) first."""
    api = flashinfer_api()[0] if device == "cuda" else None
    out = {}
    for p in problems:
        built = build(p, device, 0)
        for name in [*runner.backends_to_force(p, device), runner.AUTO, *([runner.FLASHINFER] if api else [])]:
            with runner.backend_scope(name):
                try:
                    call = built.call(api if name == runner.FLASHINFER else None)
                    call(built.operands[0])
                except Exception as exc:  # refused or failing: not a host path to time
                    print(f"{p.name} {name}: {runner.one_line(exc)}", file=sys.stderr)
                    continue
            out[(p.name, name)] = (call, built)
    runner._sync(device)
    return out


def descendants(pid: int) -> list[int]:
    """Every process started by ``pid``, at any depth (from /proc: psutil is not a dependency)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # ended meanwhile
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # ended meanwhile
            pass


@contextlib.contextmanager
def stopped(warmup: Warmup):
    """The workers and every process they started stopped (SIGSTOP) meanwhile."""
    pids = [pid for proc in warmup.procs if proc.poll() is None for pid in (proc.pid, *descendants(proc.pid))]
    _signal(pids, signal.SIGSTOP)
    try:
        yield
    finally:
        _signal(pids, signal.SIGCONT)


@contextlib.contextmanager
def wide(warmup: Warmup):
    """The workers stopped and this process on every core meanwhile."""
    with stopped(warmup):
        os.sched_setaffinity(0, warmup.all_cores)
        try:
            yield
        finally:
            os.sched_setaffinity(0, warmup.sweep_cores)


def time_all(paths: dict, modes: dict, rounds: int, device: str) -> dict:
    """(name, backend) -> mode -> host us of each round; the modes rotate their order per round."""
    times = {key: {mode: [] for mode in modes} for key in paths}
    for r in range(rounds):
        order = list(modes)[r % len(modes):] + list(modes)[:r % len(modes)]
        for key, (call, built) in paths.items():
            with runner.backend_scope(key[1]):
                for mode in order:
                    with modes[mode]():
                        times[key][mode].append(runner._host_us(call, built, device))
    return times


def summary(times: dict, alone: dict) -> dict:
    rows, spread, ratio = [], {m: [] for m in [*MODES, "alone"]}, {m: [] for m in MODES}
    for key, by_mode in times.items():
        row = {"problem": key[0], "backend": key[1], "alone_us": statistics.median(alone[key]["alone"])}
        for mode, values in [*by_mode.items(), ("alone", alone[key]["alone"])]:
            values = sorted(values)
            p10, p90 = values[len(values) // 10], values[(9 * len(values)) // 10]
            row[f"{mode}_us"], row[f"{mode}_spread"] = statistics.median(values), p90 / p10
            spread[mode].append(p90 / p10)
            if mode in MODES:
                ratio[mode].append(statistics.median(values) / row["alone_us"])
        rows.append(row)
    return {"rows": rows, "median_spread": {m: statistics.median(v) for m, v in spread.items()},
            "median_over_alone": {m: statistics.median(v) for m, v in ratio.items()}}


def markdown(rep: dict) -> str:
    s = rep["summary"]
    lines = [f"# Host timings beside the warm-up workers: {rep['environment'].get('gpu')}, {rep['date']}", "",
             ", ".join(f"{k} {v}" for k, v in rep["environment"].items()), "", __doc__.split("\n\n")[2], "",
             f"Load: {rep['workers']} workers on the small copies of `--random {rep['load_problems']} --seed "
             f"{rep['load_seed']}`; {rep['rounds']} rounds.", "",
             "| mode | median spread (p90 / p10 of a row's rounds) | median of a row's median / alone's |",
             "|---|---|---|"]
    for mode in [*MODES, "alone"]:
        over = s["median_over_alone"].get(mode)
        lines.append(f"| {mode} | {s['median_spread'][mode]:.3f} | {'-' if over is None else f'{over:.3f}'} |")
    lines += ["", "| problem | backend | alone us | " + " | ".join(f"{m} us (spread)" for m in MODES) + " |",
              "|---|---|---|" + "---|" * len(MODES)]
    for r in s["rows"]:
        lines.append(f"| {r['problem']} | {r['backend']} | {r['alone_us']:.1f} | "
                     + " | ".join(f"{r[f'{m}_us']:.1f} ({r[f'{m}_spread']:.2f})" for m in MODES) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", type=Path)
    ap.add_argument("--load-seed", type=int, required=True)
    ap.add_argument("--load-problems", type=int, default=60)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    paths = calls([problem_from_json(item) for item in json.loads(args.problems.read_text())], args.device)
    warmup = Warmup(randomgrid.draw(args.load_problems, args.load_seed, args.device), args.workers, args.device)
    try:
        time.sleep(20)  # the workers past their imports, compiling
        modes = {"free": contextlib.nullcontext, "paused": lambda: stopped(warmup), "paused-wide": lambda: wide(warmup)}
        times = time_all(paths, modes, args.rounds, args.device)
    finally:
        warmup.close()
    alone = time_all(paths, {"alone": contextlib.nullcontext}, args.rounds, args.device)
    rep = {"date": datetime.date.today().isoformat(), "environment": environment(args.device), "workers": args.workers,
           "rounds": args.rounds, "load_seed": args.load_seed, "load_problems": args.load_problems,
           "times": {f"{k[0]} | {k[1]}": v for k, v in times.items()}, "summary": summary(times, alone)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host-noise-ab.json").write_text(json.dumps(rep, indent=1))
    (args.out / "host-noise-ab.md").write_text(markdown(rep))
    print(markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
