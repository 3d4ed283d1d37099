"""Vendor compiles ahead of a sweep: ``attn-dispatch bench ... --warm-workers J``.

On a fresh machine FlashInfer compiles each kernel module the first time a call needs it (about
a minute per fa2/fa3 module with 0.7.2) and Triton compiles its kernels; a sweep of random
problems then spends most of its time compiling, one module after another, in one process. With
``--warm-workers J``, J worker processes take the sweep's problems in the sweep's order, each as a
*small copy* (``small``: the same entry point, dtypes, head dim, heads, page size, cache form and
features, which are what select a module; at most two requests of few keys), call it once with
every backend forced and FlashInfer's own call, and mark it done. Before each problem the sweep
waits until its small copy is done (``Warmup.wait``; the wait is recorded as ``warm_wait_s``), so
it times warm code and compiles no FlashInfer module itself. The workers run on the CPU cores the
sweep does not use (``os.sched_setaffinity``), so the sweep's host timings keep their own cores;
a module two workers need is built once (FlashInfer's own file lock). Their calls are small: a
few microseconds of GPU time each. Still, two processes with work on one GPU take turns on it, so
a worker's call inside a timing can only add to it: while the sweep times a problem
(``Warmup.timing``) a worker starts no call (it finishes a compile it had begun, and waits before
its next). On an H100, of 8 problems whose cuDNN eager time had exceeded its graph time by
21-144% in sweeps with workers, timed again without them, 6 came within 4% of it and 2 (25-30 us
calls) within 16%; rows above 0.2 ms with eager more than 1.1x graph were 1 of 56 just after a
wait for the workers and 6 of 874 otherwise.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

from .problems import BenchProblem, problem_from_json

SWEEP_CORES = 2  # the sweep's own cores; the workers share the rest
WAIT_S = 900.0  # the longest the sweep waits for one problem's warm-up (then it compiles itself)
TIMING_FLAG = "timing"  # present in the warm-up folder while the sweep times a problem


def small(p: BenchProblem) -> BenchProblem:
    """``p`` with at most 2 requests of at most 16 queries over 64 keys: the modules it needs are ``p``'s."""
    q = 1 if p.decode else min(p.q_len, 16)
    kv = max(q, min(p.kv_len, 64))
    window = p.window_left if p.window_left < 0 else min(p.window_left, max(1, kv // 2))
    return replace(p, batch=min(p.batch, 2), q_len=q, kv_len=kv, window_left=window)


class Warmup:
    """J worker processes warming the sweep's problems in order (module doc)."""

    def __init__(self, plist: list, workers: int, device: str):
        self.dir = Path(tempfile.mkdtemp(prefix="attn-dispatch-warm-"))
        unique: dict = {}
        self.slots = [unique.setdefault(small(p), len(unique)) for p in plist]
        (self.dir / "problems.json").write_text(json.dumps([p.to_json() for p in unique]))
        cores = sorted(os.sched_getaffinity(0))
        self.sweep_cores = set(cores[:SWEEP_CORES]) if len(cores) > SWEEP_CORES else set(cores)
        spare = [c for c in cores if c not in self.sweep_cores] or cores
        self.all_cores = set(cores)
        # a worker reads no kept autotune times (the default file): it compiles; what decides auto is the sweep's
        env = dict(os.environ, MAX_JOBS=str(max(1, len(spare) // workers + 1)), ATTN_DISPATCH_AUTOTUNE="0")
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "dispatch.benchmark.warm", str(self.dir), str(k), str(workers),
             ",".join(map(str, spare)), device],
            stdout=open(self.dir / f"worker-{k}.log", "w"), stderr=subprocess.STDOUT, env=env)
            for k in range(workers)]
        os.sched_setaffinity(0, self.sweep_cores)
        print(f"warm-up: {workers} workers on cores {spare[0]}-{spare[-1]}, {len(unique)} small problems "
              f"for {len(plist)}; logs in {self.dir}", file=sys.stderr, flush=True)

    def wait(self, i: int) -> float:
        """Seconds spent waiting until problem i's small copy is warm (or no worker is left)."""
        t0, marker = time.perf_counter(), self.dir / f"done-{self.slots[i]}"
        while not marker.exists() and time.perf_counter() - t0 < WAIT_S:
            if all(proc.poll() is not None for proc in self.procs):
                break
            time.sleep(0.05)
        return round(time.perf_counter() - t0, 2)

    @contextlib.contextmanager
    def timing(self):
        """While the sweep times a problem: no worker starts a call (``wait_while_timing``)."""
        flag = self.dir / TIMING_FLAG
        flag.touch()
        try:
            yield
        finally:
            flag.unlink(missing_ok=True)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        os.sched_setaffinity(0, self.all_cores)


def wait_while_timing(folder: Path, most_s: float = WAIT_S) -> None:
    """A worker, before a call: wait while the sweep times a problem (at most ``most_s``, so a
    sweep that died mid-problem leaves no worker waiting for ever)."""
    t0, flag = time.perf_counter(), folder / TIMING_FLAG
    while flag.exists() and time.perf_counter() - t0 < most_s:
        time.sleep(0.01)


def _warm_one(p: BenchProblem, device: str, folder: Path) -> list[str]:
    """Call ``p`` once per backend forced and with FlashInfer's own call, each when the sweep is
    not timing (``wait_while_timing``); the failures, one line each."""
    from . import runner
    from .build import build, flashinfer_api, flashinfer_own_not_run

    built, failed = build(p, device), []
    api, _ = flashinfer_api() if device == "cuda" else (None, "")
    calls = [(name, None) for name in runner.backends_to_force(p, device)]
    own = api is not None and api.get(p.entry) is not None and flashinfer_own_not_run(p) is None
    calls += [(runner.FLASHINFER, api)] if own else []
    for name, own in calls:
        wait_while_timing(folder)
        with runner.backend_scope(name):
            try:
                built.call(own)(built.operands[0])
            except Exception as exc:  # a refusal or a vendor's error: the sweep reports it
                failed.append(f"{name}: {runner.one_line(exc)}")
    if device == "cuda":
        import torch
        torch.cuda.synchronize()
    return failed


def _worker(folder: Path, k: int, workers: int, cores: str, device: str) -> int:
    os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    items = json.loads((folder / "problems.json").read_text())
    for slot in range(k, len(items), workers):
        p, t0 = problem_from_json(items[slot]), time.perf_counter()
        try:
            failed = _warm_one(p, device, folder)
        except Exception:  # a problem that cannot even be built: the sweep reports it
            traceback.print_exc()
            failed = ["build failed"]
        print(f"[{slot}] {p.name}: {time.perf_counter() - t0:.1f} s" + "".join(f"\n    {f}" for f in failed), flush=True)
        (folder / f"done-{slot}").touch()
    return 0


if __name__ == "__main__":
    folder, k, j, cores, device = sys.argv[1:6]
    sys.exit(_worker(Path(folder), int(k), int(j), cores, device))
