"""Candidates -> checks -> choice -> fallback; decisions cached per problem key.

The hot path is ``decide`` (a dict lookup after the first call for a key), then ``plan`` and
``run`` on the chosen backend (the entry points keep the plans). Everything that explains
a decision (reasons, fallbacks) is recorded on the Decision for ``explain()``.
"""
from __future__ import annotations

import logging
import textwrap
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch

import backends
import capability_db
from backends import BackendRejected, BoundedCache, DeviceDesc, Reason, defect_reason, defects_for, get_backend

from . import autotune, choice, policy
from .problem import AttentionBatch, AttentionProblem

log = logging.getLogger("attn_dispatch")


class _Detailed(Exception):
    """An error whose message opens with a one-line summary; ``details`` holds every reason."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details or message


class BackendRefusedError(_Detailed, ValueError):
    """An explicitly chosen backend cannot serve the problem (its reasons attached)."""


class NoBackendError(_Detailed, RuntimeError):
    """No candidate accepts the problem (the ranked ones' reasons; ``details``: every backend's)."""


WIDTH = 100  # explain() fits a 100-column terminal


@dataclass
class Candidate:
    backend: str
    why: str  # why it sits at this place in the priority list, or that it is not in it
    reasons: list[Reason]  # empty = accepted
    ranked: bool = True  # in the priority list: only ranked candidates are chosen automatically
    estimate: str = ""  # the measurement or model estimate behind its place among the accepted
    evidence: Optional[choice.Estimate] = None  # that estimate, as numbers and its source
    score: Optional[float] = None  # what the ranking sorts when it spans sizes: time / fastest's, mean

    @property
    def accepted(self) -> bool:
        return not self.reasons

    def mark(self, chosen: Optional[str]) -> str:
        return "CHOSEN  " if self.backend == chosen else ("ok      " if self.accepted else "rejected")

    def to_json(self) -> dict[str, Any]:
        e = self.evidence
        return {"backend": self.backend, "accepted": self.accepted, "ranked": self.ranked, "why_here": self.why,
                "estimate": self.estimate or None, "score": self.score,
                "estimate_ms": e.ms if e else None, "estimate_sizes": list(e.sizes) if e else None,
                "estimate_source": e.source if e else None, "reasons": [str(r) for r in self.reasons]}


def wrap(text: str, indent: int, width: int = WIDTH) -> list[str]:
    """``text`` in lines of at most ``width`` columns, every line indented by ``indent``."""
    pad = " " * indent
    return textwrap.wrap(text, width, initial_indent=pad, subsequent_indent=pad + "  ",
                         break_long_words=True, break_on_hyphens=False) or [pad]


def short_reason(r: Reason) -> str:
    """A reason without its source: field, value, what is allowed."""
    return f"{r.field}={r.value!r}: allowed {r.allowed}"


def first_reason(reasons: list[Reason]) -> str:
    """The reason a one-line summary names (the device kind first: on the CPU it says it all)."""
    top = sorted(reasons, key=lambda r: r.field != "device_kind")[0]
    return short_reason(top) + (f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else "")


def candidate_lines(c: Candidate, chosen: Optional[str], prefix: str = "  ", verbose: bool = True) -> list[str]:
    """One candidate as explain() and query show it: mark, name, why, its estimate, its reasons
    (verbose: every reason with its source; else one line for a rejected candidate)."""
    head = f"{prefix}{c.mark(chosen)} {c.backend:14s} "
    if not verbose and c.reasons:
        line = head + first_reason(c.reasons)
        return [line if len(line) <= WIDTH else line[:WIDTH - 3] + "..."]
    why = textwrap.wrap(c.why, WIDTH - len(head), break_on_hyphens=False) or [""]
    lines = [head + why[0]] + [" " * len(head) + line for line in why[1:]]
    if c.estimate:
        score = f"{c.score:.3f}x the fastest (mean over sizes); " if c.score is not None else ""
        lines.extend(wrap(f"= {score}{c.estimate}", len(prefix) + 11))
    for r in c.reasons:
        lines.extend(wrap(f"- {r}", len(prefix) + 11))
    return lines


def sources_lines(candidates: list[Candidate]) -> list[str]:
    """The estimates' sources, each once (they are shared by most candidates)."""
    sources = dict.fromkeys(c.evidence.source for c in candidates if c.evidence is not None)
    return [line for s in sources for line in wrap(f"estimates from: {s}", 0)]


def describe_on(problem: AttentionProblem, device: DeviceDesc) -> str:
    """The problem's description ending with the device's name, once ("..., on h100")."""
    where = device.name if device.kind == "cpu" else f"{device.name} ({device.arch})"
    return problem.describe().removesuffix(f", on {problem.device_type}") + f", on {where}"


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
    ranked_by: str = "the static order"  # choice.Ranking.evidence

    @property
    def evidence(self) -> str:
        """Which evidence decided: "measured here (<ISO time>)" (the autotune's times), "the table"
        (its expected times), "the static order" (the priority list), or "an explicit choice"."""
        return "an explicit choice" if self.explicit else self.ranked_by

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
            "evidence": self.evidence,
            "candidates": [c.to_json() for c in self.candidates],
            "fallbacks": [{"backend": b, "reasons": [str(r) for r in rs]} for b, rs in self.fallbacks],
        }

    def summary(self) -> str:
        """One line: what serves the call, where, and why."""
        others = sum(c.accepted for c in self.candidates if c.ranked) - 1
        why = (f"explicit choice from {self.explicit[1]}" if self.explicit
               else f"{others} other ranked candidate(s) accept it" if others > 0 else "the only ranked candidate that accepts it")
        ran = f"; ran {self.ran} (fell back)" if self.ran and self.ran != self.chosen else ""
        return f"{self.chosen} serves {self.problem.entry} on {self.device.name} ({why}){ran}"

    def explain(self, verbose: bool = False) -> str:
        """The summary, the problem, one line per rejected candidate; ``verbose``: every reason with
        its source."""
        lines = [self.summary()] + wrap(f"problem: {describe_on(self.problem, self.device)}", 0)
        if not self.explicit:
            lines.append(f"decided by: {self.evidence}")
        if self.ranking and not self.explicit:
            lines.extend(wrap(f"ranked by: {self.ranking}", 0))
        for c in self.candidates:
            if not c.ranked and not verbose and c is next(o for o in self.candidates if not o.ranked):
                lines.append(f"  {c.why} (never chosen automatically; one that accepts can be forced):")
            lines.extend(candidate_lines(c, self.chosen, verbose=verbose))
        lines.extend(sources_lines(self.candidates))
        for b, rs in self.fallbacks:
            lines.extend(wrap(f"fallback: {b} refused at plan time: " + "; ".join(map(str, rs)), 2))
        if not verbose and any(c.reasons for c in self.candidates):
            lines.append("every reason with its source: explain(verbose=True) (CLI: --verbose)")
        return "\n".join(lines)

    def __str__(self) -> str:  # what a user sees when printing explain(...)
        return self.explain()


# bounded like every cache: a model's new size classes add decisions for as long as it serves
_decisions = BoundedCache(maxsize=4096)  # (problem, device, explicit, strict, live) -> Decision
_logged = BoundedCache(maxsize=4096)  # (problem, device) whose reference choice was logged -> True
# (backend, problem less its sizes, device, live, defects) -> reasons: capabilities, availability and known
# defects read the problem's facts, never its sizes, so a new size class of a problem decided before
# checks nothing again (an engine's batch reaches a new size class every few steps). Besides facts they
# read the installed versions and native-triton's interpreter switch, each fixed for the process as the
# backends' own availability already holds them; clear_caches() forgets them with the decisions.
_reasons = BoundedCache(maxsize=4096)
_lock = threading.Lock()


def backend_reasons(name: str, problem: AttentionProblem, device: DeviceDesc, live: bool,
                    defects: bool = True) -> list[Reason]:
    """Availability and known defects of the installed version (only for a live device) plus
    capability reasons of one backend. ``defects=False``: an explicit choice (run with a warning)."""
    key = (name, problem, device, live, defects)
    known = _reasons.get(key)
    if known is None:
        known = _reasons.put(key, tuple(_backend_reasons(name, problem, device, live, defects)))
    return list(known)


def _backend_reasons(name: str, problem: AttentionProblem, device: DeviceDesc, live: bool,
                     defects: bool) -> list[Reason]:
    backend = get_backend(name)
    reasons = []
    if live:
        missing = backend.available()
        if missing is not None:
            reasons.append(missing)
    reasons.extend(backend.check(problem, device))
    if live and defects and not reasons:
        reasons.extend(defect_reason(d, version) for d, version in defects_for(backend, problem, device))
    return reasons


_warned_defects: set[tuple[str, str]] = set()  # (backend, defect id): bounded by defects.json


def _warn_defects(name: str, problem: AttentionProblem, device: DeviceDesc) -> None:
    """An explicit choice of a backend with a known defect runs, with one WARNING per defect."""
    for defect, version in defects_for(get_backend(name), problem, device):
        if (name, defect.id) not in _warned_defects:
            _warned_defects.add((name, defect.id))
            log.warning("attn_dispatch: %s was chosen explicitly and runs, but %s %s has a known defect: %s [%s]",
                        name, defect.provider, version, defect.summary(), ", ".join(defect.sources or [defect.report]))


def evaluate(problem: AttentionProblem, device: DeviceDesc, live: bool = True) -> list[Candidate]:
    """Every backend with its reasons (all, not the first): the accepted candidates of the
    device's priority list ordered by expected time (``rank_measured``), then the rejected ones
    in priority order, then every other registered backend, unranked (it can be forced, never
    chosen)."""
    return _evaluate(problem, device, live)[0]


def _evaluate(problem: AttentionProblem, device: DeviceDesc, live: bool) -> tuple[list[Candidate], choice.Ranking]:
    """``evaluate``'s candidates, and the ranking that ordered the accepted ones."""
    static = replace(problem, sizes=(), replay_kv=0) if problem.sizes or problem.replay_kv else problem
    ranked = [Candidate(e.backend, e.why, backend_reasons(e.backend, static, device, live))
              for e in capability_db.candidates(device, problem.phase, problem.entry)]
    ranked, ranking = rank_measured(problem, device, ranked)
    listed = {c.backend for c in ranked}
    outside = f"not in the {capability_db.priority_list_name(device, problem.phase)} priority list"
    return ranked + [Candidate(name, outside, backend_reasons(name, static, device, live), ranked=False)
                     for name in backends.REGISTRY if name not in listed], ranking


def rank_measured(problem: AttentionProblem, device: DeviceDesc,
                  ranked: list[Candidate]) -> tuple[list[Candidate], choice.Ranking]:
    """The accepted candidates ordered by measured time or cost model (dispatch/choice.py), each
    with its estimate: they trade places among their own slots of the priority list, so a rejected
    candidate keeps its place (strict mode and explain read it there); ties keep the priority order."""
    accepted = [c for c in ranked if c.accepted]
    ranking = choice.rank(problem, device, [c.backend for c in accepted], problem.sizes or None)
    by_name = {c.backend: c for c in accepted}
    for name, est in ranking.estimates.items():
        by_name[name].estimate, by_name[name].evidence = est.short(), est
        by_name[name].score = ranking.scores.get(name) if ranking.points > 1 else None
    order = iter(ranking.order)
    return [by_name[next(order)] if c.accepted else c for c in ranked], ranking


def decide(problem: AttentionProblem, device: DeviceDesc, explicit: Optional[tuple[str, str]] = None,
           strict: Optional[bool] = None, live: bool = True,
           lengths: Optional[Callable[[], autotune.Lengths]] = None) -> Decision:
    """The cached decision for (problem, device, explicit, strict). Raises if nothing can serve.
    ``lengths``: reads the call's per-request (q, kv) lengths, which a new bucket is timed on inside
    a tuning context (``autotune.CALL_LENGTHS``); read only then."""
    strict = policy.strict_mode() if strict is None else strict
    key = (problem, device, explicit, strict, live, choice.capturing(device))  # captured: GPU time alone
    decision = _decisions.get(key)
    if decision is None:
        if key[-1] and not problem.cuda_graph:  # decided inside a capture: only what a graph can hold
            problem = replace(problem, cuda_graph=True)
        token = autotune.CALL_LENGTHS.set(lengths)
        try:
            decision = _decide(problem, device, explicit, strict, live)
        finally:
            autotune.CALL_LENGTHS.reset(token)
        _decisions.put(key, decision)
    return decision


def _decide(problem, device, explicit, strict, live) -> Decision:
    candidates, ranking = _evaluate(problem, device, live)
    if explicit is not None:
        name, source = explicit
        reasons = backend_reasons(name, problem, device, live, defects=False)
        if reasons:
            raise BackendRefusedError(_refusal_text(problem, device, name, source, reasons, candidates))
        if live:
            _warn_defects(name, problem, device)
        return Decision(problem, device, candidates, name, explicit, strict)
    accepted = [c for c in candidates if c.accepted and c.ranked]
    if not accepted:
        raise NoBackendError(*_nothing_text(problem, device, candidates))
    chosen = accepted[0].backend
    if strict:
        _check_strict(problem, device, candidates, chosen)
    basis = ranking.basis if ranking.estimates else ""  # the priority list alone: nothing to add
    decision = Decision(problem, device, candidates, chosen, None, strict, ranking=basis, ranked_by=ranking.evidence)
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
        held_back = all(r.field == "known defect" for r in c.reasons)  # a refusal by data, not a fallback
        if installed and not held_back:
            raise NoBackendError(
                f"strict mode ({policy.ENV_STRICT}=1): {c.backend} would fall back to {chosen} for "
                f"{problem.describe()} on {device.name}: " + "; ".join(map(str, c.reasons)))


def _refusal_text(problem, device, name, source, reasons, candidates) -> str:
    would = [c.backend for c in candidates if c.accepted]
    return (f"backend {name!r} (chosen by {source}) cannot serve this {problem.entry} call on {device.name}: "
            f"{first_reason(reasons)}\nproblem: {describe_on(problem, device)}\n"
            + "\n".join(f"  - {r}" for r in reasons)
            + f"\nbackends that would accept it: {', '.join(would) or 'none'}"
            + (f"; force one with backend=... or {policy.ENV_BACKEND}=<name>" if would else ""))


def _nothing_text(problem, device, candidates) -> tuple[str, str]:
    """(message, details): the ranked candidates' reasons and a line for the rest; every reason."""
    ranked = [c for c in candidates if c.ranked]
    top = f"{ranked[0].backend}: {first_reason(ranked[0].reasons)}" if ranked else "no priority list"
    if problem.cuda_graph and device.kind != "cuda":  # the one thing to change, whatever the backends say
        top = "CUDA graphs need a CUDA device: is_cuda_graph_compatible / use_cuda_graph must be False here"
    lines = [f"no backend can serve this {problem.entry} call on {device.name} ({top})",
             f"problem: {describe_on(problem, device)}"]
    details = list(lines)
    for c in candidates:
        block = [f"  {c.backend}:" + ("" if c.ranked else f" ({c.why})")] + [f"    - {r}" for r in c.reasons]
        if c.accepted:  # only an unranked one can accept here: say how to use it anyway
            block.append(f"    accepts it; force it with backend={c.backend!r} or {policy.ENV_BACKEND}={c.backend}")
        details += block
        if c.ranked or c.accepted:
            lines += block
    rest = [c.backend for c in candidates if not c.ranked and not c.accepted]
    if rest:
        lines.append(f"  refusing too, outside the priority list: {', '.join(rest)}")
        lines.append("every backend's reasons with their sources: this error's .details "
                     "(attn-dispatch explain --verbose)")
    return "\n".join(lines), "\n".join(details)


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


def batch_lengths(batch: AttentionBatch) -> autotune.Lengths:
    """The batch's per-request query and key lengths, read from the device (a decision that times)."""
    return lengths_of(batch.qo_indptr, batch.kv_lens)


def lengths_of(qo_indptr: torch.Tensor, kv_lens: torch.Tensor) -> autotune.Lengths:
    """Per-request query lengths (from the indptr) and key lengths, as host lists."""
    qo = qo_indptr.tolist()
    return [b - a for a, b in zip(qo[:-1], qo[1:])], kv_lens.tolist()


def clear_caches() -> None:
    """Forget cached decisions (tests, after installing a package, autotune switched)."""
    with _lock:
        _decisions.clear()
        _logged.clear()
        _reasons.clear()
        _warned_defects.clear()


autotune.on_switch(clear_caches)
