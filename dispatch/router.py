"""Candidates -> checks -> choice -> fallback; decisions cached per problem key.

The hot path is ``decide`` (a dict lookup after the first call for a key) and
``execute`` (the chosen backend's plan cache + launch). Everything that explains
a decision (reasons, fallbacks) is recorded on the Decision for ``explain()``.
"""
from __future__ import annotations

import logging
import textwrap
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

import backends
import capability_db
from backends import BackendRejected, DeviceDesc, Reason, get_backend
from backends._device import BoundedCache

from . import autotune, choice, policy
from .problem import AttentionBatch, AttentionProblem

log = logging.getLogger("attn_dispatch")


class BackendRefusedError(ValueError):
    """An explicitly chosen backend cannot serve the problem (its reasons attached)."""


class NoBackendError(RuntimeError):
    """No candidate accepts the problem (every backend's reasons attached)."""


WIDTH = 100  # explain() fits a 100-column terminal


@dataclass
class Candidate:
    backend: str
    why: str  # why it sits at this place in the priority list, or that it is not in it
    reasons: list[Reason]  # empty = accepted
    ranked: bool = True  # in the priority list: only ranked candidates are chosen automatically
    estimate: str = ""  # the measurement or model estimate behind its place among the accepted

    @property
    def accepted(self) -> bool:
        return not self.reasons

    def mark(self, chosen: Optional[str]) -> str:
        return "CHOSEN  " if self.backend == chosen else ("ok      " if self.accepted else "rejected")

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "accepted": self.accepted, "ranked": self.ranked, "why_here": self.why,
                "estimate": self.estimate or None, "reasons": [str(r) for r in self.reasons]}


def wrap(text: str, indent: int, width: int = WIDTH) -> list[str]:
    """``text`` in lines of at most ``width`` columns, every line indented by ``indent``."""
    pad = " " * indent
    return textwrap.wrap(text, width, initial_indent=pad, subsequent_indent=pad + "  ",
                         break_long_words=True, break_on_hyphens=False) or [pad]


def candidate_lines(c: Candidate, chosen: Optional[str], prefix: str = "  ") -> list[str]:
    """One candidate as explain() and query show it: mark, name, why, then its reasons."""
    head = f"{prefix}{c.mark(chosen)} {c.backend:14s} "
    why = textwrap.wrap(c.why, WIDTH - len(head), break_on_hyphens=False) or [""]
    lines = [head + why[0]] + [" " * len(head) + line for line in why[1:]]
    if c.estimate:
        lines.extend(wrap(f"= {c.estimate}", len(prefix) + 11))
    for r in c.reasons:
        lines.extend(wrap(f"- {r}", len(prefix) + 11))
    return lines


@dataclass
class Decision:
    problem: AttentionProblem
    device: DeviceDesc
    candidates: list[Candidate]
    chosen: Optional[str]
    explicit: Optional[tuple[str, str]] = None
    strict: bool = False
    fallbacks: list[tuple[str, list[Reason]]] = field(default_factory=list)  # plan-time rejections
    ran: Optional[str] = None  # the backend that served the latest call (differs from chosen after a fallback)
    ranking: str = ""  # what ordered the accepted candidates (measured time, cost model, priority list)

    def accepted(self) -> list[str]:
        """The automatic order: ranked candidates that accept the problem (fallbacks follow it)."""
        return [c.backend for c in self.candidates if c.accepted and c.ranked]

    def to_json(self) -> dict[str, Any]:
        return {
            "problem": self.problem.describe(),
            "device": self.device.name,
            "chosen": self.chosen,
            "ran": self.ran or self.chosen,
            "explicit": {"backend": self.explicit[0], "from": self.explicit[1]} if self.explicit else None,
            "strict": self.strict,
            "ranking": self.ranking,
            "candidates": [c.to_json() for c in self.candidates],
            "fallbacks": [{"backend": b, "reasons": [str(r) for r in rs]} for b, rs in self.fallbacks],
        }

    def explain(self) -> str:
        lines = wrap(self.problem.describe(), 0) + [f"device: {self.device.name} ({self.device.arch})"]
        if self.explicit:
            lines.append(f"explicit choice: {self.explicit[0]} (from {self.explicit[1]})")
        elif self.ranking:
            lines.extend(wrap(f"ranked by: {self.ranking}", 0))
        for c in self.candidates:
            lines.extend(candidate_lines(c, self.chosen))
        for b, rs in self.fallbacks:
            lines.extend(wrap(f"fallback: {b} refused at plan time: " + "; ".join(map(str, rs)), 2))
        if self.ran and self.ran != self.chosen:
            lines.append(f"ran: {self.ran} (the latest call fell back from {self.chosen})")
        return "\n".join(lines)

    def __str__(self) -> str:  # what a user sees when printing explain(...)
        return self.explain()


# bounded like every cache: a model's new size classes add decisions for as long as it serves
_decisions = BoundedCache(maxsize=4096)  # (problem, device, explicit, strict, live) -> Decision
_logged = BoundedCache(maxsize=4096)  # (problem, device) whose reference choice was logged -> True
_lock = threading.Lock()
_live_devices: dict[int, DeviceDesc] = {}


def live_device(tensor: torch.Tensor) -> DeviceDesc:
    """The DeviceDesc of the tensor's device (cached per CUDA device index)."""
    if tensor.device.type != "cuda":
        return capability_db.CPU_DEVICE
    index = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    desc = _live_devices.get(index)
    if desc is None:
        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index)
        desc = _live_devices[index] = capability_db.device_for_capability(major, minor, name)
    return desc


def backend_reasons(name: str, problem: AttentionProblem, device: DeviceDesc, live: bool) -> list[Reason]:
    """Availability (only for a live device) plus capability reasons of one backend."""
    backend = get_backend(name)
    reasons = []
    if live:
        missing = backend.available()
        if missing is not None:
            reasons.append(missing)
    reasons.extend(backend.check(problem, device))
    return reasons


def evaluate(problem: AttentionProblem, device: DeviceDesc, live: bool = True) -> list[Candidate]:
    """Every backend with its reasons (all, not the first): the accepted candidates of the
    device's priority list ordered by expected time (``rank_measured``), then the rejected ones
    in priority order, then every other registered backend, unranked (it can be forced, never
    chosen)."""
    return _evaluate(problem, device, live)[0]


def _evaluate(problem: AttentionProblem, device: DeviceDesc, live: bool) -> tuple[list[Candidate], str]:
    """``evaluate``'s candidates, and what ordered the accepted ones ("" for the priority list alone)."""
    ranked = [Candidate(e.backend, e.why, backend_reasons(e.backend, problem, device, live))
              for e in capability_db.candidates(device, problem.phase, problem.entry)]
    ranked, basis = rank_measured(problem, device, ranked)
    listed = {c.backend for c in ranked}
    outside = f"not in the {capability_db.priority_list_name(device, problem.phase)} priority list"
    return ranked + [Candidate(name, outside, backend_reasons(name, problem, device, live), ranked=False)
                     for name in backends.REGISTRY if name not in listed], basis


def rank_measured(problem: AttentionProblem, device: DeviceDesc,
                  ranked: list[Candidate]) -> tuple[list[Candidate], str]:
    """The accepted candidates ordered by measured time or cost model (dispatch/choice.py), each
    with its estimate: they trade places among their own slots of the priority list, so a rejected
    candidate keeps its place (strict mode and explain read it there); ties keep the priority order."""
    accepted = [c for c in ranked if c.accepted]
    ranking = choice.rank(problem, device, [c.backend for c in accepted], problem.sizes or None)
    by_name = {c.backend: c for c in accepted}
    for name, est in ranking.estimates.items():
        by_name[name].estimate = est.describe()
    basis = ranking.basis if ranking.estimates else ""  # the priority list alone: nothing to add
    order = iter(ranking.order)
    return [by_name[next(order)] if c.accepted else c for c in ranked], basis


def decide(problem: AttentionProblem, device: DeviceDesc, explicit: Optional[tuple[str, str]] = None,
           strict: Optional[bool] = None, live: bool = True) -> Decision:
    """The cached decision for (problem, device, explicit, strict). Raises if nothing can serve."""
    strict = policy.strict_mode() if strict is None else strict
    key = (problem, device, explicit, strict, live)
    decision = _decisions.get(key)
    if decision is None:
        decision = _decide(problem, device, explicit, strict, live)
        _decisions.put(key, decision)
    return decision


def _decide(problem, device, explicit, strict, live) -> Decision:
    candidates, ranking = _evaluate(problem, device, live)
    if explicit is not None:
        name, source = explicit
        reasons = backend_reasons(name, problem, device, live)
        if reasons:
            raise BackendRefusedError(_refusal_text(problem, device, name, source, reasons, candidates))
        return Decision(problem, device, candidates, name, explicit, strict)
    accepted = [c for c in candidates if c.accepted and c.ranked]
    if not accepted:
        raise NoBackendError(_nothing_text(problem, device, candidates))
    chosen = accepted[0].backend
    if strict:
        _check_strict(problem, device, candidates, chosen)
    decision = Decision(problem, device, candidates, chosen, None, strict, ranking=ranking)
    if _logged.get((problem, device)) is None:
        _logged.put((problem, device), True)
        if chosen == "reference" and device.kind == "cuda":  # every faster backend refused: say so, once
            log.warning("attn_dispatch: the slow PyTorch reference serves %s on %s; the others: %s",
                        problem.describe(), device.name, "; ".join(
                            f"{c.backend}: {', '.join(map(str, c.reasons)) or 'accepts'}" for c in candidates
                            if c.backend != "reference" and c.ranked))
        log.info("attn_dispatch: %s -> %s (candidates: %s)", problem.describe(), chosen,
                 ", ".join(f"{c.backend}{'' if c.accepted else ' (rejected)'}" for c in candidates if c.ranked))
    return decision


def _check_strict(problem, device, candidates, chosen) -> None:
    """Strict: the first *installed* candidate must serve. Missing packages are not fallbacks."""
    for c in candidates:
        if c.backend == chosen:
            return
        installed = get_backend(c.backend).available() is None
        if installed:
            raise NoBackendError(
                f"strict mode ({policy.ENV_STRICT}=1): {c.backend} would fall back to {chosen} for "
                f"{problem.describe()} on {device.name}: " + "; ".join(map(str, c.reasons)))


def _refusal_text(problem, device, name, source, reasons, candidates) -> str:
    would = [c.backend for c in candidates if c.accepted]
    return (f"backend {name!r} (chosen by {source}) cannot serve {problem.describe()} on {device.name}:\n"
            + "\n".join(f"  - {r}" for r in reasons)
            + f"\nbackends that would accept it: {', '.join(would) or 'none'}"
            + (f"; force one with backend=... or {policy.ENV_BACKEND}=<name>" if would else ""))


def _nothing_text(problem, device, candidates) -> str:
    lines = [f"no backend can serve {problem.describe()} on {device.name}:"]
    for c in candidates:
        lines.append(f"  {c.backend}:" + ("" if c.ranked else f" ({c.why})"))
        lines.extend(f"    - {r}" for r in c.reasons)
        if c.accepted:  # only an unranked one can accept here: say how to use it anyway
            lines.append(f"    accepts it; force it with backend={c.backend!r} or {policy.ENV_BACKEND}={c.backend}")
    return "\n".join(lines)


@dataclass
class Planned:
    """What a wrapper keeps between plan() and run(): the backend and its plan."""

    decision: Decision
    backend: str
    plan: Any


def plan(decision: Decision, batch: AttentionBatch) -> Planned:
    """Plan on the chosen backend; a plan-time rejection hands over to the next accepted one.
    ``decision.ran`` records which backend planned (what explain() reports as having run)."""
    try:
        planned = Planned(decision, decision.chosen, get_backend(decision.chosen).plan(decision.problem, batch))
    except BackendRejected as exc:
        _record_fallback(decision, decision.chosen, exc)
        planned = _plan_fallback(decision, batch)
    decision.ran = planned.backend
    return planned


def _plan_fallback(decision: Decision, batch: AttentionBatch) -> Planned:
    for name in (b for b in decision.accepted() if b != decision.chosen):
        try:
            return Planned(decision, name, get_backend(name).plan(decision.problem, batch))
        except BackendRejected as exc:
            _record_fallback(decision, name, exc)
    raise NoBackendError(f"every accepted backend refused at plan time:\n{decision.explain()}")


def _record_fallback(decision: Decision, name: str, exc: BackendRejected) -> None:
    if decision.explicit or decision.strict:
        raise BackendRefusedError(f"{name} refused at plan time ({exc}); no fallback under "
                                  + ("an explicit choice" if decision.explicit else "strict mode")) from exc
    with _lock:
        if all(b != name for b, _ in decision.fallbacks):
            decision.fallbacks.append((name, exc.reasons))
            log.warning("attn_dispatch: %s refused %s at plan time, falling back: %s",
                        name, decision.problem.describe(), "; ".join(map(str, exc.reasons)))


def run(planned: Planned, batch: AttentionBatch) -> Planned:
    """Launch. A BackendRejected raised by run() *before any launch* still falls back;
    any other error propagates (a launched kernel may have poisoned the context)."""
    try:
        get_backend(planned.backend).run(planned.plan, batch)
        return planned
    except BackendRejected as exc:
        _record_fallback(planned.decision, planned.backend, exc)
        rest = planned.decision.accepted()
        nxt = rest[rest.index(planned.backend) + 1:] if planned.backend in rest else []
        for name in nxt:
            try:
                replanned = Planned(planned.decision, name, get_backend(name).plan(planned.decision.problem, batch))
                planned.decision.ran = name
                return run(replanned, batch)
            except BackendRejected as exc2:
                _record_fallback(planned.decision, name, exc2)
        raise NoBackendError(f"every accepted backend refused:\n{planned.decision.explain()}") from exc


def execute(problem: AttentionProblem, batch: AttentionBatch, explicit: Optional[tuple[str, str]] = None) -> Planned:
    """One-shot path for the functions: decide (cached), plan (backend-cached), run."""
    decision = decide(problem, live_device(batch.q), explicit)
    return run(plan(decision, batch), batch)


def clear_caches() -> None:
    """Forget cached decisions (tests, after installing a package, autotune switched)."""
    _decisions.clear()
    _logged.clear()


autotune._on_switch.append(clear_caches)
