"""``attn-dispatch bench --trace --first-call``: each side's first call of each entry, in a fresh process.

An engine imports its attention library when it starts, and its first call of an entry point then
pays whatever the library left for first use (vendor imports, loading compiled modules, its tables,
a first decision). Per entry, three processes run the first step of the entry's trace (the warm-up
draw's step 0, the same seed as the trace):

1. a *priming* process runs the step through both sides, so every kernel it needs is compiled and
   in the on-disk caches (FlashInfer's JIT modules, Triton's cache): compiles are excluded on both
   sides. cuDNN keeps no graph on disk: both sides build theirs in the measured process;
2. a process that imports the package of one side (timed), builds the step's inputs (untimed,
   synchronized), then times the step: host time (``time.perf_counter`` around the calls) and the
   time until the GPU finished it (a synchronize after);
3. the same for the other side (the order alternates between entries);
4. ours again with the vendor packages imported before the step (``ours_imported``): our adapters
   import a vendor on first use, where FlashInfer's caller imported it with the package, so this is
   the first call with imports excluded on both sides.

Reported per entry: each side's package import, first step host and synchronized time, and ours less
FlashInfer's (with and without the vendor imports). The trace's own first step
(``first_step_host_ms``) runs both sides in one process, so whichever side goes first there also pays
the loads the other then reuses; this does not.
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

SIDES = ("ours", "flashinfer")
VENDORS = ("flashinfer.prefill", "flashinfer.decode", "cudnn", "triton")  # what ours_imported imports first
TARGET_MS = 20.0  # the bound: our first call within this of FlashInfer's (compiles excluded)
CHILD_TIMEOUT_S = 600.0
# the child starts by timing its side's package import, before anything else of ours is imported
_BOOT = ("import sys, time, json, torch\n"
         "side = json.loads(sys.argv[1])['side']\n"
         "t0 = time.perf_counter()\n"
         "import dispatch\n"
         "imported = (time.perf_counter() - t0) * 1e3\n"
         "from dispatch.benchmark.first_call import child\n"
         "child(json.loads(sys.argv[1]), imported if side == 'ours' else None)\n")


def child(job: dict, ours_import_ms: Optional[float]) -> None:
    """In the fresh process: the first step of ``job['entry']`` through ``job['side']`` (or both, to
    prime the caches); prints one JSON line."""
    import torch

    from . import trace as T

    parser = T.parser()
    cfg = T.config(parser, parser.parse_args(job["argv"]))
    spec = T.ENTRIES[job["entry"]]
    step = T.draw(spec.trace, job["seed"], "warm-up", 1, cfg)[0]
    result: dict = {}
    apis = {}
    if job["side"] in ("ours", "ours_imported", "prime"):
        apis["ours"] = T.ours_api()
        result["import_ms"] = ours_import_ms
    if job["side"] == "ours_imported":
        t0 = time.perf_counter()
        for name in VENDORS:
            try:
                importlib.import_module(name)
            except ImportError:  # a vendor not installed here: nothing to import ahead
                pass
        result["vendor_import_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    if job["side"] in ("flashinfer", "prime"):
        t0 = time.perf_counter()
        api, reason = T.flashinfer_api(cfg.device)
        reason = reason or T.flashinfer_entry_reason(job["entry"], cfg.device)
        if job["side"] == "flashinfer":
            result["import_ms"] = (time.perf_counter() - t0) * 1e3
        if reason and job["side"] == "flashinfer":
            print(json.dumps({"not_run": reason}), flush=True)
            return
        if not reason:
            apis["flashinfer"] = api
    pools = T.make_pools([step], spec.paged, cfg, job["seed"])
    x = spec.inputs(step, pools, cfg)
    for name, api in apis.items():
        fn = spec.side(api, cfg)
        if cfg.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(x, {})
        host = (time.perf_counter() - t0) * 1e3
        if cfg.device == "cuda":
            torch.cuda.synchronize()
        result.update(host_ms=round(host, 3), synced_ms=round((time.perf_counter() - t0) * 1e3, 3))
    print(json.dumps(result), flush=True)


def _run_child(job: dict) -> dict:
    """One fresh process; its JSON line, or what went wrong."""
    try:
        done = subprocess.run([sys.executable, "-c", _BOOT, json.dumps(job)], capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"not_run": f"the process ran past {CHILD_TIMEOUT_S:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"not_run": f"exit {done.returncode}: {tail}"[:200]}
    return json.loads(lines[-1])


def measure(argv: list[str], entries: list[str], seed: int) -> dict:
    """Per entry: prime, then each side in its own process (module doc)."""
    results = {}
    for i, entry in enumerate(entries):
        job = {"argv": argv, "entry": entry, "seed": seed}
        prime = _run_child({**job, "side": "prime"})
        row = {"prime": prime}
        for side in (SIDES if i % 2 == 0 else SIDES[::-1]) + ("ours_imported",):
            row[side] = _run_child({**job, "side": side})
        fi = row["flashinfer"].get("host_ms")
        for side, key in (("ours", "ours_less_flashinfer_ms"), ("ours_imported", "imported_less_flashinfer_ms")):
            ours = row[side].get("host_ms")
            row[key] = None if ours is None or fi is None else round(ours - fi, 3)
        results[entry] = row
        print(f"  first call, {entry}: ours {row['ours'].get('host_ms')} ms ({row['ours_imported'].get('host_ms')} "
              f"with the vendors imported first), flashinfer {fi} ms", file=sys.stderr, flush=True)
    return results


def markdown(rows: dict) -> list[str]:
    """The first-call table."""
    def fig(side: dict, key: str) -> str:
        value = side.get(key)
        return "-" if value is None else f"{value:.3g}"
    def signed(value) -> str:
        return "-" if value is None else f"{value:+.3g}"
    lines = ["## First call in a fresh process (compiles excluded on both sides)", "",
             "Package import, then the first step's host time and the time until it synchronized (ms); then ours "
             "with the vendor packages imported before the step (FlashInfer's caller imported them with its "
             f"package). The target: ours within {TARGET_MS:g} ms of FlashInfer's host time.", "",
             "| entry | import ours | FlashInfer | first step host ours | FlashInfer | synced ours | FlashInfer "
             "| ours - FlashInfer | vendors imported first: ours | - FlashInfer |", "|---" * 10 + "|"]
    for entry, r in rows.items():
        o, f, pre = r["ours"], r["flashinfer"], r["ours_imported"]
        lines.append(f"| {entry} | {fig(o, 'import_ms')} | {fig(f, 'import_ms')} | {fig(o, 'host_ms')} | "
                     f"{fig(f, 'host_ms')} | {fig(o, 'synced_ms')} | {fig(f, 'synced_ms')} | "
                     f"{signed(r['ours_less_flashinfer_ms'])} | {fig(pre, 'host_ms')} | "
                     f"{signed(r['imported_less_flashinfer_ms'])} |")
    reasons = {f"{side}: {r[side]['not_run']}" for r in rows.values() for side in (*SIDES, "ours_imported")
               if "not_run" in r[side]}
    return lines + ([""] + [f"- {reason}" for reason in sorted(reasons)] if reasons else [])


def write(rep: dict, out: Path, stem: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(rep, indent=1))
    head = [f"# First calls: {rep['device']}, seed {rep['seed']} ({rep['seed_source']})", "",
            f"again: `{rep['again']}`", ""]
    paths[1].write_text("\n".join(head + markdown(rep["first_call"])) + "\n")
    return paths


def main(argv: list[str]) -> int:
    """``attn-dispatch bench --trace --first-call``: the first-call table instead of the trace."""
    from . import trace as T

    _, args, _, seed, rep = T.start(argv)
    children = [a for a in argv if a != "--first-call"] + ["--seed", str(seed)]
    rep.update(benchmark="first-call", first_call=measure(children, args.entries, seed))
    paths = write(rep, args.out, f"first-call-{rep['device']}-seed-{seed}")
    print("\n".join(markdown(rep["first_call"])))
    print("outputs:\n" + "\n".join(f"  {path}" for path in paths))
    return 0 if all("host_ms" in r["ours"] for r in rep["first_call"].values()) else 1
