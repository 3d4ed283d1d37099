"""What every entry module shares: seed signatures with keyword aliases, cache keys, call caches.

**Signatures.** The seed documents fix every parameter's name, order, kind and default. Newer
FlashInfer spellings are extra keyword-only parameters. Where a seed parameter has such an
alias, both default to the ``UNSET`` sentinel in the code (so "given twice" is detectable,
even when the value given equals the default) and ``seed_signature`` publishes the seed's own
defaults through ``__signature__`` (what ``inspect.signature`` and ``help`` show).

**Cache keys.** A call's key holds every fact the cached path does not re-check: for each
tensor its dtype, device (with its index), rank, every dimension that does not vary from call
to call, and whether its last stride is 1; every scalar option's value; for per-call numbers
(lengths, maxima, scales) only their type. The dims that vary per call are named per entry
(``vary``); the spec's ``size_checks`` re-check them on every call.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
from types import SimpleNamespace
from typing import Any, Callable, Hashable, Iterator, Mapping, Optional

import torch

from .._cache import BoundedCache
from .._normalize import full_validation, paged_nhd, split_kv
from backends import get_backend

from .. import policy, router, specs
from ..problem import AttentionProblem


class _Unset:
    """Default of a parameter that has two spellings (never a user value)."""

    _instance: Optional["_Unset"] = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()
REQUIRED_SHOWN = inspect.Parameter.empty  # how seed_signature shows a required parameter


def seed_signature(fn: Callable, shown: Mapping[str, Any]) -> Callable:
    """Publish the seed's defaults for parameters the code defaults to UNSET.

    ``shown`` maps a parameter name to the default the seed shows (``inspect.Parameter.empty``
    for a required one); every UNSET default not listed shows as None (an alias).
    """
    sig = inspect.signature(fn)
    params = []
    for p in sig.parameters.values():
        if p.default is UNSET:
            p = p.replace(default=shown.get(p.name, None))
        params.append(p)
    fn.__signature__ = sig.replace(parameters=params)
    return fn


def one_of(seed_name: str, seed_value: Any, new_name: str, new_value: Any, default: Any) -> Any:
    """The value of a parameter spelled two ways; TypeError naming both when both are given."""
    if new_value is UNSET:
        return default if seed_value is UNSET else seed_value
    if seed_value is not UNSET:
        raise TypeError(f"{seed_name}= and {new_name}= are two spellings of one parameter "
                        f"(the seed's and FlashInfer's newer one): give one of them, not both")
    return new_value


def required(name: str, value: Any, where: str) -> Any:
    if value is UNSET:
        raise TypeError(f"{where}() missing required argument: {name!r}")
    return value


# -- documented argument forms ----------------------------------------------------------------------
def int32_lengths(lengths: Any) -> Any:
    """uint32 lengths (the seed's dtype for ``seq_lens``) as an int32 view: no copy, and a value
    >= 2**31 shows as negative, which the value checks refuse."""
    if isinstance(lengths, torch.Tensor) and lengths.dtype == torch.uint32:
        return lengths.view(torch.int32)
    return lengths


def sinks_tensor(sinks: Any, query: Any) -> Any:
    """``sinks`` as the seed types it (a list: of floats, of one (Hq,) tensor, or of 0-dim
    tensors) -> one fp32 (Hq,) tensor on the query's device; other values pass through to the
    spec, which names what is allowed."""
    if not isinstance(sinks, (list, tuple)) or not sinks or not isinstance(query, torch.Tensor):
        return sinks
    if all(isinstance(s, torch.Tensor) for s in sinks):
        if len(sinks) == 1 and sinks[0].dim() == 1:
            return sinks[0]
        if all(s.dim() == 0 for s in sinks):
            return torch.stack(list(sinks))
        return sinks
    if all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in sinks):
        return torch.tensor([float(s) for s in sinks], dtype=torch.float32, device=query.device)
    return sinks


# -- cache keys ---------------------------------------------------------------------------------
ROWS = (0,)  # the usual varying dim: tokens, pages or KV rows
ALL_DIMS = tuple(range(8))  # every dim varies (index tensors): dtype, device and rank only
FULL: tuple = ()  # no dim varies (a wrapper's run: the plan fixes every size)


def tensor_facts(t: torch.Tensor, vary: tuple[int, ...] = ROWS) -> tuple:
    """dtype, device (with index), the fixed dims (varying ones left out, the rank kept), and
    whether the last stride is 1. The two common cases skip the generic loop (hot path)."""
    unit = t.dim() == 0 or t.stride(-1) == 1
    if vary is FULL:
        return (t.dtype, t.device, t.shape, unit)
    if vary is ROWS:
        return (t.dtype, t.device, t.dim(), t.shape[1:], unit)
    if vary is ALL_DIMS:
        return (t.dtype, t.device, t.dim(), unit)
    return (t.dtype, t.device, t.dim(), tuple(n for i, n in enumerate(t.shape) if i not in vary), unit)


_PLAIN = (bool, int, float, str, torch.dtype, _Unset, type(None))


class _NothingVaries(dict):
    def get(self, name, default=None):
        return FULL


_NOTHING_VARIES = _NothingVaries()


def value_facts(value: Any, vary: tuple[int, ...] = ROWS) -> Hashable:
    if type(value) in _PLAIN:  # the type too: True and 1 are equal keys otherwise
        return (type(value), value)
    if isinstance(value, torch.Tensor):
        return tensor_facts(value, vary)
    if isinstance(value, (tuple, list)):
        return (type(value),) + tuple(value_facts(v, vary) for v in value)
    return type(value)


def call_key(entry: str, args: Mapping[str, Any], vary: Optional[Mapping[str, tuple[int, ...]]],
             per_call: tuple[str, ...] = ()) -> tuple:
    """The key of one call. ``vary``: per tensor argument, the dims whose size varies per call
    (default: ROWS, dim 0); ``per_call``: scalar arguments whose value varies per call (their
    type only: the spec's size checks test their values on every call). ``vary=None``: every
    tensor's whole shape is in the key (nothing varies)."""
    parts: list = [entry]
    if vary is None:
        vary = _NOTHING_VARIES
    for name, value in args.items():
        kind = type(value)
        if kind in _PLAIN:  # inlined value_facts: the common case on the hot path
            parts.append(kind if name in per_call else (kind, value))
        elif kind is torch.Tensor:
            parts.append(tensor_facts(value, vary.get(name, ROWS)))
        else:
            parts.append(value_facts(value, vary.get(name, ROWS)))
    return tuple(parts)


class CallPlan:
    """What a call key proves, kept between calls: the problem, and its routing decisions per
    (explicit choice, strict mode) — so a repeated call neither rebuilds nor re-hashes the
    problem. The decision is the device's: the key holds the device index."""

    __slots__ = ("problem", "_decisions", "_planned")

    def __init__(self, problem: AttentionProblem):
        self.problem = problem
        self._decisions: dict = {}
        self._planned: dict = {}  # (explicit, strict) -> a backend plan the backend says is reusable

    def decision(self, query: torch.Tensor, explicit) -> router.Decision:
        strict = policy.strict_mode()
        decision = self._decisions.get((explicit, strict))
        if decision is None:
            decision = router.decide(self.problem, router.live_device(query), explicit, strict)
            self._decisions[(explicit, strict)] = decision
        return decision

    def planned(self, batch, explicit) -> router.Planned:
        """The backend's plan: kept per call key when it reads nothing a later call could change."""
        decision = self.decision(batch.q, explicit)
        key = (decision.explicit, decision.strict)
        planned = self._planned.get(key)
        if planned is None:
            planned = router.plan(decision, batch)
            if get_backend(planned.backend).plan_reusable(self.problem):
                self._planned[key] = planned
        return planned


PLANS = BoundedCache(maxsize=4096)  # call key -> CallPlan (model configurations)


# CPU tensors re-run the device-data (value) checks on every call: they are cheap there. Tests turn
# this off to drive the GPU's cached path on the CPU.
CPU_VALUE_CHECKS = True


def values_every_call(device: torch.device) -> bool:
    """Whether a known key still re-reads device data (lengths, page ids) on this call."""
    return (CPU_VALUE_CHECKS and device.type == "cpu") or full_validation()


def checked(spec_cls: type, args: dict, key: tuple, query: Any, build: Callable):
    """(call plan, spec, derived). A new key: the full spec (every check, device reads included)
    and the problem. A known key: the spec's size checks, plus its value checks for CPU tensors
    or under ATTN_DISPATCH_VALIDATE=full (the key proves the static checks still hold)."""
    plan = PLANS.get(key)
    if plan is None:
        spec, derived = specs.validate(spec_cls, args)
        plan = CallPlan(build(spec, derived))
        PLANS.put(key, plan)
        return plan, spec, derived
    # A known key proves ``query`` is a tensor (its facts are in the key).
    spec, derived = spec_cls.fast(args, values=values_every_call(query.device))
    return plan, spec, derived


# whole-call key -> (CallPlan, the derived sizes): calls that repeat exactly (every shape and every
# per-call number, as the 32 layers of one decode step do) skip the spec's per-call checks too.
REPEATS = BoundedCache(maxsize=1024)


def checked_repeat(entry: str, spec_cls: type, args: dict, key: Callable[[], tuple], query: Any,
                   build: Callable, views: Callable):
    """``checked``, plus a second key holding every shape and every per-call number by value: a
    repeat of a call whose size checks passed only rebuilds the views of the caller's tensors
    (``views(args) -> dict``); ``key()`` (the call key) is built only when it is not a repeat.
    CPU tensors and ATTN_DISPATCH_VALIDATE=full take ``checked``."""
    repeatable = isinstance(query, torch.Tensor) and not values_every_call(query.device)
    if repeatable:
        whole = call_key(entry, args, None, ())
        hit = REPEATS.get(whole)
        if hit is not None:
            plan, sizes = hit
            return plan, None, SimpleNamespace(**sizes, **views(args))
    plan, spec, derived = checked(spec_cls, args, key(), query, build)
    if repeatable:
        fresh = views(args)
        REPEATS.put(whole, (plan, {n: x for n, x in vars(derived).items() if n not in fresh}))
    return plan, spec, derived


def paged_views(kv_cache, layout: str) -> dict:
    """The logical NHD views of a paged cache that already passed the checks (as the specs make)."""
    k, v, squeezed = split_kv(kv_cache, "kv_cache", False)
    return {"k": paged_nhd(k, layout, squeezed), "v": paged_nhd(v, layout, squeezed)}


def new_out(out, rows: int, heads: int, dim: int, dtype, device) -> torch.Tensor:
    return out if out is not None else torch.empty(rows, heads, dim, dtype=dtype, device=device)


def new_lse(lse, rows: int, heads: int, device, wanted: bool):
    if lse is not None or not wanted:
        return lse
    return torch.empty(rows, heads, dtype=torch.float32, device=device)


# -- explain without launching -------------------------------------------------------------------
_DRY = threading.local()


@contextlib.contextmanager
def dry_run() -> Iterator[None]:
    """Inside the block an entry validates, decides and records its decision, but neither
    plans a vendor nor launches (``dispatch.explain``)."""
    _DRY.on = True
    try:
        yield
    finally:
        _DRY.on = False


def is_dry() -> bool:
    return getattr(_DRY, "on", False)


def execute(plan: CallPlan, batch, explicit) -> router.Planned:
    """The functions' one-shot path: the cached decision, the backend's plan, the launch; only
    the decision when dry (explain)."""
    if is_dry():
        decision = plan.decision(batch.q, explicit)
        return router.Planned(decision, decision.chosen, None)
    return router.run(plan.planned(batch, explicit), batch)


def remember(entry: Callable, planned) -> None:
    """``entry.last_decision``: the decision that served the entry's latest call."""
    entry.last_decision = planned.decision


def clear_caches() -> None:
    PLANS.clear()
    REPEATS.clear()
