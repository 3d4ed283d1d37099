"""Measure in the warm-up, look up afterwards: ``with dispatch.autotune(tune_mode=True, cache=None):``.

The contract of ``flashinfer.autotune`` (FlashInfer 0.7.2: ``tune_mode``, ``cache``, ``skip_ops``),
so an engine that wraps its warm-up in FlashInfer's context wraps it in ours the same way:

* **Inside a context with tune_mode=True**, each new bucket an entry point decides (its problem's
  facts and its size class: sizes rounded up to powers of two; ``choice.rank``, once per decision,
  never per call) times the candidates ``lookup``'s ``leading`` names. The router's is
  ``choice.leading``: the table's ``LEADING`` (3) predicted fastest (GPU time, plus host time for an
  eager call) and any other predicted within ``WITHIN`` (15%) of the fastest; every accepted one where
  the GPU has no table. Without ``leading``, every accepted one. On a GPU a CPU-only backend (the PyTorch reference)
  is not timed while a GPU backend is accepted (``timed_on``). Each is timed on a faithful input with
  the per-request lengths of the call that opened the bucket (``CALL_LENGTHS``; equal lengths at the
  bucket's middle where no call is known, as for a graph's replay points): its own plan and
  workspace, a paged cache whose pages are shuffled over
  the pool (no request's pages adjacent, none shared), the L2 cache flushed before each repetition,
  the median of ``REPS`` (a call shorter than ``SHORT_MS`` over back-to-back calls); the warm call
  before the timing compiles what the bucket needs. On a GPU its host time per eager call is
  timed too (its launcher's, else its run's; a plan and a run where a function entry plans every
  call): an eager call's ranking adds it. The times decide the
  bucket from then on.
* **Outside a context, with tune_mode=False, inside CUDA-graph capture or torch.compile
  tracing**: lookups only, never a timing. A bucket nobody timed is decided by the table.
* **A CUDA graph** with a replay bound (``problem.replay_kv``) is decided by the mean of its times
  over every kv bucket it replays (``lookup_over``, from ``choice.rank``); an eager call with such a
  bound inside a tuning context times those buckets too, so a graph captured after the warm-up
  (lookups only) finds them.
* **Under torch.distributed** (an initialized process group of more than one rank; or the group
  given to ``set_process_group``), every bucket decided inside a tuning context is agreed: rank 0
  times it (or reads it from its cache) and broadcasts the times (``broadcast_object_list``), so
  every rank makes the same choice however its own timings would have fallen. As with FlashInfer's
  reduction, every rank must run the same warm-up (the same buckets in the same order).

**The cache.** ``cache=None``: the default file, ``$ATTN_DISPATCH_CACHE_DIR`` (default
``~/.cache/attn-dispatch``) ``/autotune-<fingerprint digest>.json``, read at first use (outside any
context too); ``cache=PATH``: that file is read when the context opens. Either way, on exit from a
tuning context the buckets it timed are merged into the file: read again under a lock, merged
(this process's entries win), capped at ``MAX_BUCKETS`` (the oldest measured go), written to a
temporary file and renamed over it. The header (``environment``) is the fingerprint: GPU name, SM,
SM count, driver, CUDA, cuDNN (and its frontend), FlashInfer, torch, Triton and attn-dispatch
versions; a file made in another environment is ignored with one log line, and never overwritten.
``ATTN_DISPATCH_AUTOTUNE=0``: the default file is neither read nor written (a context's own
``cache=PATH`` still is), and outside a context no kept time decides (the table does); no value of
it times anything: only a tuning context does.

Unlike FlashInfer's, ``cache=None`` keeps the times in the default file rather than in this
process only; ``tuning_buckets``, ``round_up`` and ``cuda_graph_profile_replays`` are refused (our
buckets are powers of two of batch, query and key lengths; timings run eagerly, never in a graph).
``with dispatch.autotune(...) as session``: ``session.new`` holds the buckets it timed,
``session.file`` where they go.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import functools
import hashlib
import json
import logging
import math
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Optional, Union

import torch

import capability_db
from capability_db.choice_table import ANCHORS

from . import devices
from .inputs import Case, make_batch
from .problem import AttentionProblem, DeviceDesc, class_middle, size_class

ENV_AUTOTUNE = "ATTN_DISPATCH_AUTOTUNE"  # "0": the default cache file is neither read nor written
ENV_CACHE_DIR = "ATTN_DISPATCH_CACHE_DIR"
FORMAT = 2  # the file's layout: {"format", "environment", "buckets": {key: {"measured", "times"}}}
MAX_BUCKETS = 4096  # a file keeps at most this many buckets, the most recently measured
REPS = 7  # timed repetitions per candidate; the median counts
SHORT_MS = 0.2  # a call shorter than this is timed over back-to-back calls (at most MAX_CALLS)
MAX_CALLS = 64
HOST_CALLS = 20
log = logging.getLogger("attn_dispatch")

# which of a bucket's accepted backends it times: (problem, device, accepted, sizes) -> names
Leading = Callable[[AttentionProblem, DeviceDesc, list, tuple], list]
Lengths = tuple[list[int], list[int]]  # per request: query lengths, key lengths
_on_switch: list[Callable[[], None]] = []  # the router's and entries' caches: decisions made before are stale
_lock = threading.RLock()
_known: dict[str, dict[str, dict]] = {}  # environment digest -> bucket key -> {"measured", "times"}
_read_default: set[str] = set()  # digests whose default file was read (first use)
_logged: set[str] = set()  # files whose mismatch or damage was logged (one line each)
_replayed: Optional[Path] = None  # replaying(): decide from this kept file, never time
_group = None  # set_process_group(); None: the default group when one is initialized


@dataclasses.dataclass
class Session:
    """An open ``autotune`` context (what ``with dispatch.autotune(...) as session`` binds)."""
    tune: bool
    cache: Optional[Path]  # None: the default file of the environment
    skip: frozenset  # entry points not timed (FlashInfer's skip_ops)
    digest: str
    environment: dict
    new: dict = dataclasses.field(default_factory=dict)  # bucket key -> entry timed inside it
    file: Optional[Path] = None  # where its times go on exit (None: nowhere, ATTN_DISPATCH_AUTOTUNE=0)


_contexts: list[Session] = []


# -- the context ------------------------------------------------------------------------------------
@contextlib.contextmanager
def autotune(tune_mode: bool = True, cache: Union[str, os.PathLike, None] = None, tuning_buckets=None,
             round_up=None, skip_ops: Union[str, Iterable[str], None] = None, cuda_graph_profile_replays=None):
    """Time each new bucket decided inside (``tune_mode``) and keep the times in ``cache`` (module doc)."""
    for name, value in (("tuning_buckets", tuning_buckets), ("round_up", round_up),
                        ("cuda_graph_profile_replays", cuda_graph_profile_replays)):
        if value is not None:
            raise ValueError(f"autotune({name}={value!r}): allowed only None (dispatch times each bucket, powers "
                             "of two of batch, query and key lengths, eagerly)")
    device = current_device()
    env = fingerprint(device)
    ctx = Session(bool(tune_mode), Path(cache) if cache is not None else None,
                   frozenset([skip_ops] if isinstance(skip_ops, str) else skip_ops or ()), digest(env), env)
    ctx.file = ctx.cache or (default_file(device) if _default_on() else None)
    with _lock:
        known = _known_for(device)
        if ctx.cache is not None:
            adopt(known, read_file(ctx.cache, env) or {})
        _contexts.append(ctx)
    _forget()  # a bucket decided before the context opened is decided again: timed, or read from the file
    try:
        yield ctx
    finally:
        with _lock:
            _contexts.remove(ctx)
        if ctx.tune and ctx.new and ctx.file is not None:
            save(ctx.file, ctx.new, env)


def tuning(entry: str = "") -> bool:
    """Whether a new bucket of ``entry`` is timed now: inside a tuning context that does not skip it."""
    with _lock:
        return any(c.tune and entry not in c.skip for c in _contexts)


def may_measure() -> bool:
    """Not inside CUDA-graph capture, not while torch.compile traces."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def set_process_group(group) -> None:
    """The ranks that agree on every tuned bucket (rank 0 of ``group`` times, all adopt); None: the
    default group whenever torch.distributed is initialized."""
    global _group
    _group = group


def _forget() -> None:
    for forget in _on_switch:
        forget()


@contextlib.contextmanager
def replaying(path: Path):
    """Decide from the buckets of a kept autotune file (a sweep's ``-cache.json``) and never time:
    an autotune sweep's choice replayed off its GPU (``bench --replay ... --autotune-file``), so each
    miss is named against the times the autotune acted on. A bucket the file lacks: the table decides."""
    global _replayed
    before, _replayed = _replayed, Path(path)
    _forget()
    try:
        yield
    finally:
        _replayed = before
        _forget()


def enabled() -> bool:
    """Whether kept times can decide here: a replay, an open context, or the default file read."""
    return _replayed is not None or bool(_contexts) or _default_on()


def _default_on() -> bool:
    return os.environ.get(ENV_AUTOTUNE, "").strip() != "0"


# -- the environment's fingerprint and the files ----------------------------------------------------
def current_device() -> DeviceDesc:
    """This process's device: the current CUDA device, else the CPU."""
    if not torch.cuda.is_available():
        return capability_db.CPU_DEVICE
    return devices.live_device(torch.empty(0, device="cuda"))


# The distributions that provide the modules a timing depends on, looked up by name: asking the
# metadata which distribution provides a module reads every installed distribution (0.2 s here, more
# on a long path), and the first decision of a process reads the fingerprint.
_DISTRIBUTIONS = {"cudnn": ("nvidia-cudnn-frontend",), "flashinfer": ("flashinfer-python", "flashinfer"),
                  "triton": ("triton", "pytorch-triton")}


@functools.lru_cache(maxsize=None)
def _package(module: str) -> str:
    """The installed version of the distribution providing ``module`` (package metadata: nothing imported)."""
    from importlib import metadata

    for dist in _DISTRIBUTIONS.get(module, (module,)):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return "none"


@functools.lru_cache(maxsize=64)
def fingerprint(device: DeviceDesc) -> dict[str, str]:
    """What a timing depends on besides the problem: the GPU and every version on the path."""
    from ._version import version

    cuda = device.kind == "cuda"
    cudnn = torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None
    return {"gpu": device.name, "sm": str(device.sm), "sm_count": str(device.sm_count),
            "driver": _driver() if cuda else "none",
            "cuda": (torch.version.cuda or "none") if cuda else "none", "cudnn": str(cudnn or "none"),
            "cudnn_frontend": _package("cudnn"), "flashinfer": _package("flashinfer"), "torch": torch.__version__,
            "triton": _package("triton"), "attn_dispatch": version()}


def _driver() -> str:
    """The NVIDIA driver's release (Linux: /proc/driver/nvidia/version), else the CUDA driver API version."""
    with contextlib.suppress(OSError):
        found = re.search(r"Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", Path("/proc/driver/nvidia/version").read_text())
        if found:
            return found.group(1)
    api = getattr(torch._C, "_cuda_getDriverVersion", None)
    return f"CUDA driver API {api()}" if api is not None else "unknown"


def digest(env: dict) -> str:
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=64)
def environment_digest(device: DeviceDesc) -> str:
    """``digest(fingerprint(device))``, once per device (a lookup reads it for every new bucket)."""
    return digest(fingerprint(device))


def cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE_DIR) or Path.home() / ".cache" / "attn-dispatch")


def default_file(device: DeviceDesc) -> Path:
    return cache_dir() / f"autotune-{environment_digest(device)}.json"


def describe_cache() -> str:
    return f"autotune cache under {cache_dir()}"


def describe_kept() -> str:
    """What kept times can decide in this process ("" where none): a benchmark's record says so."""
    if tuning():
        return "tuning: new buckets timed in a dispatch.autotune context"
    with _lock:
        count = sum(len(buckets) for buckets in _known.values())
    if not count and _default_on():
        count = len(_known_for(current_device()))
    return f"kept times of {count} buckets ({describe_cache()})" if count else ""


def _known_for(device: DeviceDesc) -> dict[str, dict]:
    """The buckets known for ``device``'s environment; its default file is read at first use."""
    key = environment_digest(device)
    with _lock:
        known = _known.setdefault(key, {})
        if key not in _read_default and _default_on():
            _read_default.add(key)
            adopt(known, read_file(default_file(device), fingerprint(device)) or {})
        return known


def adopt(known: dict[str, dict], buckets: dict[str, dict]) -> None:
    """Each bucket of ``buckets`` measured later than the one ``known`` holds (or that it lacks)."""
    for key, entry in buckets.items():
        held = known.get(key)
        if held is None or (entry.get("measured") or "") > (held.get("measured") or ""):
            known[key] = entry


def _log_once(path: Path, text: str, *args) -> None:
    if str(path) not in _logged:
        _logged.add(str(path))
        log.warning(text, path, *args)


def mismatch(saved: object, env: dict) -> dict[str, tuple]:
    """{field: (saved, here)} where a file's header differs from ``env`` ("*" matches anything)."""
    saved = saved if isinstance(saved, dict) else {}
    return {k: (saved.get(k), v) for k, v in env.items() if saved.get(k) not in (v, "*")}


def load(path: Path) -> Optional[dict]:
    """The file's JSON (None: no file; ValueError: not a cache file)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("buckets"), dict):
        raise ValueError("not an attn-dispatch autotune cache (no 'buckets' object)")
    data["buckets"] = {k: _normal(v) for k, v in data["buckets"].items()}
    return data


def read_file(path: Path, env: Optional[dict]) -> Optional[dict[str, dict]]:
    """The buckets of ``path`` if its header matches ``env`` (None: skip the check); else None, with
    one log line for a file made elsewhere or damaged."""
    try:
        data = load(path)
    except (OSError, ValueError) as exc:
        _log_once(path, "attn_dispatch: autotune cache %s ignored: %s", exc)
        return None
    if data is None:
        return None
    differs = mismatch(data.get("environment"), env) if env is not None else {}
    if differs:
        _log_once(path, "attn_dispatch: autotune cache %s ignored: made in another environment (%s)",
                  ", ".join(f"{k}: {a} there, {b} here" for k, (a, b) in differs.items()))
        return None
    return data["buckets"]


def _normal(value) -> dict:
    """A bucket as ``FORMAT`` 2 writes it ({"measured", "times"}); a format-1 bucket is its times alone."""
    if isinstance(value, dict) and isinstance(value.get("times"), dict):
        return value
    return {"measured": None, "times": value if isinstance(value, dict) else {}}


def newest(buckets: dict[str, dict], cap: Optional[int] = None) -> dict[str, dict]:
    """At most ``cap`` (default MAX_BUCKETS) buckets: the most recently measured (undated ones count as oldest)."""
    cap = MAX_BUCKETS if cap is None else cap
    if len(buckets) <= cap:
        return buckets
    kept = sorted(buckets, key=lambda k: buckets[k].get("measured") or "", reverse=True)[:cap]
    return {k: buckets[k] for k in sorted(kept)}


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock on ``path``.lock where the platform has fcntl (else none: the rename is atomic)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path.with_name(path.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def save(path: Path, buckets: dict[str, dict], env: dict) -> bool:
    """Merge ``buckets`` into ``path`` (read again under its lock; these win; capped) and replace it
    atomically. A file made in another environment is left as it is (one log line). Returns whether written."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(path):
            try:
                disk = load(path) or {"buckets": {}}
            except ValueError:
                disk = {"buckets": {}}  # a damaged cache is replaced
            differs = mismatch(disk.get("environment"), env) if "environment" in disk else {}
            if differs:
                _log_once(path, "attn_dispatch: autotune cache %s not written: made in another environment (%s)",
                          ", ".join(differs))
                return False
            merged = newest({**disk["buckets"], **buckets})
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump({"format": FORMAT, "environment": env, "buckets": merged}, out, indent=1, sort_keys=True)
            os.replace(tmp, path)
        return True
    except OSError as exc:  # a read-only home: the times still serve this process
        log.warning("attn_dispatch: autotune cache %s not written: %s", path, exc)
        return False


# -- the lookup -----------------------------------------------------------------------------------------
def bucket_key(problem: AttentionProblem, sizes: tuple[int, int, int]) -> str:
    """The problem's facts and its sizes rounded up to powers of two. Not ``cuda_graph``: a call
    declared for a graph runs the same backends at the same sizes, and the ranking decides what
    counts (GPU time alone), so one timing serves both; nor ``replay_kv`` (which buckets a graph's
    choice weighs, not what one bucket's timing is)."""
    return f"{dataclasses.replace(problem, cuda_graph=False, replay_kv=0)!r}|" + "x".join(map(str, size_class(*sizes)))


class Timed(NamedTuple):
    ms: float  # GPU time per call
    sizes: tuple  # where it was timed (the bucket's middle)
    host_us: Optional[float]  # host time per eager repeat (the backend's launcher, else its run); None: not timed
    measured: Optional[str] = None  # when (ISO 8601, UTC); None: a file that did not say


def lookup(problem: AttentionProblem, device: DeviceDesc, accepted: list[str],
           sizes: Optional[tuple[int, int, int]], leading: Optional[Leading] = None) -> Optional[dict[str, Timed]]:
    """{backend: Timed} kept for the bucket (timed now when tuning; module doc); None: nothing kept.
    ``leading``: which of the accepted a new bucket times (the router's: ``choice.leading``); every
    one where not given."""
    sizes = size_class(*(sizes or ANCHORS.get(problem.phase, ANCHORS["prefill"])))
    key, middle = bucket_key(problem, sizes), class_middle(sizes)
    if _replayed is not None:
        entry = (read_file(_replayed, None) or {}).get(key)
    elif not (_default_on() or _contexts):
        return None
    else:
        with _lock:
            entry = _known_for(device).get(key)
        if tuning(problem.entry) and may_measure():
            entry = _tuned(problem, device, accepted, sizes, key, entry, leading)
    times = (entry or {}).get("times", {})
    found = {n: _timed_entry(times[n], middle, entry.get("measured")) for n in accepted if times.get(n) is not None}
    return found or None


def lookup_over(problem: AttentionProblem, device: DeviceDesc, accepted: list[str],
                points: list[tuple[int, int, int]], leading: Optional[Leading] = None) -> Optional[dict[str, Timed]]:
    """A CUDA graph's kept times over the kv buckets it replays (``choice.replay_points``; each point
    timed now when tuning, as ``lookup``): per backend the mean of its times at every point, at a
    point where it was not among those timed (the table put it behind the leaders) the slowest time
    kept there. None unless every point has times; a backend that failed at a point is left out."""
    found = [lookup(problem, device, accepted, point, leading) for point in points]
    if not found or not all(found):
        return None  # a point nobody timed (a capture after a warm-up that did not reach it): the table decides
    failed = {n for point in points for n in _failed(problem, device, point)}
    names = [n for n in accepted if n not in failed and any(n in f for f in found)]
    if not names:
        return None
    when = max((t.measured or "" for f in found for t in f.values()), default="") or None
    mean = {n: sum(f[n].ms if n in f else max(t.ms for t in f.values()) for f in found) / len(found) for n in names}
    return {n: Timed(mean[n], found[-1][n].sizes if n in found[-1] else points[-1], None, when) for n in names}


def _failed(problem: AttentionProblem, device: DeviceDesc, point: tuple) -> list[str]:
    """The backends whose timing failed in the bucket of ``point`` (kept as None)."""
    key = bucket_key(problem, size_class(*point))
    with _lock:
        entry = (read_file(_replayed, None) or {}).get(key) if _replayed is not None else _known_for(device).get(key)
    return [n for n, t in (entry or {}).get("times", {}).items() if t is None]


# The call being decided: a function that reads its per-request (q, kv) lengths, set by ``router.decide``
# on a decision it has not cached. A new bucket is timed on those lengths when they fall in it: a
# decode batch's spread of lengths is what separates a kernel whose time follows the longest request
# from one whose time follows the mean, which equal lengths at the bucket's middle hide.
CALL_LENGTHS: contextvars.ContextVar[Optional[Callable[[], Lengths]]] = contextvars.ContextVar(
    "attn_dispatch_call_lengths", default=None)


def _call_lengths(sizes: tuple[int, int, int]) -> Optional[Lengths]:
    """The decided call's lengths when they fall in the bucket ``sizes`` (a size class), else None."""
    read = CALL_LENGTHS.get()
    lengths = read() if read is not None else None
    if not lengths or not lengths[0] or len(lengths[0]) != len(lengths[1]):
        return None
    q_lens, kv_lens = lengths
    return lengths if size_class(len(q_lens), max(q_lens), max(kv_lens)) == tuple(sizes) else None


def _tuned(problem, device, accepted, sizes, key, entry, leading: Optional[Leading]) -> Optional[dict]:
    """The bucket's entry with the leading candidates timed (what it lacks of them); agreed across ranks."""
    def complete() -> Optional[dict]:
        candidates = timed_on(device, accepted)
        wanted = leading(problem, device, candidates, sizes) if leading is not None else candidates
        missing = [n for n in wanted if n not in (entry or {}).get("times", {})]
        if not missing:
            return entry
        times = {**(entry or {}).get("times", {}),
                 **measure(problem, missing, class_middle(sizes), _call_lengths(sizes))}
        return {"measured": now(), "times": times}
    group = _ranks()
    tuned = complete() if group is None else _agreed(group, complete)
    if tuned is not None and tuned is not entry:
        with _lock:
            known = _known_for(device)
            known[key] = tuned
            if len(known) > MAX_BUCKETS:  # bounded in memory as in the file: the oldest measured go
                kept = newest(known)
                known.clear()
                known.update(kept)
            for ctx in _contexts:
                if ctx.tune and ctx.digest == environment_digest(device):
                    ctx.new[key] = tuned
    return tuned


def on_switch(forget: Callable[[], None]) -> None:
    """Call ``forget`` whenever a tuning context starts or ends (the caches of decisions made before
    are stale then)."""
    _on_switch.append(forget)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _ranks():
    """The process group whose ranks must agree, or None (no torch.distributed, or one rank)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = _group or dist.group.WORLD
    return group if dist.get_world_size(group) > 1 else None


def _agreed(group, complete: Callable[[], Optional[dict]]) -> Optional[dict]:
    """Rank 0 of ``group`` completes the entry (times it, or has it); every rank adopts rank 0's. A
    failure on rank 0 is broadcast too, so the other ranks raise instead of waiting for it."""
    import torch.distributed as dist

    box: list = [None]
    failure: Optional[BaseException] = None
    if dist.get_rank(group) == 0:
        try:
            box = [("entry", complete())]
        except Exception as exc:  # noqa: BLE001 - re-raised below, after the others are told
            failure, box = exc, [("failed", f"{type(exc).__name__}: {exc}")]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    kind, value = box[0]
    if failure is not None:
        raise failure
    if kind == "failed":
        raise RuntimeError(f"attn_dispatch: the autotune on rank 0 failed, so no rank chose: {value}")
    return value


def _timed_entry(value, sizes: tuple, measured: Optional[str]) -> Timed:
    """A kept time: {"ms", "host_us"}, or the GPU ms alone (files written before host times)."""
    if isinstance(value, dict):
        return Timed(value["ms"], sizes, value.get("host_us"), measured)
    return Timed(value, sizes, None, measured)


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


# -- the timing -----------------------------------------------------------------------------------------
def measure(problem: AttentionProblem, names: list[str], sizes: tuple[int, int, int],
            lengths: Optional[Lengths] = None) -> dict[str, Optional[dict]]:
    """Per backend, on fresh random inputs of these sizes (every request at them), or of the call's
    own ``lengths``: {"ms": GPU time per call, "host_us": host time per eager call on a GPU, None on
    the CPU (``_host_us``), "tune_s": seconds its timing took, compiles included}; None: it failed."""
    from backends import get_backend

    b, q, kv = sizes
    device = torch.device("cuda" if problem.device_type == "cuda" else "cpu")
    q_lens, kv_lens = (tuple(lengths[0]), tuple(lengths[1])) if lengths else ((q,) * b, (kv,) * b)
    batch = make_batch(Case("autotune", problem, q_lens, kv_lens), device, seed=0)  # paged: pages shuffled
    if problem.has_sinks and batch.sinks is None:
        batch.sinks = torch.zeros(problem.num_qo_heads, device=device)
    out: dict[str, Optional[dict]] = {}
    for name in names:
        backend, start = get_backend(name), time.perf_counter()
        try:
            plan = backend.plan(problem, batch)  # its own workspace, as a call's plan allocates it
            backend.run(plan, batch)  # warm: compiles what the bucket needs
            out[name] = {"ms": _timed(lambda: backend.run(plan, batch), device.type),
                         "host_us": _host_us(backend, problem, plan, batch) if device.type == "cuda" else None,
                         "tune_s": round(time.perf_counter() - start, 3)}
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run here is not chosen by its time
            log.info("attn_dispatch: autotune of %s on %s failed: %s", name, problem.describe(), exc)
            out[name] = None
    log.info("attn_dispatch: autotuned %s at %s%s: %s", problem.describe(), sizes,
             " (the call's own lengths)" if lengths else "", out)
    return out


_flush_buffer: dict[int, torch.Tensor] = {}


def flush_l2() -> None:
    """Overwrite twice the GPU's L2 cache, so a repetition does not find its inputs cached."""
    index = torch.cuda.current_device()
    buf = _flush_buffer.get(index)
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or (64 << 20)
        buf = _flush_buffer[index] = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
    buf.zero_()


def _timed(run: Callable[[], object], device_type: str) -> float:
    """ms per call, the median of REPS with the L2 flushed before each; a short call is timed again
    over back-to-back calls filling about SHORT_MS, so the events' resolution (about a microsecond)
    does not decide between kernels of a few."""
    from . import timing

    flush = flush_l2 if device_type == "cuda" else None
    once = timing.device_ms(run, device_type, reps=REPS, before_rep=flush)
    if device_type != "cuda" or once >= SHORT_MS:
        return once
    calls = min(MAX_CALLS, math.ceil(SHORT_MS / max(once, 1e-3)))
    return timing.device_ms(run, device_type, reps=REPS, calls=calls, before_rep=flush)


def _host_us(backend, problem: AttentionProblem, plan, batch) -> float:
    """Host microseconds per eager call: back-to-back calls on the host clock, no sync inside
    (HOST_CALLS, few enough that the launch queue never fills). A wrapper's run, and a function
    entry's call on a backend whose plan the entry keeps, repeat its launcher (else its run); a
    function entry's call on any other backend plans on every call (an engine's lengths change every
    step), so its time is a plan and a run."""
    from . import timing

    if not problem.entry.endswith("Wrapper") and not backend.plan_reusable(problem):
        def call():
            backend.run(backend.plan(problem, batch), batch)
    else:
        launch = backend.launcher(plan, batch)
        call = (lambda: launch(batch)) if launch is not None else (lambda: backend.run(plan, batch))
    torch.cuda.synchronize()
    return timing.wall_ms(call, reps=3, warmup=1, calls=HOST_CALLS) * 1e3


class _CallableModule(sys.modules[__name__].__class__):
    """``with dispatch.autotune(...):`` opens the context while ``dispatch.autotune.<name>`` stays this
    module (a function of the same name would hide the module from ``from dispatch import autotune``)."""

    def __call__(self, tune_mode: bool = True, cache=None, **options):
        return autotune(tune_mode, cache, **options)


sys.modules[__name__].__class__ = _CallableModule
