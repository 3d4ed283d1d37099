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
from typing import Any, Callable, Hashable, Iterator, Mapping, Optional

import torch

from .._cache import BoundedCache
from .._normalize import full_validation
from .. import router, specs


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
def tensor_facts(t: torch.Tensor, vary: tuple[int, ...] = (0,)) -> tuple:
    """dtype, device (with index), rank, the fixed dims (varying ones as -1), unit last stride."""
    shape = tuple(-1 if i in vary else n for i, n in enumerate(t.shape))
    return (t.dtype, t.device, shape, t.dim() == 0 or t.stride(-1) == 1)


def value_facts(value: Any, vary: tuple[int, ...] = (0,)) -> Hashable:
    if isinstance(value, torch.Tensor):
        return tensor_facts(value, vary)
    if isinstance(value, (tuple, list)):
        return (type(value),) + tuple(value_facts(v, vary) for v in value)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, _Unset)):
        return (type(value), value)
    return type(value)


ALL_DIMS = tuple(range(8))


def call_key(entry: str, args: Mapping[str, Any], vary: Mapping[str, tuple[int, ...]],
             per_call: tuple[str, ...] = ()) -> tuple:
    """The key of one call. ``vary``: per tensor argument, the dims whose size varies per call
    (default: dim 0); ``per_call``: scalar arguments whose value varies per call (type only)."""
    parts: list = [entry]
    for name, value in args.items():
        if name in per_call and not isinstance(value, torch.Tensor):
            parts.append(type(value))
        else:
            parts.append(value_facts(value, vary.get(name, (0,))))
    return tuple(parts)


PROBLEMS = BoundedCache(maxsize=4096)  # call key -> AttentionProblem (model configurations)


def checked(spec_cls: type, args: dict, key: tuple, query: Any, build: Callable):
    """(problem, spec, derived). A new key: the full spec (every check, device reads included)
    and the problem. A known key: the spec's size checks, plus its value checks for CPU tensors
    or under ATTN_DISPATCH_VALIDATE=full (the key proves the static checks still hold)."""
    problem = PROBLEMS.get(key)
    if problem is None:
        spec, derived = specs.validate(spec_cls, args)
        problem = build(spec, derived)
        PROBLEMS.put(key, problem)
        return problem, spec, derived
    # A known key proves ``query`` is a tensor (its facts are in the key).
    spec, derived = spec_cls.fast(args, values=query.device.type == "cpu" or full_validation())
    return problem, spec, derived


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


def execute(problem, batch, explicit) -> router.Planned:
    """The functions' one-shot path: decide (cached), plan, launch; only decide when dry."""
    if is_dry():
        decision = router.decide(problem, router.live_device(batch.q), explicit)
        return router.Planned(decision, decision.chosen, None)
    return router.execute(problem, batch, explicit)


def remember(entry: Callable, planned) -> None:
    """``entry.last_decision``: the decision that served the entry's latest call."""
    entry.last_decision = planned.decision


def clear_caches() -> None:
    PROBLEMS.clear()
