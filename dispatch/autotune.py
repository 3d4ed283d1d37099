"""Opt-in online autotune: time the accepted candidates of a new bucket on this machine, keep the times.

On with ``ATTN_DISPATCH_AUTOTUNE=1`` or ``dispatch.autotune()`` (``dispatch.autotune(False)`` turns
it off). When the router ranks the candidates of a problem it has not decided before
(``choice.rank``, inside ``router.decide``'s cached step: never per call), the bucket — the
problem's facts and its sizes rounded up to powers of two; without sizes the phase's anchor
sizes — is looked up in a JSON file; a miss times every accepted candidate on fresh random
inputs at the middle of the bucket (plan, one warm call, then ``timing.device_ms``: GPU time;
on a GPU also the host time of the backend's launcher, what an eager repeat calls) and stores the
times. The ranking (``choice.rank``) adds that host time for an eager call (the table's figure for
the entry point where none was timed), GPU time alone in a CUDA graph.

Never inside CUDA-graph capture or torch.compile tracing (the table or model decides then and
nothing is stored). The file is keyed by the GPU, driver, torch and library versions (a new
driver or FlashInfer starts a new file): ``$ATTN_DISPATCH_CACHE_DIR/autotune-<key>.json``,
default ``~/.cache/attn-dispatch``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import torch

import capability_db
from capability_db.choice_table import ANCHORS

from . import policy

from .inputs import Case, make_batch
from .problem import AttentionProblem, DeviceDesc, class_middle

ENV_AUTOTUNE = "ATTN_DISPATCH_AUTOTUNE"
ENV_CACHE_DIR = "ATTN_DISPATCH_CACHE_DIR"
REPS = 5
SHORT_MS = 0.2  # a call shorter than this is timed over back-to-back calls (at most MAX_CALLS)
MAX_CALLS = 64
HOST_CALLS = 20
log = logging.getLogger("attn_dispatch")

_switch: Optional[bool] = None  # set by autotune(); None: the environment decides
_on_switch: list[Callable[[], None]] = []  # the router's clear_caches: decisions made before are stale
_lock = threading.Lock()
_files: dict[Path, dict] = {}
_replayed: Optional[Path] = None  # replaying(): decide from this kept file, never time


def autotune(enabled: bool = True) -> None:
    """Turn online autotune on (or off) for this process; decisions made so far are forgotten."""
    global _switch
    _switch = bool(enabled)
    for forget in _on_switch:
        forget()


def enabled() -> bool:
    if _replayed is not None:
        return True
    return _switch if _switch is not None else policy.env_flag(ENV_AUTOTUNE)


@contextlib.contextmanager
def replaying(path: Path):
    """Decide from the buckets of a kept autotune file (a sweep's ``-cache.json``) and never time:
    an autotune sweep's choice replayed off its GPU (``bench --replay ... --autotune-file``), so each
    miss is named against the times the autotune acted on. A bucket the file lacks: the table decides."""
    global _replayed
    before, _replayed = _replayed, Path(path)
    for forget in _on_switch:
        forget()
    try:
        yield
    finally:
        _replayed = before
        for forget in _on_switch:
            forget()


def cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "attn-dispatch")


def environment_key(device: DeviceDesc) -> dict[str, str]:
    """What a timing depends on besides the problem: GPU, driver, torch and library versions."""
    import backends

    key = {"device": device.name, "sm": str(device.sm), "torch": torch.__version__}
    driver = getattr(torch._C, "_cuda_getDriverVersion", None)
    key["driver"] = str(driver()) if driver is not None and device.kind == "cuda" else "none"
    for name in backends.REGISTRY:
        try:
            key[name] = str(backends.get_backend(name).version())
        except Exception as exc:  # noqa: BLE001 - a version that cannot be read is part of the key
            key[name] = f"unknown ({type(exc).__name__})"
    return key


def cache_file(device: DeviceDesc) -> Path:
    digest = hashlib.sha256(json.dumps(environment_key(device), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"autotune-{digest}.json"


def describe_cache() -> str:
    return f"autotune cache under {cache_dir()}"


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def bucket_key(problem: AttentionProblem, sizes: tuple[int, int, int]) -> str:
    """The problem's facts and its sizes rounded up to powers of two. Not ``cuda_graph``: a call
    declared for a graph runs the same backends at the same sizes, and the ranking decides what
    counts (GPU time alone), so one timing serves both."""
    return f"{dataclasses.replace(problem, cuda_graph=False)!r}|" + "x".join(str(_pow2(n)) for n in sizes)


def may_measure() -> bool:
    """Not inside CUDA-graph capture, not while torch.compile traces."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


class Timed(NamedTuple):
    ms: float  # GPU time per call
    sizes: tuple  # where it was timed (the bucket's middle)
    host_us: Optional[float]  # host time per eager repeat (the backend's launcher, else its run); None: not timed


def lookup(problem: AttentionProblem, device: DeviceDesc, accepted: list[str],
           sizes: Optional[tuple[int, int, int]]) -> Optional[dict[str, Timed]]:
    """{backend: Timed} for the bucket (timed now on a miss), or None when off or not allowed."""
    if not enabled():
        return None
    accepted = timed_on(device, accepted)
    sizes = tuple(_pow2(n) for n in (sizes or ANCHORS.get(problem.phase, ANCHORS["prefill"])))
    path, key = _replayed or cache_file(device), bucket_key(problem, sizes)
    with _lock:
        data = _files.get(path) or _read(path)
        _files[path] = data
        hit = data["buckets"].get(key)
    if _replayed is not None:  # what was timed then: the candidates a replay's rebuilt problem adds are untimed
        hit = hit or {}
    elif hit is None or any(n not in hit for n in accepted):
        if not may_measure():
            return None
        hit = {**(hit or {}), **measure(problem, [n for n in accepted if n not in (hit or {})], class_middle(sizes))}
        with _lock:
            data["buckets"][key] = hit
            _write(path, data, device)
    times = {n: _entry(hit[n], class_middle(sizes)) for n in accepted if hit.get(n) is not None}
    return times or None


def _entry(value, sizes: tuple) -> Timed:
    """A cache value: {"ms", "host_us"}, or the GPU ms alone (files written before host times)."""
    if isinstance(value, dict):
        return Timed(value["ms"], sizes, value.get("host_us"))
    return Timed(value, sizes, None)


def timed_on(device: DeviceDesc, accepted: list[str]) -> list[str]:
    """The candidates worth timing: on a GPU not a CPU-only backend (the PyTorch reference runs
    100-1000x slower there: up to 6 s a call, tens of seconds per bucket on the H200) while a
    GPU backend is accepted; untimed, it ranks last (``choice.rank``)."""
    def cpu_only(name: str) -> bool:
        try:
            return capability_db.backend_caps(name).hardware.status == "cpu only"
        except ValueError:  # a backend the data does not know (a test's fake)
            return False
    if device.kind != "cuda":
        return accepted
    gpu = [n for n in accepted if not cpu_only(n)]
    return gpu or accepted


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        if isinstance(data.get("buckets"), dict):
            return data
    except (OSError, ValueError):
        pass  # no file yet, or a broken one: start over (the file is a cache)
    return {"buckets": {}}


def _write(path: Path, data: dict, device: DeviceDesc) -> None:
    data["environment"] = environment_key(device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:  # a read-only home: tuning still serves this process
        log.warning("attn_dispatch: autotune cache %s not written: %s", path, exc)


def measure(problem: AttentionProblem, names: list[str], sizes: tuple[int, int, int]) -> dict[str, Optional[dict]]:
    """Per backend, on fresh random inputs of these sizes: {"ms": GPU time per call, "host_us": host
    time per eager repeat on a GPU (its launcher, what a lane's repeats call; else its run), None on
    the CPU, "tune_s": seconds its timing took, compiles included}; None: it failed."""
    from backends import get_backend

    b, q, kv = sizes
    device = torch.device("cuda" if problem.device_type == "cuda" else "cpu")
    case = Case("autotune", problem, (q,) * b, (kv,) * b)
    batch = make_batch(case, device, seed=0)
    if problem.has_sinks and batch.sinks is None:
        batch.sinks = torch.zeros(problem.num_qo_heads, device=device)
    out: dict[str, Optional[dict]] = {}
    for name in names:
        backend, start = get_backend(name), time.perf_counter()
        try:
            plan = backend.plan(problem, batch)
            backend.run(plan, batch)  # warm: compiles, workspaces
            out[name] = {"ms": _timed(lambda: backend.run(plan, batch), device.type),
                         "host_us": _host_us(backend, plan, batch) if device.type == "cuda" else None,
                         "tune_s": round(time.perf_counter() - start, 3)}  # what this bucket's first call waited
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run here is not chosen by its time
            log.info("attn_dispatch: autotune of %s on %s failed: %s", name, problem.describe(), exc)
            out[name] = None
    log.info("attn_dispatch: autotuned %s at %s: %s", problem.describe(), sizes, out)
    return out


def _timed(run: Callable[[], object], device_type: str) -> float:
    """ms per call; a short call is timed again over back-to-back calls filling about SHORT_MS, so
    the events' resolution (about a microsecond) does not decide between kernels of a few."""
    from . import timing

    once = timing.device_ms(run, device_type, reps=REPS)
    if device_type != "cuda" or once >= SHORT_MS:
        return once
    calls = min(MAX_CALLS, math.ceil(SHORT_MS / max(once, 1e-3)))
    return timing.device_ms(run, device_type, reps=REPS, calls=calls)


def _host_us(backend, plan, batch) -> float:
    """Host microseconds per eager repeat: back-to-back calls of the backend's launcher (else its
    run) on the host clock, no sync inside (HOST_CALLS, few enough that the launch queue never fills)."""
    from . import timing

    launch = backend.launcher(plan, batch)
    call = (lambda: launch(batch)) if launch is not None else (lambda: backend.run(plan, batch))
    torch.cuda.synchronize()
    return timing.wall_ms(call, reps=3, warmup=1, calls=HOST_CALLS) * 1e3


class _CallableModule(sys.modules[__name__].__class__):
    """``dispatch.autotune(...)`` turns it on or off while ``dispatch.autotune.<name>`` stays this
    module (a function of the same name would hide the module from ``from dispatch import autotune``)."""

    def __call__(self, enabled: bool = True) -> None:
        autotune(enabled)


sys.modules[__name__].__class__ = _CallableModule
