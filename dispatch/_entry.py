"""The per-call machinery shared by the function entry points: signature cache, out/lse buffers.

A call builds a cheap signature tuple from invariant metadata (ranks, dtypes, devices, inner
dims, unit last stride, scalar arguments). The first call with a signature runs the full
pydantic spec (including device-data checks) and builds the AttentionProblem; later calls run
only the spec's size checks, plus its value checks for CPU tensors or under
ATTN_DISPATCH_VALIDATE=full.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

import torch

from . import specs
from ._normalize import full_validation
from .problem import AttentionProblem

_problems: dict[tuple, AttentionProblem] = {}
_lock = threading.Lock()


def meta(value: Any, full_shape: bool = False) -> Any:
    """Invariant metadata of one argument for the signature."""
    if isinstance(value, torch.Tensor):
        shape = tuple(value.shape) if full_shape else tuple(value.shape[1:])
        return (value.dtype, value.device, shape, value.dim() == 0 or value.stride(-1) == 1)
    if isinstance(value, (tuple, list)):
        return tuple(meta(v) for v in value)
    if isinstance(value, (int, float, bool, str, torch.dtype)) or value is None:
        return value
    return type(value)


def signature(entry: str, args: dict, loose: Iterable[str] = (), full: Iterable[str] = (),
              sizes: Iterable[str] = ()) -> tuple:
    """``loose``: tensors whose inner dims vary per call (only dtype/device/rank kept);
    ``full``: small tensors whose whole shape is static (sinks); ``sizes``: per-call numbers
    (only their type is kept)."""
    parts = [entry]
    for name, value in args.items():
        if name in sizes:
            parts.append(type(value))
        elif name in loose and isinstance(value, torch.Tensor):
            parts.append((value.dtype, value.device, value.dim()))
        else:
            parts.append(meta(value, name in full))
    return tuple(parts)


def checked(spec_cls: type, args: dict, sig: tuple, device: torch.device,
            build: Callable[[Any, Any], AttentionProblem]):
    """(problem, spec, derived): full validation once per signature, cheap checks after."""
    problem = _problems.get(sig)
    if problem is None:
        spec, d = specs.validate(spec_cls, args)
        problem = build(spec, d)
        with _lock:
            _problems[sig] = problem
        return problem, spec, d
    spec, d = spec_cls.fast(args, values=device.type == "cpu" or full_validation())
    return problem, spec, d


def new_out(out, total_q: int, heads: int, dim: int, dtype, device) -> torch.Tensor:
    return out if out is not None else torch.empty(total_q, heads, dim, dtype=dtype, device=device)


def new_lse(lse, total_q: int, heads: int, device, wanted: bool):
    if lse is not None or not wanted:
        return lse
    return torch.empty(total_q, heads, dtype=torch.float32, device=device)


def remember(entry: Callable, planned) -> None:
    """``entry.last_decision``: the decision that served the entry's latest call."""
    entry.last_decision = planned.decision


def clear_caches() -> None:
    with _lock:
        _problems.clear()
